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

/// How long the sequences of a request are, for a model whose sequence dimension varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Lengths {
    /// The shortest, at least 1.
    pub min: u32,
    /// The longest, at least `min`.
    pub max: u32,
}

impl std::fmt::Display for Lengths {
    /// The form `--lengths` takes: `MIN-MAX`, or one length when they are equal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

impl Lengths {
    /// Short mixed sentences, as search queries and chat messages are: 4 to 48 words (text
    /// models) or tokens (padded tensor models).
    pub(crate) const DEFAULT: Lengths = Lengths { min: 4, max: 48 };

    /// Parses `MIN-MAX` (`8-64`) or one length (`32`: every request equally long).
    pub(crate) fn parse(s: &str) -> Result<Lengths, String> {
        let bad = || {
            format!(
                "--lengths `{s}` must be MIN-MAX with 1 <= MIN <= MAX (e.g. 4-48), or one length"
            )
        };
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let min: u32 = a.trim().parse().map_err(|_| bad())?;
        let max: u32 = b.trim().parse().map_err(|_| bad())?;
        if min == 0 || min > max {
            return Err(bad());
        }
        Ok(Lengths { min, max })
    }
}

/// Distinct request bodies a variable-length model gets, sent in turn: enough for a mix of
/// lengths to meet in every batch, few enough to prepare in a moment.
pub(crate) const VARIANTS: usize = 64;

/// How a model's requests vary, read from its inputs' metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Every dimension but the batch is fixed: one request body serves.
    Fixed,
    /// A text model: its `BYTES` inputs take one text per row.
    Text,
    /// A padded tensor model: inputs of shape `[-1, -1]` share one sequence length.
    Tokens,
}

/// Which [`Shape`] `meta`'s inputs have.
pub(crate) fn shape_of(meta: &ModelMeta) -> Shape {
    if meta.inputs.iter().any(|t| t.datatype == "BYTES") {
        Shape::Text
    } else if meta
        .inputs
        .iter()
        .any(|t| t.shape.len() == 2 && t.shape[1] < 0)
    {
        Shape::Tokens
    } else {
        Shape::Fixed
    }
}

/// The concrete shape sent for `t` with `batch` rows: the first dynamic dim is the batch, the
/// second a padded model's sequence `length`.
fn concrete_shape(
    model: &str,
    t: &TensorMeta,
    batch: u32,
    length: Option<u32>,
) -> Result<Vec<i64>, Error> {
    let mut out = Vec::with_capacity(t.shape.len());
    for (i, &d) in t.shape.iter().enumerate() {
        match (d, i, length) {
            (d, _, _) if d >= 0 => out.push(d),
            (_, 0, _) => out.push(i64::from(batch)),
            (_, 1, Some(l)) if t.shape.len() == 2 => out.push(i64::from(l)),
            _ => {
                return Err(Error::Metadata {
                    model: model.to_string(),
                    why: format!(
                    "input `{}` has a dynamic dim {i} besides the batch: bench cannot choose it",
                    t.name
                ),
                })
            }
        }
    }
    Ok(out)
}

/// Words bench's texts are made of: common English words, most of them one token in the
/// usual vocabularies, so a text of n words is about n tokens.
const WORDS: [&str; 48] = [
    "the",
    "a",
    "model",
    "serves",
    "text",
    "fast",
    "and",
    "with",
    "every",
    "request",
    "in",
    "one",
    "batch",
    "of",
    "short",
    "long",
    "sentences",
    "people",
    "search",
    "for",
    "answers",
    "about",
    "weather",
    "travel",
    "food",
    "music",
    "prices",
    "news",
    "sports",
    "health",
    "today",
    "this",
    "week",
    "new",
    "best",
    "how",
    "to",
    "make",
    "good",
    "coffee",
    "at",
    "home",
    "near",
    "me",
    "open",
    "late",
    "city",
    "park",
];

/// A deterministic sentence of `words` words.
pub(crate) fn sentence(words: u32, rng: &mut Rng) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    s.push('.');
    s
}

