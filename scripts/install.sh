#!/usr/bin/env bash
# Install infer-build and the runtime its images carry, from this checkout, into PREFIX/bin:
#
#   scripts/install.sh [--prefix DIR]        (default DIR: $HOME/.local)
#
# What `infer-build build` needs on a fresh machine is two binaries side by side: `infer-build`
# itself and `infer-serve`, the runtime every image starts. The image runtime is not an
# ordinary build of the `infer-serve` package: CPU images are FROM scratch, so it must be
# statically linked, and it is built reproducibly (scripts/build-runtime.sh remaps every path
# that could enter the binary), so two machines with the same toolchain and Cargo.lock ship
# byte-identical runtimes. `build` finds the runtime next to `infer-build`, so after this script
# nothing else is needed: no INFER_SERVE_BIN, no --runtime. Images whose engine is ONNX Runtime
# run on a glibc base with the dynamically linked flavour, installed beside it as
# `infer-serve-dynamic` (FLAVOUR=dynamic scripts/build-runtime.sh).
#
# Needs Rust (cargo) and a C compiler; nothing is downloaded but the crates Cargo.lock pins.
# Idempotent: a second run with nothing changed rebuilds nothing and copies the same files.
# The last lines on stdout are the installed files with their sha256, for a CI log or a cache key.
#
#   PREFIX              the same as --prefix
#   CARGO_TARGET_DIR    where cargo builds (default: target/ of this checkout)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
prefix=${PREFIX:-$HOME/.local}
while [[ $# -gt 0 ]]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install: unknown argument '$1' (usage: scripts/install.sh [--prefix DIR])" >&2; exit 2 ;;
    esac
done
command -v cargo >/dev/null || { echo "install: cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }

echo "==> building the image runtime (statically linked infer-serve)" >&2
serve=$("$root/scripts/build-runtime.sh")

echo "==> building the dynamically linked image runtime (tract and ONNX Runtime)" >&2
serve_dynamic=$(FLAVOUR=dynamic "$root/scripts/build-runtime.sh")

echo "==> building infer-build" >&2
(cd "$root" && cargo build --release --locked --quiet --bin infer-build) >&2
builder="${CARGO_TARGET_DIR:-$root/target}/release/infer-build"
[[ -x $builder ]] || { echo "install: $builder was not produced" >&2; exit 1; }

bin="$prefix/bin"
mkdir -p "$bin"
# Copy under a temporary name and rename: a running infer-build in PREFIX is never half-written.
for pair in "$builder:infer-build" "$serve:infer-serve" "$serve_dynamic:infer-serve-dynamic"; do
    src=${pair%%:*} name=${pair##*:}
    install -m 0755 "$src" "$bin/.$name.tmp.$$"
    mv -f "$bin/.$name.tmp.$$" "$bin/$name"
done

"$bin/infer-build" --version >&2
case ":$PATH:" in
    *":$bin:"*) ;;
    *) echo "install: add $bin to PATH (e.g. export PATH=\"$bin:\$PATH\")" >&2 ;;
esac
(cd "$bin" && sha256sum infer-build infer-serve infer-serve-dynamic)
