"""infer-build's precision converter: FP32 ONNX -> FP16 / INT8 Q/DQ (/ FP8 Q/DQ), then the
accuracy figures of the converted model against the FP32 one under ONNX Runtime on the CPU.

Run by infer-build (src/engine/convert.rs) with the interpreter of the pinned environment it
creates (matrix/convert-requirements.txt). One JSON request on stdin, one JSON report as the
last line of stdout; errors go to stderr with a non-zero exit. Not a public interface.

Request:
  {"command": "versions"}
  {"command": "convert", "source": PATH, "output": PATH, "precision": "fp16"|"int8"|"fp8",
   "method": "minmax"|"entropy"|"percentile" (fp8: "minmax"|"percentile"),
   "calibration": DIR|null, "evaluation": DIR|null,
   "inputs": [{"name": N, "datatype": "fp32", "shape": [concrete dims]}],
   "generated_samples": K, "fp16_keep_ops": [OP, ...], "quantize_ops": [OP, ...],
   "tool": "builtin"|"modelopt"}

With "tool": "modelopt" the interpreter is the user's (one with nvidia-modelopt and torch, as
NVIDIA's TensorRT containers have): AutoCast makes the FP16 model, modelopt.onnx.quantization
the INT8 / FP8 Q/DQ one; the accuracy figures are measured the same way.
"""
import glob
import json
import os
import sys
import time


def versions(tool="builtin"):
    if tool == "modelopt":
        # Imported first, so a missing package is the error a user sees, not a later one.
        import modelopt
        import modelopt.onnx.quantization  # noqa: F401 - imports torch, as ModelOpt's ONNX tools do
        import torch
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
    if tool == "modelopt":
        out["nvidia-modelopt"] = modelopt.__version__
        out["torch"] = torch.__version__
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
    integers, except a text model's attention mask (an integer input whose name holds `mask`),
    all ones, and its token type ids (`token_type`), all zeros; one row per batch."""
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
            elif "mask" in i["name"]:
                feeds[i["name"]] = np.ones(shape, t)
            elif "token_type" in i["name"]:
                feeds[i["name"]] = np.zeros(shape, t)
            else:
                feeds[i["name"]] = rng.integers(0, 10, shape).astype(t)
        out.append(feeds)
    return out


def session(path, literal=False):
    """A single-threaded CPU session of a model file (or its bytes). literal: no graph
    optimisation, every node run as written, so a Q/DQ model computes what its Q/DQ nodes say
    on any CPU (the gate measures the model TensorRT builds, not a CPU kernel): ONNX Runtime
    1.32's extended-level Q/DQ
    fusions compute FP8 Q/DQ -> Conv wrongly, and its fused INT8 kernels saturate on x86 CPUs
    without VNNI (u8s8 through vpmaddubsw), see docs/engines.md."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if literal:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def probe(model, tensors):
    """A session running `model` (an onnx ModelProto) as written, with `tensors` among its
    outputs: no graph optimisation, since fusions could remove the very tensors measured."""
    import onnx

    p = onnx.ModelProto()
    p.CopyFrom(model)
    have = {o.name for o in p.graph.output}
    p.graph.output.extend([onnx.ValueInfoProto(name=t) for t in tensors if t not in have])
    return session(p.SerializeToString(), literal=True)


# AutoCast's defaults (NVIDIA Model Optimizer): an initializer beyond INIT_MAX, or an activation
# beyond DATA_MAX on the range data, keeps its node in FP32.
INIT_MAX = 65504.0
DATA_MAX = 512.0
# Names listed per reason in the report (the counts are complete).
LISTED = 20


