//! The gRPC request decoder and response encoder: message framing, `ModelInferRequest` →
//! [`InferRequest`], tensors → `ModelInferResponse`. Pure: bytes and the model signature in,
//! a request or an [`ApiError`] out; no I/O, no batching, no model.
//!
//! Validation is the HTTP decoder's: names, datatypes and shapes go through the served
//! `Signature`'s one check (`signature::Inputs`), tensor bytes
//! (`raw_input_contents`, and typed `contents` once turned into bytes) through
//! `v2::check_binary`, so both protocols accept and refuse the same tensors with the same
//! words. No input can make it panic (the mutation test below and the
//! fuzz target `fuzz/fuzz_targets/grpc_request.rs`).

use super::pb::inference as pb;
use crate::error::ApiError;
use crate::signature::Signature;
use crate::tensor::Tensor;
use crate::v2::{self, InferRequest, RequestedOutput};
use bytes::Bytes;
use infer_spec::DataType;
#[cfg(test)]
use infer_spec::RuntimeConfig;
use pb::infer_parameter::ParameterChoice;
use prost::Message;

/// A gRPC message's prefix: a compressed flag byte, then the length (4 bytes, big endian).
pub const PREFIX: usize = 5;

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// The one message of a unary call's request body.
pub fn unframe(body: &Bytes) -> Result<Bytes, ApiError> {
    let Some(prefix) = body.get(..PREFIX) else {
        return Err(bad(format!(
            "the request body has {} bytes, fewer than a gRPC message prefix ({PREFIX})",
            body.len()
        )));
    };
    match prefix[0] {
        0 => {}
        1 => {
            return Err(ApiError::Unimplemented(
                "compressed messages are not supported (this server accepts identity only); send them uncompressed"
                    .to_owned(),
            ))
        }
        f => return Err(bad(format!("bad gRPC message prefix: compressed flag {f}"))),
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    let rest = body.len() - PREFIX;
    if rest != len {
        return Err(bad(format!(
            "the gRPC message prefix announces {len} bytes but {rest} follow (a unary call carries exactly one message)"
        )));
    }
    Ok(body.slice(PREFIX..))
}

/// `msg` with its gRPC prefix: the body of a successful unary response.
pub fn frame(msg: &impl Message) -> Bytes {
    let len = msg.encoded_len();
    let mut out = Vec::with_capacity(PREFIX + len);
    out.push(0);
    // A message over 4 GiB cannot be framed; responses are bounded far below by the model's
    // output shapes and max_batch_size.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    // Encoding into a Vec only fails when the buffer is too small, and a Vec grows.
    let _ = msg.encode(&mut out);
    Bytes::from(out)
}

/// Decodes one protobuf message; `what` names it in the error.
pub fn decode<M: Message + Default>(msg: Bytes, what: &str) -> Result<M, ApiError> {
    M::decode(msg).map_err(|e| bad(format!("malformed {what} message: {e}")))
}

/// Decodes and validates a `ModelInfer` request message (without its prefix). Outputs are
/// always answered in `raw_output_contents`, as Triton does, so every [`RequestedOutput`] is
/// binary.
pub fn decode_infer<'a>(
    sig: impl Into<Signature<'a>>,
    msg: Bytes,
) -> Result<InferRequest, ApiError> {
    let req: pb::ModelInferRequest = decode(msg, "ModelInferRequest")?;
    infer_request(sig.into(), req)
}

