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

# infer-build and the runtime installed the way users install them (the CI example's tools job
# and scripts/example.sh run the same script: its runtime is the one built above, and
# infer-build is built once more with the release profile).
scripts/install.sh --prefix target/install >/dev/null

# The runtime the tests start on loopback carries the synthetic cost-model backend (never
# shipped in images) and the ONNX Runtime backend; building it here keeps the tests' own build
# of it a no-op.
cargo build -q -p infer-serve --features synthetic,onnxruntime --target-dir target/serve-it

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The TensorRT backend, its C++ shim compiled against TensorRT's public headers (no GPU needed).
TENSORRT_ROOT="$PWD/../shared/third_party/tensorrt-headers/10.16" \
    cargo clippy -p infer-trt -p infer-serve --features infer-serve/tensorrt --all-targets -- -D warnings
cargo clippy -p infer-serve --features onnxruntime --all-targets -- -D warnings
cargo test --workspace
