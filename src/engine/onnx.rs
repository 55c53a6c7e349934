//! A summary of an ONNX model's graph, enough to choose the TensorRT precision path: which
//! operator types occur (Q/DQ nodes mean the model is already quantized) and whether it carries
//! FP16 tensors (a model pre-converted for a strongly typed FP16 build); and which outputs have
//! a shape that depends on the input values, which the TensorRT runtime does not serve; and
//! which inputs index a constant table (token ids into an embedding), and its rows, which
//! `runtime.toml`'s `table_rows` and the tokenizer check hold requests and tokenizers to.

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
    /// Graph inputs that index an embedding table (see [`embedding_rows`]): input name and the
    /// table's rows (the largest id the input may hold, plus one), in the graph's input order.
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

/// ONNX `TensorProto.DataType`s a `Cast` may turn indices into and keep every value an input
/// may hold within a table's range (`-rows..rows`) inside it: the signed integers. A narrower
/// one wraps a value only when the table is longer than its range, so the wrapped value stays
/// inside the table; an unsigned type would turn -1 into its largest value, and a float would
/// round.
const INDEX_CASTS: [i32; 4] = [3, 5, 6, 7];

/// Operators whose first input's values reach their output unchanged (only the type or the
/// shape changes): the path from a graph input to the indices of the `Gather` that reads an
/// embedding table with it.
const VALUE_PRESERVING_OPS: [&str; 6] = [
    "Cast",
    "Identity",
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Flatten",
];

