#!/usr/bin/env python3
"""The queue delay at its two settings on the example MLP: `queue_delay = "adaptive"` (the
default) against `"strict"` (Triton's rule), same binary, same recipe delay, alternating run by
run with a fresh server each time. One connection shows what a lone request pays for the delay;
16 show that batches, throughput and p99 under load stay those of the strict rule. Prints a
markdown table of medians: inferences/s, wrk p50/p99, and from the server's metrics the queue
p50 and the average batch.

usage: queue_delay.py BIN [DELAY_US] [CONNECTIONS] [RUNS] [SECONDS]
  e.g. python3 bench/queue_delay.py target/runtime/.../infer-serve 2000 1,16 5 4
"""
import statistics
import sys

import runtime_lib as lib
from runtime_lib import Server, counter, hist_quantile, write_config

args = sys.argv[1:]
binary = args[0]
delay = int(args[1]) if len(args) > 1 else 2000
conns = [int(c) for c in (args[2] if len(args) > 2 else "1,16").split(",")]
runs = int(args[3]) if len(args) > 3 else 5
lib.SECS = int(args[4]) if len(args) > 4 else 4
port = 18491


def config(mode):
    path = write_config(f"queue-{mode}.toml", port, mbs=32, delay=delay)
    text = open(path).read().replace(
        f"max_queue_delay_us = {delay}\n", f"max_queue_delay_us = {delay}\nqueue_delay = \"{mode}\"\n")
    open(path, "w").write(text)
    return path


def one_run(mode, c):
    s = Server([binary, "--config", config(mode)], port)
    r = lib.wrk(port, c, "json")
    m = s.metrics()
    s.stop()
    batches = counter(m, "nv_inference_exec_count")
    rows = counter(m, "nv_inference_count")
    return dict(rps=r["rps"], p50=r["p50"] * 1e3, p99=r["p99"] * 1e3,
                queue_p50=hist_quantile(m, "infer_serve_queue_duration_seconds", 0.5) * 1e6,
                batch=rows / max(batches, 1))


print(f"max_queue_delay_us = {delay}, max_batch_size = 32, JSON, median of {runs} runs of {lib.SECS} s")
print()
print("| queue_delay | connections | inferences/s | wrk p50 µs | wrk p99 µs | queue p50 µs | rows per batch |")
print("|---|---:|---:|---:|---:|---:|---:|")
for c in conns:
    results = {"adaptive": [], "strict": []}
    for _ in range(runs):
        for mode in results:
            results[mode].append(one_run(mode, c))
    for mode, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {mode} | {c} | {med['rps']:,.0f} | {med['p50']:.0f} | {med['p99']:.0f} | "
              f"{med['queue_p50']:.1f} | {med['batch']:.2f} |")
