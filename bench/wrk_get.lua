-- wrk script of bench/rest_get.py: GET <path prefix><random key> with an optional bearer token, and one
-- JSON line of results at the end (the bench parses it).
--
--   wrk -t1 -c32 -d5s -s bench/wrk_get.lua http://127.0.0.1:7400 -- /stores/bench/get/ 100000 [token]
--
-- Keys are the benchmarks' names (bench/loadgen.py key_name): k0000000 ... k<keys - 1>, uniformly random.

local prefix, keys, headers

local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
  table.insert(threads, thread)
end

function init(args)
  prefix = args[1]
  keys = tonumber(args[2])
  headers = {}
  if args[3] ~= nil and args[3] ~= "" then
    headers["Authorization"] = "Bearer " .. args[3]
  end
  math.randomseed(os.time() * 1000 + (seed or 0))
end

function request()
  return wrk.format("GET", prefix .. string.format("k%07d", math.random(0, keys - 1)), headers)
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    '{"requests":%d,"errors":%d,"non2xx":%d,"rps":%.1f,"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f}\n',
    summary.requests,
    e.connect + e.read + e.write + e.status + e.timeout,
    e.status,
    summary.requests / seconds,
    latency:percentile(50) / 1000,
    latency:percentile(90) / 1000,
    latency:percentile(99) / 1000,
    latency.max / 1000
  ))
end
