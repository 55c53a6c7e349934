//! Compiles the C++ shim when the `tensorrt` feature is on AND `TENSORRT_ROOT` points at a
//! TensorRT installation (or a copy of the Apache-2.0 headers from NVIDIA/TensorRT `include/`).
//! Nothing is linked against TensorRT: the shim only makes virtual calls through the header's
//! inline wrappers, and the runtime library is opened with `dlopen` at run time.
#![allow(
    clippy::disallowed_macros,
    reason = "a build script speaks to cargo on stdout"
)]

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(infer_trt_shim)");
    println!("cargo::rerun-if-env-changed=TENSORRT_ROOT");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    println!("cargo::rerun-if-changed=shim/shim.cpp");
    println!("cargo::rerun-if-changed=shim/cuda_stub");
    if std::env::var_os("CARGO_FEATURE_TENSORRT").is_none() {
        return;
    }
    let Some(root) = std::env::var_os("TENSORRT_ROOT").map(PathBuf::from) else {
        println!("cargo::warning=infer-trt: TENSORRT_ROOT is not set; building without the TensorRT shim");
        return;
    };
    let include = root.join("include");
    if !include.join("NvInferRuntime.h").is_file() {
        println!(
            "cargo::warning=infer-trt: {} has no NvInferRuntime.h; building without the TensorRT shim",
            include.display()
        );
        return;
    }
    // A directory here makes cargo rerun when any file under it changes: headers swapped for
    // another release under the same TENSORRT_ROOT rebuild the shim.
    println!("cargo::rerun-if-changed={}", include.display());
    build_shim(&include);
    println!("cargo::rustc-cfg=infer_trt_shim");
}

#[cfg(feature = "tensorrt")]
fn build_shim(include: &std::path::Path) {
    // TensorRT's headers include cuda_runtime_api.h for the stream/event handle types only: use
    // the CUDA toolkit's when present, else the shim's stand-in.
    let cuda = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(std::path::PathBuf::from))
        .chain([std::path::PathBuf::from("/usr/local/cuda")])
        .map(|p| p.join("include"))
        .find(|p| p.join("cuda_runtime_api.h").is_file())
        .unwrap_or_else(|| std::path::PathBuf::from("shim/cuda_stub"));
    // Warnings on and fatal for the shim's own code; TensorRT's and CUDA's headers are system
    // headers (-isystem), whose deprecation warnings are theirs. tests/shim.rs compiles with the
    // same flags against every header release in ../shared/third_party.
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file("shim/shim.cpp")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true);
    for dir in [include, cuda.as_path()] {
        build.flag(format!("-isystem{}", dir.display()));
    }
    build.compile("infer_trt_shim");
    // The shim uses the C++ standard library; the TensorRT libraries are dlopen'ed.
    println!("cargo::rustc-link-lib=dylib=stdc++");
}

#[cfg(not(feature = "tensorrt"))]
fn build_shim(_include: &std::path::Path) {}