/// Validates a decoded `ModelInfer` request against the model's served signature (the model
/// it names, found by the caller: see [`decode_infer`] for one model).
pub fn infer_request(sig: Signature, req: pb::ModelInferRequest) -> Result<InferRequest, ApiError> {
    let pb::ModelInferRequest {
        model_name,
        model_version,
        id,
        parameters,
        inputs: given,
        outputs: requested,
        raw_input_contents: raw,
    } = req;
    sig.check_model(&model_name, &model_version)?;
    let timeout_us = param_u64(&parameters, "timeout", " (µs)", "")?;
    if !raw.is_empty() && raw.len() != given.len() {
        return Err(bad(format!(
            "raw_input_contents has {} entries but the request has {} inputs (one each, in the inputs' order)",
            raw.len(),
            given.len()
        )));
    }

    let mut inputs = sig.request();
    for (i, input) in given.into_iter().enumerate() {
        let dims: Result<Vec<u64>, _> = input.shape.iter().map(|&d| u64::try_from(d)).collect();
        let declared = inputs.declare(
            &input.name,
            &input.datatype,
            dims.as_deref()
                .map_err(|_| format!("shape {:?} has a negative dimension", input.shape)),
        )?;
        let (at, dtype, elements) = (&declared.at, declared.dtype, declared.elements());
        let contents = input
            .contents
            .filter(|c| *c != pb::InferTensorContents::default());
        let data = match (raw.get(i), contents) {
            (Some(_), Some(_)) => {
                return Err(bad(format!("{at}has both contents and raw_input_contents")))
            }
            (None, None) => {
                return Err(bad(format!(
                    "{at}has neither contents nor raw_input_contents"
                )))
            }
            (Some(data), None) => {
                v2::check_binary(dtype, elements, data)
                    .map_err(|m| bad(format!("{at}raw_input_contents: {m}")))?;
                data.clone()
            }
            (None, Some(c)) => {
                let data = contents_bytes(dtype, elements, &input.shape, c)
                    .map_err(|m| bad(format!("{at}{m}")))?;
                v2::check_binary(dtype, elements, &data).map_err(|m| bad(format!("{at}{m}")))?;
                data
            }
        };
        inputs.set(declared, data);
    }
    let (inputs, rows) = inputs.finish()?;

    let outputs = if requested.is_empty() {
        sig.all_outputs(true)
    } else {
        let mut out: Vec<RequestedOutput> = Vec::with_capacity(requested.len());
        for o in &requested {
            let at = format!("output {:?}: ", o.name);
            let count = param_u64(&o.parameters, "classification", "", &at)?;
            let classification = v2::classification_count(count, &at)?;
            let index = sig.output(&o.name, classification, &out)?;
            out.push(RequestedOutput {
                index,
                binary: true,
                classification,
            });
        }
        out
    };
    Ok(InferRequest {
        id: (!id.is_empty()).then_some(id),
        inputs,
        outputs,
        timeout_us,
        rows,
    })
}

