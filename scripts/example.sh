#!/usr/bin/env bash
# Build the embedded default example end to end on any machine: install infer-build and the
# statically linked runtime its images carry into target/install/bin (scripts/install.sh), then
# build the example recipe (a tiny MLP, CPU target) into the OCI layout out/mlp.
# No registry, no GPU, no Docker daemon needed.
set -euo pipefail
cd "$(dirname "$0")/.."

recipe="${1:-examples/mlp/recipe.toml}"

scripts/install.sh --prefix target/install --without-onnxruntime >/dev/null
ib=target/install/bin/infer-build

"$ib" check "$recipe"
"$ib" plan "$recipe"
"$ib" build "$recipe"
"$ib" inspect "out/$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$recipe" | head -n1)"
