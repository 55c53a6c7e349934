#!/usr/bin/env bash
# Layer build benchmark (docs/BENCHMARKS.md, "Layer build").
#
# One layer holding a file of float32 random weights (1 GiB by default: an engine or model
# barely compresses), built by infer-build with each compression setting, against
# `umoci insert` of the same file, `tar | pigz -p2 -6 | sha256sum` and
# `tar | zstd -T2 -3 | openssl dgst -sha256`: wall time and peak RSS (GNU time, medians of
# RUNS runs, page cache warm), output size. Then the full `infer-build build` of a recipe
# whose model is that file: cold, no-op rebuild, and rebuild after touching the model.
#
# usage: bench/layers.sh            (env: RUNS=3 SIZE_MIB=1024 BENCH_DIR=… INFER_SERVE_BIN=…)
# needs: umoci pigz zstd openssl /usr/bin/time (GNU), numpy (INFER_BUILD_PYTHON or /opt/ibvenv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
W=${BENCH_DIR:-$(mktemp -d /tmp/layers-bench.XXXXXX)}
PY=${INFER_BUILD_PYTHON:-/opt/ibvenv/bin/python}
for t in umoci pigz zstd openssl /usr/bin/time; do
    command -v "$t" >/dev/null || { echo "missing $t (apt-get install -y umoci pigz zstd openssl time)" >&2; exit 2; }
done

echo "==> building (release)" >&2
cargo build --release --quiet --example layer-bench --bin infer-build
lb=$root/target/release/examples/layer-bench
ib=$root/target/release/infer-build

mkdir -p "$W/in"
in=$W/in/model.onnx
if [ ! -s "$in" ] || [ "$(stat -c %s "$in")" != $((SIZE_MIB << 20)) ]; then
    echo "==> generating $SIZE_MIB MiB of float32 N(0,1) weights" >&2
    "$PY" - "$in" "$SIZE_MIB" <<'PY'
import sys, numpy as np
path, mib = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
with open(path, "wb") as f:
    for _ in range(mib):
        rng.standard_normal(1 << 18, dtype=np.float32).tofile(f)
PY
fi
insize=$(stat -c %s "$in")
cat "$in" >/dev/null   # page cache warm for every contender

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# run NAME SIZE_CMD -- CMD...: RUNS timed runs of CMD (fresh scratch dir $W/s each time),
# then one untimed SIZE_CMD that prints the output size in bytes.
results=$W/results.tsv
: > "$results"
run() {
    local name=$1 size_cmd=$2; shift 3
    local ts=() rs=()
    for i in $(seq "$RUNS"); do
        rm -rf "$W/s"; mkdir -p "$W/s"
        /usr/bin/time -f '%e %M' -o "$W/time.txt" bash -c "$*" >/dev/null
        read -r t r < "$W/time.txt"; ts+=("$t"); rs+=("$r")
    done
    local size; size=$(bash -c "$size_cmd")
    local tm rm_; tm=$(printf '%s\n' "${ts[@]}" | median); rm_=$(printf '%s\n' "${rs[@]}" | median)
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$tm" "$size" "$rm_" "${ts[*]}" >> "$results"
    printf '%-28s %7ss  %12s B  %8s KiB  (%s)\n' "$name" "$tm" "$size" "$rm_" "${ts[*]}" >&2
}
blob_size() { find "$W/s/l/blobs/sha256" -type f -size +1M -printf '%s\n' | sort -n | tail -1; }
export -f blob_size; export W

echo "==> layer of $insize bytes, $RUNS runs each" >&2
for c in gzip-stored none zstd gzip; do
    run "infer-build $c" "$lb $in $W/s/l $c | sed 's/.*\"size\":\([0-9]*\).*/\1/'" -- "$lb $in $W/s/l $c"
done
run "umoci insert" "blob_size" -- \
    "umoci init --layout $W/s/l && umoci new --image $W/s/l:x && umoci insert --image $W/s/l:x $in /opt/infer/model/model.onnx"
run "tar | pigz -p2 -6 | sha256sum" "tar -cf - -C $W/in model.onnx | pigz -p2 -6 | wc -c" -- \
    "tar -cf - -C $W/in model.onnx | pigz -p2 -6 | sha256sum"
run "tar | zstd -T2 -3 | openssl" "tar -cf - -C $W/in model.onnx | zstd -T2 -3 -c | wc -c" -- \
    "tar -cf - -C $W/in model.onnx | zstd -T2 -3 -c | openssl dgst -sha256"

# The whole build of a recipe whose model is this file.
if [ -z "${INFER_SERVE_BIN:-}" ] && [ -x scripts/build-runtime.sh ]; then
    INFER_SERVE_BIN=$(scripts/build-runtime.sh)
fi
if [ -n "${INFER_SERVE_BIN:-}" ]; then
    export INFER_SERVE_BIN
    mkdir -p "$W/recipe"
    sed 's/^onnx = .*/onnx = "model.onnx"/' examples/mlp/recipe.toml > "$W/recipe/recipe.toml"
    ln -f "$in" "$W/recipe/model.onnx"
    rm -rf "$W/out"
    b() { "$ib" build "$W/recipe/recipe.toml" --out "$W/out" 2>/dev/null >/dev/null; }
    export -f b; export ib
    run "build recipe (cold, auto)" "du -sb $W/out/blobs | cut -f1" -- "rm -rf $W/out && b"
    b
    run "build recipe (no-op)" "echo -" -- "b"
    run "build recipe (model touched)" "echo -" -- "touch $W/recipe/model.onnx && b"
else
    echo "(no INFER_SERVE_BIN and no scripts/build-runtime.sh: skipping the recipe builds)" >&2
fi

echo "==> $results (name, median s, output bytes, median peak RSS KiB, runs)" >&2
echo "input $insize bytes; $(nproc) cores; $(uname -m); $(umoci --version 2>&1 | head -1); pigz $(pigz --version 2>&1 | awk '{print $2}'); zstd $(zstd --version | grep -o 'v[0-9.]*' | head -1)"
awk -F'\t' -v insz="$insize" '{ gsub(/\|/, "\\|", $1); r = ($3 ~ /^[0-9]+$/) ? sprintf("%.5f", $3 / insz) : "-"; printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, r, $4 }' "$results"
