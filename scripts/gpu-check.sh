#!/usr/bin/env bash
# GPU acceptance check, for a machine with an NVIDIA GPU and driver (and, for the full check,
# TensorRT's builder: trtexec and libnvinfer, e.g. inside NVIDIA's TensorRT container image).
#
#   1. reports the GPU, the driver and the TensorRT it can find;
#   2. builds the example's engine (examples/mlp/mlp.onnx) with trtexec, fp32 and fp16;
#   3. builds infer-serve with feature `tensorrt` against the headers of the TensorRT major found
#      (scripts/build-runtime.sh FLAVOUR=gpu) and serves each engine through the real backend;
#   4. sends the same random batches to it and to onnxruntime on the ONNX model, and compares
#      (max abs difference: 1e-4 for fp32, 2e-2 for fp16);
#   5. repeats the precision accuracy comparison on built engines: on the real PaddleOCR
#      direction classifier (tests/it/real_models.py) `infer-build engine` converts the model
#      (fp16, int8, and fp8 on sm_89 and newer), gates it on the CPU and builds its engine with
#      the local trtexec; the served engine and onnxruntime on the converted ONNX (the model the
#      gate measured) get the same evaluation batches, compared with a tolerance per precision
#      (max abs difference of the class probabilities: fp16 2e-2, int8 and fp8 5e-2); the
#      engine's top-1 agreement with FP32 is printed.
#
# Every step it cannot do is said plainly ("NOT DONE: …") and makes the exit status non-zero;
# exit 0 only when everything above ran and matched. Needs python with numpy, onnxruntime and
# tritonclient[http] ($INFER_BUILD_PYTHON, default python3).
#
# `--dry-run` (or DRY_RUN=1), for a machine without a GPU: every step says what it would run
# (trtexec's flags, the library and runtime.toml each engine is served with) and that it was
# skipped; the header/library check runs on a stated node (DRY_TRT, default 10.16.1; DRY_GPU,
# default "NVIDIA L4, 8.9, 580.95.05"). Exit 0 when the script ran through.
#
#   WORK=DIR         scratch directory (default: a new temporary one)
#   GPU_NAME=NAME    the GPU's name as matrix/gpus.toml spells it (default: nvidia-smi's, less
#                    "NVIDIA ")
#   INFER_BUILD=BIN  the infer-build binary (default: built here with cargo)
set -uo pipefail

