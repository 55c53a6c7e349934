"""gRPC load across a server's SIGTERM: THREADS threads share one tritonclient gRPC client (one
HTTP/2 connection, as gRPC clients do) and call ModelInfer on the synthetic model `syn` (1×4
FP32) until the server is gone, at most SECONDS + 20 s.

usage: serve_grpc_load.py HOST:GRPC_PORT THREADS SECONDS
Prints one JSON line: calls answered, answered after the server started draining (its health
said NOT_SERVING), refused a connection (the listener had closed: never sent), and failed (any
other error: a call that was sent and lost).
"""
import json
import sys
import threading
import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

url, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
client = grpcclient.InferenceServerClient(url=url)
health = grpc.insecure_channel(url).unary_unary(
    "/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None
)
lock = threading.Lock()
counts = {"ok": 0, "ok_after_sigterm": 0, "refused": 0, "failed": []}
draining = threading.Event()
gone = threading.Event()
end = time.monotonic() + seconds + 20


def refused(msg):
    m = msg.lower()
    return "failed to connect" in m or "connection refused" in m or "connect failed" in m


def work(i):
    x = np.full((1, 4), i, dtype=np.float32)
    inp = grpcclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    while not gone.is_set() and time.monotonic() < end:
        after = draining.is_set()
        try:
            r = client.infer("synthetic", [inp], client_timeout=10)
            assert r.as_numpy("y").shape == (1, 4)
            with lock:
                counts["ok"] += 1
                counts["ok_after_sigterm"] += after
        except InferenceServerException as e:
            msg = f"{e.status()} {e.message()}"
            with lock:
                if refused(msg):
                    counts["refused"] += 1
                    if counts["refused"] > 20:
                        gone.set()
                else:
                    counts["failed"].append(msg)
            time.sleep(0.01)


def watch():
    # The drain turns health to NOT_SERVING (b"\x08\x02") while calls are still answered.
    while not gone.is_set() and time.monotonic() < end:
        try:
            if health(b"", timeout=2) == b"\x08\x02":
                draining.set()
                return
        except grpc.RpcError:
            return
        time.sleep(0.02)


ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)] + [threading.Thread(target=watch)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps(counts))
