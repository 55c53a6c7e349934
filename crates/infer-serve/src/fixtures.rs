//! The model the request decoders are tested and fuzzed against (unit tests of `v2` and
//! `grpc::codec`, and the `v2_request` / `grpc_request` fuzz targets, which build this crate
//! with the `fixtures` feature): an FP32 input `x` and an integer input `ids` of two columns,
//! optionally a BYTES input `s`; outputs `y` (FP32, two columns) and `z` (INT64, one column);
//! batches of at most 4.

use infer_spec::RuntimeConfig;

/// The configuration as `runtime.toml` text, with `ids` of datatype `ids` (`INT8`, `INT64`…)
/// and the BYTES input `s` when `strings`.
pub fn decoder_model_toml(ids: &str, strings: bool) -> String {
    let s = if strings {
        "[[inputs]]\nname = \"s\"\ndatatype = \"BYTES\"\ndims = [-1, 1]\n"
    } else {
        ""
    };
    format!(
        r#"[model]
name = "m"
[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 2]
[[inputs]]
name = "ids"
datatype = "{ids}"
dims = [-1, 2]
{s}[[outputs]]
name = "y"
datatype = "FP32"
dims = [-1, 2]
[[outputs]]
name = "z"
datatype = "INT64"
dims = [-1, 1]
[batching]
max_batch_size = 4
[engine]
kind = "tract-onnx"
path = "m.onnx"
"#
    )
}

/// [`decoder_model_toml`] parsed.
pub fn decoder_model(ids: &str, strings: bool) -> RuntimeConfig {
    RuntimeConfig::from_toml_str(&decoder_model_toml(ids, strings))
        .expect("the decoder test model parses")
}
