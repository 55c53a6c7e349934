"""Images in, labels out, measured (docs/BENCHMARKS.md, "Images in: JPEG to labels"):
EfficientNet-Lite0 (ImageNet-1k, tests/it/vision_models.py's ONNX from Google's weights) fed
640 x 480 JPEG photographs (five of scikit-image's, resized and saved at quality 90), torchvision's
evaluation transform (Resize(256), CenterCrop(224), bilinear), softmax, the top 5 labels.

  1. The pipeline in one Python process: PIL decodes, resizes and crops, numpy normalises,
     onnxruntime runs it (1 and 2 intra-op threads, the faster kept), one image at a time;
     images/s, and the share of each image's time spent before the engine.
  2. infer-serve (the dynamic runtime, ONNX Runtime library, `[vision]`), `POST
     /predictions/effnet` with the JPEG as the body, under wrk at 1 and 16 connections for
     DURATION s; images/s, p50 and p99; the share of the server's time per request spent
     decoding and resizing (its metrics), and the bytes on the wire against the FP32 tensor
     (binary and V2 JSON).
  3. The peer: a FastAPI server (uvicorn, one worker) doing 1. in its handler, the JPEG as the
     body; same wrk runs.

usage: python bench/images.py SERVE CACHE PEER_PYTHON [THREADS] [DURATION]
  SERVE: target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve
  CACHE: target/real-models (tests/it/vision_models.py fetch; real_models.py fetch-ort)
  PEER_PYTHON: a Python with fastapi, uvicorn, pillow, onnxruntime, numpy
"""
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text import free_port, load, wait_http  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PHOTOS = ["coffee.png", "chelsea.png", "astronaut.png", "motorcycle_left.png", "rocket.jpg"]
MEAN, STD = 127.0, 128.0

LUA = r'''
local bodies = {}
local i = 0
init = function(args)
  for path in io.lines(os.getenv("BODIES")) do
    local f = io.open(path, "rb"); bodies[#bodies + 1] = f:read("*a"); f:close()
  end
end
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", nil, {["Content-Type"] = "image/jpeg"}, bodies[i])
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_us=%d non2xx=%d errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
'''

PEER = r'''
import io, json, os, numpy as np, onnxruntime as ort
from PIL import Image
from fastapi import FastAPI, Request
from fastapi.responses import Response
o = ort.SessionOptions(); o.intra_op_num_threads = int(os.environ["THREADS"]); o.inter_op_num_threads = 1
s = ort.InferenceSession(os.environ["ONNX"], o, providers=["CPUExecutionProvider"])
labels = json.load(open(os.environ["LABELS"]))
app = FastAPI()

@app.get("/health")
def health():
    return {}

def tensor(data):
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    nw, nh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
    a = np.asarray(img, dtype=np.float32)[top:top + 224, left:left + 224]
    return ((a - 127.0) / 128.0).transpose(2, 0, 1)[None]

@app.post("/predictions/effnet")
async def predict(request: Request):
    x = tensor(await request.body())
    logits = s.run(None, {"pixel_values": x})[0][0]
    e = np.exp(logits - logits.max()); p = e / e.sum()
    top = np.argsort(-p)[:5]
    return Response(json.dumps([{"label": labels[i], "score": float(p[i])} for i in top]), media_type="application/json")
'''


def jpegs(cache, out):
    """The five photographs at 640 x 480, JPEG quality 90: their paths."""
    from PIL import Image

    fetched = json.loads(subprocess.run([sys.executable, os.path.join(ROOT, "tests/it/vision_models.py"), "fetch", cache],
                                        capture_output=True, text=True, check=True).stdout)
    paths = []
    for name in PHOTOS:
        img = Image.open(fetched[name]).convert("RGB").resize((640, 480), Image.BICUBIC)
        p = os.path.join(out, os.path.splitext(name)[0] + ".jpg")
        img.save(p, "JPEG", quality=90)
        paths.append(p)
    return fetched, paths


def in_process(onnx, paths):
    """The pipeline in this process (see the module docs): (images/s, share before the engine),
    at the faster thread count, and that count."""
    import numpy as np
    import onnxruntime as ort
    from PIL import Image

    datas = [open(p, "rb").read() for p in paths]
    best = None
    for threads in (1, 2):
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        o.inter_op_num_threads = 1
        s = ort.InferenceSession(onnx, o, providers=["CPUExecutionProvider"])
        pre = run = 0.0
        n = 0
        end = time.perf_counter() + 10
        while time.perf_counter() < end:
            for d in datas:
                t0 = time.perf_counter()
                img = Image.open(io.BytesIO(d)).convert("RGB")
                w, h = img.size
                nw, nh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
                img = img.resize((nw, nh), Image.BILINEAR)
                top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
                a = np.asarray(img, dtype=np.float32)[top:top + 224, left:left + 224]
                x = ((a - MEAN) / STD).transpose(2, 0, 1)[None]
                t1 = time.perf_counter()
                logits = s.run(None, {"pixel_values": np.ascontiguousarray(x)})[0][0]
                e = np.exp(logits - logits.max())
                np.argsort(-(e / e.sum()))[:5]
                t2 = time.perf_counter()
                pre += t1 - t0
                run += t2 - t1
                n += 1
        rate = n / (pre + run)
        print(f"in one process: {threads} thread(s): {rate:.1f} images/s, pre-processing {100 * pre / (pre + run):.1f}%", flush=True)
        if best is None or rate > best[0]:
            best = (rate, pre / (pre + run), threads)
    return best


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        text = r.read().decode()

    def m(name):
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))

    return {k: m(k) for k in ("infer_serve_images_total", "infer_serve_image_decode_duration_us",
                              "infer_serve_image_resize_duration_us", "infer_serve_postprocess_duration_us",
                              "nv_inference_request_success", "nv_inference_request_duration_us")}


