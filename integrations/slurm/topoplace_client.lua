-- topoplace_client.lua: what job_submit.lua and cli_filter.lua share.
--
-- Lua 5.1 with luasocket and lua-cjson (Debian: lua-socket, lua-cjson).
-- Settings come from topoplace.conf in the same directory (next to
-- slurm.conf), "key = value" lines, "#" comments:
--   server = http://127.0.0.1:8080   the topoplace service (https://... for TLS)
--   timeout_ms = 100                  the whole HTTP exchange, connect included
--   token_file = /etc/slurm/topoplace.token   bearer token, first line (optional)
--   cli_token_file = ...              cli_filter.lua's (a viewer token: users read it)
--   ca_file = /etc/slurm/topoplace-ca.crt     https: the CA bundle the service's
--                                     certificate must chain to (default: the
--                                     system's, /etc/ssl/certs)
-- https needs LuaSec (Debian: lua-sec); the certificate's chain and its names
-- (subjectAltName DNS or IP) are checked against the server's host.
-- Raw HTTP/1.1 on one kept-alive connection, with a deadline per step:
-- slurmctld holds its locks while job_submit runs, so a slow service must cost
-- at most the timeout, and any failure lets the job through unchanged.

local socket = require("socket")
local cjson = require("cjson")

local M = {}

local function script_dir()
  local source = debug.getinfo(1, "S").source
  return source:match("^@(.*/)") or "./"
end

-- slurmctld's log inside slurmctld (the slurm table its plugins give Lua), else stderr.
local function log_error(format, ...)
  if type(slurm) == "table" and type(slurm.log_error) == "function" then
    slurm.log_error(format, ...)
  else
    io.stderr:write(string.format(format, ...) .. "\n")
  end
end

-- A topoplace.conf that is missing or cannot be read means the defaults, said once
-- (the module is read once per load of the script): failing inside slurmctld would
-- fail every submission, which is worse than a filter using the default service.
local function read_config(path)
  local config = { server = "http://127.0.0.1:8080", timeout_ms = "100" }
  local file, err = io.open(path, "r")
  local text
  if file ~= nil then
    text, err = file:read("*a")
    file:close()
  end
  if text == nil then
    err = tostring(err)
    if err:sub(1, #path) ~= path then -- io.open's names the file, a read's does not
      err = path .. ": " .. err
    end
    log_error("topoplace: cannot read %s; using the defaults (server %s, timeout_ms %s)",
      err, config.server, config.timeout_ms)
    return config
  end
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local key, value = line:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
    if key ~= nil and not line:match("^%s*#") then
      config[key] = value
    end
  end
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
M.read_token = read_token
local scheme, host, port, base = M.config.server:match("^(https?)://([^:/]+):?(%d*)(.-)/*$")
M.tls = scheme == "https"
M.host, M.base = host or "127.0.0.1", base or ""
M.port = tonumber(port) or (M.tls and 443 or 80)

M.NO_VAL = 4294967294

-- Status, body and whether the server keeps the connection, of an HTTP/1.1
-- response: the body by its Content-Length, so the answer counts as soon as it
-- is complete. The fourth result on failure says whether nothing at all came
-- back (a kept connection the server had already closed).
local function read_response(tcp)
  local line, err = tcp:receive("*l")
  if line == nil then
    return nil, nil, err, true
  end
  local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  local length
  local keep = true
  repeat
    line, err = tcp:receive("*l")
    if line == nil then
      return nil, nil, err, false
    end
    local lower = line:lower()
    local value = lower:match("^content%-length:%s*(%d+)")
    if value ~= nil then
      length = tonumber(value)
    end
    if lower:match("^connection:%s*close") then
      keep = false
    end
  until line == ""
  local body
  if length ~= nil then
    body, err = tcp:receive(length)
  else
    body, err = tcp:receive("*a")
    keep = false
  end
  if status == nil or body == nil then
    return nil, nil, err or "not an HTTP answer", false
  end
  return status, body, keep
end

-- One connection kept open between calls: slurmctld keeps this Lua state from
-- job to job, and a connection per job cost a handshake and the server's
-- set-up of a new connection on every submission.
local kept = nil

local function exchange(tcp, request)
  local ok, err = tcp:send(request)
  if not ok then
    return nil, nil, err, true
  end
  return read_response(tcp)
end

-- Whether the certificate names host: LuaSec checks the chain, not the name.
local function names_host(cert, wanted)
  local extensions = cert and cert:extensions() or {}
  local names = extensions["2.5.29.17"] or {}
  for _, ip in ipairs(names.iPAddress or {}) do
    if ip == wanted then
      return true
    end
  end
  for _, name in ipairs(names.dNSName or {}) do
    local suffix = name:match("^%*(%..+)$")
    if name:lower() == wanted:lower() then
      return true
    end
    if suffix and wanted:lower():sub(-#suffix) == suffix:lower()
        and not wanted:sub(1, #wanted - #suffix):find(".", 1, true) then
      return true
    end
  end
  return false
end

-- The connection wrapped in TLS, the server's certificate verified; or nil, why.
local function secured(tcp)
  local ok_ssl, ssl = pcall(require, "ssl")
  if not ok_ssl then
    return nil, "https needs LuaSec (lua-sec)"
  end
  local conn, err = ssl.wrap(tcp, {
    mode = "client",
    protocol = "any",
    options = { "all", "no_sslv2", "no_sslv3", "no_tlsv1", "no_tlsv1_1" },
    verify = { "peer", "fail_if_no_peer_cert" },
    cafile = M.config.ca_file,
    capath = M.config.ca_file == nil and "/etc/ssl/certs" or nil,
  })
  if conn == nil then
    return nil, err
  end
  conn:sni(M.host)
  conn:settimeout(M.timeout_s)
  local ok, handshake_err = conn:dohandshake()
  if not ok then
    return nil, handshake_err
  end
  if not names_host(conn:getpeercertificate(), M.host) then
    return nil, "the service's certificate does not name " .. M.host
  end
  return conn
end

local function fresh()
  local tcp = socket.tcp()
  tcp:settimeout(M.timeout_s, "t") -- a deadline for each step below
  local ok, err = tcp:connect(M.host, M.port)
  if not ok then
    tcp:close()
    return nil, err
  end
  if M.tls then
    local conn, tls_err = secured(tcp)
    if conn == nil then
      tcp:close()
      return nil, tls_err
    end
    return conn
  end
  return tcp
end

-- A new Idempotency-Key, one per submission. A request is sent again only when its
-- kept connection closed with no answer: mostly a connection the service dropped while
-- idle, but also a service that committed the reservation and stopped before it could
-- answer. Under the same key the resend is answered with that reservation instead of a
-- second one. Unique per slurmctld (its host, pid and start) and per call (a count).
local key_prefix, key_count = nil, 0

local function process_id()
  local stat = io.open("/proc/self/stat", "r")
  if stat == nil then
    return "0"
  end
  local line = stat:read("*l") or ""
  stat:close()
  return line:match("^(%d+)") or "0"
end

function M.new_key()
  if key_prefix == nil then
    local host = (socket.dns.gethostname() or "slurmctld"):gsub("[^%w%.%-]", "")
    key_prefix = string.format("slurm-%s-%s-%.6f", host:sub(1, 64), process_id(),
      socket.gettime())
  end
  key_count = key_count + 1
  return key_prefix .. "-" .. key_count
end

-- POST a JSON body, with an Idempotency-Key when ``key`` is given; returns (status,
-- decoded body, ms) or (nil, why, ms).
function M.post(path, body, key)
  local started = socket.gettime()
  local function failed(err)
    local elapsed_ms = (socket.gettime() - started) * 1000
    return nil, string.format("%s after %.0f ms", tostring(err), elapsed_ms), elapsed_ms
  end
  local payload = cjson.encode(body)
  local headers = {
    "POST " .. M.base .. path .. " HTTP/1.1",
    "Host: " .. M.host .. ":" .. M.port,
    "Content-Type: application/json",
    "Content-Length: " .. #payload,
  }
  if M.token ~= nil and M.token ~= "" then
    headers[#headers + 1] = "Authorization: Bearer " .. M.token
  end
  if key ~= nil then
    headers[#headers + 1] = "Idempotency-Key: " .. key
  end
  local request = table.concat(headers, "\r\n") .. "\r\n\r\n" .. payload
  -- On success: status, body, whether the connection stays open.
  -- On failure: nil, nil, the error, whether nothing at all came back.
  local status, answer, keep, nothing
  if kept ~= nil then
    status, answer, keep, nothing = exchange(kept, request)
    if status == nil then
      kept:close()
      kept = nil
      -- Only a connection that closed with no answer at all is tried again: the
      -- server dropped it while it sat idle, and never read the request, or it stopped
      -- after reading it, which a key makes safe to send again (M.new_key). A timeout
      -- or a partial answer is not retried.
      if not (nothing and keep == "closed") then
        return failed(keep)
      end
    end
  end
  if status == nil then
    local tcp, err = fresh()
    if tcp == nil then
      return failed(err)
    end
    status, answer, keep = exchange(tcp, request)
    if status == nil then
      tcp:close()
      return failed(keep)
    end
    kept = tcp
  end
  if not keep then
    kept:close()
    kept = nil
  end
  local elapsed_ms = (socket.gettime() - started) * 1000
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
