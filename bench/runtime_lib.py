"""Shared pieces of the runtime benchmarks (bench/runtime.py, bench/runtime_ab.py): the
example MLP's runtime.toml, the request bodies, a server process, wrk runs and Prometheus
histogram quantiles."""
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
tmp = tempfile.mkdtemp(prefix="infer-serve-bench-")
MODEL = os.path.join(os.path.dirname(HERE), "examples", "mlp", "mlp.onnx")
RUNS = 3
SECS = 5

# The model's inputs and outputs from the fixture the runtime's own tests use; batching,
# engine and server sections are the benchmark's.
_FIXTURE = open(os.path.join(os.path.dirname(HERE), "crates", "infer-serve", "testdata",
                             "mlp.runtime.toml")).read()
CONFIG = _FIXTURE[:_FIXTURE.index("[batching]")] + """
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
        f.write(CONFIG.format(mbs=mbs, delay=delay, preferred=preferred, model=MODEL, port=port))
    return path


def bodies():
    xs = [((i % 13) / 13.0) for i in range(64)]
    j = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": xs}]},
                   separators=(",", ":")).encode()
    jp = os.path.join(tmp, "body.json")
    open(jp, "wb").write(j)
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


def wrk(port, conns, kind, secs=None):
    secs = secs or SECS
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


def median_runs(port, conns, kind, runs=None):
    runs = [wrk(port, conns, kind) for _ in range(runs or RUNS)]
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


