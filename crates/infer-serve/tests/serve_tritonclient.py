"""tritonclient[http] against a running infer-serve, cross-checked with onnxruntime.

usage: serve_tritonclient.py HOST:PORT MODEL.onnx
Exits non-zero with a message on the first mismatch; prints one JSON summary line on success.
"""
import json
import sys

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

url, onnx_path = sys.argv[1], sys.argv[2]
c = httpclient.InferenceServerClient(url=url)

assert c.is_server_live(), "is_server_live"
assert c.is_server_ready(), "is_server_ready"
assert c.is_model_ready("mlp"), "is_model_ready"
assert c.is_model_ready("mlp", "1"), "is_model_ready with version"
assert not c.is_model_ready("nope"), "is_model_ready on an unknown model"

server = c.get_server_metadata()
assert "binary_tensor_data" in server["extensions"], server

meta = c.get_model_metadata("mlp")
assert meta["name"] == "mlp", meta
assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}], meta
assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}], meta

config = c.get_model_config("mlp")
assert config["max_batch_size"] == 32, config
assert config["input"][0]["data_type"] == "TYPE_FP32" and config["input"][0]["dims"] == [64], config
assert config["output"][0]["dims"] == [10], config
assert "dynamic_batching" in config, config

index = c.get_model_repository_index()
assert index == [{"name": "mlp", "version": "1", "state": "READY", "reason": ""}], index

stats = c.get_inference_statistics("mlp")
assert stats["model_stats"][0]["name"] == "mlp", stats

try:
    c.get_model_metadata("nope")
    raise AssertionError("metadata of an unknown model succeeded")
except InferenceServerException as e:
    assert "unknown model" in e.message(), e.message()

sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(7)
worst = 0.0
modes = 0
for rows in (1, 3, 32):
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    want = sess.run(None, {"input": x})[0]
    for binary_in in (True, False):
        for binary_out in (True, False, None):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary_in)
            outputs = None if binary_out is None else [httpclient.InferRequestedOutput("output", binary_data=binary_out)]
            res = c.infer("mlp", [inp], outputs=outputs, request_id=f"r{rows}")
            got = res.as_numpy("output")
            assert got is not None and got.shape == (rows, 10), (rows, binary_in, binary_out, got)
            diff = float(np.abs(got - want).max())
            assert diff <= 1e-5, f"rows {rows} binary_in {binary_in} binary_out {binary_out}: max |diff| {diff}"
            assert res.get_response()["id"] == f"r{rows}"
            worst = max(worst, diff)
            modes += 1

# A shape the model does not accept comes back as a 400 with a message.
bad = httpclient.InferInput("input", [1, 63], "FP32")
bad.set_data_from_numpy(np.zeros((1, 63), np.float32))
try:
    c.infer("mlp", [bad])
    raise AssertionError("a wrong shape was accepted")
except InferenceServerException as e:
    assert "does not match" in e.message(), e.message()

print(json.dumps({"ok": True, "max_abs_diff": worst, "infer_calls": modes}))
