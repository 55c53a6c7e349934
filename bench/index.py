"""Indexing, measured (docs/BENCHMARKS.md, "Text in: indexing, many texts per request"):
all-MiniLM-L6-v2 (tests/it/real_models.py's ONNX and tokenizer, mean pooling, L2-normalised)
on requests of 32 texts of mixed lengths (4 to 126 tokens), the way an indexing job sends its
documents' chunks.

  1. The limit: the engine alone, in this process: the tokenizers package and onnxruntime on the
     same texts, one text at a time, and in batches of 8 and of 16 sorted by length (the best a
     client holding every text at once can do); texts/s.
  2. infer-serve (the dynamic runtime, ONNX Runtime library): TEI's `POST /embed` with 32 texts a
     request, under wrk at 4 connections for DURATION s; texts/s, p50 and p99 per request; and the
     liveness probe's slowest answer during the run.
  3. The peer: a FastAPI server (uvicorn, one worker) with the tokenizers package and onnxruntime,
     a request's texts tokenized, padded to its longest and run in its handler (bench/text.py's).

usage: python bench/index.py SERVE CACHE PEER_PYTHON [THREADS] [DURATION]
  SERVE: target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve
  CACHE: target/real-models (tests/it/real_models.py fetch; fetch-ort for the library)
  PEER_PYTHON: a Python with fastapi, uvicorn, tokenizers, onnxruntime, numpy
  env PEER_URL: also drive an already running peer at this URL (e.g. infinity-emb's
  /embeddings), with OpenAI's request shape when PEER_MODEL names the model;
  PADDING: the server's [text] max_padding_percent (default 25, what CPU images get);
  MAX_BATCH: its max_batch_size (default 16); SERVE_ONLY=1: the server alone (no limit, no peer)
"""
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text import LUA, PEER, WORDS, free_port, wait_http  # noqa: E402
from tune_text import config  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PER_REQUEST = 32


