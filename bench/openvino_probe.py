"""OpenVINO against ONNX Runtime on this machine's CPU, in Python: is a third CPU engine worth it
here? (docs/BENCHMARKS.md, "OpenVINO on the test machines".) Not an engine of the product yet.

usage: python bench/openvino_probe.py MODEL.onnx text ROWS TOKENS
       python bench/openvino_probe.py MODEL.onnx image N,C,H,W

Needs `openvino` (the wheel from the Python registry), `onnxruntime` and numpy. Each engine at 1
and 2 intra-op threads, OpenVINO at FP32 and at BF16 (INFERENCE_PRECISION_HINT), latency mode;
the median of 60 runs after 5; the outputs' agreement with ONNX Runtime FP32 (the least cosine per
row for a text model's hidden states, the largest absolute difference for an image model). One
JSON line.
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort
import openvino as ov


def median_ms(f, runs=60, warm=5):
    for _ in range(warm):
        f()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def main():
    path, kind, arg = sys.argv[1], sys.argv[2], sys.argv[3:]
    rng = np.random.default_rng(1)
    if kind == "text":
        rows, tokens = int(arg[0]), int(arg[1])
        ids = np.concatenate([np.full((rows, 1), 101), rng.integers(1000, 30000, (rows, tokens - 2)),
                              np.full((rows, 1), 102)], axis=1).astype(np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    else:
        shape = [int(x) for x in arg[0].split(",")]
        feed = None
        x = rng.standard_normal(shape).astype(np.float32)
    out = {"model": path.rsplit("/", 1)[-1], "kind": kind, "args": arg, "openvino": ov.__version__,
           "onnxruntime": ort.__version__,
           "cpu_capabilities": ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")}
    reference = None
    for threads in (1, 2):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        f = feed if feed is not None else {s.get_inputs()[0].name: x}
        got = s.run(None, f)[0]
        reference = got if reference is None else reference
        out[f"onnxruntime_fp32_{threads}t_ms"] = median_ms(lambda: s.run(None, f))
    core = ov.Core()
    model = core.read_model(path)
    for precision in ("f32", "bf16"):
        for threads in (1, 2):
            c = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                  "INFERENCE_NUM_THREADS": threads,
                                                  "PERFORMANCE_HINT": "LATENCY"})
            r = c.create_infer_request()
            f = feed if feed is not None else {0: x}
            got = r.infer(f)[c.outputs[0]]
            key = f"openvino_{precision}_{threads}t"
            out[key + "_ms"] = median_ms(lambda: r.infer(f))
            a = reference.reshape(reference.shape[0], -1).astype(np.float64)
            b = got.reshape(got.shape[0], -1).astype(np.float64)
            if kind == "text":
                cos = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
                out[key + "_least_cosine"] = float(cos.min())
            else:
                out[key + "_max_abs_diff"] = float(np.abs(a - b).max())
    best_ort = min(out["onnxruntime_fp32_1t_ms"], out["onnxruntime_fp32_2t_ms"])
    for precision in ("f32", "bf16"):
        best = min(out[f"openvino_{precision}_1t_ms"], out[f"openvino_{precision}_2t_ms"])
        out[f"speedup_openvino_{precision}_vs_onnxruntime"] = best_ort / best
    print(json.dumps(out))


if __name__ == "__main__":
    main()
