//! A summary of an ONNX model's graph, enough to choose the TensorRT precision path: which
//! operator types occur (Q/DQ nodes mean the model is already quantized) and whether it carries
//! FP16 tensors (a model pre-converted for a strongly typed FP16 build); and which outputs have
//! a shape that depends on the input values, which the TensorRT runtime does not serve.

use std::collections::{BTreeMap, BTreeSet};

use tract_onnx::pb::type_proto::Value as TypeValue;
use tract_onnx::prelude::Framework;

/// ONNX `TensorProto.DataType.FLOAT16`.
const ONNX_FLOAT16: i32 = 10;

/// What the precision checks need to know about a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OnnxSummary {
    /// Operator types of the main graph's nodes, sorted.
    pub op_types: BTreeSet<String>,
    /// Graph inputs: name and ONNX element type.
    pub inputs: Vec<(String, i32)>,
    /// Some initializer, graph input, output or value, Constant node or Cast is FLOAT16.
    pub fp16_tensors: bool,
    /// Graph inputs: name and, per dimension, its symbolic name (`dim_param`), `""` when the
    /// dimension is a number or unnamed.
    pub input_dim_names: Vec<(String, Vec<String>)>,
    /// Graph outputs: name, ONNX element type and dimensions (`-1` for a symbolic or unknown
    /// one); empty dimensions when the file declares no shape.
    pub outputs: Vec<(String, i32, Vec<i64>)>,
    /// Graph outputs whose shape depends on the input values: name and the operator upstream of
    /// it that makes it so (see [`data_dependent_outputs`]).
    pub data_dependent: Vec<(String, String)>,
    /// Graph inputs that index an embedding table (a `Gather` of an initializer by the input):
    /// input name and the table's rows (the largest id the input may hold, plus one).
    pub embedding_rows: Vec<(String, i64)>,
}

/// ONNX operators whose output shape depends on the values of their inputs, not only on their
/// shapes: TensorRT cannot size such an output before it runs (its dimension stays `-1` once
/// every input shape is set), and needs an output allocator infer-serve does not have.
pub(crate) const DATA_DEPENDENT_OPS: [&str; 4] =
    ["NonZero", "NonMaxSuppression", "Unique", "Compress"];

/// The graph outputs whose shape depends on the data: downstream of a [`DATA_DEPENDENT_OPS`]
/// node, with a declared dimension that is neither a number nor a symbol of one of the graph's
/// inputs (so nothing but the data can fix it). An output whose declared dimensions all come
/// from the inputs (a NonZero used only to index into a tensor of fixed shape) is kept, as is
/// one without a declared shape: the runtime still refuses an unresolved output when it creates
/// an instance. Returns (output, operator), in the graph's output order.
pub(crate) fn data_dependent_outputs(graph: &tract_onnx::pb::GraphProto) -> Vec<(String, String)> {
    use tract_onnx::pb::tensor_shape_proto::dimension::Value as D;
    let producer: BTreeMap<&str, &tract_onnx::pb::NodeProto> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n)))
        .collect();
    // The operator making `value` data-dependent, searching upstream.
    let upstream = |value: &str| -> Option<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![value];
        while let Some(v) = todo.pop() {
            if !seen.insert(v) {
                continue;
            }
            let Some(n) = producer.get(v) else { continue };
            if DATA_DEPENDENT_OPS.contains(&n.op_type.as_str()) {
                return Some(n.op_type.clone());
            }
            todo.extend(n.input.iter().map(String::as_str).filter(|i| !i.is_empty()));
        }
        None
    };
    let dims = |v: &tract_onnx::pb::ValueInfoProto| -> Option<Vec<Option<D>>> {
        let TypeValue::TensorType(t) = v.r#type.as_ref()?.value.as_ref()?;
        Some(
            t.shape
                .as_ref()?
                .dim
                .iter()
                .map(|d| d.value.clone())
                .collect(),
        )
    };
    let input_symbols: BTreeSet<String> = graph
        .input
        .iter()
        .filter_map(dims)
        .flatten()
        .filter_map(|d| match d {
            Some(D::DimParam(p)) if !p.is_empty() => Some(p),
            _ => None,
        })
        .collect();
    graph
        .output
        .iter()
        .filter_map(|o| {
            let unresolved = dims(o)?.iter().any(|d| match d {
                Some(D::DimValue(v)) => *v <= 0,
                Some(D::DimParam(p)) => !input_symbols.contains(p),
                None => true,
            });
            if !unresolved {
                return None;
            }
            upstream(&o.name).map(|op| (o.name.clone(), op))
        })
        .collect()
}

