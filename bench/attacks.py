"""The serving core under attack (docs/BENCHMARKS.md, "Text in: the serving core under attack"):
all-MiniLM-L6-v2 served from text (tests/it/real_models.py's ONNX and tokenizer) by the release
runtime, with `server.memory_budget_bytes` = 1 GiB and a 32 MiB response cache, against each of
the hostile requests the serving core bounds. For each attack: what the clients got (statuses, the
slowest answer against the 5 s deadline), the slowest `/v2/health/live` answer while it ran (a
probe every 20 ms), and the server's peak resident memory (sampled every 20 ms) against the
budget.

usage: python bench/attacks.py SERVE CACHE
  SERVE: target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve
  CACHE: target/real-models (tests/it/real_models.py fetch; fetch-ort for the library)
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text import free_port, wait_http  # noqa: E402
from tune_text import config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = 1 << 30


def post(port, path, body, timeout=60):
    t = time.perf_counter()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        e.read()
        status = e.code
    except OSError as e:
        status = f"error {e}"
    return status, time.perf_counter() - t


def withheld(port, n, size):
    """`n` connections announcing `size`-byte bodies and sending all but the last byte: how many
    the server kept reading and how many it refused (503)."""
    conns, refused = [], 0
    chunk = b" " * (1 << 20)
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(2)
        s.sendall(f"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode())
        sent = 0
        try:
            while sent + len(chunk) < size:
                s.sendall(chunk)
                sent += len(chunk)
            s.sendall(chunk[: size - sent - 1])
        except OSError:
            pass  # the server refused the body and stopped reading: its answer is there
        try:
            answer = s.recv(256)
        except OSError:
            answer = b""
        if answer.startswith(b"HTTP/1.1 503"):
            refused += 1
            s.close()
        else:
            conns.append(s)
    time.sleep(2)
    for s in conns:
        s.close()
    return {"held": len(conns), "refused 503": refused}


PROBE = r"""
import sys, time, urllib.request
url = sys.argv[1]
while True:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        r.read()
    print((time.perf_counter() - t) * 1e3, flush=True)
    time.sleep(0.02)
