-- cli_filter.lua: srun and salloc ask for the GPUs topoplace would choose.
--
-- job_submit.lua decides for every job, but an srun step keeps the --gpus or
-- --gres the user typed; this filter (CliFilterPlugins=cli_filter/lua, next to
-- slurm.conf with topoplace_client.lua and topoplace.conf) asks the service
-- what it would choose (nothing is reserved) and rewrites the options to name
-- those GPUs and that node, so the step gets them too. It runs as the user and
-- can be bypassed; job_submit.lua still decides. Any failure leaves the
-- options as they were.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local topoplace -- loaded on first use: sbatch, which never needs it, skips the cost

local function option(options, name)
  local value = options[name]
  if value == nil or value == "" or value == "0" then
    return nil
  end
  return value
end

local function with_prefix(gres)
  if gres == nil then
    return nil
  end
  local entries = {}
  for entry in string.gmatch(gres, "[^,]+") do
    entries[#entries + 1] = entry:find("^gres:") and entry or ("gres:" .. entry)
  end
  return table.concat(entries, ",")
end

local function pre_submit(options)
  -- sbatch jobs are wholly decided by job_submit.lua; steps inside an
  -- allocation use what it holds.
  if options["type"] == "sbatch" or os.getenv("SLURM_JOB_ID") ~= nil then
    return
  end
  local gpus = option(options, "gpus")
  local per_node = option(options, "gpus-per-node")
  local gres = with_prefix(option(options, "gres"))
  if per_node ~= nil then
    gres = "gres:gpu:" .. per_node
  end
  if gpus == nil and (gres == nil or not gres:find("gpu", 1, true)) then
    return
  end
  if topoplace == nil then
    package.path = here .. "?.lua;" .. package.path
    topoplace = require("topoplace_client")
  end
  local status, decision = topoplace.post("/v1/slurm/job-submit", {
    tres_per_job = gpus and ("gres:gpu:" .. gpus) or nil,
    tres_per_node = gres,
    min_nodes = tonumber((option(options, "nodes") or ""):match("^(%d+)")),
    features = option(options, "constraint"),
    req_nodes = option(options, "nodelist"),
    exc_nodes = option(options, "exclude"),
    partition = option(options, "partition"),
    comment = option(options, "comment"),
    batch = false,
    reserve = false,
  })
  if status ~= 200 or decision.action ~= "modify" then
    return
  end
  options["gpus"] = ""
  options["gpus-per-node"] = ""
  options["gres"] = decision.gres
  options["nodelist"] = decision.set.req_nodes
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  pcall(pre_submit, options)
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
