#!/usr/bin/env bash
# Two dynamic runtimes, or one under two settings (a wrapper script that sets an environment
# variable, e.g. INFER_BUSY_POLL_US=0, and execs it), on ONNX Runtime at 2 intra-op threads
# (docs/BENCHMARKS.md, "ONNX Runtime's spin-wait"): MiniLM (32 tokens) and PaddleOCR's detector
# (1x3x96x96), one instance, max batch 16, no queue delay; per binary, alternating, ROUNDS times:
# wrk (one thread, bench/runtime-post.lua, batch-1 binary requests) for DURATION s at 1 and at
# 16 connections. Prints the medians per binary.
#   usage: BEFORE=path/infer-serve AFTER=path/infer-serve bench/ort_spin.sh
#          (env: ROUNDS=3 DURATION=6 PY=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-6}
PY=${PY:-${INFER_BUILD_PYTHON:-.venv/bin/python}}
: "${BEFORE:?set BEFORE to a dynamic infer-serve}" "${AFTER:?set AFTER to a dynamic infer-serve}"
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
cache=${INFER_BUILD_MODEL_CACHE:-target/real-models}
models=$("$PY" tests/it/real_models.py fetch "$cache")
lib=$(realpath "$("$PY" tests/it/real_models.py fetch-ort "$cache" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["library"])')")
W=$(mktemp -d /tmp/bench-spin.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$W"' EXIT
rows=$W/rows.jsonl
: > "$rows"

# serve BIN NAME TENSORS: starts the server, sets $pid and $addr
serve() {
    local bin=$1 name=$2 tensors=$3 onnx
    onnx=$(realpath "$(echo "$models" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$name'])")")
    printf '[model]\nname = "%s"\n%s\n[batching]\nmax_batch_size = 16\nmax_queue_delay_us = 0\ninstances = 1\n\n[engine]\nkind = "onnxruntime"\npath = "%s"\nlibrary = "%s"\nthreads = 2\n\n[server]\nhost = "127.0.0.1"\nport = 0\n' \
        "$name" "$tensors" "$onnx" "$lib" > "$W/$name.toml"
    start_server "$bin" "$W/$name.toml" "$W/$name.log"
}

# bench NAME INPUT DATATYPE TENSORS SHAPE-JSON
bench() {
    local name=$1 input=$2 dtype=$3 tensors=$4 shape=$5 hlen
    hlen=$("$PY" tests/it/real_models.py body "$input" "$shape" "$dtype" "$W/body")
    for round in $(seq "$ROUNDS"); do
        for which in before after; do
            if [ $which = before ]; then serve "$BEFORE" "$name" "$tensors"; else serve "$AFTER" "$name" "$tensors"; fi
            for c in 1 16; do
                r=$(BODY_FILE="$W/body" HEADER_LEN=$hlen wrk -t1 -c$c -d"${DURATION}s" -s bench/runtime-post.lua \
                    "http://$addr/v2/models/$name/infer" | grep '^RESULT')
                echo "{\"model\": \"$name\", \"binary\": \"$which\", \"connections\": $c, \"round\": $round, \"result\": \"$r\"}" >> "$rows"
            done
            kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        done
    done
}

bench minilm input_ids,attention_mask,token_type_ids INT64 "$MINILM_TENSORS" '[1,32]'
bench ocr-det x FP32 "$DET_TENSORS" '[1,3,96,96]'

"$PY" - "$rows" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {}
for r in rows:
    k = {a: int(b) for a, b in re.findall(r"(\w+)=(\d+)", r["result"])}
    out.setdefault((r["model"], r["connections"], r["binary"]), []).append(
        ((k["requests"] - k["non2xx"]) / (k["duration_us"] / 1e6), k["p50_us"] / 1e3, k["p99_us"] / 1e3, k["non2xx"] + k["errors"]))
print("| model | connections | binary | inferences/s | p50 ms | p99 ms | errors |")
print("|---|---:|---|---:|---:|---:|---:|")
for (m, c, b), v in out.items():
    med = lambda i: statistics.median(x[i] for x in v)
    print(f"| {m} | {c} | {b} | {med(0):.0f} | {med(1):.3f} | {med(2):.3f} | {sum(x[3] for x in v)} |")
PY
