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


def classes(row, k):
    """Triton's classification extension on one row: the k largest, "%f:index", largest first."""
    order = sorted(range(len(row)), key=lambda i: (-float(row[i]), i))[:k]
    return [f"{float(row[i]):f}:{i}" for i in order]


# The classification extension: each row's k largest values as "value:index" strings, as
# Triton answers (JSON and binary), beside the raw output requested in the same call.
classified = 0
for rows in (1, 3):
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    for k, binary_out in ((3, True), (3, False), (10, False), (25, True)):
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        outputs = [httpclient.InferRequestedOutput("output", binary_data=binary_out, class_count=k)]
        res = c.infer("mlp", [inp], outputs=outputs)
        got = res.as_numpy("output")
        out = res.get_output("output")
        assert out["datatype"] == "BYTES" and out["shape"] == [rows, min(k, 10)], out
        raw = c.infer("mlp", [inp]).as_numpy("output")
        for r in range(rows):
            want = classes(raw[r], k)
            strs = [v.decode() if isinstance(v, bytes) else v for v in got[r]]
            assert strs == want, (rows, k, binary_out, strs, want)
        classified += 1
for params, says in (({"classification": -1}, "non-negative integer"),
                     ({"classification": "3"}, "non-negative integer"),
                     ({"classification": 1 << 20}, "more than 65536 classes")):
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}],
                       "outputs": [{"name": "output", "parameters": params}]})
    import urllib.error
    import urllib.request
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://{url}/v2/models/mlp/infer", body.encode()))
        raise AssertionError(f"{params} was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and says in e.read().decode(), (params, e.code)

# A shape the model does not accept comes back as a 400 with a message.
bad = httpclient.InferInput("input", [1, 63], "FP32")
bad.set_data_from_numpy(np.zeros((1, 63), np.float32))
try:
    c.infer("mlp", [bad])
    raise AssertionError("a wrong shape was accepted")
except InferenceServerException as e:
    assert "does not match" in e.message(), e.message()

print(json.dumps({"ok": True, "max_abs_diff": worst, "infer_calls": modes, "classified": classified}))