def fold(source, output):
    """ONNX Runtime's basic graph optimisation (constant folding and the semantics-preserving
    rewrites that keep the graph portable ONNX), the same pass the engine stage runs before tract:
    constants a shape computation only passes through (9.79e7 in PaddleOCR's detector) fold away
    instead of being clamped to FP16."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = output
    opts.log_severity_level = 3
    ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    return "onnxruntime %s basic optimisation" % ort.__version__


def activation_amax(model, batches):
    """The largest magnitude of every float tensor a top-level node reads or writes, over
    `batches`, with the model run as written (no optimisation removes a tensor); non-finite
    values count as infinite. Also the names of those that are FLOAT (FP32)."""
    import numpy as np

    inits = {i.name for i in model.graph.initializer}
    names = list(dict.fromkeys(t for n in model.graph.node for t in n.output if t and t not in inits))
    sess = probe(model, names)
    fetch = [o.name for o in sess.get_outputs()]
    amax = {}
    fp32 = set()
    for feeds in batches:
        for name, v in list(feeds.items()) + list(zip(fetch, sess.run(fetch, feeds))):
            v = np.asarray(v)
            if not np.issubdtype(v.dtype, np.floating):
                continue
            if v.dtype == np.float32:
                fp32.add(name)
            if not v.size:
                continue
            m = float(np.abs(v.astype(np.float64)).max()) if np.all(np.isfinite(v)) else float("inf")
            amax[name] = max(amax.get(name, 0.0), m)
    return amax, fp32


# Layers TensorRT fuses into their producer (`fused` in `emulation`).
POINTWISE = {
    "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Elu", "Selu", "Softplus", "Erf", "Gelu", "BatchNormalization", "Neg",
    "Abs",
}
GEMM_LIKE = {"Conv", "ConvTranspose", "MatMul", "Gemm"}


def emulation(model, kept, fp32, output):
    """The FP32 model with every value the FP16 model holds in FP16 rounded to FP16: the
    initializers FP16 nodes read (clamped as the converter clamps them), the tensors FP16 nodes
    write (for every reader), and the FP32 tensors FP16 nodes read (for those readers), each
    through a Cast to FP16 and back. ONNX Runtime's CPU provider has FP16 kernels for few
    operators and runs the others on FP32 islands without rounding between them, so the
    converted model alone would hide an FP16 overflow or rounding that TensorRT's FP16 kernels
    (FP32 accumulation, FP16 storage) meet: the gate measures this model too."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxconverter_common import float16

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    half = [n for n in g.node if n.name not in kept]
    rounded_inits = {}
    for n in half:
        for t in n.input:
            i = inits.get(t)
            if i is not None and i.data_type == TensorProto.FLOAT and t not in rounded_inits:
                a = numpy_helper.to_array(i)
                r = float16.convert_np_to_float16(np.atleast_1d(a), 1e-7, INIT_MAX).reshape(a.shape)
                r = numpy_helper.from_array(r.astype(np.float32), t + "_fp16_values")
                g.initializer.append(r)
                rounded_inits[t] = r.name
    half_names = {n.name for n in half}

    def pair(src, dst):
        return [
            helper.make_node("Cast", [src], [dst + "_as_fp16"], to=TensorProto.FLOAT16, name=dst + "_emulate16"),
            helper.make_node("Cast", [dst + "_as_fp16"], [dst], to=TensorProto.FLOAT, name=dst + "_emulate32"),
        ]

    # FP32 tensors FP16 nodes read (graph inputs, FP32 nodes' outputs): rounded for those readers.
    read = {t for n in half for t in n.input if t in fp32 and t not in inits}
    readers = {}
    for n in g.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    outputs = {o.name for o in g.output}

    def fused(n, t):
        # TensorRT keeps in FP32 registers what it fuses: a GEMM-shaped or pointwise layer's
        # result read only by one pointwise layer (Conv + bias + activation, residual adds,
        # pointwise chains).
        r = readers.get(t, [])
        return (
            t not in outputs
            and len(r) == 1
            and r[0].name in half_names
            and r[0].op_type in POINTWISE
            and (n.op_type in POINTWISE or n.op_type in GEMM_LIKE)
        )

    written = {t for n in half for t in n.output if t in fp32 and not fused(n, t)}
    read -= {t for n in half for t in n.output}
    nodes = []
    for i in g.input:
        if i.name in read:
            nodes.extend(pair(i.name, i.name + "_fp16_rounded"))
    for n in g.node:
        for k, t in enumerate(n.input):
            if n.name in half_names and t in rounded_inits:
                n.input[k] = rounded_inits[t]
            elif n.name in half_names and t in read:
                n.input[k] = t + "_fp16_rounded"
        after = []
        for k, t in enumerate(n.output):
            if t in written:
                # Every reader, the graph's outputs included, reads the rounded value.
                n.output[k] = t + "_fp32_value"
                after.extend(pair(n.output[k], t))
            elif t in read:
                after.extend(pair(t, t + "_fp16_rounded"))
        nodes.append(n)
        nodes.extend(after)
    del g.node[:]
    g.node.extend(nodes)
    onnx.save(m, output)


