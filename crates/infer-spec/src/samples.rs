//! Warm-up samples: the file a recipe's `[warmup] samples` names, shipped in the image and named
//! by `runtime.toml`'s `[warmup] samples`. It holds one V2 inference request in JSON
//! (`{"inputs": [{"name", "datatype", "shape", "data"}]}`, as a client would send it, without
//! binary data) or a JSON array of them. The builder checks them against the model's inputs
//! ([`check`]); the runtime decodes each as it decodes a request and warms up on it.

use serde_json::Value;

use crate::runtime::RuntimeConfig;

/// Element `i` of a synthetic integer or boolean input, where no sample is given (the runtime's
/// warm-up; the builder's measurements and checks): 0 and 1 alternating. Valid as a token id, a
/// mask and an index into any table of two rows or more (a segment or token-type embedding has
/// two), so a model the builder ran on these values runs on them at start.
pub fn synthetic_integer(i: usize) -> u8 {
    (i % 2) as u8
}

/// Element `i` of a synthetic floating-point input: 0, 1/7, …, 6/7, repeating.
pub fn synthetic_unit(i: usize) -> f64 {
    (i % 7) as f64 / 7.0
}

/// The largest samples file accepted: it is read whole, at build time and at start, and both
/// readers refuse a larger one before reading it.
pub const MAX_BYTES: u64 = 256 << 20;

/// The requests of a samples file, in order; an error says what is wrong with the file.
pub fn requests(text: &str) -> Result<Vec<Value>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let list = match doc {
        Value::Array(items) => items,
        one @ Value::Object(_) => vec![one],
        other => {
            return Err(format!(
                "expected a V2 inference request (a JSON object with \"inputs\") or an array of them, found {}",
                kind(&other)
            ))
        }
    };
    if list.is_empty() {
        return Err("the file holds no request".into());
    }
    for (i, r) in list.iter().enumerate() {
        if !r.get("inputs").is_some_and(Value::is_array) {
            return Err(format!(
                "request {i}: expected an object with an \"inputs\" array"
            ));
        }
    }
    Ok(list)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The number of leaf values of a (possibly nested) JSON `data` array.
fn leaves(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(leaves).sum(),
        _ => 1,
    }
}

