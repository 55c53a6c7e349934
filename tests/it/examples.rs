//! The examples under `examples/`, one directory per headline feature (text in, a reranker, a
//! bundle, the split layout), run as their READMEs say. Nothing of a README is copied here: the
//! test reads its fenced `sh` blocks and runs them verbatim, in order, as one bash script
//! (`set -euo pipefail`: the first command that fails fails the test), in a temporary copy of the
//! example directories laid out as in the repository (the READMEs start from its root), with the
//! `infer-build` this test run built first on `PATH`, where `scripts/install.sh` puts it for a
//! user, and the statically linked runtime as `$INFER_SERVE_BIN` (an install has it beside
//! `infer-build`).
//!
//! What a README shows a command print: a fenced `json` block is printed exactly so (the
//! tokens of `/tokenize`, a V2 model's metadata, the repository index, an error), checked here;
//! a `text` block is an illustration (vectors and scores of stand-in weights, digests, Docker's
//! messages), not compared, and each test checks those answers' shape and bounds instead.
//! Every image a README builds starts and answers (the model image of the split layout, which has
//! no entrypoint, is mounted into the runtime image instead); what the script loaded into Docker
//! is removed afterwards, with any container it left.

use std::path::{Path, PathBuf};
use std::process::Command;

use infer_build::report::Inspection;
use serde_json::Value;

use super::support::{self, have_docker, have_tool, stderr, stdout};

/// The examples with a README a test runs.
const EXAMPLES: [&str; 5] = [
    "text-embeddings",
    "reranker",
    "bundle",
    "split-layout",
    "image-classification",
];

/// What the READMEs write into an example's directory (the root `.gitignore` lists them): never
/// copied, so a README that was run in place is tested as a fresh checkout has it.
fn is_output(name: &str) -> bool {
    ["out", "k8s", "model"].contains(&name) || name.ends_with(".tar")
}

/// The fenced blocks of `markdown` whose info string is `lang`, in order, each as its lines.
fn fenced(markdown: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    // The open block: whether it is one of `lang`, and its text so far.
    let mut open: Option<(bool, String)> = None;
    for line in markdown.lines() {
        open = match open {
            None => line
                .strip_prefix("```")
                .map(|info| (info.trim() == lang, String::new())),
            Some((keep, body)) if line.trim_end() == "```" => {
                if keep {
                    blocks.push(body);
                }
                None
            }
            Some((keep, mut body)) => {
                body.push_str(line);
                body.push('\n');
                Some((keep, body))
            }
        };
    }
    assert!(open.is_none(), "a fenced block is not closed");
    blocks
}

