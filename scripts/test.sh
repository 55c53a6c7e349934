#!/usr/bin/env bash
# The project's test command: format check, clippy and rustdoc with warnings denied, then every
# test of the workspace (unit tests and the one integration-test binary). Tests that need Docker, the
# registry or Python tools skip with a printed reason only where the tool is absent; `.ci/run`
# installs them all.
set -euo pipefail
cd "$(dirname "$0")/.."

# The runtimes the images carry are built with the profile images ship (`release-serve`), all
# three in their own target directory (target/runtime, where they share their dependencies'
# build), in the background, while the lints and the test build take the main one.
# TensorRT's public headers the GPU runtime and the TensorRT lint pass compile against.
trt_headers=${TENSORRT_ROOT:-$PWD/../shared/third_party/tensorrt-headers/10.16}
serve_profile=${INFER_SERVE_PROFILE:-release-serve}
# They are quick builds (build-runtime.sh QUICK=1): release-serve's optimisation level, without
# link-time optimisation, every crate in 16 codegen units. With LTO the dependencies leave LLVM
# bitcode and each flavour's final link optimises and compiles the whole program again: three
# such links (fat, or thin over 16 units) were the longest chain of this command. The binaries'
# bytes differ from the ones `scripts/install.sh` and `scripts/example.sh` ship, and they run
# tract slower, not what they do; QUICK=0 tests the shipped builds. Exported: the installs below
# and in the tests reuse these builds.
export QUICK=${QUICK-1}
bg_dir=$(mktemp -d)
trap 'rm -rf "$bg_dir"' EXIT
(
    set -e
    # The statically linked runtime of the CPU images the end-to-end tests build and run.
    PROFILE=$serve_profile CHECK=1 scripts/build-runtime.sh >"$bg_dir/static"
    # The glibc-dynamic runtime (tract and ONNX Runtime) that ONNX Runtime images carry.
    PROFILE=$serve_profile FLAVOUR=dynamic CHECK=1 scripts/build-runtime.sh >"$bg_dir/dynamic"
    # The runtime of GPU images (feature `tensorrt`, its shim compiled against TensorRT's public
    # headers): the GPU image tests assemble it, load it into Docker and start it.
    PROFILE=$serve_profile FLAVOUR=gpu CHECK=1 TENSORRT_ROOT="$trt_headers" \
        scripts/build-runtime.sh >"$bg_dir/gpu"
) 2>"$bg_dir/log" &
bg=$!

cargo fmt --all --check
# One pass over every crate and target, the runtime's optional backends included: TensorRT (its
# C++ shim compiled against TensorRT's public headers, no GPU needed) and ONNX Runtime.
TENSORRT_ROOT="$trt_headers" cargo clippy --workspace --all-targets \
    --features infer-serve/tensorrt,infer-serve/onnxruntime,infer-serve/openvino -- -D warnings
# The API docs of every crate, with the same features: a broken intra-doc link, or a public
# item's docs linking to a private one, is an error (it reuses the lints' metadata: seconds).
TENSORRT_ROOT="$trt_headers" RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace \
    --features infer-serve/tensorrt,infer-serve/onnxruntime,infer-serve/openvino
# The runtime the tests start on loopback carries the synthetic cost-model backend (never
# shipped in images) and the ONNX Runtime backend: infer-build's dev-dependency on infer-serve
# turns both on in this one build of the workspace.
cargo test --workspace --no-run
INFER_SERVE_TEST_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/infer-serve"
export INFER_SERVE_TEST_BIN
# Every crate's unit tests run while the runtimes finish building. (Selecting only some test
# targets would change which dev-dependency features are on, and rebuild: a selection without the
# builder's `tests` target rebuilt infer-serve and tokenizers, 1m14s. The unit tests' does not.)
cargo test --workspace --lib --bins

if ! wait "$bg"; then
    cat "$bg_dir/log" >&2
    echo "test.sh: building a runtime failed (its log is above)" >&2
    exit 1
fi
grep -h 'build-runtime:\|Finished' "$bg_dir/log" >&2 || true
INFER_SERVE_BIN=$(tail -n1 "$bg_dir/static")
INFER_SERVE_DYNAMIC_BIN=$(tail -n1 "$bg_dir/dynamic")
INFER_SERVE_GPU_BIN=$(tail -n1 "$bg_dir/gpu")
export INFER_SERVE_BIN INFER_SERVE_DYNAMIC_BIN INFER_SERVE_GPU_BIN

# infer-build and the runtimes installed the way users install them (the CI example's tools job
# and scripts/example.sh run the same script: the runtimes are the ones built above). The
# tests run infer-build as `cargo test` built it, and the install (and the CI example's tools
# job, which inherits these variables) installs that same binary instead of compiling the
# builder again (a `cargo build` of it alone resolves other dependency features: 3 minutes).
export INFER_BUILD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/infer-build"
export INFER_BUILD_PROFILE=${INFER_BUILD_PROFILE:-dev}
TENSORRT_ROOT="$trt_headers" scripts/install.sh --prefix target/install --with-gpu >/dev/null

# Every test target (the builder's tests need the runtimes, infer-trt's the GPU one), each binary
# run as `cargo test` runs it, from its package's directory: the builder's integration tests
# (`tests`) INTEGRATION_THREADS at a time (default 3: they wait on Docker, registries and
# Python more than they compute), the others with libtest's default. Then the documentation's
# examples.
late=()
for f in tests/*.rs crates/*/tests/*.rs; do late+=(--test "$(basename "$f" .rs)"); done
cargo test --workspace "${late[@]}" --no-run --message-format=json-render-diagnostics \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["manifest_path"], m["executable"], sep="\t")
' >"$bg_dir/tests"
while IFS=$'\t' read -r name manifest exe; do
    threads=()
    [[ $name == tests ]] && threads=(--test-threads="${INTEGRATION_THREADS:-3}")
    echo "==> $name ($exe)" >&2
    (cd "$(dirname "$manifest")" && "$exe" ${threads[@]+"${threads[@]}"})
done <"$bg_dir/tests"
[[ -s $bg_dir/tests ]] || { echo "test.sh: no test binaries were built" >&2; exit 1; }
cargo test --workspace --doc
