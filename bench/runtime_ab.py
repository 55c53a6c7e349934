#!/usr/bin/env python3
"""Before/after comparison of infer-serve binaries on the example MLP: for each run, each
binary in turn gets a fresh server and one wrk run of the same load, so host noise falls on
both alike. Prints a markdown table of medians: inferences/s, wrk p50/p99, and from the
server's own metrics the overhead (request time minus compute) p50 and mean, queue p50 and
batch compute p50.

usage: runtime_ab.py BIN[,BIN...] CONNECTIONS[,CONNECTIONS...] [RUNS] [SECONDS] [-- SERVER ARGS]
  e.g. python3 bench/runtime_ab.py /tmp/old/infer-serve,target/.../infer-serve 1,4,16,64 7 4
"""
import os
import statistics
import sys

import runtime_lib as lib
from runtime_lib import Server, counter, hist_quantile, write_config

args = sys.argv[1:]
extra = []
if "--" in args:
    extra = args[args.index("--") + 1:]
    args = args[: args.index("--")]
bins = args[0].split(",")
conns = [int(c) for c in args[1].split(",")]
runs = int(args[2]) if len(args) > 2 else 5
lib.SECS = int(args[3]) if len(args) > 3 else 4
port = 18490
cfg = write_config("ab.toml", port, mbs=32, delay=0)


def one_run(binary, c):
    s = Server([binary, "--config", cfg] + extra, port)
    r = lib.wrk(port, c, "json")
    m = s.metrics()
    s.stop()
    n = counter(m, "nv_inference_request_success")
    return dict(
        rps=r["rps"], p50=r["p50"] * 1e3, p99=r["p99"] * 1e3,
        overhead_p50=hist_quantile(m, "infer_serve_overhead_seconds", 0.5) * 1e6,
        overhead_mean=(counter(m, "nv_inference_request_duration_us")
                       - counter(m, "nv_inference_compute_infer_duration_us")) / n,
        queue_p50=hist_quantile(m, "infer_serve_queue_duration_seconds", 0.5) * 1e6,
        compute_p50=hist_quantile(m, "infer_serve_compute_duration_seconds", 0.5) * 1e6,
    )


print(f"JSON, max_batch_size 32, delay 0; median of {runs} alternating runs of {lib.SECS} s each"
      + (f"; server args {' '.join(extra)}" if extra else ""))
print()
print("| binary | connections | inferences/s | wrk p50 µs | wrk p99 µs | overhead p50 µs | overhead mean µs | queue p50 µs | compute p50 µs |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in conns:
    res = {b: [] for b in bins}
    for _ in range(runs):
        for b in bins:
            res[b].append(one_run(b, c))
    for b in bins:
        med = {k: statistics.median(r[k] for r in res[b]) for k in res[b][0]}
        print(f"| {os.path.basename(os.path.dirname(b)) or b}/{os.path.basename(b)} | {c} | {med['rps']:,.0f} | {med['p50']:.0f} | {med['p99']:.0f} "
              f"| {med['overhead_p50']:.1f} | {med['overhead_mean']:.1f} | {med['queue_p50']:.1f} | {med['compute_p50']:.1f} |", flush=True)
