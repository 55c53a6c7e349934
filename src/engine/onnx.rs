//! A summary of an ONNX model's graph, enough to choose the TensorRT precision path: which
//! operator types occur (Q/DQ nodes mean the model is already quantized) and whether it carries
//! FP16 tensors (a model pre-converted for a strongly typed FP16 build).

use std::collections::BTreeSet;

use tract_onnx::pb::type_proto::Value as TypeValue;
use tract_onnx::prelude::Framework;

/// ONNX `TensorProto.DataType.FLOAT16`.
const ONNX_FLOAT16: i32 = 10;

/// What the precision checks need to know about a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnnxSummary {
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
}

/// The recipe datatype of an ONNX `TensorProto.DataType`, when the runtime serves it.
pub fn recipe_datatype(elem: i32) -> Option<crate::recipe::DataType> {
    use crate::recipe::DataType as D;
    Some(match elem {
        1 => D::Fp32,
        2 => D::Uint8,
        3 => D::Int8,
        4 => D::Uint16,
        5 => D::Int16,
        6 => D::Int32,
        7 => D::Int64,
        8 => D::Bytes,
        9 => D::Bool,
        10 => D::Fp16,
        11 => D::Fp64,
        12 => D::Uint32,
        13 => D::Uint64,
        16 => D::Bf16,
        _ => return None,
    })
}

impl OnnxSummary {
    /// Parse the ONNX protobuf (no shape inference, no optimisation).
    pub fn from_bytes(bytes: &[u8]) -> Result<OnnxSummary, String> {
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
        Ok(OnnxSummary {
            op_types: graph.node.iter().map(|n| n.op_type.clone()).collect(),
            inputs,
            fp16_tensors,
            input_dim_names,
            outputs,
        })
    }

    /// The model carries QuantizeLinear/DequantizeLinear nodes (explicit quantization).
    pub fn has_qdq(&self) -> bool {
        self.op_types.contains("QuantizeLinear") && self.op_types.contains("DequantizeLinear")
    }

    pub fn has_fp16(&self) -> bool {
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
    }
}
