#!/usr/bin/env bash
# Runtime benchmark: builds the shipped infer-serve (scripts/build-runtime.sh, release-serve
# profile, static) and the ceiling example with the same profile, then runs bench/runtime.py
# (wrk on 127.0.0.1, the example MLP) and prints the markdown for docs/BENCHMARKS.md.
#   RUNS (default 3)  SECONDS per wrk run (default 5)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
command -v wrk >/dev/null || { echo "bench/runtime.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
serve=$(scripts/build-runtime.sh)
profile=${PROFILE:-release-serve}
# The ceiling needs no backend: build it without tract.
cargo build --locked -p infer-serve --no-default-features --profile "$profile" --example ceiling >&2
ceiling=${CARGO_TARGET_DIR:-$root/target}/$profile/examples/ceiling
echo "machine: $(uname -m), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $(rustc --version)" >&2
cargo build --locked -p infer-serve --no-default-features --release --example metrics_cost >&2
METRICS_COST_JSON=$("${CARGO_TARGET_DIR:-$root/target}/release/examples/metrics_cost")
cargo build --locked -p infer-serve --no-default-features --release --example codec_cost >&2
CODEC_COST_JSON=$("${CARGO_TARGET_DIR:-$root/target}/release/examples/codec_cost")
export METRICS_COST_JSON CODEC_COST_JSON
python3 bench/runtime.py "$serve" "$ceiling" examples/mlp/mlp.onnx "${RUNS:-3}" "${SECONDS_PER_RUN:-5}"
size=$(stat -c %s "$serve")
deps=$(cargo tree -p infer-serve --prefix none -e normal | sort -u | wc -l)
echo "- binary: $(numfmt --to=iec-i --suffix=B "$size") ($size bytes, static, stripped, $profile); $deps crates in \`cargo tree -p infer-serve --prefix none -e normal | sort -u | wc -l\`"
