//! Generates the protobuf message types of the gRPC surface (`src/grpc/pb.rs` includes them)
//! from `proto/`. The `.proto` files are compiled by `protox`, a protobuf compiler in Rust, so
//! building needs no `protoc` on the machine; `prost-build` turns the descriptors into Rust.
#![allow(
    clippy::disallowed_macros,
    reason = "a build script speaks to cargo on stdout"
)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/grpc_service.proto", "proto/health.proto"];
    for f in [
        "proto/grpc_service.proto",
        "proto/model_config.proto",
        "proto/health.proto",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new()
        // Tensor bytes stay `Bytes`: decoding slices them out of the request body instead of
        // copying, and responses hand the batcher's output buffers over as they are.
        .bytes([
            ".inference.ModelInferRequest.raw_input_contents",
            ".inference.ModelInferResponse.raw_output_contents",
            ".inference.InferTensorContents.bytes_contents",
        ])
        // Deterministic maps (no HashMap iteration order in responses).
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
