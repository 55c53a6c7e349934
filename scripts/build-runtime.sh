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
#   PROFILE   cargo profile (default release-serve: fat LTO, strip; panics unwind)
#   TARGET    target triple (default x86_64-unknown-linux-gnu; static glibc via crt-static)
#   FEATURES  extra cargo features for infer-serve (default none: the tract backend only)
#   CHECK=1   also verify that the result is static (no PT_INTERP, no DT_NEEDED)
#   FLAVOUR   cpu (default: the static binary above) or gpu: the binary GPU images carry, with
#             feature `tensorrt`, linked dynamically against glibc (a static glibc binary cannot
#             reliably dlopen TensorRT and the NVIDIA driver), its C++ shim compiled against
#             TENSORRT_ROOT (default ../shared/third_party/tensorrt-headers/$TRT_HEADERS, with
#             TRT_HEADERS=10.16); CHECK=1 then verifies that it needs nothing beyond glibc,
#             libstdc++ and libgcc_s;
#             or dynamic: the binary of glibc-based CPU images, with features `tract`,
#             `onnxruntime` and `openvino` (libonnxruntime and libopenvino_c are opened at run
#             time, not linked), linked dynamically against glibc; CHECK=1 verifies the same as
#             for gpu.
#   QUICK=1   a test build: the profile's optimisation level, but every crate in 16 codegen units
#             and no link-time optimisation (CARGO_PROFILE_<PROFILE>_LTO=false,
#             _CODEGEN_UNITS=16), so each flavour's final link is a plain link of code compiled
#             once, not a whole-program optimisation. The same code and features, other bytes
#             and a slower runtime (tract's kernels are not inlined across crates): for test runs
#             only (scripts/test.sh), never for images you ship. Cargo keeps a quick and a full
#             build of each dependency side by side, so switching back compiles nothing again.
#
# The three flavours share one target directory, target/runtime/ (or $CARGO_TARGET_DIR/runtime/):
# they differ only in infer-serve's own features and in how its binary is linked, so the
# dependencies (tract, tokio, hyper...) compile once for all three, with the same flags. The
# static one gets `+crt-static` on its final link only (`cargo rustc`), not through RUSTFLAGS,
# which would make every dependency a different build. Cargo writes each flavour's binary to the
# same path, so it is copied, under a lock, to <dir>/<flavour>/infer-serve, the path printed.
# Its own directory also lets a runtime build run beside a build of the builder (scripts/test.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
profile=${PROFILE:-release-serve}
target=${TARGET:-x86_64-unknown-linux-gnu}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
cargo_home=$(cd "$cargo_home" && pwd -P)

flavour=${FLAVOUR:-cpu}
export RUSTFLAGS="--remap-path-prefix=$cargo_home/registry/src=/cargo/registry/src --remap-path-prefix=$cargo_home/git/checkouts=/cargo/git/checkouts --remap-path-prefix=$root=/build/infer-build"
# Only the final crate's link differs between flavours (see above).
final_flags=()
case $flavour in
    cpu) tag=static; final_flags=(-C target-feature=+crt-static) ;;
    gpu)
        headers=${TRT_HEADERS:-10.16}
        export TENSORRT_ROOT=${TENSORRT_ROOT:-$root/../shared/third_party/tensorrt-headers/$headers}
        [[ -f $TENSORRT_ROOT/include/NvInferRuntime.h ]] || {
            echo "build-runtime: no TensorRT headers at $TENSORRT_ROOT (set TENSORRT_ROOT)" >&2; exit 1; }
        TENSORRT_ROOT=$(cd "$TENSORRT_ROOT" && pwd -P)
        # The headers' version names the copy: switching versions rebuilds only infer-trt's shim
        # and the final crate.
        tag=gpu-$(basename "$TENSORRT_ROOT")
        # Only infer-trt compiles C++ (its shim), so this touches no other crate's build.
        export CXXFLAGS="${CXXFLAGS:-} -ffile-prefix-map=$root=/build/infer-build -ffile-prefix-map=$TENSORRT_ROOT=/tensorrt"
        FEATURES=${FEATURES:+$FEATURES,}tensorrt
        ;;
    dynamic)
        tag=dynamic
        FEATURES=${FEATURES:+$FEATURES,}tract,onnxruntime,openvino
        ;;
    *) echo "build-runtime: FLAVOUR must be cpu, gpu or dynamic, not $flavour" >&2; exit 2 ;;
esac
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}/runtime
# Timestamps never enter a Rust binary, but keep anything that honours it stable. Always 0, not
# the caller's: a caller's SOURCE_DATE_EPOCH dates the images infer-build writes, and the C
# compiler wrappers of several dependencies rebuild when it changes (cargo:rerun-if-env-changed),
# so inheriting it would rebuild the whole runtime, to the same bytes, for every new value.
export SOURCE_DATE_EPOCH=0

if [[ ${QUICK:-0} == 1 ]]; then
    # Cargo reads a profile's settings from CARGO_PROFILE_<NAME>_* (upper case, `-` as `_`).
    profile_env=CARGO_PROFILE_$(tr 'a-z-' 'A-Z_' <<<"$profile")
    export "${profile_env}_LTO=false" "${profile_env}_CODEGEN_UNITS=16"
fi

args=(rustc --locked -p infer-serve --bin infer-serve --target "$target" --profile "$profile")
if [[ -n "${FEATURES:-}" ]]; then
    args+=(--features "$FEATURES")
fi
if [[ ${#final_flags[@]} -gt 0 ]]; then
    args+=(-- "${final_flags[@]}")
fi

dir=$profile
[[ $profile == dev ]] && dir=debug
out_dir="$CARGO_TARGET_DIR/$target/$dir"
bin="$out_dir/$tag/infer-serve"
mkdir -p "$CARGO_TARGET_DIR"
(
    # Two builds of different flavours at once would overwrite each other's binary between
    # cargo's write and the copy below.
    flock 9
    (cd "$root" && cargo "${args[@]}") >&2
    [[ -x $out_dir/infer-serve ]] || { echo "build-runtime: $out_dir/infer-serve was not produced" >&2; exit 1; }
    mkdir -p "$out_dir/$tag"
    if ! cmp -s "$out_dir/infer-serve" "$bin"; then
        # Under a temporary name and renamed: a reader of the previous copy never sees half a file.
        cp "$out_dir/infer-serve" "$bin.tmp.$$"
        mv -f "$bin.tmp.$$" "$bin"
    fi
) 9>"$CARGO_TARGET_DIR/.build-runtime.lock"

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
