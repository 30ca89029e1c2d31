-- wrk_small.lua - the throughput benchmark of `make bench-wrk` (a benchmark, not a test):
-- POST /v1/attention with small requests, one head, 16x64 query, key and value as nested JSON
-- (the "small" class of loadgen.c), each connection sending them back to back.
--
--   build/attnd --host 127.0.0.1 --port 8080 --log-level warn &
--   wrk -t2 -c32 -d10s -s tests/load/wrk_small.lua http://127.0.0.1:8080
--
-- Prints requests/s and latency p50/p90/p99 (wrk's own summary lists any non-2xx replies).

local L, D = 16, 64
local seed = 1

-- A fixed linear congruential sequence, so that every run sends the same body.
local function rand()
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed / 2147483648 * 2 - 1
end

local function nested(rows, cols)
    local out = {}
    for i = 1, rows do
        local row = {}
        for j = 1, cols do
            row[j] = string.format("%.4f", rand())
        end
        out[i] = "[" .. table.concat(row, ",") .. "]"
    end
    return "[" .. table.concat(out, ",") .. "]"
end

wrk.method = "POST"
wrk.path = "/v1/attention"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"query":' .. nested(L, D) .. ',"key":' .. nested(L, D) .. ',"value":' .. nested(L, D) .. '}'

function done(summary, latency, requests)
    local seconds = summary.duration / 1e6
    io.write(string.format("requests %d in %.1f s: %.0f requests/s; errors: connect %d, read %d, "
        .. "write %d, status %d, timeout %d\n", summary.requests, seconds,
        summary.requests / seconds, summary.errors.connect, summary.errors.read,
        summary.errors.write, summary.errors.status, summary.errors.timeout))
    io.write(string.format("latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms (body %d bytes)\n",
        latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3,
        latency.max / 1e3, #wrk.body))
end