fn readme(example: &str) -> String {
    let path = support::root()
        .join("examples")
        .join(example)
        .join("README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A copy of `from` at `to`, without what the READMEs write.
fn copy_example(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if is_output(&name.to_string_lossy()) {
            continue;
        }
        let kind = e.file_type().unwrap();
        if kind.is_dir() {
            copy_example(&e.path(), &to.join(&name));
        } else if kind.is_file() {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// The images a README loaded into Docker (`Loaded image: …` lines of its output), removed on
/// drop with every container of theirs, whether the README ran to its end or not.
struct Loaded(Vec<String>);

impl Loaded {
    fn from_output(out: &str) -> Loaded {
        Loaded(
            out.lines()
                .filter_map(|l| l.strip_prefix("Loaded image: "))
                .map(|t| t.trim().to_string())
                .collect(),
        )
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        for image in &self.0 {
            let ids = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("ancestor={image}")])
                .output()
                .map(|o| stdout(&o))
                .unwrap_or_default();
            for id in ids.split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", id]).output();
            }
            let _ = Command::new("docker").args(["rmi", image]).output();
        }
    }
}

/// One README run to its end: its directory (the copy the commands ran in, as the repository's
/// root) and what the commands printed.
struct ReadmeRun {
    dir: tempfile::TempDir,
    out: String,
    _loaded: Loaded,
}

impl ReadmeRun {
    /// A path under the example's directory of the copy.
    fn path(&self, example: &str, p: &str) -> PathBuf {
        self.dir.path().join("examples").join(example).join(p)
    }

    /// The lines the commands printed that parse as JSON.
    fn json_lines(&self) -> Vec<Value> {
        self.out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// Runs `example`'s README as described in the module docs, in a copy of the example
/// directories `copies` (the example's own, and those its files name); `None` (the reason
/// printed) without Docker, curl or one of `tools`. Panics when a command fails, or when a
/// `json` block of the README is not what its command printed.
fn run_readme(example: &str, copies: &[&str], tools: &[&str], test: &str) -> Option<ReadmeRun> {
    if !have_docker(test) || !have_tool("curl", test) {
        return None;
    }
    if tools.iter().any(|t| !have_tool(t, test)) {
        return None;
    }
    let text = readme(example);
    let script = fenced(&text, "sh").concat();
    assert!(!script.is_empty(), "{example}/README.md has no sh block");
    let dir = tempfile::tempdir().unwrap();
    for c in copies {
        copy_example(
            &support::root().join("examples").join(c),
            &dir.path().join("examples").join(c),
        );
    }
    // `infer-build` first on PATH, as an install leaves it.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_infer-build"), bin.join("infer-build")).unwrap();
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    // `timeout`: a command that hangs fails the test instead of holding it.
    let o = Command::new("timeout")
        .args(["600", "bash", "-euo", "pipefail", "-x", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("INFER_SERVE_BIN", super::real_models::static_runtime())
        .env("INFER_BUILD_CACHE_DIR", dir.path().join("cache"))
        .env_remove("INFER_BUILD_MATRIX")
        .output()
        .unwrap();
    let out = stdout(&o);
    let loaded = Loaded::from_output(&out);
    if !o.status.success() {
        let err = stderr(&o);
        // The end of it, cut at a character (`build` prints non-ASCII).
        let skip = err.chars().count().saturating_sub(12_000);
        let tail: String = err.chars().skip(skip).collect();
        panic!(
            "{example}/README.md: a command failed ({}); the commands printed:\n{out}\n\
             the commands (bash -x) and their errors:\n{tail}",
            o.status
        );
    }
    eprintln!("{example}/README.md: the commands printed:\n{out}");
    for want in fenced(&text, "json") {
        let want = want.trim();
        assert!(
            out.contains(want),
            "{example}/README.md shows\n{want}\nbut the commands printed:\n{out}"
        );
    }
    Some(ReadmeRun {
        dir,
        out,
        _loaded: loaded,
    })
}

/// A unit-length vector, within float rounding.
fn assert_unit(v: &[Value], what: &str) {
    let norm: f64 = v.iter().map(|x| x.as_f64().unwrap().powi(2)).sum();
    assert!(
        (norm.sqrt() - 1.0).abs() < 1e-3,
        "{what}: norm {}",
        norm.sqrt()
    );
}

/// Every example this file runs has a README with commands, and every example directory with a
/// README with commands is run here; the recipes and the bundle file pass `check` (without
/// Docker too).
#[test]
fn every_example_readme_is_run_and_its_files_check() {
    let mut with_commands: Vec<String> = std::fs::read_dir(support::root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|d| {
            std::fs::read_to_string(support::root().join("examples").join(d).join("README.md"))
                .is_ok_and(|t| !fenced(&t, "sh").is_empty())
        })
        .collect();
    with_commands.sort();
    let mut want = EXAMPLES.map(String::from).to_vec();
    want.sort();
    assert_eq!(with_commands, want);
    for file in [
        "examples/text-embeddings/recipe.toml",
        "examples/reranker/recipe.toml",
        "examples/bundle/bundle.toml",
        "examples/split-layout/recipe.toml",
        "examples/image-classification/recipe.toml",
    ] {
        let o = support::run(&["check", file]);
        assert!(o.status.success(), "{file}: {}", stderr(&o));
    }
    // The text examples carry the real tokenizer, one file.
    let tokenizer =
        support::sha256_file(&support::root().join("examples/text-embeddings/tokenizer.json"));
    for other in [
        "examples/reranker/tokenizer.json",
        "examples/split-layout/tokenizer.json",
        "recipes/tokenizers/bert-base-uncased.json",
    ] {
        assert_eq!(
            support::sha256_file(&support::root().join(other)),
            tokenizer,
            "{other}"
        );
    }
}

#[test]
fn readme_blocks_are_read_in_order_by_their_language() {
    let md = "# t\n```sh\na\nb\n```\ntext\n```json\n{}\n```\n```sh\nc\n```\n```\nd\n```\n";
    assert_eq!(fenced(md, "sh"), ["a\nb\n", "c\n"]);
    assert_eq!(fenced(md, "json"), ["{}\n"]);
}

/// `examples/text-embeddings`: all-MiniLM-L6-v2 from text, FROM scratch on tract. `/embed`
/// answers one unit vector of 384 numbers per text, `/v1/embeddings` the `dimensions` asked for,
/// and the JSON the README shows (`/tokenize` with the real tokenizer's ids and offsets, the V2
/// metadata) is what came back.
#[test]
fn docker_text_embeddings_example_runs_as_written() {
    let test = "docker_text_embeddings_example_runs_as_written";
    let Some(run) = run_readme("text-embeddings", &["text-embeddings"], &[], test) else {
        return;
    };
    let answers = run.json_lines();
    let embed = answers
        .iter()
        .find_map(|v| v.as_array().filter(|a| a.len() == 2 && a[0].is_array()))
        .unwrap_or_else(|| panic!("no /embed answer in:\n{}", run.out));
    for (i, v) in embed.iter().enumerate() {
        let v = v.as_array().unwrap();
        assert_eq!(v.len(), 384, "text {i}");
        assert_unit(v, &format!("/embed text {i}"));
    }
    let openai = answers
        .iter()
        .find(|v| v["object"] == "list")
        .unwrap_or_else(|| panic!("no /v1/embeddings answer in:\n{}", run.out));
    assert_eq!(openai["model"], "all-minilm-l6-v2");
    assert_unit(
        openai["data"][0]["embedding"].as_array().unwrap(),
        "/v1/embeddings",
    );
    assert_eq!(openai["data"][0]["embedding"].as_array().unwrap().len(), 4);
    // The image is the tract one, FROM scratch: the runtime, the engine, the config; no base.
    let doc: Inspection = support::inspect(&run.path("text-embeddings", "out/all-minilm-l6-v2"));
    let image = &doc.images[0];
    assert_eq!(
        image.annotations["dev.infer-build.engine.kind"], "tract",
        "{image:?}"
    );
    assert_eq!(image.layers.len(), 3, "{image:?}");
}

/// `examples/image-classification`: a classifier from photographs, FROM scratch on tract. The
/// raw body answers the top 3 labels best first (softmax scores, labels from the labels file),
/// the form upload of two files one such answer each, and the JSON the README shows (the V2
/// metadata with its `image` input, the refusal of what is not an image) is what came back.
#[test]
fn docker_image_classification_example_runs_as_written() {
    let test = "docker_image_classification_example_runs_as_written";
    let Some(run) = run_readme("image-classification", &["image-classification"], &[], test) else {
        return;
    };
    let labels: Vec<String> =
        std::fs::read_to_string(support::root().join("examples/image-classification/labels.txt"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
    let check = |answer: &Value, what: &str| {
        let a = answer
            .as_array()
            .unwrap_or_else(|| panic!("{what}: {answer}"));
        assert_eq!(a.len(), 3, "{what}: {answer}");
        let scores: Vec<f64> = a.iter().map(|x| x["score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{what}: {answer}");
        assert!(
            scores.iter().all(|s| (0.0..=1.0).contains(s)),
            "{what}: {answer}"
        );
        for x in a {
            assert!(
                labels.contains(&x["label"].as_str().unwrap().to_owned()),
                "{what}: {x}"
            );
        }
    };
    let answers = run.json_lines();
    let one = answers
        .iter()
        .find(|v| v[0]["label"].is_string())
        .unwrap_or_else(|| panic!("no /predictions answer in:\n{}", run.out));
    check(one, "raw body");
    let two = answers
        .iter()
        .find(|v| v[0][0]["label"].is_string())
        .unwrap_or_else(|| panic!("no multipart answer in:\n{}", run.out));
    assert_eq!(two.as_array().map(Vec::len), Some(2), "{two}");
    check(&two[0], "multipart 0");
    assert_eq!(two[0], *one, "the same photograph, the same answer");
    let doc: Inspection = support::inspect(&run.path("image-classification", "out/resnet50"));
    let image = &doc.images[0];
    assert_eq!(
        image.annotations["dev.infer-build.vision.resize"], "crop",
        "{image:?}"
    );
}

/// `examples/reranker`: the cross-encoder from text pairs. `/rerank` answers every passage once,
/// sorted by score, each score a sigmoid; the V2 metadata and the refusal of `/embed` are as
/// the README shows.
#[test]
fn docker_reranker_example_runs_as_written() {
    let test = "docker_reranker_example_runs_as_written";
    let Some(run) = run_readme("reranker", &["reranker"], &[], test) else {
        return;
    };
    let rerank = run
        .json_lines()
        .into_iter()
        .find(|v| v[0]["index"].is_u64())
        .unwrap_or_else(|| panic!("no /rerank answer in:\n{}", run.out));
    let ranked = rerank.as_array().unwrap();
    let mut indexes: Vec<u64> = ranked
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    let scores: Vec<f64> = ranked
        .iter()
        .map(|r| r["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{rerank}");
    assert!(scores.iter().all(|s| *s > 0.0 && *s < 1.0), "{rerank}");
    assert!(ranked.iter().all(|r| r["text"].is_string()), "{rerank}");
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1, 2], "{rerank}");
}

/// `examples/bundle`: the two text examples in one image. Both are in the repository index,
/// `/v1/embeddings` reaches the embedder by name, V2 the reranker (its `logits` output carries
/// sigmoid scores), and each has its own metrics.
#[test]
fn docker_bundle_example_runs_as_written() {
    let test = "docker_bundle_example_runs_as_written";
    let Some(run) = run_readme(
        "bundle",
        &["bundle", "text-embeddings", "reranker"],
        &[],
        test,
    ) else {
        return;
    };
    let answers = run.json_lines();
    let openai = answers
        .iter()
        .find(|v| v["object"] == "list")
        .unwrap_or_else(|| panic!("no /v1/embeddings answer in:\n{}", run.out));
    assert_eq!(openai["model"], "all-minilm-l6-v2");
    let v2 = answers
        .iter()
        .find(|v| v["model_name"] == "msmarco-reranker")
        .unwrap_or_else(|| panic!("no V2 answer of the reranker in:\n{}", run.out));
    let out = &v2["outputs"][0];
    assert_eq!(out["name"], "logits", "{v2}");
    assert_eq!(out["shape"], serde_json::json!([2, 1]), "{v2}");
    for s in out["data"].as_array().unwrap() {
        let s = s.as_f64().unwrap();
        assert!(s > 0.0 && s < 1.0, "{v2}");
    }
    for model in ["all-minilm-l6-v2", "msmarco-reranker"] {
        assert!(
            run.out
                .lines()
                .any(|l| l.starts_with("nv_inference_request_success{")
                    && l.contains(&format!("model=\"{model}\""))),
            "no metrics of {model} in:\n{}",
            run.out
        );
    }
}

/// `examples/split-layout`: the split build's runtime image serves the model image unpacked
/// and mounted where the image volume goes, the combined image serves alone, and the YAML
/// `deploy` wrote pins the layout's runtime and model images by digest and passes
/// `kubernetes-validate --strict` for Kubernetes 1.35, where image volumes are on by default.
#[test]
fn docker_py_split_layout_example_runs_as_written() {
    let test = "docker_py_split_layout_example_runs_as_written";
    if !super::deploy::have_validator(test) {
        return;
    }
    let Some(run) = run_readme("split-layout", &["split-layout"], &["umoci"], test) else {
        return;
    };
    // Both runs answered: the runtime image with the model mounted, then the combined image.
    assert_eq!(
        run.out.matches("{\"ready\":true}").count(),
        2,
        "{}",
        run.out
    );
    let answers = run.json_lines();
    let openai = answers
        .iter()
        .find(|v| v["object"] == "list")
        .unwrap_or_else(|| panic!("no /v1/embeddings answer in:\n{}", run.out));
    assert_eq!(openai["model"], "all-minilm-l6-v2");

    let doc = support::inspect(&run.path("split-layout", "out/all-minilm-l6-v2"));
    let digest = |tag: &str| {
        doc.images
            .iter()
            .find(|i| i.tags.iter().any(|t| t == tag))
            .unwrap_or_else(|| panic!("no image tagged {tag}"))
            .manifest_digest
            .to_string()
    };
    let yaml_path = run.path("split-layout", "k8s/all-minilm-l6-v2-cpu-fp32.yaml");
    let yaml = std::fs::read_to_string(&yaml_path).unwrap();
    let repo = "registry.example.com/nlp/all-minilm-l6-v2";
    for want in [
        format!("image: \"{repo}@{}\"", digest("1.0.0-cpu-fp32-runtime")),
        format!("reference: \"{repo}@{}\"", digest("1.0.0-cpu-fp32-model")),
    ] {
        assert!(yaml.contains(&want), "no {want:?} in:\n{yaml}");
    }
    let (ok, out) = super::deploy::validate_at(&[yaml_path.as_path()], "1.35.0");
    assert!(ok, "{out}");
    assert_eq!(out.matches("passed").count(), 4, "{out}");
}

/// `recipe` with each table `snippet` writes (`[name]` to the next header) in place of the
/// recipe's own, or added at the end.
fn with_tables(recipe: &str, snippet: &str) -> String {
    let tables = |text: &str| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if line.starts_with('[') {
                out.push((line.trim().to_string(), String::new()));
            }
            if let Some((_, body)) = out.last_mut() {
                body.push_str(line);
                body.push('\n');
            }
        }
        out
    };
    let mut text = recipe.to_string();
    for (header, body) in tables(snippet) {
        match tables(&text).into_iter().find(|(h, _)| *h == header) {
            Some((_, old)) => text = text.replacen(&old, &body, 1),
            None => text = format!("{text}\n{body}"),
        }
    }
    text
}

/// The recipe changes a README shows as TOML (not run as commands) apply to its example's
/// recipe and pass `check`, and say what the README says they do: text-embeddings' `cpu-bf16`
/// section plans a BF16 target beside the FP32 one, on OpenVINO.
#[test]
fn readme_recipe_snippets_apply_and_check() {
    let snippets = fenced(&readme("text-embeddings"), "toml");
    assert_eq!(snippets.len(), 1, "{snippets:?}");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("text-embeddings");
    copy_example(&support::root().join("examples/text-embeddings"), &copy);
    let recipe = copy.join("recipe.toml");
    let text = std::fs::read_to_string(&recipe).unwrap();
    let changed = with_tables(&text, &snippets[0]);
    assert!(changed.contains("cpu = [\"fp32\", \"bf16\"]"), "{changed}");
    assert!(!changed.contains("cpu = \"tract\""), "{changed}");
    std::fs::write(&recipe, changed).unwrap();
    let o = support::run(&["plan", recipe.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let targets: Vec<(&str, &str)> = plan["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tag"].as_str().unwrap(),
                t["cpu"]["engine"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [("1.0.0-cpu-fp32", "auto"), ("1.0.0-cpu-bf16", "openvino")],
        "{plan}"
    );
}
