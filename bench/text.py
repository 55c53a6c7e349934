"""Text in, measured (docs/BENCHMARKS.md, "Text in: texts/s against the engine alone and a peer"):
all-MiniLM-L6-v2 (tests/it/real_models.py's ONNX and tokenizer, mean pooling, L2-normalised)
on mixed-length short texts, one text per request.

  1. The limit: the engine alone, in this process: the tokenizers package and onnxruntime, at
     batch 1 and at batch 16 (padded to the longest; the texts in arrival order, and sorted by
     length, the best a client holding every text at once can do), 1 and 2 intra-op threads;
     texts/s.
  2. infer-serve (the dynamic runtime, ONNX Runtime 1.31 library): TEI's `POST /embed`, one
     instance at the thread count given, max batch 16, max_queue_delay_us 2000 (adaptive), under
     wrk at 1 and 16 connections for DURATION s (a Lua script cycling through the texts); then
     the share of tokenization in a request's server time, from the runtime's metrics, one text
     per request from 16 client threads.
  3. The peer: a FastAPI server (uvicorn, one worker) with the tokenizers package and
     onnxruntime, one request's texts tokenized, run and pooled in its handler (no batching
     across requests), one intra-op thread; same wrk runs.

usage: python bench/text.py SERVE CACHE PEER_PYTHON [THREADS] [DURATION]
  env PADDING: the server's [text] max_padding_percent (default 25, what CPU images get; 0
  leaves the key out: no bound, and what runtimes before the key read); SERVE_ONLY=1 skips the
  engine-alone limit and the peer (to compare servers or settings); OPENVINO_LIB=PATH serves
  with OpenVINO (`kind = "openvino"`, PATH the libopenvino_c.so.N with the rest of OpenVINO's CPU
  files beside it, as an image has them) instead of ONNX Runtime, and OPENVINO_PRECISION=bf16
  computes in BF16 (engine.precision)
  SERVE: target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve
  CACHE: target/real-models (tests/it/real_models.py fetch; fetch-ort for the library)
  PEER_PYTHON: a Python with fastapi, uvicorn, tokenizers, onnxruntime, numpy
"""
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_text import config  # noqa: E402
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORDS = ("the a model serves text fast slow image container runtime batch token queue answer "
         "engine request user cluster node memory thread server client sentence embedding search "
         "query passage document vector cache layer registry build deploy metric latency").split()


def texts(n=256, seed=3):
    """Deterministic short texts of 3 to 40 words, most of them short (a search workload)."""
    import random

    r = random.Random(seed)
    out = []
    for _ in range(n):
        k = min(40, 3 + int(r.expovariate(1 / 10)))
        out.append(" ".join(r.choice(WORDS) for _ in range(k)).capitalize() + ".")
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def engine_alone(onnx, tok_path, corpus):
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    tok.enable_truncation(256)
    tok.enable_padding()
    rows = {}
    for threads in (1, 2):
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        o.inter_op_num_threads = 1
        s = ort.InferenceSession(onnx, o, providers=["CPUExecutionProvider"])
        for batch in (1, 16):
            def run(chunk):
                enc = tok.encode_batch(chunk)
                ids = np.array([e.ids for e in enc], np.int64)
                mask = np.array([e.attention_mask for e in enc], np.int64)
                out = s.run(None, {"input_ids": ids, "attention_mask": mask,
                                   "token_type_ids": np.zeros_like(ids)})[0]
                m = mask[..., None].astype(np.float32)
                v = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
                return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
            orders = [("arrival", corpus)]
            if batch > 1:
                # The best batching a client holding every text at once can do: by length.
                orders.append(("by length", sorted(corpus, key=lambda x: len(tok.encode(x).ids))))
            for order, texts_ in orders:
                chunks = [texts_[i:i + batch] for i in range(0, len(texts_), batch)]
                run(chunks[0])
                t = time.perf_counter()
                for _ in range(2):
                    for c in chunks:
                        run(c)
                rows[(threads, batch, order)] = 2 * len(corpus) / (time.perf_counter() - t)
    return rows


LUA = r'''
local bodies = {}
local i = 0
init = function(args)
  for line in io.lines(os.getenv("BODIES")) do bodies[#bodies + 1] = line end
end
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, bodies[i])
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_us=%d non2xx=%d errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
'''


def load(url, bodies, lua, duration):
    out = {}
    for c in (1, 16):
        r = subprocess.run(["wrk", "-t1", f"-c{c}", f"-d{duration}s", "-s", lua, url],
                           env={**os.environ, "BODIES": bodies}, capture_output=True, text=True, check=True)
        k = {a: int(b) for a, b in re.findall(r"(\w+)=(\d+)", r.stdout.split("RESULT", 1)[1])}
        out[c] = ((k["requests"] - k["non2xx"]) / (k["duration_us"] / 1e6), k["p50_us"] / 1e3,
                  k["p99_us"] / 1e3, k["non2xx"] + k["errors"])
    return out


def wait_http(url, proc, log):
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {open(log).read()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    raise SystemExit("server did not start")


def shares(port, corpus):
    """The mean tokenization time per text (the runtime's tokenization metrics) against the
    mean server time per request (`nv_inference_request_duration_us` over
    `nv_inference_request_success`), over the texts sent one per request from 16 client
    threads."""
    def metrics():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            text = r.read().decode()
        def m(name):
            return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))
        return (m("infer_serve_tokenized_texts_total"), m("infer_serve_tokenization_duration_us"),
                m("nv_inference_request_success"), m("nv_inference_request_duration_us"))

    before = metrics()

    def worker(k):
        for t in corpus[k::16]:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/embed", json.dumps({"inputs": t}).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req) as r:
                r.read()

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = metrics()
    texts, tok_us, requests, request_us = (a - b for a, b in zip(after, before))
    per_text = tok_us / max(texts, 1)
    per_request = request_us / max(requests, 1)
    return per_text / per_request, per_text, per_request


