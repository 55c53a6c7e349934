-- wrk script: POST a prepared V2 infer body (JSON, or JSON header + binary tensors).
-- BODY_FILE: the body; HEADER_LEN: set for binary bodies (Inference-Header-Content-Length).
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
local h = os.getenv("HEADER_LEN")
if h and h ~= "" then
  wrk.headers["Content-Type"] = "application/octet-stream"
  wrk.headers["Inference-Header-Content-Length"] = h
else
  wrk.headers["Content-Type"] = "application/json"
end

done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d duration_us=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
