"""tritonclient[grpc] against a running infer-serve's gRPC port, cross-checked with onnxruntime.

usage: serve_grpc_tritonclient.py HOST:GRPC_PORT MODEL.onnx MAX_BODY_BYTES
Raw tensors (raw_input_contents, what tritonclient's InferInput sends) and typed `contents`
(built with tritonclient's own protobuf messages and stub), the metadata, config, statistics
and health RPCs, and bad input: malformed protobuf, a raw size that disagrees with the shape,
unknown model and input, a message over the size limit, an RPC the server does not have. Exits
non-zero with a message on the first mismatch; prints one JSON summary line on success.
"""
import json
import sys

import grpc
import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

url, onnx_path, max_body = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = grpcclient.InferenceServerClient(url=url)
channel = grpc.insecure_channel(url)
stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)


def expect_error(fn, code, needle):
    """fn() must fail with gRPC status `code` and a message containing `needle`."""
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        assert needle in e.details(), (needle, e.details())
        return e.details()
    except InferenceServerException as e:
        assert e.status() == str(code), (e.status(), e.message())
        assert needle in e.message(), (needle, e.message())
        return e.message()
    raise AssertionError(f"expected {code} with {needle!r}, the call succeeded")


assert c.is_server_live(), "is_server_live"
assert c.is_server_ready(), "is_server_ready"
assert c.is_model_ready("mlp"), "is_model_ready"
assert c.is_model_ready("mlp", "1"), "is_model_ready with version"
expect_error(lambda: c.is_model_ready("nope"), grpc.StatusCode.NOT_FOUND, 'unknown model "nope"')

server = c.get_server_metadata()
assert server.name == "infer-serve" and "binary_tensor_data" in server.extensions, server

meta = c.get_model_metadata("mlp")
assert meta.name == "mlp" and list(meta.versions) == ["1"], meta
assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("input", "FP32", [-1, 64])], meta
assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [("output", "FP32", [-1, 10])], meta
expect_error(lambda: c.get_model_metadata("nope"), grpc.StatusCode.NOT_FOUND, "unknown model")

config = c.get_model_config("mlp").config
assert config.name == "mlp" and config.max_batch_size == 32, config
assert config.input[0].data_type == grpcclient.model_config_pb2.TYPE_FP32, config
assert list(config.input[0].dims) == [64] and list(config.output[0].dims) == [10], config
assert list(config.dynamic_batching.preferred_batch_size) == [8, 16, 32], config
assert config.dynamic_batching.default_queue_policy.max_queue_size == 1024, config

sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(11)
worst = 0.0
calls = 0


def compare(got, x, what):
    global worst
    want = sess.run(None, {"input": x})[0]
    assert got is not None and got.shape == want.shape, (what, None if got is None else got.shape)
    diff = float(np.abs(got - want).max())
    assert diff <= 1e-5, f"{what}: max |diff| {diff}"
    worst = max(worst, diff)


for rows in (1, 3, 32):
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    # Raw tensors: tritonclient's InferInput sends raw_input_contents.
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for outputs in (None, [grpcclient.InferRequestedOutput("output")]):
        res = c.infer("mlp", [inp], outputs=outputs, request_id=f"raw{rows}")
        compare(res.as_numpy("output"), x, f"raw rows {rows}")
        assert res.get_response().id == f"raw{rows}"
        calls += 1
    # Typed contents: the same request with fp32_contents, through tritonclient's stub.
    req = service_pb2.ModelInferRequest(model_name="mlp", model_version="1", id=f"typed{rows}")
    t = req.inputs.add(name="input", datatype="FP32", shape=[rows, 64])
    t.contents.fp32_contents.extend(x.ravel().tolist())
    resp = stub.ModelInfer(req)
    assert resp.id == f"typed{rows}" and resp.model_name == "mlp", resp.id
    out = resp.outputs[0]
    assert (out.name, out.datatype, list(out.shape)) == ("output", "FP32", [rows, 10]), out
    got = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(rows, 10)
    compare(got, x, f"typed rows {rows}")
    calls += 1

