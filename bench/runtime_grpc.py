"""gRPC raw tensors against HTTP binary tensors, same server, same run (docs/BENCHMARKS.md,
"gRPC"). The example MLP, one row per request; HTTP: wrk (bench/runtime-post.lua, the binary
body) with N connections; gRPC: h2load (Debian nghttp2-client) sending a prepared ModelInfer
request (raw_input_contents) as N concurrent streams on one HTTP/2 connection, as a gRPC
channel does. Alternates the two protocols per round; prints the medians.

usage: runtime_grpc.py INFER_SERVE STREAMS(1,16,64) ROUNDS SECONDS
"""
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runtime_lib as rl  # noqa: E402

serve, streams, rounds, secs = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
rl.SECS = secs
port, gport = 18500, 18501


def grpc_body():
    """A framed ModelInferRequest: model "mlp", input "input" [1, 64] FP32 in raw_input_contents."""
    def field(n, wire, payload):
        key = bytes([n << 3 | wire])
        if wire == 2:
            return key + varint(len(payload)) + payload
        return key + payload

    def varint(v):
        out = b""
        while True:
            b = v & 0x7F
            v >>= 7
            if v:
                out += bytes([b | 0x80])
            else:
                return out + bytes([b])

    xs = [((i % 13) / 13.0) for i in range(64)]
    shape = field(3, 2, varint(1) + varint(64))  # packed repeated int64
    tensor = field(1, 2, b"input") + field(2, 2, b"FP32") + shape
    msg = field(1, 2, b"mlp") + field(5, 2, tensor) + field(7, 2, struct.pack("<64f", *xs))
    path = os.path.join(rl.tmp, "grpc.bin")
    open(path, "wb").write(b"\0" + struct.pack(">I", len(msg)) + msg)
    return path


def h2load(n):
    out = subprocess.run(["h2load", "-c1", f"-m{n}", f"-D{secs}", "-d", BODY,
                          "-H", "content-type: application/grpc", "-H", "te: trailers",
                          f"http://127.0.0.1:{gport}/inference.GRPCInferenceService/ModelInfer"],
                         capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1))
    ok = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out).group(1)
    mean_ms = float(mean[:-2]) if mean.endswith("ms") else float(mean[:-2]) / 1000 if mean.endswith("us") else float(mean[:-1]) * 1000
    if int(ok.group(2)):
        print(f"warning: grpc m={n}: {ok.group(2)} failed", file=sys.stderr)
    return {"rps": rps, "mean_ms": mean_ms}


def failures():
    """The server's failed-request counters by reason (REJECTED, CANCELED, BACKEND, OTHER)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {r: int(float(v)) for r, v in
            re.findall(r'nv_inference_request_failure\{[^}]*reason="([A-Z]+)"\} (\S+)', text)}


failed = {}
BODY = grpc_body()
cfg = rl.write_config("grpc.toml", port)
os.environ["INFER_GRPC_PORT"] = str(gport)  # the server inherits it
srv = rl.Server([serve, "--config", cfg], port)
results = {}
try:
    for n in streams:
        for _ in range(rounds):
            before = failures()
            results.setdefault(("http binary", n), []).append(rl.wrk(port, n, "binary"))
            mid = failures()
            results.setdefault(("grpc raw", n), []).append(h2load(n))
            after = failures()
            for kind, a, b in (("http binary", before, mid), ("grpc raw", mid, after)):
                for reason in b:
                    if b[reason] - a.get(reason, 0):
                        failed.setdefault((kind, n, reason), 0)
                        failed[(kind, n, reason)] += b[reason] - a.get(reason, 0)
    stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/mlp/stats").read())
    fails = stats["model_stats"][0]["inference_stats"]["fail"]["count"]
finally:
    srv.stop()
print("| protocol | concurrent streams | inferences/s | latency |")
print("|---|---:|---:|---|")
for (kind, n), runs in results.items():
    rps = statistics.median(r["rps"] for r in runs)
    lat = (f"p50 {statistics.median(r['p50'] for r in runs):.2f} ms" if "p50" in runs[0]
           else f"mean {statistics.median(r['mean_ms'] for r in runs):.2f} ms")
    print(f"| {kind} | {n} | {rps:,.0f} | {lat} |")
print(f"\nfailed requests on the server: {fails}")
for (kind, n, reason), k in sorted(failed.items()):
    print(f"  {kind} at {n}: {k} {reason}")