/// Checks every request of the samples file `text` against `cfg`: each model input exactly
/// once and nothing else, its datatype, its shape (a batch of 1 to `max_batch_size` rows,
/// fixed dimensions as declared, variable ones within their profile's bounds), and as many
/// data values as the shape holds. Returns the number of requests; the error names the
/// request and the input.
pub fn check(cfg: &RuntimeConfig, text: &str) -> Result<usize, String> {
    let list = requests(text)?;
    for (i, r) in list.iter().enumerate() {
        let at = |m: String| format!("request {i}: {m}");
        let inputs = r["inputs"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for spec in &cfg.inputs {
            let given: Vec<&Value> = inputs
                .iter()
                .filter(|t| t.get("name").and_then(Value::as_str) == Some(spec.name.as_str()))
                .collect();
            match given.len() {
                0 => return Err(at(format!("input {:?} is missing", spec.name))),
                1 => {}
                _ => return Err(at(format!("input {:?} is given twice", spec.name))),
            }
        }
        for t in inputs {
            let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
            let Some(spec) = cfg.inputs.iter().find(|s| s.name == name) else {
                let known: Vec<&str> = cfg.inputs.iter().map(|s| s.name.as_str()).collect();
                return Err(at(format!(
                    "unknown input {name:?} (the model's inputs are {known:?})"
                )));
            };
            let at = |m: String| format!("request {i}: input {name:?}: {m}");
            let datatype = t
                .get("datatype")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !datatype.eq_ignore_ascii_case(spec.datatype.as_str()) {
                return Err(at(format!(
                    "datatype {datatype:?} does not match the model's {}",
                    spec.datatype
                )));
            }
            let shape: Option<Vec<u64>> = t
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_u64).collect());
            let Some(shape) = shape else {
                return Err(at(
                    "\"shape\" must be an array of non-negative integers".into()
                ));
            };
            if shape.len() != spec.dims.len() {
                return Err(at(format!(
                    "shape {shape:?} has {} dimensions, the model's has {}",
                    shape.len(),
                    spec.dims.len()
                )));
            }
            let rows = shape[0];
            if rows == 0 || rows > u64::from(cfg.batching.max_batch_size.max(1)) {
                return Err(at(format!(
                    "batch of {rows} rows: 1 to max_batch_size ({}) are served",
                    cfg.batching.max_batch_size
                )));
            }
            for (d, (&got, &want)) in shape.iter().zip(&spec.dims).enumerate().skip(1) {
                let ok = if want >= 0 {
                    i64::try_from(got).ok() == Some(want)
                } else {
                    match &spec.profile {
                        Some(p) => {
                            let (lo, hi) = (p.min[d - 1], p.max[d - 1]);
                            i64::try_from(got).is_ok_and(|g| lo <= g && g <= hi)
                        }
                        None => got > 0,
                    }
                };
                if !ok {
                    let bound = match (&spec.profile, want) {
                        (Some(p), -1) => format!("{} to {}", p.min[d - 1], p.max[d - 1]),
                        _ => want.to_string(),
                    };
                    return Err(at(format!(
                        "dimension {d} of shape {shape:?} is {got}, the model takes {bound}"
                    )));
                }
            }
            if t.get("parameters")
                .and_then(|p| p.get("binary_data_size"))
                .is_some()
            {
                return Err(at("binary data cannot be given in a samples file".into()));
            }
            let Some(data) = t.get("data") else {
                return Err(at("has no \"data\"".into()));
            };
            let want: u64 = shape.iter().product();
            let got = leaves(data) as u64;
            if got != want {
                return Err(at(format!(
                    "\"data\" holds {got} values, shape {shape:?} needs {want}"
                )));
            }
        }
    }
    Ok(list.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RuntimeConfig {
        RuntimeConfig::from_toml_str(
            r#"
[model]
name = "m"

[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, -1]
profile = { min = [3, 2], opt = [3, 4], max = [3, 8] }

[[inputs]]
name = "ids"
datatype = "INT64"
dims = [-1, 2]

[[outputs]]
name = "y"
datatype = "FP32"
dims = [-1, 1]

[batching]
max_batch_size = 4

[engine]
kind = "tract-onnx"
path = "model.onnx"
"#,
        )
        .unwrap()
    }

    fn req(x_shape: &str, x_data: &str, extra: &str) -> String {
        format!(
            r#"{{"inputs": [{{"name": "x", "datatype": "FP32", "shape": {x_shape}, "data": {x_data}}},
                {{"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}}{extra}]}}"#
        )
    }

    #[test]
    fn samples_are_checked_against_the_served_inputs() {
        let c = cfg();
        let six = "[1, 2, 3, 4, 5, 6]";
        let ok = req("[1, 3, 2]", six, "");
        assert_eq!(check(&c, &ok), Ok(1));
        // A list of requests; nested data counts its leaves.
        let nested = req("[1, 3, 2]", "[[[1, 2], [3, 4], [5, 6]]]", "");
        assert_eq!(check(&c, &format!("[{ok}, {nested}]")), Ok(2));
        for (text, want) in [
            ("{", "not valid JSON"),
            ("3", "found a number"),
            ("[]", "holds no request"),
            (
                "[{}]",
                "request 0: expected an object with an \"inputs\" array",
            ),
            (
                &req(
                    "[1, 3, 2]",
                    six,
                    r#", {"name": "z", "datatype": "FP32", "shape": [1], "data": [1]}"#,
                ),
                "unknown input \"z\"",
            ),
            (
                r#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 2], "data": [1, 2, 3, 4, 5, 6]}]}"#,
                "input \"ids\" is missing",
            ),
            (
                &req("[1, 3, 2]", six, "").replace("FP32", "FP16"),
                "datatype \"FP16\" does not match the model's FP32",
            ),
            (
                &req("[1, 3]", six, ""),
                "has 2 dimensions, the model's has 3",
            ),
            (
                &req("[5, 3, 2]", six, ""),
                "batch of 5 rows: 1 to max_batch_size (4)",
            ),
            (&req("[0, 3, 2]", six, ""), "batch of 0 rows"),
            (
                &req("[1, 4, 2]", six, ""),
                "dimension 1 of shape [1, 4, 2] is 4, the model takes 3",
            ),
            (
                &req("[1, 3, 9]", six, ""),
                "dimension 2 of shape [1, 3, 9] is 9, the model takes 2 to 8",
            ),
            (
                &req("[1, 3, 2]", "[1, 2, 3]", ""),
                "\"data\" holds 3 values, shape [1, 3, 2] needs 6",
            ),
            (
                &req("[1, -3, 2]", six, ""),
                "\"shape\" must be an array of non-negative integers",
            ),
        ] {
            let e = check(&c, text).unwrap_err();
            assert!(e.contains(want), "{text}\n  got: {e}\n  want: {want}");
        }
    }
}
