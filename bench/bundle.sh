#!/usr/bin/env bash
# A bundle against single-model servers (docs/BENCHMARKS.md, "Several models: one bundle or three
# servers"): PaddleOCR's detector, direction classifier and recogniser served by ONNX Runtime
# (the library of the pinned wheel), either as one bundle (one infer-serve, three model
# directories) or as three infer-serve processes, one model each, on the same machine. Every
# model computes with the same intra-op threads in both (the bundle's share: CPUs / 3, at least
# 1), one instance, max_batch_size 8, the default adaptive 2 ms queue delay.
# Load: three wrk processes at once, one per model (1 thread, CONNS connections each, binary
# tensors of one shape: det 1x3x96x96, cls 1x3x48x192, rec 1x3x48x160), DURATION seconds;
# ROUNDS rounds, bundle and singles alternating. Per model: requests/s and p99; and the
# servers' peak resident memory (VmHWM, summed over the three singles). Medians over rounds.
#   usage: bench/bundle.sh    (env: ROUNDS=3 DURATION=10 CONNS=4 INFER_SERVE=… PY=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONNS=${CONNS:-4}
BIN=${INFER_SERVE:-target/runtime/x86_64-unknown-linux-gnu/release-serve/dynamic/infer-serve}
PY=${PY:-${INFER_BUILD_PYTHON:-.venv/bin/python}}
[ -x "$BIN" ] || { echo "build first: FLAVOUR=dynamic scripts/build-runtime.sh" >&2; exit 1; }
command -v wrk >/dev/null || { echo "needs wrk" >&2; exit 1; }
cache=${INFER_BUILD_MODEL_CACHE:-target/real-models}
models=$("$PY" tests/it/real_models.py fetch "$cache")
lib=$(realpath "$("$PY" tests/it/real_models.py fetch-ort "$cache" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["library"])')")
W=$(mktemp -d /tmp/bench-bundle.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"' EXIT
cpus=$(nproc)
threads=$(( cpus / 3 )); [ "$threads" -ge 1 ] || threads=1

declare -A TENSORS=([ocr-det]="$DET_TENSORS" [ocr-cls]="$CLS_TENSORS" [ocr-rec]="$REC_TENSORS")
declare -A SHAPE=([ocr-det]='[1,3,96,96]' [ocr-cls]='[1,3,48,192]' [ocr-rec]='[1,3,48,160]')
declare -A HLEN
NAMES=(ocr-det ocr-cls ocr-rec)
printf '[server]\nhost = "127.0.0.1"\nport = 0\ndrain_delay_s = 0\n' > "$W/runtime.toml"
for m in "${NAMES[@]}"; do
    mkdir -p "$W/$m"
    onnx=$(echo "$models" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$m'])")
    cat > "$W/$m/runtime.toml" <<EOF
[model]
name = "$m"
${TENSORS[$m]}
[batching]
max_batch_size = 8

[engine]
kind = "onnxruntime"
path = "$(realpath "$onnx")"
library = "$lib"
threads = $threads

[server]
host = "127.0.0.1"
port = 0
drain_delay_s = 0
EOF
    printf '\n[[models]]\npath = "%s"\n' "$m" >> "$W/runtime.toml"
    HLEN[$m]=$("$PY" tests/it/real_models.py body x "${SHAPE[$m]}" FP32 "$W/$m.body")
done

# load NAME=ADDR...: three wrk at once, one per model; prints "model rps p99_ms" lines.
load() {
    local spec m a wrks=()
    for spec in "$@"; do
        m=${spec%%=*}; a=${spec#*=}
        BODY_FILE="$W/$m.body" HEADER_LEN="${HLEN[$m]}" wrk -t1 -c"$CONNS" -d"${DURATION}s" \
            -s bench/runtime-post.lua "http://$a/v2/models/$m/infer" > "$W/$m.wrk" 2>&1 &
        wrks+=($!)
    done
    wait "${wrks[@]}"
    for spec in "$@"; do
        m=${spec%%=*}
        sed -n 's/^RESULT requests=\([0-9]*\) non2xx=\([0-9]*\) errors=\([0-9]*\) duration_us=\([0-9]*\) p50_us=[0-9]* p99_us=\([0-9]*\)/\1 \2 \3 \4 \5/p' "$W/$m.wrk" |
            while read -r n bad err dur p99; do
                [ "$bad" = 0 ] && [ "$err" = 0 ] || { echo "$m: $bad non-2xx, $err errors" >&2; exit 1; }
                echo "$m $(( n * 1000000 / dur )) $(( p99 / 1000 )).$(( p99 % 1000 / 100 ))"
            done
    done
}
hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }

for round in $(seq "$ROUNDS"); do
    # One bundle.
    start_server "$BIN" "$W/runtime.toml" "$W/bundle.log"; pids=("$pid")
    specs=(); for m in "${NAMES[@]}"; do specs+=("$m=$addr"); done
    load "${specs[@]}" | sed "s/^/bundle $round /"
    echo "bundle $round rss_kb $(hwm "$pid")"
    kill "$pid"; wait "$pid" 2>/dev/null || true; pids=()
    # Three single-model servers.
    specs=(); rss=0
    for m in "${NAMES[@]}"; do
        start_server "$BIN" "$W/$m/runtime.toml" "$W/$m.log"; pids+=("$pid")
        specs+=("$m=$addr")
    done
    load "${specs[@]}" | sed "s/^/singles $round /"
    for p in "${pids[@]}"; do rss=$(( rss + $(hwm "$p") )); done
    echo "singles $round rss_kb $rss"
    for p in "${pids[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done; pids=()
done > "$W/rows.txt"

"$PY" - "$W/rows.txt" "$cpus" "$threads" "$CONNS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
def vals(setup, model, i):
    return [float(r[i]) for r in rows if r[0] == setup and r[2] == model]
print(f"{sys.argv[2]} CPUs, {sys.argv[3]} intra-op thread(s) per model, {sys.argv[4]} connections per model; medians of {len({r[1] for r in rows})} rounds")
print()
print("| model | bundle req/s | singles req/s | bundle / singles | bundle p99 ms | singles p99 ms |")
print("|---|---:|---:|---:|---:|---:|")
tb = ts = 0.0
for m in ("ocr-det", "ocr-cls", "ocr-rec"):
    b, s = med(vals("bundle", m, 3)), med(vals("singles", m, 3))
    tb, ts = tb + b, ts + s
    print(f"| {m} | {b:.0f} | {s:.0f} | {b / s:.2f}x | {med(vals('bundle', m, 4)):.1f} | {med(vals('singles', m, 4)):.1f} |")
print(f"| all three | {tb:.0f} | {ts:.0f} | {tb / ts:.2f}x | | |")
rb, rs = med(vals("bundle", "rss_kb", 3)), med(vals("singles", "rss_kb", 3))
print()
print(f"Peak resident memory: bundle {rb / 1024:.0f} MiB, three singles {rs / 1024:.0f} MiB ({rb / rs:.2f}x)")
PY
