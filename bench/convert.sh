#!/usr/bin/env bash
# Precision conversion benchmark (docs/BENCHMARKS.md, "Precision conversion"): `infer-build
# engine` of a GPU target of the PaddleOCR direction classifier (tests/it/precision.rs's recipe:
# TensorRT 11, L4) on a machine without a GPU, so each call converts (or finds the conversion),
# runs the accuracy gate and stops at the GPU check (exit 1, ignored here):
#   - fp16, int8 and fp8 cold: the conversion cache emptied before every run (the converter
#     environment stays: it is created once per machine);
#   - the same calls with the conversion cached;
#   - reference, in the same run: the bare converter (src/engine/convert.py with the same
#     request, run by the environment's Python), i.e. the tools' own cost without infer-build.
#   - with INFER_BUILD_MODELOPT_PYTHON set (a Python with nvidia-modelopt[onnx] and torch): the
#     three cold conversions again under `engine.convert = "modelopt"`.
#   usage: bench/convert.sh   (env: RUNS=5 INFER_BUILD=target/release/infer-build
#                              INFER_BUILD_PYTHON=python with numpy+onnxruntime for the data)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
BIN=${INFER_BUILD:-target/release/infer-build}
PY=${INFER_BUILD_PYTHON:-python3}
[ -x "$BIN" ] || { echo "build first: cargo build --release --bin infer-build" >&2; exit 1; }
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }
W=$(mktemp -d /tmp/bench-convert.XXXXXX)
trap 'rm -rf "$W"' EXIT
export INFER_BUILD_PYENV=${INFER_BUILD_PYENV:-$PWD/target/convert-pyenv}
models=$("$PY" tests/it/real_models.py fetch "${INFER_BUILD_MODEL_CACHE:-target/real-models}")
onnx=$(echo "$models" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["ocr-cls"])')
mkdir -p "$W/r"
cp "$onnx" "$W/r/model.onnx"
"$PY" tests/it/precision_data.py "$W/r"
# The recipe of tests/it/precision.rs: [model], the classifier's tensor tables
# (real_models::CLS), then its RECIPE.
{
    printf '[model]\nname = "ocr-cls"\nversion = "1"\nonnx = "model.onnx"\n'
    sed -n '/^pub(super) const CLS: &str = r#"/,/^"#;/p' tests/it/real_models.rs | sed '1s/.*r#"//; $d'
    sed -n '/^const RECIPE: &str = r#"/,/^"#;/p' tests/it/precision.rs | sed '1s/.*r#"//; $d' \
        | sed 's/CALIB/calib/'
} > "$W/r/recipe.toml"
"$BIN" check "$W/r/recipe.toml" >&2
modelopt=()
if [ -n "${INFER_BUILD_MODELOPT_PYTHON:-}" ]; then
    mkdir -p "$W/m"
    cp -r "$W/r/." "$W/m/"
    printf '\n[engine]\nconvert = "modelopt"\n' >> "$W/m/recipe.toml"
    for p in fp16 int8 fp8; do
        modelopt+=(--prepare "rm -rf $W/c2/v1/converted" -n "engine $p, cold conversion, modelopt"
            "$BIN engine $W/m/recipe.toml --target sm89-$p --cache $W/c2")
    done
fi
# Once, to create the converter environment if needed and to print the figures; a call that
# does not get as far as the GPU check (the conversion and its gate passed) stops the bench.
once() {
    local out
    out=$("$BIN" engine "$1" --target "$2" --cache "$3" 2>&1 || true)
    printf '%s\n' "$out" | sed -n '1,5p' >&2
    grep -q 'needs a GPU to build its TensorRT engine' <<<"$out" \
        || { echo "bench/convert.sh: engine $2 of $1 failed before the GPU check" >&2; exit 1; }
}
for p in fp16 int8 fp8; do once "$W/r/recipe.toml" "sm89-$p" "$W/c0"; done
if [ ${#modelopt[@]} -gt 0 ]; then
    for p in fp16 int8 fp8; do once "$W/m/recipe.toml" "sm89-$p" "$W/c2"; done
fi
envpy=$(ls -d "$INFER_BUILD_PYENV"/convert-*/ | grep -v staging | head -1)bin/python
req() {
    printf '{"command":"convert","source":"%s","output":"%s","precision":"%s","method":"percentile","calibration":%s,"evaluation":"%s","inputs":[{"name":"x","datatype":"fp32","shape":[1,3,48,192]}],"quantize_ops":%s,"fp16_keep_ops":["Exp","Log","Pow","Sqrt","Reciprocal","ReduceMean","ReduceSum","ReduceSumSquare","ReduceL2","ReduceLogSumExp","Softmax","LogSoftmax","LayerNormalization","InstanceNormalization"]}' \
        "$W/r/model.onnx" "$W/bare/$1.onnx" "$1" "$2" "$W/r/eval" "${3:-[\"Conv\",\"ConvTranspose\",\"Gemm\",\"MatMul\"]}"
}
mkdir -p "$W/bare"
req fp16 null > "$W/fp16.json"
req int8 "\"$W/r/calib\"" > "$W/int8.json"
req fp8 "\"$W/r/calib\"" '["Conv","Gemm","MatMul"]' > "$W/fp8.json"
hyperfine -N -i --runs "$RUNS" --export-json "$W/h.json" \
    --prepare "rm -rf $W/c1/v1/converted" -n "engine fp16, cold conversion" \
        "$BIN engine $W/r/recipe.toml --target sm89-fp16 --cache $W/c1" \
    --prepare "rm -rf $W/c1/v1/converted" -n "engine int8, cold conversion" \
        "$BIN engine $W/r/recipe.toml --target sm89-int8 --cache $W/c1" \
    --prepare "rm -rf $W/c1/v1/converted" -n "engine fp8, cold conversion" \
        "$BIN engine $W/r/recipe.toml --target sm89-fp8 --cache $W/c1" \
    --prepare "true" -n "engine fp16, cached" \
        "$BIN engine $W/r/recipe.toml --target sm89-fp16 --cache $W/c0" \
    --prepare "true" -n "engine int8, cached" \
        "$BIN engine $W/r/recipe.toml --target sm89-int8 --cache $W/c0" \
    --prepare "true" -n "engine fp8, cached" \
        "$BIN engine $W/r/recipe.toml --target sm89-fp8 --cache $W/c0" \
    --prepare "true" -n "bare converter fp16 (reference)" \
        "sh -c '$envpy src/engine/convert.py < $W/fp16.json'" \
    --prepare "true" -n "bare converter int8 (reference)" \
        "sh -c '$envpy src/engine/convert.py < $W/int8.json'" \
    --prepare "true" -n "bare converter fp8 (reference)" \
        "sh -c '$envpy src/engine/convert.py < $W/fp8.json'" \
    ${modelopt[@]+"${modelopt[@]}"} >&2
python3 - "$W/h.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
print("| what | median s | runs (s) |")
print("|---|---|---|")
for r in rows:
    print(f"| {r['command']} | {r['median']:.3f} | {' '.join(f'{t:.2f}' for t in r['times'])} |")
med = {r["command"]: r["median"] for r in rows}
for p in ("fp16", "int8", "fp8"):
    cold, bare, hit = med[f"engine {p}, cold conversion"], med[f"bare converter {p} (reference)"], med[f"engine {p}, cached"]
    print(f"{p}: cold / bare converter = {cold / bare:.2f}x, cached / cold = {hit / cold:.3f}x")
PY