/// The datatype of an ONNX `TensorProto.DataType`, when the runtime serves it.
pub(crate) fn datatype(elem: i32) -> Option<infer_spec::DataType> {
    use infer_spec::DataType as D;
    Some(match elem {
        1 => D::F32,
        2 => D::U8,
        3 => D::I8,
        4 => D::U16,
        5 => D::I16,
        6 => D::I32,
        7 => D::I64,
        8 => D::Bytes,
        9 => D::Bool,
        10 => D::F16,
        11 => D::F64,
        12 => D::U32,
        13 => D::U64,
        16 => D::BF16,
        _ => return None,
    })
}

impl OnnxSummary {
    /// Parse the ONNX protobuf (no shape inference, no optimisation).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<OnnxSummary, String> {
        let proto = tract_onnx::onnx()
            .proto_model_for_read(&mut &bytes[..])
            .map_err(|e| format!("{e:#}"))?;
        let graph = proto.graph.ok_or("the model has no graph")?;
        let elem = |v: &tract_onnx::pb::ValueInfoProto| match v
            .r#type
            .as_ref()
            .and_then(|t| t.value.as_ref())
        {
            Some(TypeValue::TensorType(t)) => t.elem_type,
            _ => 0,
        };
        let inputs: Vec<(String, i32)> = graph
            .input
            .iter()
            .filter(|i| !graph.initializer.iter().any(|init| init.name == i.name))
            .map(|i| (i.name.clone(), elem(i)))
            .collect();
        let dim_names = |v: &tract_onnx::pb::ValueInfoProto| -> Vec<String> {
            use tract_onnx::pb::tensor_shape_proto::dimension::Value as D;
            match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(TypeValue::TensorType(t)) => t
                    .shape
                    .as_ref()
                    .map(|s| {
                        s.dim
                            .iter()
                            .map(|d| match &d.value {
                                Some(D::DimParam(p)) => p.clone(),
                                _ => String::new(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                _ => Vec::new(),
            }
        };
        let input_dim_names = graph
            .input
            .iter()
            .filter(|i| !graph.initializer.iter().any(|init| init.name == i.name))
            .map(|i| (i.name.clone(), dim_names(i)))
            .collect();
        let outputs = graph
            .output
            .iter()
            .map(|o| {
                use tract_onnx::pb::tensor_shape_proto::dimension::Value as D;
                let dims = match o.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                    Some(TypeValue::TensorType(t)) => t
                        .shape
                        .as_ref()
                        .map(|s| {
                            s.dim
                                .iter()
                                .map(|d| match &d.value {
                                    Some(D::DimValue(v)) if *v > 0 => *v,
                                    _ => -1,
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                (o.name.clone(), elem(o), dims)
            })
            .collect();
        let fp16_tensors = graph
            .initializer
            .iter()
            .any(|t| t.data_type == ONNX_FLOAT16)
            || graph
                .input
                .iter()
                .chain(graph.output.iter())
                .chain(graph.value_info.iter())
                .any(|v| elem(v) == ONNX_FLOAT16)
            // Weights held by Constant nodes (Paddle exports), and casts to FLOAT16 (a model
            // converted with its inputs and outputs kept FP32).
            || graph.node.iter().any(|n| {
                n.attribute.iter().any(|a| {
                    (n.op_type == "Constant"
                        && a.t.as_ref().is_some_and(|t| t.data_type == ONNX_FLOAT16))
                        || (n.op_type == "Cast" && a.name == "to" && a.i == ONNX_FLOAT16 as i64)
                })
            });
        let embedding_rows = graph
            .node
            .iter()
            .filter(|n| n.op_type == "Gather" && n.input.len() == 2)
            .filter_map(|n| {
                let table = graph.initializer.iter().find(|i| i.name == n.input[0])?;
                let input = inputs.iter().find(|(name, _)| *name == n.input[1])?;
                Some((input.0.clone(), *table.dims.first()?))
            })
            .collect();
        Ok(OnnxSummary {
            data_dependent: data_dependent_outputs(&graph),
            embedding_rows,
            op_types: graph.node.iter().map(|n| n.op_type.clone()).collect(),
            inputs,
            fp16_tensors,
            input_dim_names,
            outputs,
        })
    }

    /// The model carries QuantizeLinear/DequantizeLinear nodes (explicit quantization).
    pub(crate) fn has_qdq(&self) -> bool {
        self.op_types.contains("QuantizeLinear") && self.op_types.contains("DequantizeLinear")
    }

    pub(crate) fn has_fp16(&self) -> bool {
        self.fp16_tensors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarises_the_example_mlp() {
        let bytes = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/mlp/mlp.onnx"
        ))
        .unwrap();
        let s = OnnxSummary::from_bytes(&bytes).unwrap();
        assert_eq!(s.inputs, vec![("input".to_string(), 1)]);
        assert!(!s.has_qdq());
        assert!(!s.has_fp16());
        assert!(
            s.op_types.contains("Gemm") || s.op_types.contains("MatMul"),
            "{:?}",
            s.op_types
        );
        assert!(OnnxSummary::from_bytes(b"not a model").is_err());
        assert!(s.data_dependent.is_empty());
    }

    fn value(name: &str, dims: &[&str]) -> tract_onnx::pb::ValueInfoProto {
        use tract_onnx::pb::tensor_shape_proto::{dimension::Value as D, Dimension};
        use tract_onnx::pb::{type_proto, TensorShapeProto, TypeProto, ValueInfoProto};
        let dim = dims
            .iter()
            .map(|d| Dimension {
                value: match d.parse::<i64>() {
                    Ok(v) => Some(D::DimValue(v)),
                    Err(_) if d.is_empty() => None,
                    Err(_) => Some(D::DimParam((*d).into())),
                },
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(TypeValue::TensorType(type_proto::Tensor {
                    elem_type: 1,
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(op: &str, inputs: &[&str], output: &str) -> tract_onnx::pb::NodeProto {
        tract_onnx::pb::NodeProto {
            op_type: op.into(),
            input: inputs.iter().map(|s| (*s).into()).collect(),
            output: vec![output.into()],
            ..Default::default()
        }
    }

    #[test]
    fn outputs_whose_shape_depends_on_the_data() {
        // x[N, 4] → NonZero → Transpose → `indices` [n, 2] (n only the data fixes);
        // x → Relu → `y` [N, 4]; x → NonZero → Gather of a fixed table → `picked` [N, 4]
        // (its dimensions all come from the input); boxes → NMS → `selected` [?, 3].
        let graph = tract_onnx::pb::GraphProto {
            node: vec![
                node("NonZero", &["x"], "nz"),
                node("Transpose", &["nz"], "indices"),
                node("Relu", &["x"], "y"),
                node("Gather", &["x", "nz"], "picked"),
                node(
                    "NonMaxSuppression",
                    &["boxes", "scores", "", "iou"],
                    "selected",
                ),
            ],
            input: vec![
                value("x", &["N", "4"]),
                value("boxes", &["1", "100", "4"]),
                value("scores", &["1", "1", "100"]),
            ],
            output: vec![
                value("indices", &["NonZero_dim_1", "2"]),
                value("y", &["N", "4"]),
                value("picked", &["N", "4"]),
                value("selected", &["", "3"]),
            ],
            ..Default::default()
        };
        assert_eq!(
            data_dependent_outputs(&graph),
            [
                ("indices".to_string(), "NonZero".to_string()),
                ("selected".to_string(), "NonMaxSuppression".to_string())
            ]
        );
        // A symbolic dimension with no data-dependent operator upstream is the inputs' business
        // (a sequence length TensorRT resolves from the profile).
        let plain = tract_onnx::pb::GraphProto {
            node: vec![node("Relu", &["x"], "y")],
            input: vec![value("x", &["N", "4"])],
            output: vec![value("y", &["N", "seq"])],
            ..Default::default()
        };
        assert!(data_dependent_outputs(&plain).is_empty());
    }
}
