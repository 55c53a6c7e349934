//! Building KServe V2 `infer` request bodies from the model's metadata, in JSON or with the
//! binary tensor data extension (`Inference-Header-Content-Length`, raw little-endian bytes).

use infer_spec::DataType;
use serde_json::{json, Value};

use super::load::{Endpoint, Prepared, Rng};
use super::Error;

/// One input tensor as the server's metadata describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorMeta {
    pub name: String,
    pub datatype: String,
    /// Dims, -1 for dynamic; the first is the batch dimension when the model batches.
    pub shape: Vec<i64>,
}

/// The parts of `GET /v2/models/{m}` that bench needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelMeta {
    pub name: String,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<String>,
}

/// Request encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) enum Protocol {
    Json,
    Binary,
}

/// Parse model metadata JSON.
pub(crate) fn parse_metadata(model: &str, body: &[u8]) -> Result<ModelMeta, Error> {
    let bad = |why: String| Error::Metadata {
        model: model.to_string(),
        why,
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let inputs = v
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no `inputs` array".into()))?;
    let mut ins = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("inputs[{i}] has no name")))?;
        let datatype = t
            .get("datatype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("input `{name}` has no datatype")))?;
        let shape = t
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(format!("input `{name}` has no shape")))?
            .iter()
            .map(Value::as_i64)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| bad(format!("input `{name}` has a non-integer dim")))?;
        ins.push(TensorMeta {
            name: name.to_string(),
            datatype: datatype.to_string(),
            shape,
        });
    }
    let outputs = v
        .get("outputs")
        .and_then(Value::as_array)
        .map(|o| {
            o.iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(ModelMeta {
        name: model.to_string(),
        inputs: ins,
        outputs,
    })
}

/// Bytes per element of a V2 datatype bench can generate.
/// The concrete shape sent for `t` with `batch` rows: the first dynamic dim is the batch.
fn concrete_shape(model: &str, t: &TensorMeta, batch: u32) -> Result<Vec<i64>, Error> {
    let mut out = Vec::with_capacity(t.shape.len());
    for (i, &d) in t.shape.iter().enumerate() {
        if d >= 0 {
            out.push(d);
        } else if i == 0 {
            out.push(i64::from(batch));
        } else {
            return Err(Error::Metadata {
                model: model.to_string(),
                why: format!(
                    "input `{}` has a dynamic dim {i} besides the batch: bench cannot choose it",
                    t.name
                ),
            });
        }
    }
    Ok(out)
}

/// Deterministic, dtype-valid values (floats in [0, 1), small integers, 0/1 booleans) for a
/// fixed-size `dt` (the caller refuses `BYTES`).
fn values(dt: DataType, n: usize, rng: &mut Rng) -> (Vec<Value>, Vec<u8>) {
    let size = dt.size().unwrap_or(1);
    let mut js = Vec::with_capacity(n);
    let mut raw = Vec::with_capacity(n * size);
    for _ in 0..n {
        match dt {
            DataType::F16 | DataType::BF16 => {
                // k/256 has at most 8 significant bits: exact in both half formats.
                let v = (rng.next_u64() % 256) as f32 / 256.0;
                js.push(json!(v));
                raw.extend_from_slice(&half_bits(dt, v).to_le_bytes());
            }
            DataType::F32 => {
                let v = rng.next_f64() as f32;
                js.push(json!(v));
                raw.extend_from_slice(&v.to_le_bytes());
            }
            DataType::F64 => {
                let v = rng.next_f64();
                js.push(json!(v));
                raw.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Bool => {
                let v = rng.next_u64() & 1 == 1;
                js.push(json!(v));
                raw.push(u8::from(v));
            }
            _ => {
                let v = (rng.next_u64() % 10) as u8;
                js.push(json!(v));
                raw.push(v);
                raw.extend(std::iter::repeat_n(0u8, size - 1));
            }
        }
    }
    (js, raw)
}

/// The FP16 or BF16 bits of `v`, a value in [0, 1) with at most 8 significant bits.
fn half_bits(dt: DataType, v: f32) -> u16 {
    let b = v.to_bits();
    if dt == DataType::BF16 {
        return (b >> 16) as u16;
    }
    if v == 0.0 {
        return 0;
    }
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// Build the `infer` request for `batch` rows.
pub(crate) fn infer_request(
    ep: &Endpoint,
    meta: &ModelMeta,
    batch: u32,
    protocol: Protocol,
    seed: u64,
) -> Result<Prepared, Error> {
    let mut rng = Rng::new(seed);
    let mut inputs = Vec::new();
    let mut blob = Vec::new();
    for t in &meta.inputs {
        let Some(dt) = DataType::parse(&t.datatype).filter(|d| d.size().is_some()) else {
            return Err(Error::Metadata {
                model: meta.name.clone(),
                why: format!(
                    "input `{}` has datatype {} which bench cannot generate",
                    t.name, t.datatype
                ),
            });
        };
        let shape = concrete_shape(&meta.name, t, batch)?;
        let n: i64 = shape.iter().product();
        let n = usize::try_from(n).map_err(|_| Error::Metadata {
            model: meta.name.clone(),
            why: format!("input `{}` has a negative element count", t.name),
        })?;
        let (js, raw) = values(dt, n, &mut rng);
        match protocol {
            Protocol::Json => inputs.push(json!({
                "name": t.name, "shape": shape, "datatype": t.datatype, "data": js
            })),
            Protocol::Binary => {
                inputs.push(json!({
                    "name": t.name, "shape": shape, "datatype": t.datatype,
                    "parameters": {"binary_data_size": raw.len()}
                }));
                blob.extend_from_slice(&raw);
            }
        }
    }
    let path = format!("{}/v2/models/{}/infer", ep.base, meta.name);
    match protocol {
        Protocol::Json => Ok(Prepared {
            method: hyper::Method::POST,
            path,
            content_type: "application/json",
            header_len: None,
            body: serde_json::to_vec(&json!({ "inputs": inputs }))
                .unwrap_or_default()
                .into(),
        }),
        Protocol::Binary => {
            let outputs: Vec<Value> = meta
                .outputs
                .iter()
                .map(|o| json!({"name": o, "parameters": {"binary_data": true}}))
                .collect();
            let mut header = json!({ "inputs": inputs });
            if !outputs.is_empty() {
                header["outputs"] = Value::Array(outputs);
            }
            let mut body = serde_json::to_vec(&header).unwrap_or_default();
            let header_len = body.len();
            body.extend_from_slice(&blob);
            Ok(Prepared {
                method: hyper::Method::POST,
                path,
                content_type: "application/octet-stream",
                header_len: Some(header_len),
                body: body.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = r#"{"name":"mlp","versions":["1"],"platform":"onnx",
        "inputs":[{"name":"input","datatype":"FP32","shape":[-1,64]}],
        "outputs":[{"name":"output","datatype":"FP32","shape":[-1,10]}]}"#;

    fn ep() -> Endpoint {
        Endpoint {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: "127.0.0.1:1".into(),
            base: String::new(),
        }
    }

    /// FP16 and BF16 inputs get 2-byte values whose bits decode to the JSON numbers sent.
    #[test]
    fn half_precision_inputs_are_generated() {
        fn f16_to_f32(h: u16) -> f32 {
            let (e, m) = (i32::from((h >> 10) & 0x1f), f32::from(h & 0x3ff));
            if e == 0 {
                m * 2f32.powi(-24)
            } else {
                (1.0 + m / 1024.0) * 2f32.powi(e - 15)
            }
        }
        for dt in ["FP16", "BF16"] {
            let meta = META.replacen("FP32", dt, 1);
            let m = parse_metadata("mlp", meta.as_bytes()).unwrap();
            let mut rng = Rng::new(7);
            let d = DataType::parse(dt).unwrap();
            let (js, raw) = values(d, 64, &mut rng);
            assert_eq!(raw.len(), 128, "{dt}");
            for (i, v) in js.iter().enumerate() {
                let h = u16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]);
                let back = match d {
                    DataType::BF16 => f32::from_bits(u32::from(h) << 16),
                    _ => f16_to_f32(h),
                };
                assert_eq!(f64::from(back), v.as_f64().unwrap(), "{dt} value {i}");
            }
            assert!(js.iter().any(|v| v.as_f64().unwrap() > 0.0), "{dt}");
            let r = infer_request(&ep(), &m, 2, Protocol::Binary, 1).unwrap();
            let n = r.header_len.unwrap();
            assert_eq!(r.body.len() - n, 2 * 64 * 2, "{dt}");
        }
    }

    #[test]
    fn json_request_has_the_batch_and_all_values() {
        let m = parse_metadata("mlp", META.as_bytes()).unwrap();
        let r = infer_request(&ep(), &m, 3, Protocol::Json, 1).unwrap();
        assert_eq!(r.path, "/v2/models/mlp/infer");
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["inputs"][0]["shape"], json!([3, 64]));
        assert_eq!(v["inputs"][0]["data"].as_array().unwrap().len(), 192);
    }

    #[test]
    fn binary_request_has_header_length_and_raw_bytes() {
        let m = parse_metadata("mlp", META.as_bytes()).unwrap();
        let r = infer_request(&ep(), &m, 2, Protocol::Binary, 1).unwrap();
        let n = r.header_len.unwrap();
        let header: Value = serde_json::from_slice(&r.body[..n]).unwrap();
        assert_eq!(
            header["inputs"][0]["parameters"]["binary_data_size"],
            json!(512)
        );
        assert_eq!(
            header["outputs"][0]["parameters"]["binary_data"],
            json!(true)
        );
        assert_eq!(r.body.len() - n, 2 * 64 * 4);
    }

    #[test]
    fn bad_metadata_is_named() {
        for (body, frag) in [
            ("nope", "not JSON"),
            ("{}", "no `inputs`"),
            (
                r#"{"inputs":[{"name":"x","datatype":"BYTES","shape":[-1]}]}"#,
                "BYTES",
            ),
            (
                r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[-1,-1]}]}"#,
                "dynamic dim 1",
            ),
        ] {
            let e = parse_metadata("m", body.as_bytes())
                .and_then(|m| infer_request(&ep(), &m, 1, Protocol::Json, 1))
                .unwrap_err()
                .to_string();
            assert!(e.contains(frag), "{body}: {e}");
        }
    }
}
