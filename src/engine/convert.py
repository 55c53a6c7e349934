"""infer-build's precision converter: FP32 ONNX -> FP16 / INT8 Q/DQ (/ FP8 Q/DQ), then the
accuracy figures of the converted model against the FP32 one under ONNX Runtime on the CPU.

Run by infer-build (src/engine/convert.rs) with the interpreter of the pinned environment it
creates (matrix/convert-requirements.txt). One JSON request on stdin, one JSON report as the
last line of stdout; errors go to stderr with a non-zero exit. Not a public interface.

Request:
  {"command": "versions"}
  {"command": "convert", "source": PATH, "output": PATH, "precision": "fp16"|"int8"|"fp8",
   "method": "minmax"|"entropy"|"percentile"|"distribution",
   "calibration": DIR|null, "evaluation": DIR|null,
   "inputs": [{"name": N, "datatype": "fp32", "shape": [concrete dims]}],
   "generated_samples": K, "fp16_keep_ops": [OP, ...], "quantize_ops": [OP, ...]}
"""
import glob
import json
import os
import sys
import time


def versions():
    import numpy
    import onnx
    import onnxruntime

    out = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "numpy": numpy.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    try:
        import onnxconverter_common

        out["onnxconverter-common"] = onnxconverter_common.__version__
    except Exception:  # noqa: BLE001 - reported as absent
        pass
    return out


NP_TYPES = {
    "fp32": "float32",
    "fp16": "float16",
    "fp64": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
}


def load_dir(path, inputs):
    """Batches from a directory: *.npy (single-input models) or *.npz (one array per input),
    in name order, each cast to the input's declared type. A list of {input: array}."""
    import numpy as np

    files = sorted(glob.glob(os.path.join(path, "*.npy")) + glob.glob(os.path.join(path, "*.npz")))
    if not files:
        raise SystemExit(f"{path}: no *.npy or *.npz files")
    names = [i["name"] for i in inputs]
    types = {i["name"]: NP_TYPES.get(i["datatype"], "float32") for i in inputs}
    batches = []
    for f in files:
        if f.endswith(".npy"):
            if len(names) != 1:
                raise SystemExit(f"{f}: a .npy file feeds a single-input model; this one has inputs {names}: use .npz")
            feeds = {names[0]: np.load(f, allow_pickle=False)}
        else:
            with np.load(f, allow_pickle=False) as z:
                feeds = {k: z[k] for k in z.files}
            missing = [n for n in names if n not in feeds]
            if missing:
                raise SystemExit(f"{f}: no array for input(s) {missing}")
        batches.append({n: np.ascontiguousarray(feeds[n]).astype(types[n]) for n in names})
    return batches