/// The graph inputs that index a constant table: followed through value-preserving operators
/// ([`VALUE_PRESERVING_OPS`], a `Cast` only to a signed integer) to the indices (input 1) of a
/// `Gather` whose data (input 0) is an initializer or a `Constant` node's `value`, with the
/// size of the table along the gathered axis. An input that indexes several tables gets the
/// smallest. Returns (input, rows) in the order of `inputs`; inputs that index no table are
/// left out.
pub(crate) fn embedding_rows(
    graph: &tract_onnx::pb::GraphProto,
    inputs: &[(String, i32)],
) -> Vec<(String, i64)> {
    // The dimensions of every constant tensor, by the value's name.
    let constants: BTreeMap<&str, &[i64]> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice()))
        .chain(
            graph
                .node
                .iter()
                .filter(|n| n.op_type == "Constant")
                .filter_map(|n| {
                    let t = n.attribute.iter().find(|a| a.name == "value")?.t.as_ref()?;
                    Some((n.output.first()?.as_str(), t.dims.as_slice()))
                }),
        )
        .collect();
    let mut consumers: BTreeMap<&str, Vec<&tract_onnx::pb::NodeProto>> = BTreeMap::new();
    for n in &graph.node {
        for i in &n.input {
            consumers.entry(i.as_str()).or_default().push(n);
        }
    }
    let attr = |n: &tract_onnx::pb::NodeProto, name: &str| {
        n.attribute.iter().find(|a| a.name == name).map(|a| a.i)
    };
    // The rows of the table `n` reads, when it is a Gather of a constant by `value`.
    let table_rows = |n: &tract_onnx::pb::NodeProto, value: &str| -> Option<i64> {
        if n.op_type != "Gather" || n.input.len() != 2 || n.input[1] != value {
            return None;
        }
        let dims = constants.get(n.input[0].as_str())?;
        let axis = attr(n, "axis").unwrap_or(0);
        let axis = if axis < 0 {
            axis + dims.len() as i64
        } else {
            axis
        };
        let rows = *dims.get(usize::try_from(axis).ok()?)?;
        (rows > 0).then_some(rows)
    };
    let passes = |n: &tract_onnx::pb::NodeProto, value: &str| -> bool {
        VALUE_PRESERVING_OPS.contains(&n.op_type.as_str())
            && n.input.first().is_some_and(|i| i == value)
            && (n.op_type != "Cast"
                || attr(n, "to").is_some_and(|to| INDEX_CASTS.iter().any(|&c| i64::from(c) == to)))
    };
    inputs
        .iter()
        .filter_map(|(input, _)| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![input.as_str()];
            let mut rows: Option<i64> = None;
            while let Some(v) = todo.pop() {
                if !seen.insert(v) {
                    continue;
                }
                for n in consumers.get(v).into_iter().flatten() {
                    if let Some(r) = table_rows(n, v) {
                        rows = Some(rows.map_or(r, |m| m.min(r)));
                    } else if passes(n, v) {
                        todo.extend(n.output.iter().map(String::as_str));
                    }
                }
            }
            rows.map(|r| (input.clone(), r))
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
        let embedding_rows = embedding_rows(&graph, &inputs);
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

    fn tensor(name: &str, dims: &[i64]) -> tract_onnx::pb::TensorProto {
        tract_onnx::pb::TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: 1,
            ..Default::default()
        }
    }

    fn with_attr(
        mut n: tract_onnx::pb::NodeProto,
        name: &str,
        i: i64,
    ) -> tract_onnx::pb::NodeProto {
        n.attribute.push(tract_onnx::pb::AttributeProto {
            name: name.into(),
            i,
            ..Default::default()
        });
        n
    }

    #[test]
    fn inputs_that_index_a_constant_table_through_value_preserving_ops() {
        // ids → Cast(int32) → Unsqueeze → Gather(word_emb [100, 4]) and ids → Identity →
        // Gather(a Constant node's [50, 4]): the smaller table. types → Reshape → Flatten →
        // Squeeze → Gather(type_emb [2, 4]). pos: a Gather along axis 1 of [3, 7], counted
        // along that axis. Not tables: mask indexes a computed tensor, `floats` reaches its
        // Gather through a Cast to FLOAT, `shape` is Reshape's shape operand, not its data.
        let mut constant = node("Constant", &[], "const_emb");
        constant.attribute.push(tract_onnx::pb::AttributeProto {
            name: "value".into(),
            t: Some(tensor("", &[50, 4])),
            ..Default::default()
        });
        let graph = tract_onnx::pb::GraphProto {
            node: vec![
                with_attr(node("Cast", &["ids"], "ids32"), "to", 6),
                node("Unsqueeze", &["ids32", "axes"], "ids_u"),
                node("Gather", &["word_emb", "ids_u"], "words"),
                node("Identity", &["ids"], "ids_i"),
                constant,
                node("Gather", &["const_emb", "ids_i"], "more_words"),
                node("Reshape", &["types", "shape_c"], "types_r"),
                node("Flatten", &["types_r"], "types_f"),
                node("Squeeze", &["types_f"], "types_s"),
                node("Gather", &["type_emb", "types_s"], "typed"),
                with_attr(node("Gather", &["pos_emb", "pos"], "positioned"), "axis", 1),
                node("Relu", &["word_emb"], "computed"),
                node("Gather", &["computed", "mask"], "masked"),
                with_attr(node("Cast", &["floats"], "as_float"), "to", 1),
                with_attr(node("Cast", &["as_float"], "back"), "to", 7),
                node("Gather", &["word_emb", "back"], "rounded"),
                node("Reshape", &["word_emb", "shape"], "reshaped"),
                node("Gather", &["word_emb", "reshaped"], "odd"),
            ],
            initializer: vec![
                tensor("word_emb", &[100, 4]),
                tensor("type_emb", &[2, 4]),
                tensor("pos_emb", &[3, 7]),
                tensor("axes", &[1]),
                tensor("shape_c", &[1]),
            ],
            ..Default::default()
        };
        let inputs: Vec<(String, i32)> = ["ids", "mask", "types", "pos", "floats", "shape"]
            .iter()
            .map(|n| ((*n).to_string(), 7))
            .collect();
        assert_eq!(
            embedding_rows(&graph, &inputs),
            [
                ("ids".to_string(), 50),
                ("types".to_string(), 2),
                ("pos".to_string(), 7)
            ]
        );
        // The direct case: a Gather of an initializer by the input itself.
        let direct = tract_onnx::pb::GraphProto {
            node: vec![node("Gather", &["word_emb", "ids"], "words")],
            initializer: vec![tensor("word_emb", &[30522, 384])],
            ..Default::default()
        };
        assert_eq!(
            embedding_rows(&direct, &inputs[..1]),
            [("ids".to_string(), 30522)]
        );
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
