"""`bench --tune` on a real text model: does the per-token cost model predict what the server does?

all-MiniLM-L6-v2 (the ONNX and tokenizer.json of tests/it/real_models.py) served two ways by the
same runtime: as a text model (`[text]`, mean pooling; requests carry sentences) and as a padded
tensor model (the same ONNX, token inputs with `pad = 0`; requests carry token ids). For each,
`infer-build bench --tune` sweeps the queue delay at one open-loop rate, fits T per token computed
from the server's `infer_serve_batch_tokens_total`, replays the runtime's padded batching with the
lengths it sent, and this script prints, per point, the measured and the replayed mean batch and
capacity side by side.

Usage: python bench/tune_text.py INFER_BUILD SERVE CACHE [TEXT_RATE] [TENSOR_RATE] [DURATION_S]
(SERVE: the dynamic release-serve runtime; CACHE: target/real-models.)
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = 'datatype = "INT64"\ndims = [-1, -1]\nprofile = { min = [1], opt = [16], max = [256] }\ndim_names = ["sequence"]'


def config(onnx, lib, tok, text, threads=2, padding=25, port=8000, kind="onnxruntime", precision=None):
    """all-MiniLM-L6-v2's runtime.toml: a text model (`text`: mean pooling, L2-normalised,
    `max_padding_percent = padding`, 0: none) or a padded tensor model (`pad = 0`), on the
    engine `kind` ("onnxruntime" or "openvino") from the library `lib`, computing in `precision`
    (OpenVINO's engine.precision; None: the engine's default)."""
    inputs = "".join(
        f'[[inputs]]\nname = "{n}"\n{IDS}\n{"" if text else "pad = 0"}\n\n'
        for n in ("input_ids", "attention_mask", "token_type_ids"))
    tail = f'''[text]
tokenizer = "{tok}"
max_length = 256
input_ids = "input_ids"
attention_mask = "attention_mask"
token_type_ids = "token_type_ids"
output = "last_hidden_state"
pooling = "mean"
normalize = true
{f"max_padding_percent = {padding}" if padding else ""}
''' if text else ""
    return f'''[model]
name = "minilm"

{inputs}[[outputs]]
name = "last_hidden_state"
datatype = "FP32"
dims = [-1, -1, 384]

[batching]
max_batch_size = 16
max_queue_delay_us = 2000
instances = 1

[engine]
kind = "{kind}"
path = "{onnx}"
library = "{lib}"
threads = {threads}
{f'precision = "{precision}"' if precision else ""}

{tail}
[server]
host = "127.0.0.1"
port = {port}
'''


def main():
    build, serve, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    rates = {"text": sys.argv[4] if len(sys.argv) > 4 else "250",
             "tensors": sys.argv[5] if len(sys.argv) > 5 else "150"}
    duration = sys.argv[6] if len(sys.argv) > 6 else "8"
    onnx = os.path.abspath(os.path.join(cache, "minilm.onnx"))
    tok = os.path.abspath(os.path.join(cache, "minilm.tokenizer.json"))
    lib = json.loads(subprocess.run([sys.executable, os.path.join(ROOT, "tests/it/real_models.py"), "fetch-ort", cache],
                                    capture_output=True, text=True, check=True).stdout)["library"]
    w = tempfile.mkdtemp(prefix="bench-tune-text.")
    for kind, text, lengths in (("text", True, "4-48"), ("tensors", False, "6-50")):
        cfg = os.path.join(w, f"{kind}.toml")
        with open(cfg, "w") as f:
            f.write(config(onnx, os.path.abspath(lib), tok, text))
        out = subprocess.run([build, "bench", "--tune", cfg, "--serve", serve, "--rate", rates[kind], "--budget-ms", "1000",
                              "--delays-ms", "0,10", "--max-batch", "1,4,16", "--lengths", lengths,
                              "--duration", f"{duration}s", "--warmup", "1s", "--json",
                              "--csv", os.path.join(w, f"{kind}.csv"), "--report", os.path.join(w, f"{kind}.html")],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{kind}: bench --tune failed:\n{out.stderr}")
        v = json.loads(out.stdout)
        m = v.get("model")
        if m:
            print(f"{kind}: T = {m['fixed_us'] / 1000:.2f} ms + {m['per_token_us']:.2f} us x tokens "
                  f"(+ {m['per_row_us'] / 1000:.3f} ms x rows), within {m['max_rel_error'] * 100:.1f}% of every point")
        else:
            print(f"{kind}: no cost model: {v.get('model_refused')}")
        print(f"{kind}: max_batch delay_ms | batch meas/replay | capacity rows/s meas/replay | padding % | p99 ms")
        for r in v["results"]:
            s = r["step"]["server"] or {}
            pad = 100 * (1 - s.get("sequence_tokens", 0) / s["batch_tokens"]) if s.get("batch_tokens") else float("nan")
            p = r.get("predicted") or {}
            nan = float("nan")
            r = {**r, "mean_batch": r.get("mean_batch") or nan, "capacity_rps": r.get("capacity_rps") or nan}
            print(f"{kind}: {r['point']['max_batch']:>2} {r['point']['delay_us'] / 1000:>5.0f} | {r['mean_batch']:.2f} / {p.get('mean_batch', float('nan')):.2f}"
                  f" | {r['capacity_rps']:.0f} / {p.get('capacity_rps', float('nan')):.0f} | {pad:.1f} | {r['p99_ms']:.1f}")
        rec = v.get("recommendation")
        if rec:
            print(f"{kind}: recommended max_batch_size {rec['point']['max_batch']}, "
                  f"max_queue_delay_us {rec['point']['delay_us']}")


if __name__ == "__main__":
    main()
