#!/usr/bin/env bash
# The project's test command: format check, clippy with warnings denied, then every test of the
# workspace (unit tests and the one integration-test binary). Tests that need Docker, the
# registry or Python tools skip with a printed reason only where the tool is absent; `.ci/run`
# installs them all.
set -euo pipefail
cd "$(dirname "$0")/.."

# The statically linked runtime goes into the CPU images the end-to-end tests build and run.
INFER_SERVE_BIN="$(PROFILE=${INFER_SERVE_PROFILE:-release-serve} scripts/build-runtime.sh)"
export INFER_SERVE_BIN
# The glibc-dynamic runtime (tract and ONNX Runtime) that ONNX Runtime images carry.
INFER_SERVE_DYNAMIC_BIN="$(PROFILE=${INFER_SERVE_PROFILE:-release-serve} FLAVOUR=dynamic scripts/build-runtime.sh)"
export INFER_SERVE_DYNAMIC_BIN
# The runtime of GPU images (feature `tensorrt`, its shim compiled against TensorRT's public
# headers): the lean GPU image tests assemble it, load it into Docker and start it.
INFER_SERVE_GPU_BIN="$(PROFILE=${INFER_SERVE_PROFILE:-release-serve} FLAVOUR=gpu CHECK=1 \
    TENSORRT_ROOT="${TENSORRT_ROOT:-$PWD/../shared/third_party/tensorrt-headers/10.16}" scripts/build-runtime.sh)"
export INFER_SERVE_GPU_BIN

# infer-build and the runtime installed the way users install them (the CI example's tools job
# and scripts/example.sh run the same script: its runtimes are the ones built above). The tests
# run infer-build as `cargo test` builds it; the install (and the CI example's tools job, which
# inherits this variable) uses that same dev-profile build instead of compiling the builder a
# second time with the release profile.
export INFER_BUILD_PROFILE=${INFER_BUILD_PROFILE:-dev}
scripts/install.sh --prefix target/install >/dev/null

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The runtime's optional backends in one pass: TensorRT, its C++ shim compiled against
# TensorRT's public headers (no GPU needed), and ONNX Runtime.
TENSORRT_ROOT="$PWD/../shared/third_party/tensorrt-headers/10.16" \
    cargo clippy -p infer-trt -p infer-serve --features infer-serve/tensorrt,infer-serve/onnxruntime \
    --all-targets -- -D warnings
# The runtime the tests start on loopback carries the synthetic cost-model backend (never
# shipped in images) and the ONNX Runtime backend: infer-build's dev-dependency on infer-serve
# turns both on in this one build of the workspace.
cargo test --workspace --no-run
INFER_SERVE_TEST_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/infer-serve"
export INFER_SERVE_TEST_BIN
cargo test --workspace
