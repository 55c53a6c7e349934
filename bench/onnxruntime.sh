#!/usr/bin/env bash
# ONNX Runtime backend benchmark (docs/BENCHMARKS.md, "ONNX Runtime backend"): T(b) of PaddleOCR's
# text recogniser (variable width) and text detector (variable height and width) served by
# infer-serve's onnxruntime backend (the library of the pinned onnxruntime 1.31.0 wheel, one
# intra-op thread, one instance, no queue delay: every request is one execution of its batch),
# against onnxruntime in Python (the venv's release) at the same thread count, in the same run.
# Per shape: the median of RUNS session.run calls in Python, the median of RUNS requests to the
# server one at a time (end to end through HTTP, binary tensors), alternating with the Python
# runs, and the median of the server's compute time per execution (each request's change of
# /v2/models/M/stats); the ratio is served compute / Python median.
#   usage: bench/onnxruntime.sh    (env: RUNS=30 INFER_SERVE=target/runtime/.../dynamic/infer-serve PY=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RUNS=${RUNS:-30}
BIN=${INFER_SERVE:-target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve}
PY=${PY:-${INFER_BUILD_PYTHON:-.venv/bin/python}}
[ -x "$BIN" ] || { echo "build first: FLAVOUR=dynamic scripts/build-runtime.sh" >&2; exit 1; }
cache=${INFER_BUILD_MODEL_CACHE:-target/real-models}
models=$("$PY" tests/it/real_models.py fetch "$cache")
lib=$("$PY" tests/it/real_models.py fetch-ort "$cache" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["library"])')
W=$(mktemp -d /tmp/bench-ort.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$W"' EXIT

run() { # name model-key tensors shapes-json
    local name=$1 onnx
    onnx=$(echo "$models" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$2'])")
    cat > "$W/$name.toml" <<EOF
[model]
name = "$name"
$3
[batching]
max_batch_size = 16
max_queue_delay_us = 0

[engine]
kind = "onnxruntime"
path = "$(realpath "$onnx")"
library = "$(realpath "$lib")"
threads = 1

[server]
host = "127.0.0.1"
port = 0
EOF
    start_server "$BIN" "$W/$name.toml" "$W/$name.log"
    "$PY" tests/it/real_models.py bench "$addr" "$name" "$onnx" x "$4" 1 "$RUNS"
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

{
run ocr-rec ocr-rec "$REC_TENSORS" '[[1,3,48,160],[4,3,48,160],[16,3,48,160]]'
run ocr-det ocr-det "$DET_TENSORS" '[[1,3,96,96],[4,3,96,96],[16,3,96,96]]'
} > "$W/rows.jsonl"
"$PY" - "$W/rows.jsonl" "$("$PY" -c 'import onnxruntime; print(onnxruntime.__version__)')" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"| model | input shape | onnxruntime {sys.argv[2]} in Python, median ms | served: compute median ms | served: request median ms (HTTP) | compute / Python |")
print("|---|---|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['model']} | {'x'.join(map(str, r['shape']))} | {r['onnxruntime_python_median_ms']:.3f} | {r['served_compute_median_ms']:.3f} | {r['served_request_median_ms']:.3f} | {r['compute_ratio']:.2f}x |")
PY