def to_fp16(source, output, keep_ops, batches, data_source, scratch):
    """FP16 with inputs and outputs kept FP32, in three steps: fold (`fold`); choose the nodes
    that stay FP32, as ModelOpt's AutoCast does: the operators of the block list, the nodes that
    read an initializer or constant beyond INIT_MAX (which the converter would clamp), and the
    nodes that read or write an activation beyond DATA_MAX on `batches`; then convert with
    onnxconverter-common, every other node FP16."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnxconverter_common import float16

    folded = os.path.join(scratch, "folded.onnx")
    folded_by = fold(source, folded)
    model = onnx.load(folded)
    os.remove(folded)
    graph = model.graph
    # The converter blocks nodes by name: every node gets a unique one.
    seen = set()
    for k, n in enumerate(graph.node):
        if not n.name or n.name in seen:
            n.name = "%s_%d" % (n.op_type or "node", k)
        seen.add(n.name)

    def too_large(t):
        if t.data_type != TensorProto.FLOAT:
            return False
        a = numpy_helper.to_array(t)
        return bool(a.size) and not bool(np.all(np.abs(a) <= INIT_MAX))

    large = {i.name for i in graph.initializer if too_large(i)}
    for n in graph.node:
        if n.op_type == "Constant" and any(a.name == "value" and too_large(a.t) for a in n.attribute):
            large.update(n.output)
    amax, fp32 = activation_amax(model, batches)
    block = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(keep_ops))
    reasons = {"operator": [], "initializer": [], "activation": []}
    kept = set()
    for n in graph.node:
        if n.op_type in block:
            why = "operator"
        elif any(t in large for t in list(n.input) + list(n.output)):
            why = "initializer"
        elif any(amax.get(t, 0.0) > DATA_MAX for t in list(n.input) + list(n.output) if t not in large):
            why = "activation"
        else:
            continue
        kept.add(n.name)
        reasons[why].append(n.name)
    # An initializer read by an FP32 node and an FP16 one would be left FP32 for both: the FP32
    # nodes get their own copy.
    readers = {}
    for n in graph.node:
        for t in n.input:
            readers.setdefault(t, set()).add(n.name in kept)
    inits = {i.name: i for i in graph.initializer}
    copies = {}
    for n in graph.node:
        if n.name not in kept:
            continue
        for k, t in enumerate(n.input):
            if t in inits and readers.get(t) == {True, False}:
                if t not in copies:
                    c = onnx.TensorProto()
                    c.CopyFrom(inits[t])
                    c.name = t + "_fp32"
                    graph.initializer.append(c)
                    copies[t] = c.name
                n.input[k] = copies[t]
    emulated = os.path.join(scratch, "emulated.onnx")
    emulation(model, kept, fp32, emulated)
    converted = float16.convert_float_to_float16(
        model,
        max_finite_val=INIT_MAX,
        keep_io_types=True,
        op_block_list=block,
        node_block_list=sorted(kept),
        disable_shape_infer=False,
        # A model with some FP16 tensors already (an FP16 embedding table read through a Cast)
        # is converted too: only its FLOAT tensors change.
        check_fp16_ready=False,
    )
    # The converter retypes a converted Cast's output to FP16 but leaves its `to` at FLOAT (a
    # text model's `Cast(mask) -> float`): such a Cast now casts to FP16.
    declared = {
        v.name: v.type.tensor_type.elem_type
        for v in list(converted.graph.value_info) + list(converted.graph.output)
    }
    for n in converted.graph.node:
        if n.op_type == "Cast" and n.name not in kept and declared.get(n.output[0]) == TensorProto.FLOAT16:
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.FLOAT16
    onnx.save(converted, output)
    return emulated, {
        "tool": "onnxconverter-common float16",
        "keep_io_types": True,
        "op_block_list": block,
        "folded_by": folded_by,
        "init_max": INIT_MAX,
        "data_max": DATA_MAX,
        "range_data": data_source,
        "nodes": len(graph.node),
        "fp32_nodes": {k: len(v) for k, v in reasons.items()},
        "fp32_node_names": {k: v[:LISTED] for k, v in reasons.items() if v and k != "operator"},
    }


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
    qtype = QuantType.QInt8
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


E4M3_MAX = 448.0
FP8_OPSET = 19
PERCENTILE = 99.999
HISTOGRAM_BINS = 2048


def fp8_amax(model, tensors, batches, method):
    """Per activation tensor, the calibration amax: the largest magnitude over every batch
    (minmax), or the PERCENTILE-th percentile of the magnitudes from a HISTOGRAM_BINS-bin
    histogram over [0, max] (percentile, a second pass)."""
    import numpy as np

    sess = probe(model, tensors)
    amax = {t: 0.0 for t in tensors}
    for feeds in batches:
        for t, v in zip(tensors, sess.run(tensors, feeds)):
            if v.size:
                amax[t] = max(amax[t], float(np.abs(v.astype(np.float64)).max()))
    if method == "minmax":
        return amax
    hist = {t: np.zeros(HISTOGRAM_BINS, np.int64) for t in tensors}
    for feeds in batches:
        for t, v in zip(tensors, sess.run(tensors, feeds)):
            if amax[t] > 0:
                hist[t] += np.histogram(np.abs(v.astype(np.float64)), bins=HISTOGRAM_BINS, range=(0.0, amax[t]))[0]
    out = {}
    for t in tensors:
        total = hist[t].sum()
        if amax[t] == 0 or total == 0:
            out[t] = amax[t]
            continue
        cdf = np.cumsum(hist[t]) / total
        i = int(np.searchsorted(cdf, PERCENTILE / 100.0))
        out[t] = min(amax[t], (i + 1) * amax[t] / HISTOGRAM_BINS)
    return out


def to_fp8(source, output, method, batches, quantize_ops):
    """FP8 (E4M3) explicit quantisation as TensorRT builds it: on the inputs of the operators
    in quantize_ops (Conv, Gemm, MatMul), a QuantizeLinear/DequantizeLinear pair (opset 19,
    FLOAT8E4M3FN zero point 0, saturating) with a per-tensor scale amax/448 from calibration
    for activations; weights stored as FLOAT8E4M3FN initializers behind a DequantizeLinear,
    per output channel (axis 0) for Conv and for Gemm with transB=1, per tensor otherwise.
    Biases, every other operator and the model's inputs and outputs stay FP32.

    Written here because ONNX Runtime 1.32's FP8 path in quantize_static fails in its
    calibrator; the onnx package alone builds the graph, and ONNX Runtime's CPU kernels for
    FP8 QuantizeLinear/DequantizeLinear run it for the accuracy gate."""
    import ml_dtypes
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(source)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < FP8_OPSET:
        from onnx import version_converter

        model = version_converter.convert_version(model, FP8_OPSET)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    # Constant nodes feeding weights are initializers for this purpose.
    consts = {}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    ops = set(quantize_ops)

    def weight_of(n, idx):
        name = n.input[idx]
        t = inits.get(name) or consts.get(name)
        if t is None or t.data_type != TensorProto.FLOAT:
            return None
        return name, numpy_helper.to_array(t)

    plan = []  # (node index, input index, "act" | weight ndarray, axis)
    activations = []
    for k, n in enumerate(graph.node):
        if n.op_type not in ops:
            continue
        for idx in (0, 1):
            if idx >= len(n.input) or not n.input[idx]:
                continue
            w = weight_of(n, idx)
            if w is not None:
                if idx == 0 and n.op_type == "Conv":
                    continue
                arr = w[1]
                axis = None
                if n.op_type == "Conv" and arr.ndim >= 2:
                    axis = 0
                elif n.op_type == "Gemm" and idx == 1 and arr.ndim == 2:
                    trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
                    axis = 0 if trans_b else None
                plan.append((k, idx, w, axis))
            else:
                if n.input[idx] not in activations:
                    activations.append(n.input[idx])
                plan.append((k, idx, "act", None))
    amax = fp8_amax(model, activations, batches, method) if activations else {}

    zp_name = "fp8_zero_point"
    new_inits = [helper.make_tensor(zp_name, TensorProto.FLOAT8E4M3FN, [], [0.0])]
    before = {}  # node index -> nodes to insert before it
    dq_of = {}
    scales = {}
    weights = 0
    for k, idx, what, axis in plan:
        n = graph.node[k]
        src = n.input[idx]
        if what == "act":
            if src not in dq_of:
                a = amax[src]
                s = np.float32(a / E4M3_MAX) if a > 0 else np.float32(1.0)
                base = src.replace("/", "_")
                sn, qn, dn = base + "_fp8_scale", base + "_fp8_q", base + "_fp8_dq"
                new_inits.append(numpy_helper.from_array(np.array(s, np.float32), sn))
                before.setdefault(k, []).extend([
                    helper.make_node("QuantizeLinear", [src, sn, zp_name], [qn], name=qn),
                    helper.make_node("DequantizeLinear", [qn, sn, zp_name], [dn], name=dn),
                ])
                dq_of[src] = dn
                scales[src] = float(s)
            n.input[idx] = dq_of[src]
        else:
            name, arr = what
            if name in dq_of:
                n.input[idx] = dq_of[name]
                continue
            base = name.replace("/", "_")
            if axis is None:
                a = float(np.abs(arr).max()) if arr.size else 0.0
                s = np.array(a / E4M3_MAX if a > 0 else 1.0, np.float32)
                q = np.clip(arr / s, -E4M3_MAX, E4M3_MAX)
                zp, zshape = zp_name, None
            else:
                a = np.abs(arr.reshape(arr.shape[0], -1)).max(axis=1)
                s = np.where(a > 0, a / E4M3_MAX, 1.0).astype(np.float32)
                q = np.clip(arr / s.reshape([-1] + [1] * (arr.ndim - 1)), -E4M3_MAX, E4M3_MAX)
                zp = base + "_fp8_zero_point"
                new_inits.append(helper.make_tensor(zp, TensorProto.FLOAT8E4M3FN, [arr.shape[0]], [0.0] * arr.shape[0]))
            q8 = q.astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
            wq = helper.make_tensor(base + "_fp8", TensorProto.FLOAT8E4M3FN, list(arr.shape), q8.tobytes(), raw=True)
            sn, dn = base + "_fp8_scale", base + "_fp8_dq"
            new_inits.extend([wq, numpy_helper.from_array(s, sn)])
            attrs = {"axis": axis} if axis is not None else {}
            before.setdefault(k, []).append(
                helper.make_node("DequantizeLinear", [wq.name, sn, zp], [dn], name=dn, **attrs)
            )
            dq_of[name] = dn
            n.input[idx] = dn
            weights += 1
    nodes = []
    for k, n in enumerate(graph.node):
        nodes.extend(before.get(k, []))
        nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    # FP32 weights now only read through their FP8 copies are dropped.
    used = {i for n in graph.node for i in n.input}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep + new_inits)
    onnx.checker.check_model(model)
    onnx.save(model, output)
    return {
        "tool": "infer-build fp8 (onnx Q/DQ insertion)",
        "format": "QDQ",
        "type": "FLOAT8E4M3FN",
        "opset": max(opset, FP8_OPSET),
        "calibrate_method": method,
        "percentile": PERCENTILE if method == "percentile" else None,
        "activations": "per-tensor, scale = amax / 448",
        "weights": "per-channel (axis 0) for Conv and Gemm transB=1, else per-tensor; stored FLOAT8E4M3FN",
        "op_types_to_quantize": quantize_ops,
        "quantized_activations": len(scales),
        "quantized_weights": weights,
        "calibration_batches": len(batches),
    }


MODELOPT_METHODS = {"minmax": "max", "entropy": "entropy"}


def modelopt_convert(source, output, precision, method, batches):
    """ModelOpt: AutoCast (FP16, inputs and outputs kept FP32) or post-training quantisation
    to INT8 / FP8 Q/DQ on the CPU execution provider, the other operators kept FP32."""
    import modelopt

    if precision == "fp16":
        import onnx
        from modelopt.onnx.autocast import convert_to_mixed_precision

        model = convert_to_mixed_precision(
            onnx_path=source, low_precision_type="fp16", keep_io_types=True, providers=["cpu"]
        )
        onnx.save(model, output)
        return {"tool": "modelopt.onnx.autocast", "version": modelopt.__version__,
                "low_precision_type": "fp16", "keep_io_types": True}
    import numpy as np
    from modelopt.onnx.quantization import quantize as mo_quantize

    if method not in MODELOPT_METHODS:
        raise SystemExit(
            f"ModelOpt calibrates with minmax (its 'max') or entropy, not {method!r}: "
            "set the [int8] / [fp8] method"
        )
    names = list(batches[0].keys())
    data = {n: np.concatenate([b[n] for b in batches], axis=0) for n in names}
    mo_quantize(
        onnx_path=source,
        quantize_mode=precision,
        calibration_data=data,
        calibration_method=MODELOPT_METHODS[method],
        calibration_eps=["cpu"],
        high_precision_dtype="fp32",
        output_path=output,
    )
    return {"tool": "modelopt.onnx.quantization", "version": modelopt.__version__,
            "quantize_mode": precision, "calibration_method": MODELOPT_METHODS[method],
            "high_precision_dtype": "fp32"}


def compare(source, models, batches):
    """Per output, against the FP32 model on the same inputs: max absolute error, max relative
    error (the absolute error over the FP32 output's largest magnitude) and, for [N, C] outputs
    with C >= 2, top-1 agreement. `models` are (path, literal) pairs, each run as `session`
    runs it against the same reference outputs; with several, each figure is the worst of them
    (a non-finite value counts as infinite)."""
    import numpy as np

    ref = session(source)
    runs = [session(path, literal) for path, literal in models]
    names = [o.name for o in ref.get_outputs()]
    stats = [{n: {"max_abs": 0.0, "ref_max": 0.0, "rows": 0, "agree": 0, "classification": None} for n in names}
             for _ in runs]
    for feeds in batches:
        want = [np.asarray(w, dtype=np.float64) for w in ref.run(names, feeds)]
        for new, st in zip(runs, stats):
            for n, w, g in zip(names, want, new.run(names, feeds)):
                g = np.asarray(g, dtype=np.float64)
                if w.shape != g.shape:
                    raise SystemExit(f"output {n}: converted shape {g.shape}, fp32 shape {w.shape}")
                s = st[n]
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
        o = {"name": n}
        for st in stats:
            s = st[n]
            rel = (s["max_abs"] / s["ref_max"]) if s["ref_max"] > 0 else (0.0 if s["max_abs"] == 0 else float("inf"))
            o["max_abs"] = max(o.get("max_abs", 0.0), s["max_abs"])
            o["max_rel"] = max(o.get("max_rel", 0.0), rel)
            if s["classification"]:
                top1 = s["agree"] / s["rows"] if s["rows"] else 1.0
                o["top1_agreement"] = min(o.get("top1_agreement", 1.0), top1)
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
    tool = req.get("tool", "builtin")
    emulated = None
    # Every import first (with ModelOpt, torch too): a missing package fails here, before any work.
    found = versions(tool)
    if tool == "modelopt":
        if precision in ("int8", "fp8") and calib is None:
            raise SystemExit(f"{precision} quantisation needs calibration data")
        options = modelopt_convert(req["source"], req["output"], precision, req["method"], calib)
    elif precision == "fp16":
        ranges, ranges_what = (calib, "calibration data") if calib is not None else (evaluation, what)
        emulated, options = to_fp16(req["source"], req["output"], req.get("fp16_keep_ops", []), ranges, ranges_what, scratch)
    elif precision == "int8":
        if calib is None:
            raise SystemExit("int8 quantisation needs calibration data")
        options = quantize(req["source"], req["output"], precision, req["method"], calib, req.get("quantize_ops", []), scratch)
    elif precision == "fp8":
        if calib is None:
            raise SystemExit("fp8 quantisation needs calibration data")
        if req["method"] not in ("minmax", "percentile"):
            raise SystemExit(f"fp8 calibration method {req['method']!r}: use minmax or percentile")
        options = to_fp8(req["source"], req["output"], req["method"], calib, req.get("quantize_ops", []))
    else:
        raise SystemExit(f"no converter for {precision}")
    t1 = time.monotonic()
    models = [(req["output"], precision in ("int8", "fp8"))]
    if emulated is not None:
        # The gate holds the worse of the converted model as ONNX Runtime runs it and the
        # emulation of its FP16 storage (`emulation`).
        models.append((emulated, False))
        options["figures_from"] = "the worse of the converted model and its FP16 emulation"
    figures = compare(req["source"], models, evaluation)
    if emulated is not None:
        os.remove(emulated)
    t2 = time.monotonic()
    return {
        "versions": found,
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
