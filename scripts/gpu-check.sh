#!/usr/bin/env bash
# GPU acceptance check, for a machine with an NVIDIA GPU and driver (and, for the full check,
# TensorRT's builder: trtexec and libnvinfer, e.g. inside NVIDIA's TensorRT container image).
#
#   1. reports the GPU, the driver and the TensorRT it can find;
#   2. builds the example's engine (examples/mlp/mlp.onnx) with trtexec, fp32 and fp16;
#   3. builds infer-serve with feature `tensorrt` against the headers of the TensorRT major found
#      (scripts/build-runtime.sh FLAVOUR=gpu) and serves each engine through the real backend;
#   4. sends the same random batches to it and to onnxruntime on the ONNX model, and compares
#      (max abs difference: 1e-4 for fp32, 2e-2 for fp16).
#
# Every step it cannot do is said plainly ("NOT DONE: …") and makes the exit status non-zero;
# exit 0 only when everything above ran and matched. Needs python with numpy, onnxruntime and
# tritonclient[http] ($INFER_BUILD_PYTHON, default python3).
#
#   WORK=DIR  scratch directory (default: a new temporary one)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
py=${INFER_BUILD_PYTHON:-python3}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
failures=0
say() { echo "gpu-check: $*"; }
not_done() { echo "gpu-check: NOT DONE: $*"; failures=$((failures + 1)); }

# 1. What this node has.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    say "GPU: $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -n1)"
else
    not_done "no GPU visible (nvidia-smi absent or it sees no device); nothing else can run"
    exit 1
fi
trtexec=$(command -v trtexec || ls /usr/src/tensorrt/bin/trtexec 2>/dev/null || true)
libnvinfer=$(ldconfig -p | sed -n 's/.*\(libnvinfer\.so\.[0-9]*\) .*=> \(.*\)/\2/p' | head -n1)
if [[ -n $libnvinfer ]]; then
    say "TensorRT runtime: $libnvinfer"
else
    say "TensorRT runtime: none on the loader path (libnvinfer.so.N)"
fi
[[ -n $trtexec ]] && say "trtexec: $trtexec" || say "trtexec: not found"

# The TensorRT version, from the library itself.
trt_version=""
if [[ -n $libnvinfer ]]; then
    trt_version=$("$py" - "$libnvinfer" <<'EOF' 2>/dev/null
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = lib.getInferLibVersion()
major, rest = (v // 10000, v % 10000) if v >= 100000 else (v // 1000, v % 1000)
print(f"{major}.{rest // 100}.{rest % 100}")
EOF
)
    say "TensorRT version: ${trt_version:-unreadable}"
fi
major=${trt_version%%.*}
case $major in
    10) headers=10.16 ;;
    11) headers=11.1 ;;
    8) headers=8.6 ;;
    *) headers="" ;;
esac

if [[ -z $trtexec || -z $libnvinfer || -z $headers ]]; then
    not_done "no TensorRT builder (trtexec + libnvinfer of major 8, 10 or 11): no engine built, nothing served"
    exit 1
fi

# 2-4. Build, serve, compare, per precision.
serve=$(FLAVOUR=gpu TRT_HEADERS=$headers PROFILE=release "$root/scripts/build-runtime.sh") || {
    not_done "building infer-serve with feature tensorrt failed"; exit 1; }
say "infer-serve (tensorrt, TensorRT $headers headers): $serve"

for precision in fp32 fp16; do
    dir="$work/$precision"
    mkdir -p "$dir"
    flags=(--onnx="$root/examples/mlp/mlp.onnx" --saveEngine="$dir/engine.plan"
        --minShapes=input:1x64 --optShapes=input:8x64 --maxShapes=input:32x64)
    [[ $precision == fp16 ]] && flags+=(--fp16)
    if ! "$trtexec" "${flags[@]}" >"$dir/build.log" 2>&1; then
        not_done "$precision: trtexec could not build the engine (see $dir/build.log)"
        continue
    fi
    cat >"$dir/runtime.toml" <<EOF
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
max_batch_size = 32
[engine]
kind = "tensorrt"
path = "engine.plan"
[server]
host = "127.0.0.1"
port = 0
EOF
    INFER_TRT_LIBRARY=$libnvinfer "$serve" --config "$dir/runtime.toml" >"$dir/serve.log" 2>&1 &
    pid=$!
    port=""
    for _ in $(seq 1 120); do
        port=$(sed -n 's/.*"addr":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$dir/serve.log" | head -n1)
        grep -q '"ready"' "$dir/serve.log" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if ! grep -q '"ready"' "$dir/serve.log"; then
        not_done "$precision: infer-serve did not become ready (see $dir/serve.log)"
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
        continue
    fi
    say "$precision: $(grep '"node"' "$dir/serve.log" | head -n1)"
    tol=1e-4; [[ $precision == fp16 ]] && tol=2e-2
    if "$py" - "$root/examples/mlp/mlp.onnx" "$port" "$tol" "$precision" <<'EOF'; then
import sys
import numpy as np
import onnxruntime as ort
import tritonclient.http as http

onnx, port, tol, precision = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
client = http.InferenceServerClient(f"127.0.0.1:{port}")
rng = np.random.default_rng(0)
worst = 0.0
for rows in (1, 3, 8, 32):
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    want = sess.run(None, {"input": x})[0]
    inp = http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    got = client.infer("mlp", [inp]).as_numpy("output")
    assert got.shape == want.shape, (got.shape, want.shape)
    worst = max(worst, float(np.max(np.abs(got - want))))
print(f"gpu-check: {precision}: max |tensorrt - onnxruntime| = {worst:.3g} (tolerance {tol:g}) over batches 1, 3, 8, 32")
sys.exit(0 if worst <= tol else 1)
EOF
        say "$precision: outputs match onnxruntime"
    else
        not_done "$precision: outputs differ from onnxruntime beyond the tolerance, or the request failed"
    fi
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
done

if ((failures > 0)); then
    say "$failures step(s) not done; see above"
    exit 1
fi
say "all steps done"
