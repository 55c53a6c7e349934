//! The protobuf messages of `proto/`, generated at build time by `build.rs` (prost).

#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// `package inference`: Triton's / KServe's V2 gRPC messages.
pub mod inference {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// `package grpc.health.v1`: the standard health checking messages.
pub mod health {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}
