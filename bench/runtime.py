#!/usr/bin/env python3
"""Benchmarks infer-serve on the example MLP with wrk; prints the markdown for the "Runtime"
section of docs/BENCHMARKS.md. Driven by bench/runtime.sh (which builds the binaries).

usage: runtime.py SERVE_BIN CEILING_BIN MODEL.onnx [RUNS] [SECONDS]
Every figure is the median of RUNS runs (default 3) of SECONDS (default 5) each.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

serve_bin, ceiling_bin, model = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
RUNS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
SECS = int(sys.argv[5]) if len(sys.argv) > 5 else 5
HERE = os.path.dirname(os.path.abspath(__file__))
tmp = tempfile.mkdtemp(prefix="infer-serve-bench-")

CONFIG = """
[model]
name = "mlp"
[[inputs]]
name = "input"
datatype = "FP32"
dims = [-1, 64]
[[outputs]]
name = "output"
datatype = "FP32"
dims = [-1, 10]
[batching]
max_batch_size = {mbs}
preferred_batch_sizes = {preferred}
max_queue_delay_us = {delay}
max_queue_size = 4096
default_timeout_ms = 10000
instances = 1
[engine]
kind = "tract-onnx"
path = "{model}"
[server]
host = "127.0.0.1"
port = {port}
drain_delay_s = 0
"""


def write_config(name, port, mbs=32, delay=0, preferred="[]"):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(CONFIG.format(mbs=mbs, delay=delay, preferred=preferred, model=model, port=port))
    return path


def bodies():
    xs = [((i % 13) / 13.0) for i in range(64)]
    j = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": xs}]},
                   separators=(",", ":")).encode()
    jp = os.path.join(tmp, "body.json")
    open(jp, "wb").write(j)
    import struct
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 256}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}]},
                        separators=(",", ":")).encode()
    bp = os.path.join(tmp, "body.bin")
    open(bp, "wb").write(header + struct.pack("<64f", *xs))
    return {"json": (jp, ""), "binary": (bp, str(len(header)))}


BODIES = bodies()


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except Exception as e:  # noqa: BLE001
        return getattr(e, "code", 0), ""


class Server:
    def __init__(self, argv, port, ready_path="/v2/health/ready"):
        self.port = port
        t0 = time.monotonic()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while get(f"http://127.0.0.1:{port}{ready_path}")[0] != 200:
            if self.p.poll() is not None:
                raise SystemExit(f"{argv} exited: {self.p.stdout.read()}")
            time.sleep(0.002)
        self.spawn_to_ready = time.monotonic() - t0

    def rss_kib(self):
        status = open(f"/proc/{self.p.pid}/status").read()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)), int(re.search(r"VmHWM:\s+(\d+)", status).group(1))

    def metrics(self):
        return get(f"http://127.0.0.1:{self.port}/metrics")[1]

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        return self.p.stdout.read()


def wrk(port, conns, kind, secs=SECS):
    body, hlen = BODIES[kind]
    env = dict(os.environ, BODY_FILE=body, HEADER_LEN=hlen)
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--timeout", "5s",
                          "-s", os.path.join(HERE, "runtime-post.lua"),
                          f"http://127.0.0.1:{port}/v2/models/mlp/infer"],
                         env=env, capture_output=True, text=True, check=True).stdout
    m = dict(kv.split("=") for kv in re.search(r"RESULT (.*)", out).group(1).split())
    m = {k: int(v) for k, v in m.items()}
    if m["non2xx"] or m["errors"]:
        print(f"warning: {kind} c={conns}: {m['non2xx']} non-2xx, {m['errors']} socket errors", file=sys.stderr)
    return {"rps": m["requests"] / (m["duration_us"] / 1e6), "p50": m["p50_us"] / 1e3, "p99": m["p99_us"] / 1e3}


def median_runs(port, conns, kind):
    runs = [wrk(port, conns, kind) for _ in range(RUNS)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def hist_quantile(text, name, q):
    buckets = [(float("inf") if le == "+Inf" else float(le), float(v))
               for le, v in re.findall(name + r'_bucket\{[^}]*le="([^"]+)"\} (\S+)', text)]
    total = buckets[-1][1]
    prev_le, prev_n = 0.0, 0.0
    for le, n in buckets:
        if n >= q * total:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((q * total - prev_n) / max(n - prev_n, 1e-9))
        prev_le, prev_n = le, n
    return float("nan")


def counter(text, name):
    return float(re.search(name + r"\{[^}]*\} (\S+)", text).group(1))


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
        # One request per batch at one connection, so the Triton counters give request time
        # minus compute exactly, as a mean.
        "minus_compute_mean": (counter(m1, "nv_inference_request_duration_us")
                               - counter(m1, "nv_inference_compute_infer_duration_us")) / n,
        "avg_batch": counter(m1, "nv_inference_count") / counter(m1, "nv_inference_exec_count"),
    }


one, o1 = one_connection([])
one_np, o1_np = one_connection(["--busy-poll-us", "0"])

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
say(f"- server-side overhead (request time minus queue and compute, `infer_serve_overhead_seconds`): at 1 JSON connection (a fresh server, {one['rps']:,.0f} inferences/s) p50 {o1['overhead_p50']:.1f} µs, p99 {o1['overhead_p99']:.1f} µs; over all runs of the first table (up to 64 connections, the load generator on the same 2 cores) p50 {overhead_p50:.1f} µs, p99 {overhead_p99:.1f} µs")
say(f"- request time minus compute at 1 JSON connection (queue time included: with one request at a time it is the hand-off to the backend thread; {o1['avg_batch']:.2f} rows per batch): mean {o1['minus_compute_mean']:.1f} µs; queue p50 {o1['queue_p50']:.1f} µs")
say(f"- busy polling off (`--busy-poll-us 0`), same run, 1 JSON connection: {one_np['rps']:,.0f} inferences/s (default window: {one['rps']:,.0f}), p50 {one_np['p50'] * 1e3:.0f} µs (default: {one['p50'] * 1e3:.0f} µs), overhead p50 {o1_np['overhead_p50']:.1f} µs, request minus compute mean {o1_np['minus_compute_mean']:.1f} µs")
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
