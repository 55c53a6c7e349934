//! The cost of decoding a V2 request and encoding its response, for `docs/BENCHMARKS.md`.
//!
//! Uses the benchmark's request (the example MLP: one FP32 input of 1×64, the values Python's
//! `json.dumps` writes, up to 17 significant digits) in JSON and in binary form, and a 1×10 FP32
//! response. Prints one JSON line: median nanoseconds per call over 7 rounds.
//!
//!   cargo run --release -p infer-serve --no-default-features --example codec_cost
#![allow(
    clippy::disallowed_macros,
    reason = "a measurement program: its report is its output"
)]

use bytes::Bytes;
use infer_serve::tensor::Tensor;
use infer_serve::v2::{self, RequestedOutput};
use infer_spec::{DataType, RuntimeConfig};
use std::hint::black_box;
use std::time::Instant;

const CONFIG: &str = include_str!("../testdata/mlp.runtime.toml");

fn median_ns(n: u32, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[3]
}

fn main() {
    let cfg = RuntimeConfig::from_toml_str(CONFIG).expect("config");
    // The values bench/runtime.py sends: (i % 13) / 13 as Python prints them.
    let xs: Vec<f64> = (0..64).map(|i| f64::from(i % 13) / 13.0).collect();
    let data: Vec<String> = xs.iter().map(|x| format!("{x:?}")).collect();
    let json = Bytes::from(format!(
        r#"{{"inputs":[{{"name":"input","shape":[1,64],"datatype":"FP32","data":[{}]}}]}}"#,
        data.join(",")
    ));
    let header = r#"{"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","parameters":{"binary_data_size":256}}],"outputs":[{"name":"output","parameters":{"binary_data":true}}]}"#;
    let mut binary = header.as_bytes().to_vec();
    for x in &xs {
        binary.extend((*x as f32).to_le_bytes());
    }
    let binary = Bytes::from(binary);

    let decode_json = median_ns(20_000, || {
        black_box(v2::decode_request(&cfg, None, black_box(&json)).expect("decode"));
    });
    let decode_binary = median_ns(20_000, || {
        black_box(
            v2::decode_request(&cfg, Some(header.len()), black_box(&binary)).expect("decode"),
        );
    });
    let out = Tensor {
        dtype: DataType::F32,
        shape: vec![1, 10],
        data: Bytes::from(
            (0..10)
                .flat_map(|i| (i as f32 * 0.123_456_79 - 0.5).to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
    };
    let encode = |binary: bool| {
        median_ns(20_000, || {
            let sel = [(
                RequestedOutput {
                    index: 0,
                    binary,
                    classification: None,
                },
                &out,
            )];
            black_box(v2::encode_response(&cfg, None, black_box(&sel)));
        })
    };
    let (encode_json, encode_binary) = (encode(false), encode(true));
    println!(
        r#"{{"decode_json_ns":{decode_json:.0},"decode_binary_ns":{decode_binary:.0},"encode_json_ns":{encode_json:.0},"encode_binary_ns":{encode_binary:.0},"json_bytes":{}}}"#,
        json.len()
    );
}
