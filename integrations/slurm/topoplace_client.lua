-- topoplace_client.lua: what job_submit.lua and cli_filter.lua share.
--
-- Lua 5.1 with luasocket and lua-cjson (Debian: lua-socket, lua-cjson).
-- Settings come from topoplace.conf in the same directory (next to
-- slurm.conf), "key = value" lines, "#" comments:
--   server = http://127.0.0.1:8080   the topoplace service
--   timeout_ms = 100                  the whole HTTP exchange, connect included
--   token_file = /etc/slurm/topoplace.token   bearer token, first line (optional)
-- One raw HTTP/1.1 request per call with a total deadline: slurmctld holds
-- its locks while job_submit runs, so a slow service must cost at most the
-- timeout, and any failure lets the job through unchanged.

local socket = require("socket")
local cjson = require("cjson")

local M = {}

local function script_dir()
  local source = debug.getinfo(1, "S").source
  return source:match("^@(.*/)") or "./"
end

local function read_config(path)
  local config = { server = "http://127.0.0.1:8080", timeout_ms = "100" }
  local file = io.open(path, "r")
  if file == nil then
    return config
  end
  for line in file:lines() do
    local key, value = line:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
    if key ~= nil and not line:match("^%s*#") then
      config[key] = value
    end
  end
  file:close()
  return config
end

local function read_token(path)
  if path == nil or path == "" then
    return nil
  end
  local file = io.open(path, "r")
  if file == nil then
    return nil
  end
  local token = file:read("*l")
  file:close()
  return token and token:match("^%s*(.-)%s*$")
end

M.config = read_config(script_dir() .. "topoplace.conf")
M.timeout_s = (tonumber(M.config.timeout_ms) or 100) / 1000
M.token = read_token(M.config.token_file)
local host, port, base = M.config.server:match("^http://([^:/]+):?(%d*)(.-)/*$")
M.host, M.port, M.base = host or "127.0.0.1", tonumber(port) or 80, base or ""

M.NO_VAL = 4294967294

-- Status and body of an HTTP/1.1 response: the body by its Content-Length, so
-- the answer counts as soon as it is complete, whenever the server closes.
local function read_response(tcp)
  local line, err = tcp:receive("*l")
  if line == nil then
    return nil, nil, err
  end
  local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  local length
  repeat
    line, err = tcp:receive("*l")
    if line == nil then
      return nil, nil, err
    end
    local value = line:lower():match("^content%-length:%s*(%d+)")
    if value ~= nil then
      length = tonumber(value)
    end
  until line == ""
  local body
  if length ~= nil then
    body, err = tcp:receive(length)
  else
    body, err = tcp:receive("*a")
  end
  if status == nil or body == nil then
    return nil, nil, err or "not an HTTP answer"
  end
  return status, body
end

-- POST a JSON body; returns (status, decoded body, ms) or (nil, why, ms).
function M.post(path, body)
  local started = socket.gettime()
  local payload = cjson.encode(body)
  local headers = {
    "POST " .. M.base .. path .. " HTTP/1.1",
    "Host: " .. M.host .. ":" .. M.port,
    "Content-Type: application/json",
    "Content-Length: " .. #payload,
    "Connection: close",
  }
  if M.token ~= nil and M.token ~= "" then
    headers[#headers + 1] = "Authorization: Bearer " .. M.token
  end
  local tcp = socket.tcp()
  tcp:settimeout(M.timeout_s, "t") -- a total deadline for everything below
  local ok, err = tcp:connect(M.host, M.port)
  if ok then
    ok, err = tcp:send(table.concat(headers, "\r\n") .. "\r\n\r\n" .. payload)
  end
  local status, answer
  if ok then
    status, answer, err = read_response(tcp)
  end
  tcp:close()
  local elapsed_ms = (socket.gettime() - started) * 1000
  if status == nil then
    return nil, string.format("%s after %.0f ms", tostring(err), elapsed_ms), elapsed_ms
  end
  local decoded_ok, decoded = pcall(cjson.decode, answer)
  if not decoded_ok then
    return nil, string.format("unreadable answer after %.0f ms", elapsed_ms), elapsed_ms
  end
  return status, decoded, elapsed_ms
end

-- The message of an error answer ({"error": {"code", "message"}}), for the log.
function M.error_text(status, decoded)
  if type(decoded) == "table" and type(decoded.error) == "table" then
    return string.format("%d %s: %s", status, tostring(decoded.error.code),
      tostring(decoded.error.message))
  end
  return tostring(status)
end

-- True when one of the request strings asks for GPUs: other jobs cost no call.
function M.asks_gpus(...)
  for i = 1, select("#", ...) do -- not ipairs: it stops at the first nil
    local value = select(i, ...)
    if type(value) == "string" and value:find("gpu", 1, true) then
      return true
    end
  end
  return false
end

return M
