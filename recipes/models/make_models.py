#!/usr/bin/env python3
"""Write the stand-in ONNX models the recipes in recipes/ point at.

Each stand-in has exactly the signature of the real model its recipe describes (input and output
names, dtypes, static and dynamic dimensions) but a tiny graph with random weights, so `check`,
`plan` and CPU builds work on a fresh clone without downloading hundreds of megabytes. They
compute nothing useful. To serve the real model, point the recipe's `onnx` key at your own export.

Deterministic (fixed seeds, no timestamps), needs only numpy and onnx (no torch). Uses opset 17,
IR version 8, and ops the tract CPU backend runs (Conv, MaxPool, GlobalAveragePool, Gemm, MatMul,
Gather, ReduceSum, Relu, Sigmoid, Softmax, ...). Every file stays well under 200 KB.

Run: /opt/ibvenv/bin/python recipes/models/make_models.py [OUT_DIR]
(OUT_DIR defaults to this directory; the tests regenerate into a temporary one and compare.)
"""
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent)
OUT.mkdir(parents=True, exist_ok=True)
OPSET = 17
IR_VERSION = 8
# Vocabulary size of the BERT/MiniLM WordPiece tokenizer: every real token id must index the
# embedding table, so the stand-ins keep the full vocabulary with a 1-wide embedding.
BERT_VOCAB = 30522


def weights(rng, name, shape, scale=0.1):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def const_i64(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def save(name, nodes, inputs, outputs, initializers, doc):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="infer-build-recipes",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    path = OUT / f"{name}.onnx"
    onnx.save(model, path)
    size = path.stat().st_size
    assert size < 200_000, f"{path} is {size} bytes"
    print(f"wrote {path} ({size} bytes)")


def resnet50():
    """ResNet-50 (torchvision export): input [N,3,224,224] f32 -> output [N,1000] f32."""
    rng = np.random.default_rng(50)
    nodes = [
        # A strided 7x7 stem, global pooling and the 1000-way classifier, as in the real model.
        helper.make_node("Conv", ["input", "stem_w", "stem_b"], ["stem"], kernel_shape=[7, 7], strides=[4, 4], pads=[3, 3, 3, 3]),
        helper.make_node("Relu", ["stem"], ["stem_relu"]),
        helper.make_node("GlobalAveragePool", ["stem_relu"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"], axis=1),
        helper.make_node("Gemm", ["features", "fc_w", "fc_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["output"], axis=1),
    ]
    save(
        "resnet50",
        nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 1000])],
        [
            weights(rng, "stem_w", (16, 3, 7, 7)),
            weights(rng, "stem_b", (16,)),
            weights(rng, "fc_w", (16, 1000)),
            weights(rng, "fc_b", (1000,)),
        ],
        "stand-in for ResNet-50: real signature, random weights",
    )


def masked_mean(prefix, hidden, mask):
    """Nodes that mean-pool `hidden` [N,S,H] over the tokens where `mask` [N,S] (int64) is 1."""
    return [
        helper.make_node("Cast", [mask], [f"{prefix}_maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", [f"{prefix}_maskf", "axis_last"], [f"{prefix}_mask3"]),
        helper.make_node("Mul", [hidden, f"{prefix}_mask3"], [f"{prefix}_masked"]),
        helper.make_node("ReduceSum", [f"{prefix}_masked", "axis_seq"], [f"{prefix}_sum"], keepdims=0),
        helper.make_node("ReduceSum", [f"{prefix}_mask3", "axis_seq"], [f"{prefix}_count"], keepdims=0),
        helper.make_node("Add", [f"{prefix}_count", "eps"], [f"{prefix}_count_eps"]),
        helper.make_node("Div", [f"{prefix}_sum", f"{prefix}_count_eps"], [f"{prefix}_mean"]),
    ]


def pooling_constants():
    return [
        const_i64("axis_last", [-1]),
        const_i64("axis_seq", [1]),
        numpy_helper.from_array(np.asarray([1e-9], dtype=np.float32), "eps"),
    ]


def minilm():
    """all-MiniLM-L6-v2 sentence embedding: input_ids, attention_mask [N,S] i64 ->
    sentence_embedding [N,384] f32 (mean pooling, as sentence-transformers does)."""
    rng = np.random.default_rng(384)
    nodes = [
        helper.make_node("Gather", ["word_emb", "input_ids"], ["tok"]),  # [N,S,1]
        helper.make_node("MatMul", ["tok", "proj_w"], ["proj"]),  # [N,S,384]
        helper.make_node("Add", ["proj", "proj_b"], ["hidden_lin"]),
        helper.make_node("Relu", ["hidden_lin"], ["hidden"]),
        *masked_mean("pool", "hidden", "attention_mask"),
        helper.make_node("Identity", ["pool_mean"], ["sentence_embedding"]),
    ]
    seq = ["batch", "sequence"]
    save(
        "minilm",
        nodes,
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq),
        ],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 384])],
        [
            weights(rng, "word_emb", (BERT_VOCAB, 1)),
            weights(rng, "proj_w", (1, 384)),
            weights(rng, "proj_b", (384,)),
            *pooling_constants(),
        ],
        "stand-in for sentence-transformers/all-MiniLM-L6-v2: real signature, random weights",
    )