def config(onnx, lib, labels, threads, port):
    return f'''[model]
name = "effnet"

[[inputs]]
name = "pixel_values"
datatype = "FP32"
dims = [-1, 3, 224, 224]

[[outputs]]
name = "logits"
datatype = "FP32"
dims = [-1, 1000]

[batching]
max_batch_size = 8
max_queue_delay_us = 2000
instances = 1

[engine]
kind = "onnxruntime"
path = "{onnx}"
library = "{lib}"
threads = {threads}

[vision]
input = "pixel_values"
layout = "nchw"
color = "rgb"
height = 224
width = 224
resize = "crop"
shorter = 256
interpolation = "bilinear"
scale = 1.0
mean = [{MEAN}, {MEAN}, {MEAN}]
std = [{STD}, {STD}, {STD}]
output = "logits"
answer = "classify"
activation = "softmax"
top_k = 5
labels = {json.dumps(labels)}

[server]
host = "127.0.0.1"
port = {port}
'''


def main():
    serve, cache, peer_py = sys.argv[1], sys.argv[2], sys.argv[3]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    duration = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    w = tempfile.mkdtemp(prefix="bench-images.")
    fetched, paths = jpegs(cache, w)
    onnx = os.path.abspath(fetched["efficientnet-lite0"])
    labels_path = fetched["efficientnet-lite0.labels"]
    labels = json.load(open(labels_path))
    lib = json.loads(subprocess.run([sys.executable, os.path.join(ROOT, "tests/it/real_models.py"), "fetch-ort", cache],
                                    capture_output=True, text=True, check=True).stdout)["library"]
    sizes = [os.path.getsize(p) for p in paths]
    tensor = 3 * 224 * 224 * 4
    import numpy as np
    json_tensor = len(json.dumps({"inputs": [{"name": "pixel_values", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                              "data": np.random.default_rng(0).standard_normal(3 * 224 * 224).astype(np.float32).tolist()}]}))
    mean_jpeg = sum(sizes) / len(sizes)
    print(f"JPEG 640x480: {mean_jpeg / 1e3:.1f} KB on average ({min(sizes)} to {max(sizes)} bytes); "
          f"the FP32 tensor: {tensor} bytes binary ({tensor / mean_jpeg:.0f}x), {json_tensor} as V2 JSON "
          f"({json_tensor / mean_jpeg:.0f}x)", flush=True)
    bodies = os.path.join(w, "bodies")
    with open(bodies, "w") as f:
        f.write("".join(p + "\n" for p in paths))
    lua = os.path.join(w, "images.lua")
    with open(lua, "w") as f:
        f.write(LUA)

    rate, pre, best_threads = in_process(onnx, paths)

    port = free_port()
    cfg = os.path.join(w, "runtime.toml")
    with open(cfg, "w") as f:
        f.write(config(onnx, os.path.abspath(lib), labels, threads, port))
    log = os.path.join(w, "serve.log")
    proc = subprocess.Popen([serve, "--config", cfg], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "INFER_GRPC_PORT": "0"})
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", proc, log)
        before = metrics(port)
        served = load(f"http://127.0.0.1:{port}/predictions/effnet", bodies, lua, duration)
        after = metrics(port)
    finally:
        proc.terminate()
        proc.wait()
    d = {k: after[k] - before[k] for k in after}
    per_request = d["nv_inference_request_duration_us"] / max(d["nv_inference_request_success"], 1)
    per_image_pre = (d["infer_serve_image_decode_duration_us"] + d["infer_serve_image_resize_duration_us"]) / max(d["infer_serve_images_total"], 1)
    for c, (r, p50, p99, bad) in served.items():
        print(f"infer-serve, {c} connection(s): {r:.1f} images/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, failed {bad}", flush=True)
    print(f"infer-serve: decode + resize {per_image_pre / 1e3:.2f} ms per image "
          f"(decode {d['infer_serve_image_decode_duration_us'] / max(d['infer_serve_images_total'], 1) / 1e3:.2f}), "
          f"{100 * per_image_pre / per_request:.1f}% of the server's time per request ({per_request / 1e3:.1f} ms)", flush=True)

    port = free_port()
    app = os.path.join(w, "peer.py")
    with open(app, "w") as f:
        f.write(PEER)
    log = os.path.join(w, "peer.log")
    proc = subprocess.Popen([peer_py, "-m", "uvicorn", "peer:app", "--port", str(port), "--log-level", "warning"],
                            cwd=w, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "ONNX": onnx, "LABELS": labels_path, "THREADS": str(best_threads)})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, log)
        peer = load(f"http://127.0.0.1:{port}/predictions/effnet", bodies, lua, duration)
    finally:
        proc.terminate()
        proc.wait()
    for c, (r, p50, p99, bad) in peer.items():
        print(f"FastAPI + PIL + onnxruntime, {c} connection(s): {r:.1f} images/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, failed {bad}", flush=True)
    print(f"ratios at 16 connections: infer-serve / one process {served[16][0] / rate:.2f}x, "
          f"infer-serve / FastAPI {served[16][0] / peer[16][0]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