PEER = r'''
import json, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
from fastapi import FastAPI, Request
from fastapi.responses import Response
import os
tok = Tokenizer.from_file(os.environ["TOK"])
tok.enable_truncation(256)
tok.enable_padding()
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
s = ort.InferenceSession(os.environ["ONNX"], o, providers=["CPUExecutionProvider"])
app = FastAPI()

@app.get("/health")
def health():
    return {}

@app.post("/embed")
async def embed(request: Request):
    body = await request.json()
    x = body["inputs"]
    texts = [x] if isinstance(x, str) else x
    enc = tok.encode_batch(texts)
    ids = np.array([e.ids for e in enc], np.int64)
    mask = np.array([e.attention_mask for e in enc], np.int64)
    out = s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    m = mask[..., None].astype(np.float32)
    v = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return Response(json.dumps(v.tolist()), media_type="application/json")
'''


def main():
    serve, cache, peer_py = sys.argv[1], sys.argv[2], sys.argv[3]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    duration = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    onnx = os.path.abspath(os.path.join(cache, "minilm.onnx"))
    tok = os.path.abspath(os.path.join(cache, "minilm.tokenizer.json"))
    lib = json.loads(subprocess.run([sys.executable, os.path.join(ROOT, "tests/it/real_models.py"), "fetch-ort", cache],
                                    capture_output=True, text=True, check=True).stdout)["library"]
    corpus = texts()
    w = tempfile.mkdtemp(prefix="bench-text.")
    bodies = os.path.join(w, "bodies")
    with open(bodies, "w") as f:
        for t in corpus:
            f.write(json.dumps({"inputs": t}) + "\n")
    lua = os.path.join(w, "text.lua")
    with open(lua, "w") as f:
        f.write(LUA)
    from tokenizers import Tokenizer

    counter = Tokenizer.from_file(tok)
    counter.no_padding()
    counter.enable_truncation(256)
    lengths = [len(e.ids) for e in counter.encode_batch(corpus)]
    print(f"texts: {len(corpus)}, tokens per text: median {statistics.median(lengths)}, "
          f"min {min(lengths)}, max {max(lengths)}", flush=True)

    serve_only = os.environ.get("SERVE_ONLY") == "1"
    limit = {} if serve_only else engine_alone(onnx, tok, corpus)
    for (t, b, order), v in sorted(limit.items()):
        print(f"engine alone: {t} thread(s), batch {b} ({order} order): {v:.0f} texts/s", flush=True)

    pct = int(os.environ.get("PADDING", "25"))
    port = free_port()
    cfg = os.path.join(w, "runtime.toml")
    with open(cfg, "w") as f:
        ov = os.environ.get("OPENVINO_LIB")
        kind, engine_lib = ("openvino", ov) if ov else ("onnxruntime", lib)
        print(f"infer-serve engine: {kind} ({engine_lib})", flush=True)
        precision = os.environ.get("OPENVINO_PRECISION") if ov else None
        if precision:
            print(f"infer-serve engine.precision: {precision}", flush=True)
        f.write(config(onnx, os.path.abspath(engine_lib), tok, True, threads=threads, padding=pct, port=port,
                       kind=kind, precision=precision))
    log = os.path.join(w, "serve.log")
    proc = subprocess.Popen([serve, "--config", cfg], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "INFER_GRPC_PORT": "0"})
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", proc, log)
        served = load(f"http://127.0.0.1:{port}/embed", bodies, lua, duration)
        share = shares(port, corpus)
    finally:
        proc.terminate()
        proc.wait()
    for c, r in served.items():
        print(f"infer-serve /embed, {c} connection(s): {r[0]:.0f} texts/s, p50 {r[1]:.2f} ms, p99 {r[2]:.2f} ms, errors {r[3]}", flush=True)
    print(f"tokenization: {share[0] * 100:.1f}% of a request's server time at 16 clients "
          f"(mean {share[1]:.0f} us per text, {share[2]:.0f} us per request)", flush=True)

    if serve_only:
        return
    port = free_port()
    app = os.path.join(w, "peer.py")
    with open(app, "w") as f:
        f.write(PEER)
    log = os.path.join(w, "peer.log")
    proc = subprocess.Popen([peer_py, "-m", "uvicorn", "peer:app", "--port", str(port), "--workers", "1",
                             "--log-level", "warning", "--no-access-log"], cwd=w,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "TOK": tok, "ONNX": onnx})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, log)
        peer = load(f"http://127.0.0.1:{port}/embed", bodies, lua, duration)
    finally:
        proc.terminate()
        proc.wait()
    for c, r in peer.items():
        print(f"FastAPI peer /embed, {c} connection(s): {r[0]:.0f} texts/s, p50 {r[1]:.2f} ms, p99 {r[2]:.2f} ms, errors {r[3]}", flush=True)
    best = max(limit.values())
    print(f"at 16 connections: infer-serve {served[16][0] / best:.2f}x the engine-alone limit "
          f"({best:.0f} texts/s), {served[16][0] / peer[16][0]:.2f}x the peer", flush=True)


if __name__ == "__main__":
    main()
