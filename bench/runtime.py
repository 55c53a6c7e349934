#!/usr/bin/env python3
"""Benchmarks infer-serve on the example MLP with wrk; prints the markdown for the "Runtime"
section of docs/BENCHMARKS.md. Driven by bench/runtime.sh (which builds the binaries).

usage: runtime.py SERVE_BIN CEILING_BIN MODEL.onnx [RUNS] [SECONDS]
Every figure is the median of RUNS runs (default 3) of SECONDS (default 5) each.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import runtime_lib as lib
from runtime_lib import Server, counter, hist_quantile, median_runs, write_config

serve_bin, ceiling_bin = sys.argv[1], sys.argv[2]
lib.MODEL = os.path.abspath(sys.argv[3])
RUNS = lib.RUNS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
lib.SECS = int(sys.argv[5]) if len(sys.argv) > 5 else 5

out = []
say = out.append
port = 18401
cfg = write_config("batch.toml", port, mbs=32, delay=0)
argv = [serve_bin, "--config", cfg]

# Start-to-ready and idle memory (3 starts).
starts, idle = [], []
for _ in range(RUNS):
    s = Server(argv, port)
    starts.append(s.spawn_to_ready)
    time.sleep(0.5)
    idle.append(s.rss_kib()[0])
    s.stop()

s = Server(argv, port)
table = {}
for kind in ("json", "binary"):
    for c in (1, 4, 16, 64):
        table[(kind, c)] = median_runs(port, c, kind)
loaded_rss = s.rss_kib()
m = s.metrics()
overhead_p50 = hist_quantile(m, "infer_serve_overhead_seconds", 0.5) * 1e6
overhead_p99 = hist_quantile(m, "infer_serve_overhead_seconds", 0.99) * 1e6
avg_batch = counter(m, "nv_inference_count") / counter(m, "nv_inference_exec_count")
compute_p50 = hist_quantile(m, "infer_serve_compute_duration_seconds", 0.5) * 1e6
s.stop()

# The server's own overhead when it is not competing with the load generator for the cores:
# one connection, a fresh server (its histograms hold only this run); with the default
# busy-poll window and with busy polling off.
def one_connection(extra):
    port_1 = 18405
    s = Server([serve_bin, "--config", write_config("one.toml", port_1, mbs=32, delay=0)] + extra, port_1)
    r = median_runs(port_1, 1, "json")
    m1 = s.metrics()
    s.stop()
    n = counter(m1, "nv_inference_request_success")
    return r, {
        "overhead_p50": hist_quantile(m1, "infer_serve_overhead_seconds", 0.5) * 1e6,
        "overhead_p99": hist_quantile(m1, "infer_serve_overhead_seconds", 0.99) * 1e6,
        "queue_p50": hist_quantile(m1, "infer_serve_queue_duration_seconds", 0.5) * 1e6,
        # One request per batch at one connection, so the Triton counters give the mean of
        # request time minus compute exactly.
        "minus_compute_mean": (counter(m1, "nv_inference_request_duration_us")
                               - counter(m1, "nv_inference_compute_infer_duration_us")) / n,
        "avg_batch": counter(m1, "nv_inference_count") / counter(m1, "nv_inference_exec_count"),
    }


one, o1 = one_connection([])
one_np, o1_np = one_connection(["--busy-poll-us", "0"])
s = Server(argv + ["--busy-poll-us", "0"], port)
sixteen_np = median_runs(port, 16, "json")
s.stop()
# Next to two CPU-bound processes (a node shared with batch work), polling on and off.
hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
try:
    hog, o_hog = one_connection([])
    hog_np, o_hog_np = one_connection(["--busy-poll-us", "0"])
finally:
    for h in hogs:
        h.kill()

# Queue time against the configured delay: 64 connections, max_queue_delay_us = 2000.
port_d = 18404
s = Server([serve_bin, "--config", write_config("delay.toml", port_d, mbs=32, delay=2000, preferred="[8, 16, 32]")], port_d)
delayed = median_runs(port_d, 64, "json")
md = s.metrics()
queue_p50 = hist_quantile(md, "infer_serve_queue_duration_seconds", 0.5) * 1e3
queue_p99 = hist_quantile(md, "infer_serve_queue_duration_seconds", 0.99) * 1e3
avg_batch_d = counter(md, "nv_inference_count") / counter(md, "nv_inference_exec_count")
s.stop()

# Batching off: max_batch_size = 1, same concurrency.
port_nb = 18402
s = Server([serve_bin, "--config", write_config("nobatch.toml", port_nb, mbs=1)], port_nb)
nobatch = {kind: median_runs(port_nb, 16, kind) for kind in ("json", "binary")}
nobatch64 = median_runs(port_nb, 64, "json")
s.stop()

# The ceiling: same HTTP stack, decode and encode, no batcher, no model.
port_c = 18403
ceiling = None
if os.path.exists(ceiling_bin):
    s = Server([ceiling_bin, write_config("ceiling.toml", port_c), str(port_c)], port_c, ready_path="/")
    ceiling = {kind: median_runs(port_c, 16, kind) for kind in ("json", "binary")}
    s.stop()

say("| encoding | connections | inferences/s | p50 ms | p99 ms |")
say("|---|---:|---:|---:|---:|")
for (kind, c), r in table.items():
    say(f"| {kind} | {c} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} |")
say("")
say("| comparison (16 connections) | runtime inferences/s | reference inferences/s | ratio |")
say("|---|---:|---:|---:|")
for kind in ("json", "binary"):
    say(f"| batching (max_batch_size 32) vs max_batch_size 1, {kind} | {table[(kind, 16)]['rps']:,.0f} | {nobatch[kind]['rps']:,.0f} | {table[(kind, 16)]['rps'] / nobatch[kind]['rps']:.2f}x |")
say(f"| batching vs max_batch_size 1, json, 64 connections | {table[('json', 64)]['rps']:,.0f} | {nobatch64['rps']:,.0f} | {table[('json', 64)]['rps'] / nobatch64['rps']:.2f}x |")
for kind in ("json", "binary") if ceiling else ():
    say(f"| runtime vs ceiling (same HTTP + decode/encode, no batcher, no model), {kind} | {table[(kind, 16)]['rps']:,.0f} | {ceiling[kind]['rps']:,.0f} | {table[(kind, 16)]['rps'] / ceiling[kind]['rps']:.2f} |")
say("")
say(f"- server-side overhead (request time minus compute, queue included, `infer_serve_overhead_seconds`): at 1 JSON connection (a fresh server, {one['rps']:,.0f} inferences/s) p50 {o1['overhead_p50']:.1f} µs, p99 {o1['overhead_p99']:.1f} µs, mean {o1['minus_compute_mean']:.1f} µs (from the Triton counters; {o1['avg_batch']:.2f} rows per batch); queue p50 {o1['queue_p50']:.1f} µs; over all runs of the first table (up to 64 connections, the load generator on the same 2 cores, so mostly waiting for a core) p50 {overhead_p50:.1f} µs, p99 {overhead_p99:.1f} µs")
say(f"- busy polling off (`--busy-poll-us 0`), same run, 1 JSON connection: {one_np['rps']:,.0f} inferences/s (default window: {one['rps']:,.0f}), p50 {one_np['p50'] * 1e3:.0f} µs (default: {one['p50'] * 1e3:.0f} µs), overhead p50 {o1_np['overhead_p50']:.1f} µs, mean {o1_np['minus_compute_mean']:.1f} µs; 16 JSON connections: {sixteen_np['rps']:,.0f} inferences/s, p99 {sixteen_np['p99']:.2f} ms (default: {table[('json', 16)]['rps']:,.0f}, p99 {table[('json', 16)]['p99']:.2f} ms)")
say(f"- next to two CPU-bound processes (`yes`), 1 JSON connection: {hog['rps']:,.0f} inferences/s, p50 {hog['p50'] * 1e3:.0f} µs, p99 {hog['p99']:.2f} ms, overhead mean {o_hog['minus_compute_mean']:.1f} µs; busy polling off: {hog_np['rps']:,.0f} inferences/s, p50 {hog_np['p50'] * 1e3:.0f} µs, p99 {hog_np['p99']:.2f} ms, overhead mean {o_hog_np['minus_compute_mean']:.1f} µs")
cc = os.environ.get("CODEC_COST_JSON")
if cc:
    cc = json.loads(cc)
    say(f"- V2 codec alone (`examples/codec_cost.rs`, the benchmark's request, median of 7 rounds): decode JSON ({cc['json_bytes']} bytes, 64 floats as Python writes them) {cc['decode_json_ns'] / 1e3:.1f} µs, decode binary {cc['decode_binary_ns'] / 1e3:.1f} µs; encode JSON {cc['encode_json_ns'] / 1e3:.2f} µs, binary {cc['encode_binary_ns'] / 1e3:.2f} µs")
mc = os.environ.get("METRICS_COST_JSON")
if mc:
    mc = json.loads(mc)
    cores = os.cpu_count() or 1
    per_req_ns = cores * 1e9 / table[("json", 16)]["rps"]
    say(f"- metrics cost: {mc['metrics_ns_per_request']:.0f} ns of CPU per request for every metric a one-row request touches (`examples/metrics_cost.rs`: 2 threads on one shared `Metrics`, a batch per request, clock reads included; median of {mc['runs']}) against {per_req_ns / 1e3:.1f} µs of CPU per request at 16 JSON connections ({cores} cores / {table[('json', 16)]['rps']:,.0f} inferences/s): {mc['metrics_ns_per_request'] / per_req_ns * 100:.2f}% of throughput (goal ≤ 2%)")
say(f"- queue time with max_queue_delay_us = 2000, preferred [8, 16, 32], 64 JSON connections: p50 {queue_p50:.2f} ms, p99 {queue_p99:.2f} ms (from `infer_serve_queue_duration_seconds`); {delayed['rps']:,.0f} inferences/s, p99 {delayed['p99']:.2f} ms, average batch {avg_batch_d:.1f} rows")
say(f"- average batch size over all runs above: {avg_batch:.2f} rows; batch compute p50 {compute_p50:.1f} µs")
say(f"- memory: idle RSS {statistics.median(idle) / 1024:.1f} MiB (median of {RUNS} starts); after the load above RSS {loaded_rss[0] / 1024:.1f} MiB, peak {loaded_rss[1] / 1024:.1f} MiB")
say(f"- start to ready (spawn until `/v2/health/ready` answers 200, polled every 2 ms; includes engine load and warm-up of 6 batch sizes): median {statistics.median(starts) * 1e3:.0f} ms over {RUNS} starts")
print("\n".join(out))
