#!/usr/bin/env bash
# A lone request against ONNX Runtime in-process, and load against Triton's strict delay
# (docs/BENCHMARKS.md, "A lone request, and the delay under load"). Real models of
# tests/it/real_models.rs on ONNX Runtime (the dynamic runtime; the text models as tensors: 32 token
# ids, mask and type ids), the recipe's delay of the field
# example (max_queue_delay_us = 2000), max batch 16, one instance:
#   1. onnxruntime in Python, batch 1, at 1 and 2 intra-op threads (up to nproc): the median of
#      RUNS session.run calls each; the faster count is "best" and the servers use it;
#   2. per queue_delay (adaptive, the default; strict, Triton's rule) one server, then wrk (one
#      thread, bench/runtime-post.lua, batch-1 binary requests) for DURATION s at 1 connection
#      (each request sent when the last is answered: low load) and at 16.
# ratio = served p50 at 1 connection (wrk's, the HTTP client included) / onnxruntime's median.
#   usage: bench/lone_request.sh   (env: RUNS=200 DURATION=10 PY=.venv/bin/python
#          INFER_SERVE_DYNAMIC=target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RUNS=${RUNS:-200}
DURATION=${DURATION:-10}
DYNAMIC=${INFER_SERVE_DYNAMIC:-target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve}
PY=${PY:-${INFER_BUILD_PYTHON:-.venv/bin/python}}
OUT=${OUT:-target/bench-lone-request}
[ -x "$DYNAMIC" ] || { echo "build first: FLAVOUR=dynamic scripts/build-runtime.sh (or set INFER_SERVE_DYNAMIC)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
cache=${INFER_BUILD_MODEL_CACHE:-target/real-models}
models=$("$PY" tests/it/real_models.py fetch "$cache")
lib=$("$PY" tests/it/real_models.py fetch-ort "$cache" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["library"])')
mkdir -p "$OUT"
: > "$OUT/rows.jsonl"
W=$(mktemp -d /tmp/bench-lone.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$W"' EXIT
maxthreads=$(( $(nproc) < 2 ? 1 : 2 ))

# run NAME INPUT DATATYPE TENSORS SHAPE-JSON
run() {
    local name=$1 input=$2 dtype=$3 tensors=$4 shape=$5 onnx best
    onnx=$(realpath "$(echo "$models" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$name'])")")
    best=$("$PY" - "$onnx" "$input" "$dtype" "$shape" "$RUNS" "$maxthreads" <<'PY'
import json, sys, time
import numpy as np, onnxruntime as ort
sys.path.insert(0, "tests/it")
from real_models import sample
onnx, names, dtype, shape, runs, most = sys.argv[1], sys.argv[2].split(","), sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
x = sample(np.random.default_rng(7), shape, dtype)
feed = {n: x for n in names}
out = {}
for threads in range(1, most + 1):
    o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.inter_op_num_threads = 1
    s = ort.InferenceSession(onnx, o, providers=["CPUExecutionProvider"])
    for _ in range(10):
        s.run(None, feed)
    t = []
    for _ in range(runs):
        a = time.perf_counter(); s.run(None, feed); t.append(time.perf_counter() - a)
    out[threads] = float(np.median(t)) * 1e3
best = min(out, key=out.get)
print(json.dumps({"threads": best, "ms": out}))
PY
)
    local threads; threads=$(echo "$best" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["threads"])')
    local hlen; hlen=$("$PY" tests/it/real_models.py body "$input" "$shape" "$dtype" "$W/body")
    for mode in adaptive strict; do
        cat > "$W/$name.toml" <<EOF
[model]
name = "$name"
$tensors
[batching]
max_batch_size = 16
max_queue_delay_us = 2000
queue_delay = "$mode"
instances = 1

[engine]
kind = "onnxruntime"
path = "$onnx"
library = "$(realpath "$lib")"
threads = $threads

[server]
host = "127.0.0.1"
port = 0
EOF
        start_server "$DYNAMIC" "$W/$name.toml" "$W/$name.log"
        for c in 1 16; do
            r=$(BODY_FILE="$W/body" HEADER_LEN=$hlen wrk -t1 -c$c -d"${DURATION}s" -s bench/runtime-post.lua \
                "http://$addr/v2/models/$name/infer" | grep '^RESULT')
            echo "{\"model\": \"$name\", \"mode\": \"$mode\", \"connections\": $c, \"ort\": $best, \"result\": \"$r\"}" >> "$OUT/rows.jsonl"
        done
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
    done
}

run ocr-cls x FP32 "$CLS_TENSORS" '[1,3,48,192]'
run ocr-det x FP32 "$DET_TENSORS" '[1,3,96,96]'
run wordllama input_ids,attention_mask INT64 "$WORDLLAMA_TENSORS" '[1,32]'
run minilm input_ids,attention_mask,token_type_ids INT64 "$MINILM_TENSORS" '[1,32]'

"$PY" - "$OUT" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/rows.jsonl") if l.strip()]
def kv(r):
    k = {a: int(b) for a, b in re.findall(r"(\w+)=(\d+)", r["result"])}
    ok = k["requests"] - k["non2xx"]
    return ok / (k["duration_us"] / 1e6), k["p50_us"] / 1e3, k["p99_us"] / 1e3, k["non2xx"] + k["errors"]
by = {(r["model"], r["mode"], r["connections"]): r for r in rows}
print("| model | onnxruntime in-process, batch 1, ms by threads (best) | served p50 ms, 1 conn., adaptive (ratio) | served p50 ms, 1 conn., strict (ratio) | 16 conn. inferences/s (p99 ms), adaptive | 16 conn. inferences/s (p99 ms), strict | errors |")
print("|---|---|---:|---:|---:|---:|---:|")
for m in dict.fromkeys(r["model"] for r in rows):
    ort = by[(m, "adaptive", 1)]["ort"]
    best = ort["ms"][str(ort["threads"])]
    a1, s1, a16, s16 = (kv(by[(m, mode, c)]) for mode, c in (("adaptive", 1), ("strict", 1), ("adaptive", 16), ("strict", 16)))
    threads = ", ".join(f"{t}: {v:.3f}" for t, v in ort["ms"].items())
    print(f"| {m} | {threads} ({ort['threads']}) | {a1[1]:.3f} (**{a1[1] / best:.2f}x**) | {s1[1]:.3f} ({s1[1] / best:.2f}x) "
          f"| {a16[0]:.0f} ({a16[2]:.2f}) | {s16[0]:.0f} ({s16[2]:.2f}) | {a1[3] + s1[3] + a16[3] + s16[3]} |")
PY