/// The non-negative integer parameter `key` of `params` (`int64_param` or `uint64_param`);
/// the error names it, its `unit` and where it was (`at`).
fn param_u64(
    params: &std::collections::BTreeMap<String, pb::InferParameter>,
    key: &str,
    unit: &str,
    at: &str,
) -> Result<Option<u64>, ApiError> {
    match params.get(key).and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(ParameterChoice::Int64Param(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(ParameterChoice::Uint64Param(v)) => Ok(Some(*v)),
        Some(other) => Err(bad(format!(
            "{at}parameter {key:?} must be a non-negative integer{unit}, got {other:?}"
        ))),
    }
}

/// Typed `contents` as the runtime's little-endian tensor bytes. The field must be the one
/// the datatype uses (`int_contents` for INT8/16/32, …), with exactly the shape's element
/// count, every value in range.
fn contents_bytes(
    dtype: DataType,
    elements: usize,
    shape: &[i64],
    c: pb::InferTensorContents,
) -> Result<Bytes, String> {
    let fields = [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ];
    let want = match dtype {
        DataType::Bool => "bool_contents",
        DataType::I8 | DataType::I16 | DataType::I32 => "int_contents",
        DataType::I64 => "int64_contents",
        DataType::U8 | DataType::U16 | DataType::U32 => "uint_contents",
        DataType::U64 => "uint64_contents",
        DataType::F32 => "fp32_contents",
        DataType::F64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::F16 | DataType::BF16 => {
            return Err(format!(
                "{dtype} has no typed contents field; send it in raw_input_contents"
            ))
        }
    };
    if let Some((name, _)) = fields.iter().find(|(n, len)| *len > 0 && *n != want) {
        return Err(format!(
            "contents has {name}, but a {dtype} input takes {want}"
        ));
    }
    let n = fields.iter().find(|(f, _)| *f == want).map_or(0, |f| f.1);
    if n != elements {
        return Err(format!(
            "contents has {n} elements but shape {shape:?} needs {elements}"
        ));
    }
    let range =
        |v: &dyn std::fmt::Display| format!("contents value {v} is out of range for {dtype}");
    let mut out = Vec::with_capacity(elements * dtype.size().unwrap_or(8));
    macro_rules! narrow {
        ($list:expr, $t:ty) => {
            for v in &$list {
                out.extend(<$t>::try_from(*v).map_err(|_| range(v))?.to_le_bytes());
            }
        };
    }
    match dtype {
        DataType::Bool => out.extend(c.bool_contents.iter().map(|&b| u8::from(b))),
        DataType::I8 => narrow!(c.int_contents, i8),
        DataType::I16 => narrow!(c.int_contents, i16),
        DataType::I32 => narrow!(c.int_contents, i32),
        DataType::I64 => c
            .int64_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DataType::U8 => narrow!(c.uint_contents, u8),
        DataType::U16 => narrow!(c.uint_contents, u16),
        DataType::U32 => narrow!(c.uint_contents, u32),
        DataType::U64 => c
            .uint64_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DataType::F32 => c
            .fp32_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DataType::F64 => c
            .fp64_contents
            .iter()
            .for_each(|v| out.extend(v.to_le_bytes())),
        DataType::Bytes => {
            for b in &c.bytes_contents {
                let len = u32::try_from(b.len())
                    .map_err(|_| "a BYTES element is longer than 4 GiB".to_owned())?;
                out.extend(len.to_le_bytes());
                out.extend_from_slice(b);
            }
        }
        DataType::F16 | DataType::BF16 => {}
    }
    Ok(Bytes::from(out))
}

/// The `ModelInfer` response: each requested output's name, datatype and shape, and its bytes
/// in `raw_output_contents` (in the same order), handed over without a copy.
pub fn encode_infer<'a>(
    sig: impl Into<Signature<'a>>,
    id: Option<&str>,
    outputs: &[(RequestedOutput, &Tensor)],
) -> pb::ModelInferResponse {
    let sig = sig.into();
    pb::ModelInferResponse {
        model_name: sig.model.name.clone(),
        model_version: sig.model.version.clone(),
        id: id.unwrap_or_default().to_owned(),
        parameters: Default::default(),
        outputs: outputs
            .iter()
            .map(|(r, t)| pb::model_infer_response::InferOutputTensor {
                name: sig
                    .outputs
                    .get(r.index)
                    .map(|s| s.name.clone())
                    .unwrap_or_default(),
                datatype: t.dtype.as_str().to_owned(),
                shape: t
                    .shape
                    .iter()
                    .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                    .collect(),
                parameters: Default::default(),
                contents: None,
            })
            .collect(),
        raw_output_contents: outputs.iter().map(|(_, t)| t.data.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};

    fn cfg() -> RuntimeConfig {
        crate::fixtures::decoder_model("INT8", false)
    }

    fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            ..Default::default()
        }
    }

    fn typed(rows: i64) -> pb::ModelInferRequest {
        let n = rows as usize * 2;
        let mut x = input("x", "FP32", &[rows, 2]);
        x.contents = Some(pb::InferTensorContents {
            fp32_contents: (0..n).map(|i| i as f32 + 0.5).collect(),
            ..Default::default()
        });
        let mut ids = input("ids", "INT8", &[rows, 2]);
        ids.contents = Some(pb::InferTensorContents {
            int_contents: (0..n as i32).map(|i| -i).collect(),
            ..Default::default()
        });
        pb::ModelInferRequest {
            model_name: "m".into(),
            id: "r1".into(),
            inputs: vec![ids, x],
            ..Default::default()
        }
    }

    fn raw(rows: i64) -> pb::ModelInferRequest {
        let n = rows as usize * 2;
        pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![
                input("x", "FP32", &[rows, 2]),
                input("ids", "INT8", &[rows, 2]),
            ],
            raw_input_contents: vec![
                Bytes::from(
                    (0..n)
                        .flat_map(|i| (i as f32 + 0.5).to_le_bytes())
                        .collect::<Vec<_>>(),
                ),
                Bytes::from((0..n as i8).map(|i| (-i) as u8).collect::<Vec<_>>()),
            ],
            ..Default::default()
        }
    }

    fn check_err(req: pb::ModelInferRequest, want: ApiError) {
        let msg = Bytes::from(req.encode_to_vec());
        assert_eq!(decode_infer(&cfg(), msg), Err(want));
    }

    fn bad_msg(req: pb::ModelInferRequest, want: &str) {
        check_err(req, ApiError::BadRequest(want.into()));
    }

    #[test]
    fn typed_and_raw_contents_decode_to_the_same_tensors() {
        let a = decode_infer(&cfg(), Bytes::from(typed(3).encode_to_vec())).unwrap();
        let b = decode_infer(&cfg(), Bytes::from(raw(3).encode_to_vec())).unwrap();
        assert_eq!(a.inputs, b.inputs);
        assert_eq!(a.rows, 3);
        assert_eq!(a.id.as_deref(), Some("r1"));
        assert_eq!(b.id, None);
        assert_eq!(a.inputs[0].shape, [3, 2]);
        assert_eq!(
            &a.inputs[0].data[..8],
            [0.5f32, 1.5].map(f32::to_le_bytes).concat()
        );
        assert_eq!(a.inputs[1].data[..], [0u8, 255, 254, 253, 252, 251]);
        assert_eq!(a.outputs.len(), 2);
        assert!(a.outputs.iter().all(|o| o.binary));
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        let mut r = typed(1);
        r.model_name = "nope".into();
        check_err(r, ApiError::NotFound("unknown model \"nope\"".into()));
        let mut r = typed(1);
        r.model_version = "7".into();
        check_err(
            r,
            ApiError::NotFound("unknown version \"7\" of model \"m\"".into()),
        );
        let mut r = raw(1);
        r.raw_input_contents[0].truncate(4);
        bad_msg(
            r,
            "input \"x\": raw_input_contents: binary data has 4 bytes but 2 FP32 elements need 8",
        );
        let mut r = raw(1);
        r.raw_input_contents.pop();
        bad_msg(r, "raw_input_contents has 1 entries but the request has 2 inputs (one each, in the inputs' order)");
        let mut r = typed(1);
        r.inputs[0].name = "w".into();
        bad_msg(
            r,
            "unknown input \"w\" (the model's inputs are [\"x\", \"ids\"])",
        );
        let mut r = typed(1);
        r.inputs.pop();
        bad_msg(r, "missing input \"x\"");
        let mut r = typed(1);
        r.inputs[1].shape = vec![1, 3];
        bad_msg(
            r,
            "input \"x\": shape [1, 3] does not match the model's [-1, 2]",
        );
        let mut r = typed(1);
        r.inputs[1].shape = vec![-1, 2];
        bad_msg(r, "input \"x\": shape [-1, 2] has a negative dimension");
        let mut r = typed(5);
        r.inputs[1].shape = vec![5, 2];
        bad_msg(
            r,
            "input \"ids\": shape [5, 2] has 5 rows, more than max_batch_size 4",
        );
        let mut r = typed(1);
        r.inputs[0].contents.as_mut().unwrap().int_contents[1] = 300;
        bad_msg(
            r,
            "input \"ids\": contents value 300 is out of range for INT8",
        );
        let mut r = typed(1);
        r.inputs[1]
            .contents
            .as_mut()
            .unwrap()
            .fp32_contents
            .push(1.0);
        bad_msg(
            r,
            "input \"x\": contents has 3 elements but shape [1, 2] needs 2",
        );
        let mut r = typed(1);
        r.inputs[1].contents = Some(pb::InferTensorContents {
            fp64_contents: vec![1.0, 2.0],
            ..Default::default()
        });
        bad_msg(
            r,
            "input \"x\": contents has fp64_contents, but a FP32 input takes fp32_contents",
        );
        let mut r = typed(1);
        r.inputs[1].contents = None;
        bad_msg(
            r,
            "input \"x\": has neither contents nor raw_input_contents",
        );
        let mut r = raw(1);
        r.inputs[0].contents = typed(1).inputs[1].contents.clone();
        bad_msg(r, "input \"x\": has both contents and raw_input_contents");
        let mut r = typed(1);
        r.inputs[1].datatype = "INT32".into();
        bad_msg(
            r,
            "input \"x\": datatype INT32 does not match the model's FP32",
        );
        let mut r = typed(1);
        r.outputs = vec![InferRequestedOutputTensor {
            name: "q".into(),
            ..Default::default()
        }];
        bad_msg(
            r,
            "unknown output \"q\" (the model's outputs are [\"y\", \"z\"])",
        );
        let mut r = typed(1);
        r.parameters.insert(
            "timeout".into(),
            pb::InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam("soon".into())),
            },
        );
        bad_msg(
            r,
            "parameter \"timeout\" must be a non-negative integer (µs), got StringParam(\"soon\")",
        );
        assert!(matches!(
            decode_infer(&cfg(), Bytes::from_static(b"\x0a\xff\xff")),
            Err(ApiError::BadRequest(m)) if m.starts_with("malformed ModelInferRequest message: ")
        ));
    }

    #[test]
    fn framing() {
        let msg = pb::ServerLiveResponse { live: true };
        let framed = frame(&msg);
        assert_eq!(framed[..], [0, 0, 0, 0, 2, 8, 1]);
        assert_eq!(unframe(&framed).unwrap()[..], [8, 1]);
        assert_eq!(
            unframe(&Bytes::from_static(b"\0\0\0")),
            Err(bad(
                "the request body has 3 bytes, fewer than a gRPC message prefix (5)"
            ))
        );
        assert_eq!(
            unframe(&Bytes::from_static(b"\0\0\0\0\x03ab")),
            Err(bad("the gRPC message prefix announces 3 bytes but 2 follow (a unary call carries exactly one message)"))
        );
        assert!(matches!(
            unframe(&Bytes::from_static(b"\x01\0\0\0\0")),
            Err(ApiError::Unimplemented(_))
        ));
    }

    #[test]
    fn responses_carry_raw_outputs_in_order() {
        let c = cfg();
        let y = Tensor {
            dtype: DataType::F32,
            shape: vec![1, 2],
            data: Bytes::from([1.0f32, 2.0].map(f32::to_le_bytes).concat()),
        };
        let z = Tensor {
            dtype: DataType::I64,
            shape: vec![1, 1],
            data: Bytes::from(7i64.to_le_bytes().to_vec()),
        };
        let r = encode_infer(
            &c,
            Some("a"),
            &[
                (
                    RequestedOutput {
                        index: 1,
                        binary: true,
                        classification: None,
                    },
                    &z,
                ),
                (
                    RequestedOutput {
                        index: 0,
                        binary: true,
                        classification: None,
                    },
                    &y,
                ),
            ],
        );
        assert_eq!((r.model_name.as_str(), r.id.as_str()), ("m", "a"));
        let names: Vec<_> = r
            .outputs
            .iter()
            .map(|o| (o.name.as_str(), o.datatype.as_str(), o.shape.clone()))
            .collect();
        assert_eq!(
            names,
            [("z", "INT64", vec![1, 1]), ("y", "FP32", vec![1, 2])]
        );
        assert_eq!(r.raw_output_contents, [z.data, y.data]);
    }

    /// Every single-byte mutation and truncation of valid requests decodes or is a 400 /
    /// 404: never a panic. (The fuzz target explores further.)
    #[test]
    fn mutations_never_panic() {
        for req in [typed(2), raw(2)] {
            let bytes = req.encode_to_vec();
            for i in 0..bytes.len() {
                for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                    let mut m = bytes.clone();
                    m[i] = v;
                    match decode_infer(&cfg(), Bytes::from(m)) {
                        Ok(_) | Err(ApiError::BadRequest(_)) | Err(ApiError::NotFound(_)) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
                let _ = decode_infer(&cfg(), Bytes::copy_from_slice(&bytes[..i]));
            }
        }
    }
}
