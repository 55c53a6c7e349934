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
    // The release the shim is compiled against, named in the binary (`HEADERS_MARK`) so that
    // infer-build can refuse a GPU runtime of another TensorRT major before writing an image.
    let version = std::fs::read_to_string(include.join("NvInferVersion.h"))
        .ok()
        .and_then(|h| headers_release(&h))
        .unwrap_or_else(|| {
            panic!(
                "infer-trt: no NV_TENSORRT_MAJOR/MINOR/PATCH in {}",
                include.join("NvInferVersion.h").display()
            )
        });
    println!("cargo::rustc-env=INFER_TRT_HEADERS={version}");
    println!("cargo::rustc-cfg=infer_trt_shim");
}

/// `major.minor.patch` from `NvInferVersion.h`: `#define NV_TENSORRT_MAJOR 8`, or (10.x and
/// later) `#define NV_TENSORRT_MAJOR TRT_MAJOR_ENTERPRISE` with that macro defined above it.
fn headers_release(header: &str) -> Option<String> {
    let define = |name: &str| {
        header.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some(name))
                .then(|| w.next().map(str::to_owned))
                .flatten()
        })
    };
    let number = |name: &str| {
        let v = define(name)?;
        match v.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => define(&v)?.parse().ok(),
        }
    };
    Some(format!(
        "{}.{}.{}",
        number("NV_TENSORRT_MAJOR")?,
        number("NV_TENSORRT_MINOR")?,
        number("NV_TENSORRT_PATCH")?
    ))
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
