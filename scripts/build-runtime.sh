#!/usr/bin/env bash
# Builds the statically linked `infer-serve` that CPU images ship (FROM scratch: no libc, no
# loader) and prints its path on stdout; progress goes to stderr. Idempotent: a second run
# with nothing changed is a no-op build that prints the same path.
#
# Reproducible: paths that would otherwise end up in the binary (panic locations, debug
# remnants) are remapped, the cargo registry to /cargo/registry/src and this checkout to
# /build/infer-build, so two checkouts at different paths, on different machines, with the same
# toolchain and Cargo.lock, give byte-identical binaries.
#
#   PROFILE   cargo profile (default release-serve: fat LTO, strip, panic=abort)
#   TARGET    target triple (default x86_64-unknown-linux-gnu; static glibc via crt-static)
#   FEATURES  extra cargo features for infer-serve (default none: the tract backend only)
#   CHECK=1   also verify that the result is static (no PT_INTERP, no DT_NEEDED)
#   FLAVOUR   cpu (default: the static binary above) or gpu: the binary GPU images carry, with
#             feature `tensorrt`, linked dynamically against glibc (a static glibc binary cannot
#             reliably dlopen TensorRT and the NVIDIA driver), its C++ shim compiled against
#             TENSORRT_ROOT (default ../shared/third_party/tensorrt-headers/$TRT_HEADERS, with
#             TRT_HEADERS=10.16), into target/gpu-<headers>/; CHECK=1 then verifies that it
#             needs nothing beyond glibc, libstdc++ and libgcc_s;
#             or dynamic: the binary of glibc-based CPU images, with features `tract` and
#             `onnxruntime` (libonnxruntime is opened at run time, not linked), linked
#             dynamically against glibc, into target/dynamic/ (or $CARGO_TARGET_DIR/dynamic/);
#             CHECK=1 verifies the same as for gpu.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
profile=${PROFILE:-release-serve}
target=${TARGET:-x86_64-unknown-linux-gnu}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
cargo_home=$(cd "$cargo_home" && pwd -P)

flavour=${FLAVOUR:-cpu}
remap="--remap-path-prefix=$cargo_home/registry/src=/cargo/registry/src --remap-path-prefix=$cargo_home/git/checkouts=/cargo/git/checkouts --remap-path-prefix=$root=/build/infer-build"
case $flavour in
    cpu) export RUSTFLAGS="-C target-feature=+crt-static $remap" ;;
    gpu)
        headers=${TRT_HEADERS:-10.16}
        export TENSORRT_ROOT=${TENSORRT_ROOT:-$root/../shared/third_party/tensorrt-headers/$headers}
        [[ -f $TENSORRT_ROOT/include/NvInferRuntime.h ]] || {
            echo "build-runtime: no TensorRT headers at $TENSORRT_ROOT (set TENSORRT_ROOT)" >&2; exit 1; }
        TENSORRT_ROOT=$(cd "$TENSORRT_ROOT" && pwd -P)
        export RUSTFLAGS="$remap"
        export CXXFLAGS="${CXXFLAGS:-} -ffile-prefix-map=$root=/build/infer-build -ffile-prefix-map=$TENSORRT_ROOT=/tensorrt"
        export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/gpu-$headers}
        FEATURES=${FEATURES:+$FEATURES,}tensorrt
        ;;
    dynamic)
        export RUSTFLAGS="$remap"
        # Its own directory (also under a caller's CARGO_TARGET_DIR): other RUSTFLAGS than the
        # static build, which would otherwise rebuild everything and overwrite its binary.
        export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}/dynamic
        FEATURES=${FEATURES:+$FEATURES,}tract,onnxruntime
        ;;
    *) echo "build-runtime: FLAVOUR must be cpu, gpu or dynamic, not $flavour" >&2; exit 2 ;;
esac
# Timestamps never enter a Rust binary, but keep anything that honours it stable. Always 0, not
# the caller's: a caller's SOURCE_DATE_EPOCH dates the images infer-build writes, and the C
# compiler wrappers of several dependencies rebuild when it changes (cargo:rerun-if-env-changed),
# so inheriting it would rebuild the whole runtime, to the same bytes, for every new value.
export SOURCE_DATE_EPOCH=0

args=(build --locked -p infer-serve --target "$target" --profile "$profile")
if [[ -n "${FEATURES:-}" ]]; then
    args+=(--features "$FEATURES")
fi
(cd "$root" && cargo "${args[@]}") >&2

dir=$profile
[[ $profile == dev ]] && dir=debug
bin="${CARGO_TARGET_DIR:-$root/target}/$target/$dir/infer-serve"
[[ -x $bin ]] || { echo "build-runtime: $bin was not produced" >&2; exit 1; }

if [[ ${CHECK:-0} == 1 && $flavour != cpu ]]; then
    extra=$(readelf -dW "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' \
        | grep -vxE 'lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so\.[0-9]+|ld-linux-x86-64\.so\.2' || true)
    if [[ -n $extra ]]; then
        echo "build-runtime: $bin needs more than glibc, libstdc++ and libgcc_s: $extra" >&2
        exit 1
    fi
    echo "build-runtime: dynamic, needs $(readelf -dW "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')" >&2
elif [[ ${CHECK:-0} == 1 ]]; then
    if readelf -lW "$bin" | grep -q 'INTERP'; then
        echo "build-runtime: $bin has a program interpreter (PT_INTERP): not static" >&2
        exit 1
    fi
    if readelf -dW "$bin" 2>/dev/null | grep -q 'NEEDED'; then
        echo "build-runtime: $bin needs shared libraries (DT_NEEDED): not static" >&2
        exit 1
    fi
    echo "build-runtime: static: $(file -b "$bin")" >&2
fi
echo "$bin"
