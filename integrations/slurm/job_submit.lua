-- job_submit.lua: topoplace chooses the node and the exact GPUs of each GPU job.
--
-- Install next to slurm.conf with topoplace_client.lua and topoplace.conf,
-- and set JobSubmitPlugins=lua. For every job that asks for GPUs, the job's
-- request is sent to the topoplace service (POST /v1/slurm/job-submit), which
-- answers with one of:
--   modify:    fields to write (req_nodes, tres_per_node naming exact GPUs,
--              a cleared tres_per_job, admin_comment) and, for batch jobs,
--              environment variables;
--   unchanged: the job goes to Slurm as it is (the reason is logged);
--   refuse:    the request can never be placed; the user sees the message.
-- When the service is down, slow (over timeout_ms) or answers an error, the
-- job goes through unchanged with a log line: a placement service must never
-- stop a cluster from taking jobs.

package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local topoplace = require("topoplace_client")

local function number_or_nil(value)
  if value == nil or value >= topoplace.NO_VAL then
    return nil
  end
  return value
end

-- The host list of the partitions the job may use (its own, else the default one).
local function partition_nodes(job_desc, part_list)
  local lists = {}
  if job_desc.partition ~= nil then
    for name in string.gmatch(job_desc.partition, "[^,]+") do
      local part = part_list[name]
      if part ~= nil and part.nodes ~= nil then
        lists[#lists + 1] = part.nodes
      end
    end
  else
    for _, part in pairs(part_list) do
      if part.flag_default == 1 and part.nodes ~= nil then
        lists[#lists + 1] = part.nodes
      end
    end
  end
  if #lists == 0 then
    return nil
  end
  return table.concat(lists, ",")
end

-- Whether a partition the job may use gives every job whole nodes (OverSubscribe=EXCLUSIVE:
-- max_share 0), as --exclusive does: Slurm then gives the job every GPU of a node no other
-- job uses, so a job pinned beside another one would wait for it while other nodes sit idle.
local function exclusive_partition(job_desc, part_list)
  local function exclusive(part)
    return part ~= nil and part.max_share == 0
  end
  if job_desc.partition ~= nil then
    for name in string.gmatch(job_desc.partition, "[^,]+") do
      if exclusive(part_list[name]) then
        return true
      end
    end
    return false
  end
  for _, part in pairs(part_list) do
    if part.flag_default == 1 and exclusive(part) then
      return true
    end
  end
  return false
end

-- Seconds from now to the job's --begin, nil when it has none (0). A job that may
-- start only later, like one with a --dependency or one held, is left to Slurm
-- unreserved.
local function begin_in_s(begin_time)
  if begin_time == nil or begin_time == 0 or begin_time >= topoplace.NO_VAL then
    return nil
  end
  return begin_time - os.time()
end

local function submit(job_desc, part_list)
  if not topoplace.asks_gpus(job_desc.tres_per_job, job_desc.tres_per_node,
      job_desc.tres_per_task, job_desc.tres_per_socket) then
    return slurm.SUCCESS
  end
  local batch = job_desc.script ~= nil
  local status, decision, elapsed_ms = topoplace.post("/v1/slurm/job-submit", {
    tres_per_job = job_desc.tres_per_job,
    tres_per_node = job_desc.tres_per_node,
    tres_per_task = job_desc.tres_per_task,
    tres_per_socket = job_desc.tres_per_socket,
    min_nodes = number_or_nil(job_desc.min_nodes),
    max_nodes = number_or_nil(job_desc.max_nodes),
    num_tasks = number_or_nil(job_desc.num_tasks),
    features = job_desc.features,
    req_nodes = job_desc.req_nodes,
    exc_nodes = job_desc.exc_nodes,
    partition = job_desc.partition,
    partition_nodes = partition_nodes(job_desc, part_list),
    array_inx = job_desc.array_inx,
    dependency = job_desc.dependency,
    begin_in_s = begin_in_s(job_desc.begin_time),
    -- --hold (sbatch -H) arrives as priority 0: the job waits for scontrol release.
    held = job_desc.priority == 0,
    -- --exclusive (shared 0, JOB_SHARED_NONE), or a partition with OverSubscribe=EXCLUSIVE:
    -- Slurm gives it every GPU of an idle node.
    exclusive = job_desc.shared == 0 or exclusive_partition(job_desc, part_list),
    reservation = job_desc.reservation,
    user_name = job_desc.user_name,
    name = job_desc.name,
    comment = job_desc.comment,
    batch = batch,
  }, topoplace.new_key())
  if status == nil then
    slurm.log_info("topoplace: no answer (%s); job left unchanged", decision)
    return slurm.SUCCESS
  end
  if status ~= 200 then
    slurm.log_info("topoplace: service error %s after %.1f ms; job left unchanged",
      topoplace.error_text(status, decision), elapsed_ms)
    return slurm.SUCCESS
  end
  if decision.action == "refuse" then
    slurm.log_user("%s", decision.message)
    slurm.log_info("%s (job refused, %.1f ms)", decision.message, elapsed_ms)
    return slurm.ERROR
  end
  if decision.action == "modify" then
    for field, value in pairs(decision.set) do
      job_desc[field] = value
    end
    if batch and job_desc.environment ~= nil then
      for name, value in pairs(decision.environment) do
        job_desc.environment[name] = value
      end
    end
  end
  slurm.log_info("%s [%.1f ms]", decision.message, elapsed_ms)
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  -- A fault in this script must not refuse jobs: log it and let the job through.
  local ok, result = pcall(submit, job_desc, part_list)
  if not ok then
    slurm.log_error("topoplace: filter failed (%s); job left unchanged", tostring(result))
    return slurm.SUCCESS
  end
  return result
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

slurm.log_info("topoplace: job_submit.lua loaded, service %s, timeout %.0f ms",
  topoplace.config.server, topoplace.timeout_s * 1000)
return slurm.SUCCESS
