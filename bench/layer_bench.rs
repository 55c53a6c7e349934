//! `cargo run --release --example layer-bench -- FILE LAYOUT COMPRESSION`: write one layer
//! holding FILE (as the model of an image) into a fresh OCI layout with the given encoding
//! (`gzip`, `gzip-stored`, `zstd`, `none`), bypassing the build cache, and print one JSON line
//! with the digest, sizes and seconds. Driven by `bench/layers.sh`.
#![allow(
    clippy::disallowed_macros,
    reason = "a measurement program: its report is its output"
)]

use std::path::PathBuf;
use std::time::Instant;

use infer_build::oci::{canonicalize, write_layer, BlobStore, Compression, Entry, LayerOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: layer-bench FILE LAYOUT gzip|gzip-stored|zstd|none");
        std::process::exit(2);
    }
    let file = PathBuf::from(&args[1]);
    let Some(c) = Compression::parse(&args[3]) else {
        eprintln!("unknown compression {}", args[3]);
        std::process::exit(2);
    };
    let run = || -> Result<String, Box<dyn std::error::Error>> {
        let size = std::fs::metadata(&file)?.len();
        let store = BlobStore::create(&PathBuf::from(&args[2]))?;
        let entries = canonicalize(vec![Entry::file(
            "opt/infer/model/model.onnx",
            0o644,
            file.clone(),
            size,
        )])?;
        let workers = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let opts = LayerOptions {
            compression: c,
            mtime: 0,
            zstd_workers: workers,
        };
        let t = Instant::now();
        let r = write_layer(&store, &entries, &opts, &mut |_| {})?;
        let secs = t.elapsed().as_secs_f64();
        Ok(format!(
            "{{\"compression\":\"{}\",\"digest\":\"{}\",\"size\":{},\"tar_size\":{},\"seconds\":{secs:.3}}}",
            c.name(),
            r.digest,
            r.size,
            r.tar_size
        ))
    };
    match run() {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
