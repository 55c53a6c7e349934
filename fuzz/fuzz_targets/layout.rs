//! Any bytes given to the OCI layout readers (`oci::layout::walk`, which `build --base-layout`,
//! `inspect` and archives use, and `slim::read_layout` + `flatten`) end in images or in
//! an error: never a panic, never unbounded memory.
//!
//! The input is a sequence of chunks, each a little-endian `u16` length and that many bytes
//! (a short tail is one last chunk). Chunk 0 is `index.json`; every chunk is also stored as a
//! blob under its sha256. So that the fuzzer can reach manifests, configs and layers, a token
//! `@N@` in a chunk is replaced by the digest of chunk N (N later than the chunk: references
//! point forward, as in a real layout) before it is hashed and written.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sha2::{Digest as _, Sha256};

fn chunks(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !data.is_empty() && out.len() < 16 {
        if data.len() < 2 {
            out.push(data.to_vec());
            break;
        }
        let n = u16::from_le_bytes([data[0], data[1]]) as usize;
        let end = (2 + n).min(data.len());
        out.push(data[2..end].to_vec());
        data = &data[end..];
    }
    out
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

fn write_layout(dir: &Path, data: &[u8]) {
    let mut parts = chunks(data);
    let mut digests = vec![String::new(); parts.len()];
    for k in (0..parts.len()).rev() {
        for j in k + 1..parts.len() {
            parts[k] = replace(&parts[k], format!("@{j}@").as_bytes(), digests[j].as_bytes());
        }
        digests[k] = format!("sha256:{}", hex::encode(Sha256::digest(&parts[k])));
    }
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    if let Some(index) = parts.first() {
        std::fs::write(dir.join("index.json"), index).unwrap();
    }
    for (p, d) in parts.iter().zip(&digests) {
        std::fs::write(dir.join("blobs/sha256").join(&d[7..]), p).unwrap();
    }
}

fuzz_target!(|data: &[u8]| {
    let tmp = tempfile::tempdir().unwrap();
    write_layout(tmp.path(), data);
    if let Ok(store) = infer_build::oci::BlobStore::open(tmp.path()) {
        if let Ok((images, _)) = infer_build::oci::walk(&store) {
            for img in images {
                for l in &img.manifest.layers {
                    let _ = store.verify(&l.digest, l.size);
                }
            }
        }
    }
    if let Ok(img) = infer_build::slim::read_layout(tmp.path(), None) {
        let _ = infer_build::slim::flatten(&img);
    }
});
