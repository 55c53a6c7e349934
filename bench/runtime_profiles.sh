#!/usr/bin/env bash
# How the image runtime's link-time optimisation settings trade build time for speed: builds the
# statically linked infer-serve (scripts/build-runtime.sh) from an empty target directory once
# per setting, one after the other, and prints each build's wall time and binary size; then
# bench/runtime_ab.py serves the example MLP with every binary in turn (a fresh server per run,
# JSON, wrk on 127.0.0.1) and prints the medians.
#
#   bench/runtime_profiles.sh [OUT]     (default OUT: target/profiles; each setting in OUT/NAME)
#
# Settings (cargo's CARGO_PROFILE_RELEASE_SERVE_* overrides of the release-serve profile):
#   fat   lto = "fat",  codegen-units = 1   (release-serve until 2026-12)
#   thin  lto = "thin", codegen-units = 16
#   off   lto = false,  codegen-units = 16
#   RUNS (default 5), SECONDS (default 4), CONNECTIONS (default 1,16), SETTINGS (default fat thin off)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
out=${1:-$root/target/profiles}
command -v wrk >/dev/null || { echo "bench/runtime_profiles.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
echo "machine: $(uname -m), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $(rustc --version)"

bins=()
echo
echo "| setting | build from empty target dir, s | binary bytes |"
echo "|---|---:|---:|"
for name in ${SETTINGS:-fat thin off}; do
    case $name in
        fat) lto=fat cgu=1 ;;
        thin) lto=thin cgu=16 ;;
        off) lto=false cgu=16 ;;
        *) echo "bench/runtime_profiles.sh: unknown setting $name" >&2; exit 2 ;;
    esac
    rm -rf "${out:?}/$name"
    start=$(date +%s.%N)
    bin=$(CARGO_TARGET_DIR="$out/$name" CARGO_PROFILE_RELEASE_SERVE_LTO=$lto \
        CARGO_PROFILE_RELEASE_SERVE_CODEGEN_UNITS=$cgu scripts/build-runtime.sh 2>/dev/null)
    end=$(date +%s.%N)
    mkdir -p "$out/bins/$name"
    cp "$bin" "$out/bins/$name/infer-serve"
    bins+=("$out/bins/$name/infer-serve")
    printf '| %s (lto %s, codegen-units %s) | %.0f | %s |\n' "$name" "$lto" "$cgu" \
        "$(awk "BEGIN {print $end - $start}")" "$(stat -c %s "$bin")"
done
echo
(IFS=,; python3 bench/runtime_ab.py "${bins[*]}" "${CONNECTIONS:-1,16}" "${RUNS:-5}" "${SECONDS:-4}")