def reranker():
    """cross-encoder/ms-marco-MiniLM-L-6-v2: input_ids, attention_mask, token_type_ids [N,S]
    i64 -> logits [N,1] f32 (one relevance score per query/passage pair)."""
    rng = np.random.default_rng(6)
    nodes = [
        helper.make_node("Gather", ["word_emb", "input_ids"], ["tok"]),  # [N,S,1]
        helper.make_node("Gather", ["type_emb", "token_type_ids"], ["typ"]),  # [N,S,1]
        helper.make_node("Add", ["tok", "typ"], ["emb"]),
        helper.make_node("MatMul", ["emb", "proj_w"], ["proj"]),  # [N,S,32]
        helper.make_node("Relu", ["proj"], ["hidden"]),
        *masked_mean("pool", "hidden", "attention_mask"),
        helper.make_node("Gemm", ["pool_mean", "cls_w", "cls_b"], ["logits"]),
    ]
    seq = ["batch", "sequence"]
    save(
        "reranker",
        nodes,
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, seq),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])],
        [
            weights(rng, "word_emb", (BERT_VOCAB, 1)),
            weights(rng, "type_emb", (2, 1)),
            weights(rng, "proj_w", (1, 32)),
            weights(rng, "cls_w", (32, 1)),
            weights(rng, "cls_b", (1,)),
            *pooling_constants(),
        ],
        "stand-in for cross-encoder/ms-marco-MiniLM-L-6-v2: real signature, random weights",
    )


def yolo():
    """YOLOv8n detector (Ultralytics export): images [N,3,640,640] f32 -> output0 [N,84,8400]
    f32 (4 box coordinates + 80 class scores for each of 80x80 + 40x40 + 20x20 anchors)."""
    rng = np.random.default_rng(8)
    nodes = []
    heads = []
    for stride in (8, 16, 32):
        p = f"p{stride}"
        nodes += [
            helper.make_node("MaxPool", ["images"], [f"{p}_pool"], kernel_shape=[stride, stride], strides=[stride, stride]),
            helper.make_node("Conv", [f"{p}_pool", f"{p}_w", f"{p}_b"], [f"{p}_head"], kernel_shape=[1, 1]),
            helper.make_node("Reshape", [f"{p}_head", "head_shape"], [f"{p}_flat"]),
        ]
        heads.append(f"{p}_flat")
    nodes += [
        helper.make_node("Concat", heads, ["raw"], axis=2),
        helper.make_node("Sigmoid", ["raw"], ["output0"]),
    ]
    inits = [const_i64("head_shape", [0, 84, -1])]
    for stride in (8, 16, 32):
        inits += [weights(rng, f"p{stride}_w", (84, 3, 1, 1)), weights(rng, f"p{stride}_b", (84,))]
    save(
        "yolov8n",
        nodes,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 640, 640])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 84, 8400])],
        inits,
        "stand-in for Ultralytics YOLOv8n: real signature, random weights",
    )


def whisper_encoder():
    """Whisper tiny encoder (Hugging Face export): input_features [N,80,3000] f32 (log-mel,
    30 s at 100 frames/s) -> last_hidden_state [N,1500,384] f32."""
    rng = np.random.default_rng(80)
    nodes = [
        # The real encoder starts with two 1-D convolutions, the second with stride 2.
        helper.make_node("Conv", ["input_features", "conv_w", "conv_b"], ["conv"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        helper.make_node("Relu", ["conv"], ["conv_relu"]),  # [N,16,1500]
        helper.make_node("Transpose", ["conv_relu"], ["frames"], perm=[0, 2, 1]),  # [N,1500,16]
        helper.make_node("MatMul", ["frames", "proj_w"], ["proj"]),  # [N,1500,384]
        helper.make_node("Add", ["proj", "proj_b"], ["last_hidden_state"]),
    ]
    save(
        "whisper_encoder",
        nodes,
        [helper.make_tensor_value_info("input_features", TensorProto.FLOAT, ["batch", 80, 3000])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", 1500, 384])],
        [
            weights(rng, "conv_w", (16, 80, 3)),
            weights(rng, "conv_b", (16,)),
            weights(rng, "proj_w", (16, 384)),
            weights(rng, "proj_b", (384,)),
        ],
        "stand-in for openai/whisper-tiny's encoder: real signature, random weights",
    )


if __name__ == "__main__":
    resnet50()
    minilm()
    reranker()
    yolo()
    whisper_encoder()
