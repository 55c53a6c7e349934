#!/usr/bin/env bash
# Engine cache benchmark (docs/BENCHMARKS.md, "Engine cache"): the CPU engine of the example
# recipe built once (cold: tract optimises, writes NNEF, profiles every planned batch size), then
# the same `infer-build engine` call again with unchanged inputs (a cache hit: hash the ONNX,
# compute the key, verify the entry), against `infer-build check` of the same recipe (parse and
# validate only: the floor of any command that reads the recipe), measured by hyperfine in the
# same run.
#   usage: bench/engine.sh          (env: RUNS=30 INFER_BUILD=target/release/infer-build)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-30}
BIN=${INFER_BUILD:-target/release/infer-build}
[ -x "$BIN" ] || { echo "build first: cargo build --release --bin infer-build" >&2; exit 1; }
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }
W=$(mktemp -d /tmp/bench-engine.XXXXXX)
trap 'rm -rf "$W"' EXIT
recipe=examples/mlp/recipe.toml
/usr/bin/time -f '%e' -o "$W/cold.txt" "$BIN" engine "$recipe" --target cpu-fp32 --cache "$W/cache" --json > "$W/cold.json"
"$BIN" engine "$recipe" --target cpu-fp32 --cache "$W/cache" --json > "$W/warm.json"
cold_digest=$(sed 's/.*"engine_digest":"\([^"]*\)".*/\1/' "$W/cold.json")
warm_digest=$(sed 's/.*"engine_digest":"\([^"]*\)".*/\1/' "$W/warm.json")
grep -q '"cached":true' "$W/warm.json" || { echo "second call was not a cache hit" >&2; exit 1; }
[ "$cold_digest" = "$warm_digest" ] || { echo "digests differ: $cold_digest vs $warm_digest" >&2; exit 1; }
hyperfine -N --warmup 3 --runs "$RUNS" --export-json "$W/h.json" \
    -n "engine (cache hit)" "$BIN engine $recipe --target cpu-fp32 --cache $W/cache" \
    -n "check (reference)" "$BIN check $recipe" >&2
python3 - "$W/h.json" "$(cat "$W/cold.txt")" "$warm_digest" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["results"]
hit, ref = h[0], h[1]
print("| what | median ms | runs |")
print("|---|---:|---:|")
print(f"| `infer-build engine` cold (tract optimise + NNEF + profile) | {float(sys.argv[2]) * 1e3:.0f} | 1 |")
print(f"| `infer-build engine`, unchanged inputs (cache hit) | {hit['median'] * 1e3:.1f} | {len(hit['times'])} |")
print(f"| `infer-build check` of the same recipe (reference) | {ref['median'] * 1e3:.1f} | {len(ref['times'])} |")
print(f"\ncache hit / check: {hit['median'] / ref['median']:.2f}x; engine digest {sys.argv[3]} both times")
PY
