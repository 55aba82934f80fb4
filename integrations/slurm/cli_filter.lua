-- cli_filter.lua: srun and salloc ask for the GPUs topoplace would choose.
--
-- job_submit.lua decides for every job, but an srun step keeps the --gpus or
-- --gres the user typed; this filter (CliFilterPlugins=cli_filter/lua, next to
-- slurm.conf with topoplace_client.lua and topoplace.conf) asks the service
-- what it would choose (nothing is reserved) and rewrites the options to name
-- those GPUs and that node, so the step gets them too. It runs as the user and
-- can be bypassed; job_submit.lua still decides. Inside a job, it names the
-- job's own GPUs for a step that asks for a plain per-node count (see
-- rewrite_step). Any failure leaves the options as they were.

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

-- The GPU indices of the job this step runs in, when topoplace pinned them
-- (one GRES type per GPU, "g<index>"); nil for a job Slurm chose GPUs for.
-- A placed batch job carries TOPOPLACE_GPUS; an salloc shell has no such
-- variable, so its job's TresPerNode is read back.
local function job_gpus(job_id)
  local listed = os.getenv("TOPOPLACE_GPUS")
  if listed == nil or listed == "" then
    local pipe = io.popen("scontrol show job -o " .. job_id .. " 2>/dev/null")
    if pipe == nil then
      return nil
    end
    local shown = pipe:read("*a") or ""
    pipe:close()
    local tres = shown:match("TresPerNode=(%S+)")
    if tres == nil then
      return nil
    end
    local found = {}
    for entry in string.gmatch(tres, "[^,]+") do
      local index = entry:match("^gres:gpu:g(%d+):1$") or entry:match("^gpu:g(%d+):1$")
      if index == nil then
        return nil -- not wholly per-GPU types: not a job topoplace pinned
      end
      found[#found + 1] = index
    end
    listed = table.concat(found, ",")
  end
  local gpus = {}
  for index in string.gmatch(listed, "%d+") do
    gpus[#gpus + 1] = index
  end
  return #gpus > 0 and gpus or nil
end

-- A step inside a pinned job that asks for N GPUs per node as a plain count
-- (--gres=gpu:N, --gpus-per-node=N): Slurm 22.05 matches that count against
-- one of the job's per-GPU types alone and refuses the step ("Step requested
-- gres_per_node=gpu:2 is more than the job's gres_per_node=gpu:1"), so name
-- the first N of the job's GPUs instead. --gpus=N, --gpus-per-task and a step
-- with no GPU option work as they are.
local function rewrite_step(options, job_id)
  local gres = option(options, "gres")
  local count = option(options, "gpus-per-node")
  local others = {}
  if gres ~= nil then
    for entry in string.gmatch(gres, "[^,]+") do
      local bare = (entry:gsub("^gres:", ""))
      if bare:match("^gpu:%d+$") then
        count = bare:match("^gpu:(%d+)$")
      elseif bare == "gpu" or bare:find("^gpu:") then
        return -- a typed GPU ask: the user's own
      else
        others[#others + 1] = entry
      end
    end
  end
  count = tonumber((count or ""):match("^(%d+)$"))
  if count == nil or count < 1 then
    return
  end
  local gpus = job_gpus(job_id)
  if gpus == nil or count > #gpus then
    return -- not pinned, or more than the job holds: Slurm says so itself
  end
  for i = 1, count do
    others[#others + 1] = "gpu:g" .. gpus[i] .. ":1"
  end
  options["gres"] = table.concat(others, ",")
  options["gpus-per-node"] = ""
end

-- Seconds from now to --begin: srun and salloc give it here as local time,
-- "2026-12-07T16:00:00" ("now+1hour", "16:00" and the like resolved), or
-- "Unknown" when it is not set (nil). false: a form this cannot read.
local function begin_in_s(value)
  if value == nil or value == "" or value == "Unknown" then
    return nil
  end
  local y, mo, d, h, mi, s = value:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)$")
  if y == nil then
    return false
  end
  local at = os.time({ year = tonumber(y), month = tonumber(mo), day = tonumber(d),
    hour = tonumber(h), min = tonumber(mi), sec = tonumber(s) })
  return at - os.time()
end

-- Whether a partition the job may use (those it names, else the default one) gives
-- every job whole nodes (OverSubscribe=EXCLUSIVE), as --exclusive does: Slurm then gives
-- the job every GPU of a node no other job uses, so a node named for it beside another
-- job would keep it waiting while other nodes sit idle. job_submit.lua sees the
-- partition's settings; a client sees them only through scontrol (one call per srun or
-- salloc that asks for GPUs outside a job).
local function exclusive_partition(named)
  local pipe = io.popen("scontrol show partition -o 2>/dev/null")
  if pipe == nil then
    return false
  end
  local shown = pipe:read("*a") or ""
  pipe:close()
  local wanted = {}
  for name in string.gmatch(named or "", "[^,]+") do
    wanted[name] = true
  end
  for line in string.gmatch(shown, "[^\n]+") do
    local name = line:match("^PartitionName=(%S+)")
    local mine = named == nil and line:find(" Default=YES", 1, true) or wanted[name]
    if mine and line:find(" OverSubscribe=EXCLUSIVE", 1, true) then
      return true
    end
  end
  return false
end

-- A heterogeneous job (salloc A : B, srun A : B) is submitted in one process that
-- calls pre_submit once per component, in order (offset 0, 1, ...). Slurm refuses
-- components named onto one node, and salloc excludes each other component's node
-- list from a component: each proposal must leave out the nodes proposed for the
-- components before it, or two proposals of one node get the job refused.
local proposed = {}

local function pre_submit(options, offset)
  -- sbatch jobs are wholly decided by job_submit.lua.
  if options["type"] == "sbatch" then
    return
  end
  offset = tonumber(offset) or 0
  if offset == 0 then
    proposed = {}
  end
  proposed[offset] = nil
  local job_id = os.getenv("SLURM_JOB_ID")
  if job_id ~= nil then
    if options["type"] == "srun" then
      rewrite_step(options, job_id)
    end
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
  local begin = begin_in_s(option(options, "begin"))
  if begin == false then
    return -- a --begin this cannot read: job_submit.lua, which sees the time, decides
  end
  if topoplace == nil then
    package.path = here .. "?.lua;" .. package.path
    topoplace = require("topoplace_client")
    -- This runs as the user: its own token, read-only, good for proposals alone.
    topoplace.token = topoplace.read_token(topoplace.config.cli_token_file)
  end
  local exclude = option(options, "exclude")
  for earlier = 0, offset - 1 do
    if proposed[earlier] ~= nil then
      exclude = exclude and (exclude .. "," .. proposed[earlier]) or proposed[earlier]
    end
  end
  local status, decision = topoplace.post("/v1/slurm/job-submit?propose=true", {
    tres_per_job = gpus and ("gres:gpu:" .. gpus) or nil,
    tres_per_node = gres,
    min_nodes = tonumber((option(options, "nodes") or ""):match("^(%d+)")),
    features = option(options, "constraint"),
    req_nodes = option(options, "nodelist"),
    exc_nodes = exclude,
    partition = option(options, "partition"),
    comment = option(options, "comment"),
    dependency = option(options, "dependency"),
    begin_in_s = begin,
    held = options["hold"] == "set", -- --hold: "set" or "unset"
    -- --exclusive: "exclusive" ("user", "mcs", "oversubscribe" share the node's GPUs)
    exclusive = options["exclusive"] == "exclusive"
      or exclusive_partition(option(options, "partition")),
    reservation = option(options, "reservation"),
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
  proposed[offset] = decision.set.req_nodes
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  pcall(pre_submit, options, pack_offset)
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