def generated(inputs, count, seed):
    """Seeded inputs when the recipe gives no data: uniform in [-1, 1] for floats, 0..9 for
    integers, one row per batch."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        feeds = {}
        for i in inputs:
            t = NP_TYPES.get(i["datatype"], "float32")
            shape = [1] + list(i["shape"][1:])
            if t.startswith("float"):
                feeds[i["name"]] = (rng.random(shape) * 2 - 1).astype(t)
            elif t == "bool":
                feeds[i["name"]] = rng.integers(0, 2, shape).astype(t)
            else:
                feeds[i["name"]] = rng.integers(0, 10, shape).astype(t)
        out.append(feeds)
    return out


def session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def to_fp16(source, output, keep_ops):
    import onnx
    from onnxconverter_common import float16

    model = onnx.load(source)
    block = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(keep_ops))
    converted = float16.convert_float_to_float16(
        model, keep_io_types=True, op_block_list=block, disable_shape_infer=False
    )
    onnx.save(converted, output)
    return {"tool": "onnxconverter-common float16", "keep_io_types": True, "op_block_list": block}


def quantize(source, output, precision, method, batches, quantize_ops, scratch):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
        "distribution": CalibrationMethod.Distribution,
    }

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    pre = os.path.join(scratch, "preprocessed.onnx")
    # Symbolic shape inference fails on some exports (Paddle's); ONNX shape inference and the
    # graph optimisation still run.
    quant_pre_process(source, pre, skip_symbolic_shape=True)
    import onnx

    model = onnx.load(pre)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        # Per-channel Q/DQ (the `axis` attribute) needs opset 13, as TensorRT does.
        from onnx import version_converter

        onnx.save(version_converter.convert_version(model, 13), pre)
    qtype = QuantType.QInt8 if precision == "int8" else QuantType.QFLOAT8E4M3FN
    extra = {
        # TensorRT: symmetric scales (zero point 0), float weights behind Q/DQ pairs, biases
        # left in float (TensorRT fuses them), per-channel weights.
        "ActivationSymmetric": True,
        "WeightSymmetric": True,
        "AddQDQPairToWeight": True,
        "QuantizeBias": False,
    }
    quantize_static(
        pre,
        output,
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=qtype,
        weight_type=qtype,
        per_channel=True,
        calibrate_method=methods[method],
        op_types_to_quantize=quantize_ops or None,
        extra_options=extra,
    )
    return {
        "tool": "onnxruntime.quantization.quantize_static",
        "format": "QDQ",
        "type": str(qtype),
        "calibrate_method": method,
        "per_channel": True,
        "op_types_to_quantize": quantize_ops,
        "extra_options": extra,
        "calibration_batches": len(batches),
    }


def compare(source, converted, batches):
    """Per output: max absolute error, max relative error (the absolute error over the FP32
    output's largest magnitude) and, for [N, C] outputs with C >= 2, top-1 agreement."""
    import numpy as np

    ref, new = session(source), session(converted)
    names = [o.name for o in ref.get_outputs()]
    stats = {n: {"name": n, "max_abs": 0.0, "ref_max": 0.0, "rows": 0, "agree": 0, "classification": None} for n in names}
    for feeds in batches:
        want = ref.run(names, feeds)
        got = new.run(names, feeds)
        for n, w, g in zip(names, want, got):
            w = np.asarray(w, dtype=np.float64)
            g = np.asarray(g, dtype=np.float64)
            if w.shape != g.shape:
                raise SystemExit(f"output {n}: converted shape {g.shape}, fp32 shape {w.shape}")
            s = stats[n]
            if not np.all(np.isfinite(g)):
                s["max_abs"] = float("inf")
            elif w.size:
                s["max_abs"] = max(s["max_abs"], float(np.abs(g - w).max()))
            if w.size:
                s["ref_max"] = max(s["ref_max"], float(np.abs(w).max()))
            cls = w.ndim == 2 and w.shape[1] >= 2
            s["classification"] = cls if s["classification"] is None else (s["classification"] and cls)
            if cls:
                s["rows"] += w.shape[0]
                s["agree"] += int((w.argmax(axis=1) == g.argmax(axis=1)).sum())
    out = []
    for n in names:
        s = stats[n]
        o = {
            "name": n,
            "max_abs": s["max_abs"],
            "max_rel": (s["max_abs"] / s["ref_max"]) if s["ref_max"] > 0 else (0.0 if s["max_abs"] == 0 else float("inf")),
        }
        if s["classification"]:
            o["top1_agreement"] = s["agree"] / s["rows"] if s["rows"] else 1.0
            o["rows"] = s["rows"]
        out.append(o)
    return out


def convert(req):
    t0 = time.monotonic()
    inputs = req["inputs"]
    precision = req["precision"]
    calib = load_dir(req["calibration"], inputs) if req.get("calibration") else None
    if req.get("evaluation"):
        evaluation, what = load_dir(req["evaluation"], inputs), "evaluation data"
    elif calib is not None:
        evaluation, what = calib, "calibration data"
    else:
        evaluation, what = generated(inputs, req.get("generated_samples", 8), 0), "generated inputs (seed 0, uniform -1..1)"
    scratch = os.path.dirname(os.path.abspath(req["output"]))
    if precision == "fp16":
        options = to_fp16(req["source"], req["output"], req.get("fp16_keep_ops", []))
    elif precision in ("int8", "fp8"):
        if calib is None:
            raise SystemExit(f"{precision} quantisation needs calibration data")
        options = quantize(req["source"], req["output"], precision, req["method"], calib, req.get("quantize_ops", []), scratch)
    else:
        raise SystemExit(f"no converter for {precision}")
    t1 = time.monotonic()
    figures = compare(req["source"], req["output"], evaluation)
    t2 = time.monotonic()
    return {
        "versions": versions(),
        "options": options,
        "evaluation": {"source": what, "batches": len(evaluation)},
        "outputs": figures,
        "seconds": {"convert": round(t1 - t0, 3), "compare": round(t2 - t1, 3)},
    }


def finite(v):
    """JSON has no infinity or NaN: a non-finite figure is written as null."""
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def main():
    req = json.loads(sys.stdin.read())
    cmd = req.get("command")
    if cmd == "versions":
        out = versions()
    elif cmd == "convert":
        out = convert(req)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    sys.stdout.write("\n" + json.dumps(finite(out), sort_keys=True, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