/// A length in `lengths`, uniformly.
fn draw(lengths: Lengths, rng: &mut Rng) -> u32 {
    let span = u64::from(lengths.max - lengths.min) + 1;
    lengths.min + (rng.next_u64() % span) as u32
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

/// `n` ones of `dt` (a padded model's tokens: valid ids, mask and type ids).
fn ones(dt: DataType, n: usize) -> (Vec<Value>, Vec<u8>) {
    let size = dt.size().unwrap_or(1);
    let mut one = vec![0u8; size];
    match dt {
        DataType::F16 => one.copy_from_slice(&0x3c00u16.to_le_bytes()),
        DataType::BF16 => one.copy_from_slice(&0x3f80u16.to_le_bytes()),
        DataType::F32 => one.copy_from_slice(&1f32.to_le_bytes()),
        DataType::F64 => one.copy_from_slice(&1f64.to_le_bytes()),
        _ => one[0] = 1,
    }
    (vec![json!(1); n], one.repeat(n))
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

/// One request bench sends and what it holds.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    pub request: Prepared,
    /// A padded tensor model's sequence length.
    pub length: Option<u32>,
    /// A text model's texts: per `BYTES` input, one per row.
    pub texts: Vec<Vec<String>>,
}

/// The requests for `batch` rows bench sends in turn: one for a model of fixed shapes,
/// [`VARIANTS`] of lengths drawn from `lengths` (seeded) for a text or padded tensor model.
pub(crate) fn infer_requests(
    ep: &Endpoint,
    meta: &ModelMeta,
    batch: u32,
    protocol: Protocol,
    seed: u64,
    lengths: Lengths,
) -> Result<Vec<Variant>, Error> {
    // An image model's `image` input takes encoded files, which bench has none of: refused by
    // name rather than sent texts the server would answer 400 to.
    if let Some(t) = meta
        .inputs
        .iter()
        .find(|t| t.datatype == "BYTES" && t.name == infer_spec::vision::IMAGE_INPUT)
    {
        return Err(Error::Metadata {
            model: meta.name.clone(),
            why: format!(
                "its input `{}` takes encoded images (a [vision] model) and bench sends tensors and texts, not photographs: load it with your own images on POST /predictions/{} (wrk, hey, or a V2 client)",
                t.name, meta.name
            ),
        });
    }
    let shape = shape_of(meta);
    let count = if shape == Shape::Fixed { 1 } else { VARIANTS };
    let mut rng = Rng::new(seed ^ 0x6c65_6e67_7468_7321);
    let text_inputs = meta.inputs.iter().filter(|t| t.datatype == "BYTES").count();
    (0..count as u64)
        .map(|k| {
            let (length, texts) = match shape {
                Shape::Fixed => (None, Vec::new()),
                Shape::Tokens => (Some(draw(lengths, &mut rng)), Vec::new()),
                Shape::Text => {
                    let mut texts = Vec::with_capacity(text_inputs);
                    for _ in 0..text_inputs {
                        let rows = (0..batch)
                            .map(|_| {
                                let words = draw(lengths, &mut rng);
                                sentence(words, &mut rng)
                            })
                            .collect();
                        texts.push(rows);
                    }
                    (None, texts)
                }
            };
            let request = encode(
                ep,
                meta,
                batch,
                protocol,
                seed.wrapping_add(k),
                length,
                &texts,
            )?;
            Ok(Variant {
                request,
                length,
                texts,
            })
        })
        .collect()
}

/// The `BYTES` tensor of `texts`: JSON strings, or each text's 4-byte little-endian length
/// and bytes (the binary extension).
fn text_values(texts: &[String]) -> (Vec<Value>, Vec<u8>) {
    let js = texts.iter().map(|t| json!(t)).collect();
    let mut raw = Vec::new();
    for t in texts {
        raw.extend_from_slice(&(t.len() as u32).to_le_bytes());
        raw.extend_from_slice(t.as_bytes());
    }
    (js, raw)
}

/// The request for `batch` rows: a padded model's variable inputs `length` long (every token
/// 1: a valid id, mask and type id in the usual vocabularies), a text model's `BYTES` inputs
/// from `texts` in order.
fn encode(
    ep: &Endpoint,
    meta: &ModelMeta,
    batch: u32,
    protocol: Protocol,
    seed: u64,
    length: Option<u32>,
    texts: &[Vec<String>],
) -> Result<Prepared, Error> {
    let mut rng = Rng::new(seed);
    let mut inputs = Vec::new();
    let mut blob = Vec::new();
    let mut texts = texts.iter();
    for t in &meta.inputs {
        let unfit = |why: &str| Error::Metadata {
            model: meta.name.clone(),
            why: format!("input `{}` {why}", t.name),
        };
        let (shape, (js, raw)) = if t.datatype == "BYTES" {
            if !matches!(t.shape[..], [-1] | [-1, 1]) {
                return Err(unfit(&format!(
                    "is BYTES of shape {:?}: bench sends one text per row ([-1] or [-1, 1])",
                    t.shape
                )));
            }
            let rows = texts
                .next()
                .ok_or_else(|| unfit("is BYTES: bench sends texts only to a text model"))?;
            let mut shape = vec![i64::from(batch)];
            shape.extend(&t.shape[1..]);
            (shape, text_values(rows))
        } else {
            let Some(dt) = DataType::parse(&t.datatype).filter(|d| d.size().is_some()) else {
                return Err(unfit(&format!(
                    "has datatype {} which bench cannot generate",
                    t.datatype
                )));
            };
            let shape = concrete_shape(&meta.name, t, batch, length)?;
            let n: i64 = shape.iter().product();
            let n = usize::try_from(n).map_err(|_| unfit("has a negative element count"))?;
            let variable = t.shape.len() == 2 && t.shape[1] < 0;
            (
                shape,
                if variable {
                    ones(dt, n)
                } else {
                    values(dt, n, &mut rng)
                },
            )
        };
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

    /// The request for `batch` rows of a model of fixed shapes.
    fn infer_request(
        ep: &Endpoint,
        meta: &ModelMeta,
        batch: u32,
        protocol: Protocol,
        seed: u64,
    ) -> Result<Prepared, Error> {
        encode(ep, meta, batch, protocol, seed, None, &[])
    }

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

    /// A text model gets texts of mixed lengths, one per row, in JSON and in the binary
    /// extension; a padded tensor model gets ones of mixed lengths on its `[-1, -1]` inputs;
    /// a model of fixed shapes one request; the same seed the same requests.
    #[test]
    fn variable_length_models_get_requests_of_mixed_lengths() {
        let text = parse_metadata(
            "e5",
            br#"{"inputs":[{"name":"text","datatype":"BYTES","shape":[-1,1]}],"outputs":[]}"#,
        )
        .unwrap();
        let lengths = Lengths { min: 3, max: 9 };
        let v = infer_requests(&ep(), &text, 2, Protocol::Json, 1, lengths).unwrap();
        assert_eq!(v.len(), VARIANTS);
        let mut words = std::collections::BTreeSet::new();
        for x in &v {
            let body: Value = serde_json::from_slice(&x.request.body).unwrap();
            assert_eq!(body["inputs"][0]["shape"], json!([2, 1]));
            let sent: Vec<&str> = body["inputs"][0]["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert_eq!(sent, x.texts[0]);
            for t in sent {
                let n = t.split(' ').count();
                assert!((3..=9).contains(&n), "{t}");
                words.insert(n);
            }
        }
        assert_eq!(words.len(), 7, "every length in 3-9 drawn: {words:?}");
        let bin = infer_requests(&ep(), &text, 1, Protocol::Binary, 1, lengths).unwrap();
        let r = &bin[0].request;
        let n = r.header_len.unwrap();
        let t = &bin[0].texts[0][0];
        assert_eq!(&r.body[n..n + 4], &(t.len() as u32).to_le_bytes());
        assert_eq!(&r.body[n + 4..], t.as_bytes());

        let padded = parse_metadata(
            "bert",
            br#"{"inputs":[{"name":"ids","datatype":"INT64","shape":[-1,-1]},
                {"name":"mask","datatype":"INT64","shape":[-1,-1]}],"outputs":[]}"#,
        )
        .unwrap();
        let v = infer_requests(&ep(), &padded, 1, Protocol::Binary, 1, lengths).unwrap();
        assert_eq!(v.len(), VARIANTS);
        for x in &v {
            let l = x.length.unwrap();
            assert!((3..=9).contains(&l));
            let n = x.request.header_len.unwrap();
            let header: Value = serde_json::from_slice(&x.request.body[..n]).unwrap();
            assert_eq!(header["inputs"][1]["shape"], json!([1, l]));
            let mut one = [0u8; 8];
            one[0] = 1;
            assert_eq!(&x.request.body[n..], one.repeat(2 * l as usize).as_slice());
        }
        let again = infer_requests(&ep(), &padded, 1, Protocol::Binary, 1, lengths).unwrap();
        assert!(v
            .iter()
            .zip(&again)
            .all(|(a, b)| a.request.body == b.request.body));

        let m = parse_metadata("mlp", META.as_bytes()).unwrap();
        let v = infer_requests(&ep(), &m, 1, Protocol::Json, 1, lengths).unwrap();
        assert_eq!((v.len(), v[0].length, v[0].texts.len()), (1, None, 0));
    }

    #[test]
    fn lengths_parse_or_say_the_form() {
        assert_eq!(Lengths::parse("8-64"), Ok(Lengths { min: 8, max: 64 }));
        assert_eq!(Lengths::parse("32"), Ok(Lengths { min: 32, max: 32 }));
        // The default the CLI shows is the form it parses.
        for l in [Lengths::DEFAULT, Lengths { min: 32, max: 32 }] {
            assert_eq!(Lengths::parse(&l.to_string()), Ok(l));
        }
        for bad in ["0-4", "9-3", "a-b", "", "-4"] {
            assert!(
                Lengths::parse(bad).unwrap_err().contains("MIN-MAX"),
                "{bad}"
            );
        }
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

    /// An image model's `image` input is refused with what to do instead, not sent texts.
    #[test]
    fn an_image_model_is_refused_by_name() {
        let m = parse_metadata(
            "effnet",
            br#"{"name":"effnet","inputs":[{"name":"image","datatype":"BYTES","shape":[-1,1]}],
                "outputs":[{"name":"logits","datatype":"FP32","shape":[-1,1000]}]}"#,
        )
        .unwrap();
        let lengths = Lengths { min: 4, max: 8 };
        let e = infer_requests(&ep(), &m, 1, Protocol::Json, 1, lengths)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model `effnet`: its input `image` takes encoded images")
                && e.contains("POST /predictions/effnet"),
            "{e}"
        );
    }
}
