#!/usr/bin/env bash
# FP16 gate figures of every real model the tests fetch, before and after a change to the
# converter (docs/BENCHMARKS.md, "FP16 on real models"): the embedded converter script
# (src/engine/convert.py) of the working tree and of git revision BEFORE, each given the request
# `infer-build engine` sends for a TensorRT 11 fp16 target (inputs at batch 1 and the profile's
# sample shape, 8 generated evaluation inputs, seed 0), printing per model the gate's figures
# (max abs, max rel of the first output), the nodes kept FP32 and the seconds, or the error.
# Also the two made models of tests/it/precision.rs (overflow, coarse).
#   usage: bench/fp16_gate.sh   (env: BEFORE=<git rev> CONVERT_PYTHON=<python of the converter
#          environment, e.g. target/convert-pyenv/*/bin/python> INFER_BUILD_PYTHON=<test python>)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${INFER_BUILD_PYTHON:-python3}
CPY=${CONVERT_PYTHON:?set CONVERT_PYTHON to the converter environment\'s python}
W=$(mktemp -d /tmp/bench-fp16.XXXXXX)
trap 'rm -rf "$W"' EXIT
R=${INFER_BUILD_MODEL_CACHE:-target/real-models}
"$PY" tests/it/real_models.py fetch "$R" >/dev/null
sed -n '/^const FP16_MODELS: &str = r#"/,/^"#;/p' tests/it/precision.rs | sed '1d;$d' > "$W/made.py"
"$PY" "$W/made.py" "$W"
cp src/engine/convert.py "$W/after.py"
[ -n "${BEFORE:-}" ] && git show "$BEFORE:src/engine/convert.py" > "$W/before.py"
keep='["Exp","Log","Pow","Sqrt","Reciprocal","ReduceMean","ReduceSum","ReduceSumSquare","ReduceL2","ReduceLogSumExp","Softmax","LogSoftmax","LayerNormalization","InstanceNormalization"]'
x() { echo "{\"name\":\"x\",\"datatype\":\"fp32\",\"shape\":[1,3,$1,$2]}"; }
ids='{"name":"input_ids","datatype":"int64","shape":[1,16]},{"name":"attention_mask","datatype":"int64","shape":[1,16]}'
one() { # script name onnx inputs
    printf '{"command":"convert","source":"%s","output":"%s/%s.fp16.onnx","precision":"fp16","method":"minmax","calibration":null,"evaluation":null,"inputs":[%s],"generated_samples":8,"fp16_keep_ops":%s}' \
        "$(realpath "$3")" "$W" "$2" "$4" "$keep" |
        "$CPY" "$W/$1.py" 2>"$W/err" | tail -n1 | "$PY" -c '
import json, sys
d = json.load(sys.stdin); o = d["options"]; f = d["outputs"][0]
print("%-10s %-6s max abs %-10s max rel %-10s kept FP32 %-45s %s" % (sys.argv[1], sys.argv[2],
      "%.3g" % f["max_abs"] if f["max_abs"] is not None else "non-finite",
      "%.3g" % f["max_rel"] if f["max_rel"] is not None else "non-finite",
      o.get("fp32_nodes", "-"), d["seconds"]))' "$2" "$1" 2>/dev/null ||
        echo "$2 $1 failed: $(grep -v warn "$W/err" | tail -n1)"
}
for s in ${BEFORE:+before} after; do
    one $s ocr-det "$R/ocr-det.onnx" "$(x 320 320)"
    one $s ocr-cls "$R/ocr-cls.onnx" "$(x 48 192)"
    one $s ocr-rec "$R/ocr-rec.onnx" "$(x 48 320)"
    one $s magika "$R/magika.onnx" '{"name":"bytes","datatype":"int32","shape":[1,2048]}'
    one $s wordllama "$R/wordllama.onnx" "$ids"
    one $s minilm "$R/minilm.onnx" "$ids"',{"name":"token_type_ids","datatype":"int64","shape":[1,16]}'
    one $s overflow "$W/overflow.onnx" '{"name":"x","datatype":"fp32","shape":[1,8]}'
    one $s coarse "$W/coarse.onnx" '{"name":"x","datatype":"fp32","shape":[1,8]}'
done