# The classification extension over gRPC: each row's k largest values as "value:index", as
# Triton answers, beside the raw output of the same inputs.
for rows in (1, 3):
    x = rng.standard_normal((rows, 64), dtype=np.float32)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    raw = c.infer("mlp", [inp]).as_numpy("output")
    for k in (1, 3, 25):
        res = c.infer("mlp", [inp], outputs=[grpcclient.InferRequestedOutput("output", class_count=k)])
        out = res.get_output("output")
        assert out.datatype == "BYTES" and list(out.shape) == [rows, min(k, 10)], out
        got = res.as_numpy("output")
        for r in range(rows):
            order = sorted(range(10), key=lambda i: (-float(raw[r][i]), i))[:k]
            want = [f"{float(raw[r][i]):f}:{i}".encode() for i in order]
            assert list(got[r]) == want, (rows, k, list(got[r]), want)
        calls += 1

stats = c.get_inference_statistics("mlp")
s = stats.model_stats[0]
assert s.name == "mlp" and s.inference_stats.success.count >= calls, stats
assert len(s.batch_stats) >= 1, stats
assert len(c.get_inference_statistics("").model_stats) == 1

# Bad input: a status that says what was wrong, and the server keeps serving.
infer = channel.unary_unary(
    "/inference.GRPCInferenceService/ModelInfer",
    request_serializer=None,
    response_deserializer=None,
)
errors = {}
errors["malformed"] = expect_error(
    lambda: infer(b"\x0a\xff\xff\xff"), grpc.StatusCode.INVALID_ARGUMENT, "malformed ModelInferRequest message"
)


def raw_request(nbytes, name="input", model="mlp", shape=(1, 64)):
    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype="FP32", shape=list(shape))
    req.raw_input_contents.append(b"\0" * nbytes)
    return req


errors["raw size"] = expect_error(
    lambda: stub.ModelInfer(raw_request(255)),
    grpc.StatusCode.INVALID_ARGUMENT,
    'input "input": raw_input_contents: binary data has 255 bytes but 64 FP32 elements need 256',
)
errors["unknown model"] = expect_error(
    lambda: stub.ModelInfer(raw_request(256, model="nope")), grpc.StatusCode.NOT_FOUND, 'unknown model "nope"'
)
errors["unknown input"] = expect_error(
    lambda: stub.ModelInfer(raw_request(256, name="x")), grpc.StatusCode.INVALID_ARGUMENT, 'unknown input "x"'
)
errors["shape"] = expect_error(
    lambda: stub.ModelInfer(raw_request(252, shape=(1, 63))), grpc.StatusCode.INVALID_ARGUMENT, "does not match"
)
errors["too large"] = expect_error(
    lambda: stub.ModelInfer(raw_request(max_body + 1)),
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    f"larger than the limit of {max_body} bytes",
)
errors["unimplemented"] = expect_error(
    lambda: stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="mlp")),
    grpc.StatusCode.UNIMPLEMENTED,
    "RepositoryModelLoad",
)

# The model repository index, as tritonclient asks for it.
index = c.get_model_repository_index(as_json=True)
assert index["models"] == [{"name": "mlp", "version": "1", "state": "READY"}], index

# grpc.health.v1, called as any health checker does (HealthCheckRequest{service} → status).
check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
assert check(b"") == b"\x08\x01", "health of the server: SERVING"
svc = b"inference.GRPCInferenceService"
assert check(b"\x0a" + bytes([len(svc)]) + svc) == b"\x08\x01", "health of the inference service"
errors["health"] = expect_error(lambda: check(b"\x0a\x03abc"), grpc.StatusCode.NOT_FOUND, 'unknown service "abc"')

# Still serving after all of that.
x = rng.standard_normal((2, 64), dtype=np.float32)
inp = grpcclient.InferInput("input", [2, 64], "FP32")
inp.set_data_from_numpy(x)
compare(c.infer("mlp", [inp]).as_numpy("output"), x, "after the errors")

print(json.dumps({"ok": True, "max_abs_diff": worst, "infer_calls": calls + 1, "errors": errors}))