dry=${DRY_RUN:-0}
[[ ${1:-} == --dry-run ]] && dry=1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
py=${INFER_BUILD_PYTHON:-python3}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
failures=0
say() { echo "gpu-check: $*"; }
not_done() { echo "gpu-check: NOT DONE: $*"; failures=$((failures + 1)); }
# In a dry run: says what the step would do and that it was skipped (status 0); else status 1.
skipped() {
    [[ $dry == 1 ]] || return 1
    echo "gpu-check: skipped (dry run): would $*"
}
# Starts "$serve" on DIR/runtime.toml (its log in DIR/serve.log) with the TensorRT library
# LIBRARY (empty: the one the engine's metadata calls for) and waits up to 60 s for "ready";
# sets pid and port. On failure the server is stopped and the status is 1.
serve_until_ready() {
    local dir=$1 library=${2:-}
    if [[ -n $library ]]; then
        INFER_TRT_LIBRARY=$library "$serve" --config "$dir/runtime.toml" >"$dir/serve.log" 2>&1 &
    else
        (unset INFER_TRT_LIBRARY; exec "$serve" --config "$dir/runtime.toml") >"$dir/serve.log" 2>&1 &
    fi
    pid=$!
    port=""
    for _ in $(seq 1 120); do
        port=$(sed -n 's/.*"addr":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$dir/serve.log" | head -n1)
        grep -q '"ready"' "$dir/serve.log" && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    grep -q '"ready"' "$dir/serve.log" && return 0
    stop_server
    return 1
}

# Stops the server serve_until_ready started (SIGTERM: it drains and exits) and waits for it.
stop_server() {
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

# 1. What this node has.
if [[ $dry == 1 ]]; then
    dry_gpu=${DRY_GPU:-NVIDIA L4, 8.9, 580.95.05}
    say "GPU (dry run, stated, not queried): $dry_gpu"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    say "GPU: $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -n1)"
else
    not_done "no GPU visible (nvidia-smi absent or it sees no device); nothing else can run"
    exit 1
fi
trtexec=$(command -v trtexec || ls /usr/src/tensorrt/bin/trtexec 2>/dev/null || true)
libnvinfer=$(ldconfig -p | sed -n 's/.*\(libnvinfer\.so\.[0-9]*\) .*=> \(.*\)/\2/p' | head -n1)
if [[ $dry == 1 ]]; then
    dry_trt=${DRY_TRT:-10.16.1}
    trtexec=${trtexec:-trtexec}
    libnvinfer=${libnvinfer:-libnvinfer.so.${dry_trt%%.*}}
fi
if [[ -n $libnvinfer ]]; then
    say "TensorRT runtime: $libnvinfer"
else
    say "TensorRT runtime: none on the loader path (libnvinfer.so.N)"
fi
[[ -n $trtexec ]] && say "trtexec: $trtexec" || say "trtexec: not found"

# The TensorRT version, from the library itself.
trt_version=""
if [[ -n $libnvinfer && $dry != 1 ]]; then
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
if [[ $dry == 1 ]]; then
    trt_version=$dry_trt
    say "TensorRT version (dry run, stated): $trt_version"
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
# TensorRT is compatible from older headers to newer libraries only: infer-serve refuses a library
# older than its headers (an NGC image's 10.9-10.13 under the 10.16 headers, say). The node's minor
# against the headers', said either way; TENSORRT_ROOT (headers of that release or older) overrides.
node_minor=$(cut -d. -f2 <<<"$trt_version")
if [[ -n ${TENSORRT_ROOT:-} ]]; then
    say "TensorRT headers: $TENSORRT_ROOT (TENSORRT_ROOT), node library $trt_version"
elif (( node_minor < ${headers#*.} )); then
    not_done "the node's TensorRT $trt_version is older than the $headers headers infer-serve is compiled against by default, and infer-serve refuses such a library; rerun with TENSORRT_ROOT naming headers of $major.$node_minor or older (a directory with include/NvInfer*.h: NGC images ship them in /usr/include/x86_64-linux-gnu)"
    exit 1
else
    say "TensorRT headers: $headers, node library $trt_version (same or newer minor: supported)"
fi

# 2-4. Build, serve, compare, per precision.
if skipped "build infer-serve with feature tensorrt: FLAVOUR=gpu TRT_HEADERS=$headers PROFILE=release scripts/build-runtime.sh"; then
    serve=infer-serve
else
    serve=$(FLAVOUR=gpu TRT_HEADERS=$headers PROFILE=release "$root/scripts/build-runtime.sh") || {
        not_done "building infer-serve with feature tensorrt failed"; exit 1; }
fi
say "infer-serve (tensorrt, TensorRT ${TENSORRT_ROOT:-$headers} headers): $serve"

for precision in fp32 fp16; do
    dir="$work/$precision"
    mkdir -p "$dir"
    flags=(--onnx="$root/examples/mlp/mlp.onnx" --saveEngine="$dir/engine.plan"
        --minShapes=input:1x64 --optShapes=input:8x64 --maxShapes=input:32x64)
    [[ $precision == fp16 ]] && flags+=(--fp16)
    # An ordinary plan (not version-compatible), served through the full runtime.
    if skipped "build an ordinary $precision plan: $trtexec ${flags[*]}; serve it through $libnvinfer (the full runtime), two instances on one engine; compare batches 1, 3, 8, 32 with onnxruntime"; then
        continue
    fi
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
# Two execution contexts on the one deserialized engine.
instances = 2
[engine]
kind = "tensorrt"
path = "engine.plan"
[server]
host = "127.0.0.1"
port = 0
EOF
    if ! serve_until_ready "$dir" "$libnvinfer"; then
        not_done "$precision: infer-serve did not become ready (see $dir/serve.log)"
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
    stop_server
done

# 5. Converted precisions on a real model, engine vs the converted ONNX.
if [[ $dry == 1 ]]; then
    cc=$(cut -d, -f2 <<<"$dry_gpu" | tr -d ' ')
    gpu_name=${GPU_NAME:-$(cut -d, -f1 <<<"$dry_gpu" | sed 's/^NVIDIA //')}
else
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' ')
    gpu_name=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | sed 's/^NVIDIA //')}
fi
sm="sm${cc//./}"
if [[ $dry == 1 ]]; then
    precisions=(fp16 int8)
    [[ ${cc%%.*} -gt 8 || $cc == 8.9 ]] && precisions+=(fp8)
    for precision in "${precisions[@]}"; do
        skipped "build the classifier's $precision engine ($gpu_name) with infer-build engine --target $sm-$precision (version-compatible, lean runtime excluded, as build makes it); serve it with its metadata (runtime.toml [engine] metadata), so that infer-serve opens libnvinfer_lean.so.${trt_version%%.*} as the metadata calls for; compare with onnxruntime on the converted model"
    done
    say "dry run: every GPU step above was skipped; nothing ran on a GPU"
    exit 0
fi
infer_build=${INFER_BUILD:-}
if [[ -z $infer_build ]]; then
    if (cd "$root" && cargo build --release -q --bin infer-build); then
        infer_build="${CARGO_TARGET_DIR:-$root/target}/release/infer-build"
    fi
fi
precisions=(fp16 int8)
# FP8 tensor cores: Ada (8.9), Hopper (9.0) and newer.
if [[ ${cc%%.*} -gt 8 || $cc == 8.9 ]]; then
    precisions+=(fp8)
fi
cls="$work/cls"
mkdir -p "$cls"
models=$("$py" "$root/tests/it/real_models.py" fetch "$work/models" 2>"$cls/fetch.log")
onnx=$(printf '%s' "$models" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["ocr-cls"])' 2>/dev/null)
if [[ -z $infer_build || ! -x $infer_build ]]; then
    not_done "converted precisions: no infer-build binary"
elif [[ -z $onnx ]] || ! "$py" "$root/tests/it/precision_data.py" "$cls" >>"$cls/fetch.log" 2>&1; then
    not_done "converted precisions: the classifier or its data could not be made (see $cls/fetch.log)"
else
    cp "$onnx" "$cls/model.onnx"
    plist=$(printf '"%s", ' "${precisions[@]}")
    cat >"$cls/recipe.toml" <<EOF
[model]
name = "ocr-cls"
version = "1"
onnx = "model.onnx"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, 192]
[model.outputs."save_infer_model/scale_0.tmp_1"]
datatype = "fp32"
shape = [-1, 2]
[targets]
gpus = ["$gpu_name"]
precision = [${plist%, }]
tensorrt = "$trt_version"
cpu = false
[int8]
calibration = "calib/"
[fp8]
calibration = "calib/"
[accuracy]
data = "eval/"
[accuracy.int8]
min_top1 = 0.9
[batching]
max_batch_size = 8
EOF
    for precision in "${precisions[@]}"; do
        dir="$cls/$precision"
        mkdir -p "$dir"
        if ! (cd "$cls" && "$infer_build" engine recipe.toml --target "$sm-$precision" \
            --cache "$cls/cache" --json) >"$dir/engine.json" 2>"$dir/engine.log"; then
            not_done "$precision: infer-build engine failed for $sm-$precision (see $dir/engine.log)"
            continue
        fi
        read -r engine converted < <("$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["engine"], d["conversion"]["onnx"])' "$dir/engine.json")
        cp "$engine" "$dir/engine.plan"
        # The engine's metadata says which library runs it: `build` makes version-compatible
        # plans without their lean runtime, which only the lean library of the same release runs.
        "$py" -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["meta"], open(sys.argv[2], "w"))' \
            "$dir/engine.json" "$dir/engine.meta.json"
        cat >"$dir/runtime.toml" <<EOF
[model]
name = "ocr-cls"
[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, 48, 192]
[[outputs]]
name = "save_infer_model/scale_0.tmp_1"
datatype = "FP32"
dims = [-1, 2]
[batching]
max_batch_size = 8
[engine]
kind = "tensorrt"
path = "engine.plan"
metadata = "engine.meta.json"
[server]
host = "127.0.0.1"
port = 0
EOF
        if ! serve_until_ready "$dir" ""; then
            not_done "$precision: infer-serve did not become ready on the classifier engine (see $dir/serve.log)"
            continue
        fi
        tol=2e-2; [[ $precision != fp16 ]] && tol=5e-2
        if "$py" - "$cls/model.onnx" "$converted" "$cls/eval" "$port" "$tol" "$precision" <<'EOF'; then
import glob, os, sys
import numpy as np
import onnxruntime as ort
import tritonclient.http as http

fp32, converted, data, port, tol, precision = sys.argv[1:7]
tol = float(tol)
opts = ort.SessionOptions()
if precision == "fp8":
    # As the accuracy gate: ONNX Runtime's Q/DQ fusions miscompute FP8 Conv on the CPU.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ref = ort.InferenceSession(fp32, providers=["CPUExecutionProvider"])
conv = ort.InferenceSession(converted, opts, providers=["CPUExecutionProvider"])
name = "save_infer_model/scale_0.tmp_1"
client = http.InferenceServerClient(f"127.0.0.1:{port}")
worst, rows, agree = 0.0, 0, 0
for f in sorted(glob.glob(os.path.join(data, "*.npy"))):
    x = np.load(f).astype(np.float32)
    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    got = client.infer("ocr-cls", [inp]).as_numpy(name)
    want = conv.run([name], {"x": x})[0]
    base = ref.run([name], {"x": x})[0]
    assert got.shape == want.shape, (got.shape, want.shape)
    worst = max(worst, float(np.max(np.abs(got - want))))
    rows += len(got)
    agree += int((got.argmax(1) == base.argmax(1)).sum())
print(f"gpu-check: {precision}: max |tensorrt - onnxruntime on the converted model| = {worst:.3g} "
      f"(tolerance {tol:g}); engine top-1 agreement with FP32 {agree}/{rows}")
sys.exit(0 if worst <= tol else 1)
EOF
            say "$precision: the classifier engine matches its converted model"
        else
            not_done "$precision: the classifier engine differs from its converted model beyond the tolerance, or the request failed"
        fi
        stop_server
    done
fi

if ((failures > 0)); then
    say "$failures step(s) not done; see above"
    exit 1
fi
say "all steps done"