"""


class Watch:
    """Probes liveness from a process of its own (the attack's clients hold this one's
    interpreter while they encode bodies) and samples the server's resident memory while an
    attack runs."""

    def __init__(self, port, pid):
        self.port, self.pid = port, pid
        self.worst_ms, self.peak = 0.0, 0
        self.stop = threading.Event()
        self.probe = subprocess.Popen([sys.executable, "-c", PROBE, f"http://127.0.0.1:{port}/v2/health/live"],
                                      stdout=subprocess.PIPE, text=True)
        self.threads = [threading.Thread(target=self.read), threading.Thread(target=self.sample)]
        for t in self.threads:
            t.start()

    def read(self):
        for line in self.probe.stdout:
            self.worst_ms = max(self.worst_ms, float(line))

    def sample(self):
        while not self.stop.is_set():
            with open(f"/proc/{self.pid}/status") as f:
                rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
            self.peak = max(self.peak, rss)
            time.sleep(0.02)

    def finish(self):
        self.stop.set()
        self.probe.terminate()
        self.probe.wait()
        for t in self.threads:
            t.join()
        return self.worst_ms, self.peak


def in_parallel(jobs):
    out = [None] * len(jobs)

    def run(i, f):
        out[i] = f()

    ts = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(jobs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def main():
    serve, cache = sys.argv[1], sys.argv[2]
    onnx = os.path.abspath(os.path.join(cache, "minilm.onnx"))
    tok = os.path.abspath(os.path.join(cache, "minilm.tokenizer.json"))
    lib = json.loads(subprocess.run([sys.executable, os.path.join(ROOT, "tests/it/real_models.py"), "fetch-ort", cache],
                                    capture_output=True, text=True, check=True).stdout)["library"]
    w = tempfile.mkdtemp(prefix="bench-attacks.")
    port = free_port()
    cfg = config(onnx, os.path.abspath(lib), tok, True, threads=2, padding=25, port=port)
    cfg = cfg.replace("instances = 1", "instances = 1\ndefault_timeout_ms = 5000\nmax_queue_size = 1024")
    cfg = cfg.replace("[server]", f"[response_cache]\nmax_bytes = {32 << 20}\n\n[server]\nmemory_budget_bytes = {BUDGET}\nbody_read_timeout_s = 120")
    path = os.path.join(w, "runtime.toml")
    with open(path, "w") as f:
        f.write(cfg)
    log = os.path.join(w, "serve.log")
    proc = subprocess.Popen([serve, "--config", path], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "INFER_GRPC_PORT": "0"})
    words = "the model serves text fast container runtime batch token queue answer engine".split()

    def body(v):
        return json.dumps(v).encode()

    # Each attack's bodies are made before it starts: (name, bodies, run(bodies)).
    attacks = [
        ("one 63.9 MiB text, /embed", lambda: [body({"inputs": "a" * 67_000_000})],
         lambda b: [post(port, "/embed", b[0])]),
        ("four 15 MB texts at once, /embed", lambda: [body({"inputs": " ".join(words) * 200_000})] * 4,
         lambda b: in_parallel([lambda x=x: post(port, "/embed", x) for x in b])),
        ("three 16 MiB texts at once, /tokenize", lambda: [body({"inputs": "word " * ((16 << 20) // 5)})] * 3,
         lambda b: in_parallel([lambda x=x: post(port, "/tokenize", x) for x in b])),
        ("1M one-letter texts, /tokenize", lambda: [body({"inputs": ["a"] * 1_000_000})],
         lambda b: [post(port, "/tokenize", b[0])]),
        ("100,000 texts, /embed", lambda: [body({"inputs": ["a dog"] * 100_000})],
         lambda b: [post(port, "/embed", b[0])]),
        ("three /v1/embeddings of 1M short texts at once",
         lambda: [body({"model": "minilm", "input": ["a b"] * 1_000_000})] * 3,
         lambda b: in_parallel([lambda x=x: post(port, "/v1/embeddings", x) for x in b])),
        ("20 bodies of 60 MiB withheld before their last byte", lambda: [],
         lambda b: [withheld(port, 20, 60 << 20)]),
        ("2,000 distinct requests of 32 texts, the cache on",
         lambda: [[body({"inputs": [f"{c} {k} {i} " + " ".join(words[: 3 + i % 9]) for i in range(32)]})
                   for k in range(250)] for c in range(8)],
         lambda b: in_parallel([lambda x=x: [post(port, "/embed", y) for y in x] for x in b])),
    ]
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", proc, log)
        ready = next(json.loads(l) for l in open(log) if '"ready"' in l)
        print(f"ready; memory budget {BUDGET} bytes, requests {ready.get('requests_memory_bytes')} of it", flush=True)
        for name, make, attack in attacks:
            bodies = make()
            watch = Watch(port, proc.pid)
            t = time.perf_counter()
            result = attack(bodies)
            took = time.perf_counter() - t
            worst, peak = watch.finish()
            flat = []
            for r in result:
                flat.extend(r if isinstance(r, list) else [r])
            statuses = {}
            slowest = 0.0
            for r in flat:
                if isinstance(r, tuple):
                    statuses[r[0]] = statuses.get(r[0], 0) + 1
                    slowest = max(slowest, r[1])
                elif isinstance(r, dict):
                    statuses.update(r)
            alive = proc.poll() is None
            print(f"{name}: {statuses}, slowest answer {slowest:.2f} s, all in {took:.1f} s; liveness at worst "
                  f"{worst:.1f} ms; peak RSS {peak / 2**20:.0f} MiB of {BUDGET / 2**20:.0f}; "
                  f"{'alive' if alive else 'DEAD'}", flush=True)
            if not alive:
                break
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
