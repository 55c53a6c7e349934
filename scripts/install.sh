#!/usr/bin/env bash
# Install infer-build and the runtime its images carry, from this checkout, into PREFIX/bin:
#
#   scripts/install.sh [--prefix DIR] [--with-gpu] [--without-onnxruntime]   (default DIR: $HOME/.local)
#
# What `infer-build build` needs on a fresh machine is two binaries side by side: `infer-build`
# itself and `infer-serve`, the runtime every image starts. The image runtime is not an
# ordinary build of the `infer-serve` package: CPU images are FROM scratch, so it must be
# statically linked, and it is built reproducibly (scripts/build-runtime.sh remaps every path
# that could enter the binary), so two machines with the same toolchain and Cargo.lock ship
# byte-identical runtimes. `build` finds the runtime next to `infer-build`, so after this script
# nothing else is needed: no INFER_SERVE_BIN, no --runtime. Images whose engine is ONNX Runtime or OpenVINO
# run on a glibc base with the dynamically linked flavour, installed beside it as
# `infer-serve-dynamic` (FLAVOUR=dynamic scripts/build-runtime.sh). With --with-gpu, the runtime
# of GPU images (full and lean) is built too (FLAVOUR=gpu scripts/build-runtime.sh:
# feature `tensorrt`, its C++ shim compiled against TensorRT's headers, which TENSORRT_ROOT names,
# the directory of a TensorRT tar package, with include/NvInferRuntime.h) and installed as
# `infer-serve-gpu`. --without-onnxruntime leaves out `infer-serve-dynamic`: enough for images
# whose CPU engine is tract (`[engine] cpu = "tract"`, as in the example scripts/example.sh
# builds) and GPU images, in about half the build time.
#
# Needs Rust (cargo) and a C compiler; nothing is downloaded but the crates Cargo.lock pins.
# Idempotent: a second run with nothing changed rebuilds nothing and copies the same files.
# The last lines on stdout are the installed files with their sha256, for a CI log or a cache key.
#
#   PREFIX              the same as --prefix
#   CARGO_TARGET_DIR    where cargo builds (default: target/ of this checkout)
#   INFER_BUILD_PROFILE cargo profile of infer-build itself (default release). The runtimes are
#                       always built with release-serve, the profile images ship.
#   INFER_BUILD_BIN     an infer-build already built, installed instead of building one.
#                       scripts/test.sh passes the one `cargo test` built: a `cargo build` of the
#                       builder alone resolves its dependencies' features without the workspace's
#                       dev-dependencies, so it would compile tokio, hyper and the builder again.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
prefix=${PREFIX:-$HOME/.local}
with_gpu=0
with_ort=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --with-gpu) with_gpu=1; shift ;;
        --without-onnxruntime) with_ort=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install: unknown argument '$1' (usage: scripts/install.sh [--prefix DIR] [--with-gpu] [--without-onnxruntime])" >&2; exit 2 ;;
    esac
done
command -v cargo >/dev/null || { echo "install: cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }

# The runtimes (target/runtime, scripts/build-runtime.sh) and the builder (target/) build in
# different target directories, so they build side by side: each one's long single-threaded
# steps (the runtimes' link-time optimisation, the builder's last crates) leave the second core
# to the other.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
    set -e
    echo "==> building the image runtime (statically linked infer-serve)" >&2
    "$root/scripts/build-runtime.sh" >"$work/serve"
    if [[ $with_ort == 1 ]]; then
        echo "==> building the dynamically linked image runtime (tract, ONNX Runtime and OpenVINO)" >&2
        FLAVOUR=dynamic "$root/scripts/build-runtime.sh" >"$work/serve-dynamic"
    fi
    if [[ $with_gpu == 1 ]]; then
        echo "==> building the GPU image runtime (TensorRT backend, headers at ${TENSORRT_ROOT:-TENSORRT_ROOT unset})" >&2
        FLAVOUR=gpu CHECK=1 "$root/scripts/build-runtime.sh" >"$work/serve-gpu"
    fi
) &
runtimes=$!

builder_ok=1
builder_profile=${INFER_BUILD_PROFILE:-release}
if [[ -n ${INFER_BUILD_BIN:-} ]]; then
    echo "==> infer-build: $INFER_BUILD_BIN (INFER_BUILD_BIN)" >&2
else
    echo "==> building infer-build" >&2
    # Without the caller's SOURCE_DATE_EPOCH (it dates images, not this build; several
    # dependencies' C builds rerun when it changes).
    (cd "$root" && unset SOURCE_DATE_EPOCH && cargo build --profile "$builder_profile" --locked --quiet --bin infer-build) >&2 || builder_ok=0
fi
runtimes_ok=1
wait "$runtimes" || runtimes_ok=0
[[ $builder_ok == 1 ]] || { echo "install: building infer-build failed (above)" >&2; exit 1; }
[[ $runtimes_ok == 1 ]] || { echo "install: building the image runtime failed (above)" >&2; exit 1; }

serve=$(tail -n1 "$work/serve")
pairs=()
[[ $with_ort == 1 ]] && pairs+=("$(tail -n1 "$work/serve-dynamic"):infer-serve-dynamic")
[[ $with_gpu == 1 ]] && pairs+=("$(tail -n1 "$work/serve-gpu"):infer-serve-gpu")
if [[ -n ${INFER_BUILD_BIN:-} ]]; then
    builder=$INFER_BUILD_BIN
    [[ -x $builder ]] || { echo "install: INFER_BUILD_BIN=$builder is not an executable" >&2; exit 2; }
else
    builder_dir=$builder_profile
    [[ $builder_profile == dev ]] && builder_dir=debug
    builder="${CARGO_TARGET_DIR:-$root/target}/$builder_dir/infer-build"
    [[ -x $builder ]] || { echo "install: $builder was not produced" >&2; exit 1; }
fi

bin="$prefix/bin"
mkdir -p "$bin"
# Copy under a temporary name and rename: a running infer-build in PREFIX is never half-written.
for pair in "$builder:infer-build" "$serve:infer-serve" ${pairs[@]+"${pairs[@]}"}; do
    src=${pair%%:*} name=${pair##*:}
    install -m 0755 "$src" "$bin/.$name.tmp.$$"
    mv -f "$bin/.$name.tmp.$$" "$bin/$name"
done

"$bin/infer-build" --version >&2
case ":$PATH:" in
    *":$bin:"*) ;;
    *) echo "install: add $bin to PATH (e.g. export PATH=\"$bin:\$PATH\")" >&2 ;;
esac
(cd "$bin" && sha256sum infer-build infer-serve ${pairs[@]+"${pairs[@]##*:}"})
