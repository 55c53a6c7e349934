#!/usr/bin/env python3
"""Write examples/mlp/mlp.onnx: a tiny MLP with a dynamic batch dimension.

input [N,64] f32 -> Gemm(64x128) + Relu -> Gemm(128x10) -> Softmax -> output [N,10].
Deterministic (seed 0), needs only numpy and onnx (no torch). The output file is committed;
rerun this script only to change the model. Run: python3 examples/mlp/make_mlp.py
"""
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
W1 = numpy_helper.from_array(rng.standard_normal((64, 128), dtype=np.float32) * 0.1, "W1")
B1 = numpy_helper.from_array(np.zeros(128, np.float32), "B1")
W2 = numpy_helper.from_array(rng.standard_normal((128, 10), dtype=np.float32) * 0.1, "W2")
B2 = numpy_helper.from_array(np.zeros(10, np.float32), "B2")
nodes = [
    helper.make_node("Gemm", ["input", "W1", "B1"], ["h"]),
    helper.make_node("Relu", ["h"], ["hr"]),
    helper.make_node("Gemm", ["hr", "W2", "B2"], ["logits"]),
    helper.make_node("Softmax", ["logits"], ["output"], axis=1),
]
graph = helper.make_graph(
    nodes,
    "mlp",
    [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
    [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 10])],
    initializer=[W1, B1, W2, B2],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="infer-build-examples")
model.ir_version = 8
onnx.checker.check_model(model, full_check=True)
out = pathlib.Path(__file__).with_name("mlp.onnx")
onnx.save(model, out)
print(f"wrote {out} ({out.stat().st_size} bytes)")
