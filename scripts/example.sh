#!/usr/bin/env bash
# Build the embedded default example end to end on any machine: the statically linked runtime,
# the builder, then the example recipe (a tiny MLP, CPU target) into the OCI layout out/mlp.
# No registry, no GPU, no Docker daemon needed.
set -euo pipefail
cd "$(dirname "$0")/.."

recipe="${1:-examples/mlp/recipe.toml}"

echo "==> building the runtime (statically linked infer-serve)" >&2
INFER_SERVE_BIN="$(scripts/build-runtime.sh)"
export INFER_SERVE_BIN

echo "==> building infer-build" >&2
cargo build --release --quiet --bin infer-build
ib=target/release/infer-build

"$ib" check "$recipe"
"$ib" plan "$recipe"
"$ib" build "$recipe"
"$ib" inspect "out/$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$recipe" | head -n1)"