def requests(tok, n=24, seed=11):
    """`n` requests of 32 texts each, 4 to 126 tokens a text (all-MiniLM-L6-v2's, [CLS] and
    [SEP] included), deterministic."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        texts = []
        for _ in range(PER_REQUEST):
            target = r.randint(4, 126)
            words = []
            while True:
                words.append(r.choice(WORDS))
                t = " ".join(words).capitalize() + "."
                if len(tok.encode(t).ids) >= target:
                    break
            texts.append(t)
        out.append(texts)
    return out


def engine_alone(onnx, tok_path, texts, threads):
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    tok.enable_truncation(256)
    tok.enable_padding()
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    s = ort.InferenceSession(onnx, o, providers=["CPUExecutionProvider"])

    def run(chunk):
        enc = tok.encode_batch(chunk)
        ids = np.array([e.ids for e in enc], np.int64)
        mask = np.array([e.attention_mask for e in enc], np.int64)
        out = s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        m = mask[..., None].astype(np.float32)
        v = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)

    by_length = sorted(texts, key=lambda x: len(tok.encode(x).ids))
    rows = {}
    for name, order, batch in (("one at a time", texts, 1), ("by length, batches of 8", by_length, 8),
                               ("by length, batches of 16", by_length, 16)):
        chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
        run(chunks[0])
        t = time.perf_counter()
        for c in chunks:
            run(c)
        rows[name] = len(order) / (time.perf_counter() - t)
    return rows


def drive(url, bodies, lua, duration, probe_url=None):
    """wrk at 4 connections on `url` with the request bodies of file `bodies`: texts/s, p50 and
    p99 ms per request, failures; with `probe_url`, the slowest of its answers meanwhile (ms)."""
    worst = [0.0]
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t = time.perf_counter()
            with urllib.request.urlopen(probe_url, timeout=10) as r:
                r.read()
            worst[0] = max(worst[0], (time.perf_counter() - t) * 1e3)
            time.sleep(0.02)

    th = threading.Thread(target=probe) if probe_url else None
    if th:
        th.start()
    try:
        r = subprocess.run(["wrk", "-t1", "-c4", f"-d{duration}s", "--timeout", "30s", "-s", lua, url],
                           env={**os.environ, "BODIES": bodies}, capture_output=True, text=True, check=True)
    finally:
        stop.set()
        if th:
            th.join()
    k = {a: int(b) for a, b in re.findall(r"(\w+)=(\d+)", r.stdout.split("RESULT", 1)[1])}
    ok = k["requests"] - k["non2xx"]
    return (ok * PER_REQUEST / (k["duration_us"] / 1e6), k["p50_us"] / 1e3, k["p99_us"] / 1e3,
            k["non2xx"] + k["errors"], worst[0])


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        text = r.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))


def main():
    serve, cache, peer_py = sys.argv[1], sys.argv[2], sys.argv[3]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    duration = int(sys.argv[5]) if len(sys.argv) > 5 else 15
    onnx = os.path.abspath(os.path.join(cache, "minilm.onnx"))
    tok_path = os.path.abspath(os.path.join(cache, "minilm.tokenizer.json"))
    lib = json.loads(subprocess.run([sys.executable, os.path.join(ROOT, "tests/it/real_models.py"), "fetch-ort", cache],
                                    capture_output=True, text=True, check=True).stdout)["library"]
    from tokenizers import Tokenizer

    counter = Tokenizer.from_file(tok_path)
    counter.no_padding()
    counter.enable_truncation(256)
    reqs = requests(counter)
    flat = [t for r in reqs for t in r]
    lengths = [len(counter.encode(t).ids) for t in flat]
    print(f"{len(reqs)} requests of {PER_REQUEST} texts: {min(lengths)} to {max(lengths)} tokens a text, "
          f"median {statistics.median(lengths)}, {sum(lengths) / len(reqs):.0f} tokens a request", flush=True)
    w = tempfile.mkdtemp(prefix="bench-index.")
    bodies = os.path.join(w, "bodies")
    with open(bodies, "w") as f:
        for r in reqs:
            f.write(json.dumps({"inputs": r}) + "\n")
    lua = os.path.join(w, "index.lua")
    with open(lua, "w") as f:
        f.write(LUA)

    serve_only = os.environ.get("SERVE_ONLY") == "1"
    limit = {} if serve_only else engine_alone(onnx, tok_path, flat, threads)
    for name, v in limit.items():
        print(f"engine alone, {threads} threads, {name}: {v:.0f} texts/s", flush=True)

    port = free_port()
    cfg = os.path.join(w, "runtime.toml")
    with open(cfg, "w") as f:
        text = config(onnx, os.path.abspath(lib), tok_path, True, threads=threads,
                      padding=int(os.environ.get("PADDING", "25")), port=port)
        f.write(text.replace("max_batch_size = 16", f"max_batch_size = {os.environ.get('MAX_BATCH', '16')}"))
    log = os.path.join(w, "serve.log")
    proc = subprocess.Popen([serve, "--config", cfg], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "INFER_GRPC_PORT": "0"})
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", proc, log)
        before = (metric(port, "infer_serve_batch_tokens_total"), metric(port, "infer_serve_sequence_tokens_total"))
        served = drive(f"http://127.0.0.1:{port}/embed", bodies, lua, duration,
                       probe_url=f"http://127.0.0.1:{port}/v2/health/live")
        padded = metric(port, "infer_serve_batch_tokens_total") - before[0]
        own = metric(port, "infer_serve_sequence_tokens_total") - before[1]
    finally:
        proc.terminate()
        proc.wait()
    print(f"infer-serve /embed, 32 texts a request, 4 connections: {served[0]:.0f} texts/s, "
          f"p50 {served[1]:.1f} ms, p99 {served[2]:.1f} ms a request, failures {served[3]}, "
          f"liveness at worst {served[4]:.1f} ms; computed {padded / max(own, 1):.2f}x the texts' own tokens",
          flush=True)
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
                            env={**os.environ, "TOK": tok_path, "ONNX": onnx})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, log)
        peer = drive(f"http://127.0.0.1:{port}/embed", bodies, lua, duration)
    finally:
        proc.terminate()
        proc.wait()
    print(f"FastAPI peer /embed, 32 texts a request, 4 connections: {peer[0]:.0f} texts/s, "
          f"p50 {peer[1]:.1f} ms, p99 {peer[2]:.1f} ms, failures {peer[3]}", flush=True)
    other = os.environ.get("PEER_URL")
    if other:
        shaped = bodies
        if os.environ.get("PEER_MODEL"):
            shaped = os.path.join(w, "bodies.openai")
            with open(shaped, "w") as f:
                for r in reqs:
                    f.write(json.dumps({"model": os.environ["PEER_MODEL"], "input": r}) + "\n")
        o = drive(other, shaped, lua, duration)
        print(f"{other}, 32 texts a request, 4 connections: {o[0]:.0f} texts/s, p50 {o[1]:.1f} ms, "
              f"p99 {o[2]:.1f} ms, failures {o[3]}", flush=True)
    sorted8 = limit["by length, batches of 8"]
    print(f"infer-serve: {served[0] / sorted8:.2f}x the engine alone in length-sorted batches of 8, "
          f"{served[0] / limit['one at a time']:.2f}x one at a time, {served[0] / peer[0]:.2f}x the FastAPI peer",
          flush=True)


if __name__ == "__main__":
    main()
