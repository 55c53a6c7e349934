//! Bundle files: several recipes served by one image per target (`infer-build build
//! bundle.toml`). Each model keeps its own recipe (inputs, precision, batching, warm-up, text);
//! the bundle names them, and the image they share:
//!
//! ```toml
//! [bundle]
//! name = "ocr"
//! version = "1.0.0"
//! models = ["det/recipe.toml", "cls/recipe.toml", "rec/recipe.toml"]
//!
//! [image]                                  # optional
//! repository = "registry.example.com/ml/ocr"
//! tag = "{version}-{target}"
//! labels = { "org.example.team" = "vision" }
//! ```
//!
//! Read with the recipe's `Checker`, so a bundle's problems are reported like a recipe's:
//! every one at once, at `file:line:col` with the key. The member recipes are loaded (and
//! reported) by [`super::load`] each; their paths are relative to the bundle's directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::de::DeValue;

use super::check::{join, Checker};
use super::diagnostic::{Located, Span};
use super::validate::{repository_problem, valid_model_name, valid_version, DEFAULT_TAG};
use super::{invalid, read_recipe, Deploy, Diagnostic, Error};

/// The top-level tables of a bundle file.
const ROOT_KEYS: [&str; 3] = ["bundle", "image", "deploy"];
const BUNDLE_KEYS: [&str; 3] = ["name", "version", "models"];
const IMAGE_KEYS: [&str; 4] = ["repository", "tag", "user", "labels"];

/// The most models a bundle lists (the runtime's bound, [`infer_spec::runtime::MAX_BUNDLE_MODELS`]).
pub(crate) const MAX_MODELS: usize = infer_spec::runtime::MAX_BUNDLE_MODELS;

/// A validated bundle file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bundle {
    /// The bundle file's path as given; diagnostics name it.
    pub file: PathBuf,
    /// The directory the model paths are relative to.
    pub dir: PathBuf,
    /// The image title and default layout name (`[bundle] name`).
    pub name: String,
    pub version: String,
    /// The member recipes, in the order the server loads them: the path as written (with
    /// where), resolved against [`Bundle::dir`].
    pub models: Vec<Located<PathBuf>>,
    /// `[image] repository`, default `localhost/infer-build/{name}`.
    pub repository: String,
    /// `[image] tag`: a tag template (`{model}` is the bundle's name, `{version}` its version).
    pub tag: Located<String>,
    pub user: u32,
    pub labels: BTreeMap<String, String>,
    /// `[deploy]`, as a recipe's (without `node_driver`, which each recipe's plan uses): the
    /// one pod's replicas, resources, latency budget and drain. The models' own `[deploy]`
    /// tables are not used for the bundle.
    pub deploy: Deploy,
}

impl Bundle {
    /// `first` (its first model's recipe) named, versioned, imaged and deployed as the bundle
    /// says: the recipe-shaped view the plan's tags and `deploy` read a bundle through.
    pub(crate) fn as_recipe(&self, first: &super::Recipe) -> super::Recipe {
        let mut r = first.clone();
        r.file = self.file.clone();
        r.model.name = self.name.clone();
        r.model.version = self.version.clone();
        r.image.repository.value = self.repository.clone();
        r.image.tag = self.tag.clone();
        r.image.user = self.user;
        r.image.labels = self.labels.clone();
        r.deploy = self.deploy.clone();
        r
    }
}

/// True when `text` is a bundle file (a top-level `[bundle]` table) rather than a recipe.
pub(crate) fn is_bundle_text(text: &str) -> bool {
    toml::de::DeTable::parse(text)
        .map(|t| t.get_ref().contains_key("bundle"))
        .unwrap_or(false)
}

/// True when the file at `path` is a bundle file; a file that cannot be read is not (the
/// recipe loader then reports why).
pub(crate) fn is_bundle(path: &Path) -> bool {
    read_recipe(path)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .is_some_and(|t| is_bundle_text(&t))
}

/// Read and validate the bundle file at `path`, and check that each model it lists is a file.
pub(crate) fn load(path: &Path) -> Result<Bundle, Error> {
    let bytes = read_recipe(path)?;
    let source = std::str::from_utf8(&bytes).map_err(|e| {
        let (line, col) = super::diagnostic::byte_position(&bytes, e.valid_up_to());
        invalid(
            path,
            vec![Diagnostic {
                file: path.to_path_buf(),
                line,
                col,
                key: String::new(),
                message: "the bundle file is not valid UTF-8".into(),
                hint: Some("save the file as UTF-8".into()),
            }],
        )
    })?;
    let (bundle, mut diagnostics) = parse_text(source, path);
    if let Some(b) = &bundle {
        for m in &b.models {
            let p = b.dir.join(&m.value);
            if !p.is_file() {
                diagnostics
                    .push(m.diagnostic(path, format!("{} is not a recipe file", p.display())));
            }
        }
    }
    match bundle {
        Some(b) if diagnostics.is_empty() => Ok(b),
        _ => Err(invalid(path, diagnostics)),
    }
}

/// Parse and validate bundle text without touching the filesystem.
#[cfg(test)]
fn parse(source: &str, file: &Path) -> Result<Bundle, Error> {
    match parse_text(source, file) {
        (Some(b), d) if d.is_empty() => Ok(b),
        (_, d) => Err(invalid(file, d)),
    }
}

fn parse_text(source: &str, file: &Path) -> (Option<Bundle>, Vec<Diagnostic>) {
    let mut cx = Checker::new(file, source);
    cx.root_keys = &ROOT_KEYS;
    let (doc, errors) = toml::de::DeTable::parse_recoverable(source);
    if !errors.is_empty() {
        for e in errors.into_iter().take(10) {
            let span = cx.span(e.span().unwrap_or(0..0));
            let message = e.message().trim().replace('\n', "; ");
            cx.error(span, "", format!("invalid TOML: {message}"));
        }
        return (None, cx.diagnostics);
    }
    let doc = doc.get_ref();
    let root = cx.root(doc);
    cx.unknown_keys(&root, &ROOT_KEYS);
    let Some(b) = cx.table(&root, "bundle") else {
        if !doc.contains_key("bundle") {
            cx.error_hint(
                Span::START,
                "bundle",
                "missing table [bundle]",
                "a bundle file starts with [bundle] naming the image and its models",
            );
        }
        return (None, cx.diagnostics);
    };
    cx.unknown_keys(&b, &BUNDLE_KEYS);
    let name = cx.required_string(&b, "name", "\"ocr\"").filter(|n| {
        let ok = valid_model_name(&n.value);
        if !ok {
            cx.error_hint(
                n.span,
                &n.key,
                format!("invalid bundle name {:?}", n.value),
                "use 1 to 63 lowercase letters, digits, `.`, `_` or `-`, starting with a letter or digit",
            );
        }
        ok
    });
    let version = cx.required_string(&b, "version", "\"1.0.0\"").filter(|v| {
        let ok = valid_version(&v.value);
        if !ok {
            cx.error(
                v.span,
                &v.key,
                format!(
                    "invalid version {:?}: use letters, digits, `.`, `_` and `-`",
                    v.value
                ),
            );
        }
        ok
    });
    let models = models(&mut cx, &b);
    let image = cx.table(&root, "image");
    let mut repository = None;
    let mut tag = Located::new(
        DEFAULT_TAG.to_string(),
        image.as_ref().map_or(Span::START, |t| t.span),
        "image.tag",
    );
    let mut user = super::DEFAULT_USER;
    let mut labels = BTreeMap::new();
    if let Some(t) = &image {
        cx.unknown_keys(t, &IMAGE_KEYS);
        if let Some(r) = cx.string(t, "repository") {
            match repository_problem(&r.value) {
                Some(problem) => cx.error(
                    r.span,
                    &r.key,
                    format!("invalid repository {:?}: {problem}", r.value),
                ),
                None => repository = Some(r.value),
            }
        }
        if let Some(t) = cx.string(t, "tag") {
            tag = t;
        }
        if let Some(u) = cx.int(t, "user", 1, i64::from(i32::MAX), "a non-zero user id") {
            user = u.value as u32;
        }
        if let Some(l) = cx.table(t, "labels") {
            for (k, v) in l.inner.iter() {
                let key = join(&l.key, k.get_ref());
                match v.get_ref() {
                    DeValue::String(s) => {
                        labels.insert(k.get_ref().to_string(), s.to_string());
                    }
                    _ => cx.expected(v, &key, "a string"),
                }
            }
        }
    }
    let deploy_table = cx.table(&root, "deploy");
    // The models' batching delays are checked against their own budgets; here only the
    // bundle's keys.
    let no_delay = infer_spec::Batching {
        max_queue_delay_us: 0,
        ..infer_spec::Batching::default()
    };
    let deploy = super::validate::deploy(&mut cx, deploy_table.as_ref(), &no_delay);
    if let Some(d) = &deploy.node_driver {
        cx.error_hint(
            d.span,
            &d.key,
            "a bundle's [deploy] has no node_driver",
            "set it in each model's recipe: it picks the TensorRT and CUDA their engines are built for",
        );
    }
    let bundle = match (name, version, models) {
        (Some(name), Some(version), Some(models)) if cx.diagnostics.is_empty() => Some(Bundle {
            file: file.to_path_buf(),
            dir: file.parent().unwrap_or(Path::new("")).to_path_buf(),
            repository: repository
                .unwrap_or_else(|| format!("localhost/infer-build/{}", name.value)),
            name: name.value,
            version: version.value,
            models,
            tag,
            user,
            labels,
            deploy,
        }),
        _ => None,
    };
    (bundle, cx.diagnostics)
}

/// `[bundle] models`: one to [`MAX_MODELS`] recipe paths, each once.
fn models(cx: &mut Checker<'_>, b: &super::check::Table<'_, '_>) -> Option<Vec<Located<PathBuf>>> {
    let example = "[\"det/recipe.toml\", \"rec/recipe.toml\"]";
    if b.inner.get("models").is_none() {
        cx.missing(b, "models", example);
        return None;
    }
    let (items, key, span) = cx.array(b, "models", "a list of recipe paths", example)?;
    if items.is_empty() || items.len() > MAX_MODELS {
        cx.error(
            span,
            &key,
            format!(
                "a bundle lists 1 to {MAX_MODELS} recipes, not {}",
                items.len()
            ),
        );
        return None;
    }
    let mut out: Vec<Located<PathBuf>> = Vec::new();
    let mut ok = true;
    for (i, v) in items.iter().enumerate() {
        let k = format!("{key}[{i}]");
        let DeValue::String(s) = v.get_ref() else {
            cx.expected(v, &k, "a recipe path");
            ok = false;
            continue;
        };
        let at = cx.span_of(v);
        if s.is_empty() || s.contains('\0') {
            cx.error(
                at,
                &k,
                "a recipe path must not be empty or hold a NUL character",
            );
            ok = false;
            continue;
        }
        let p = PathBuf::from(s.to_string());
        if out.iter().any(|o| o.value == p) {
            cx.error(at, &k, format!("{s:?} is listed twice"));
            ok = false;
            continue;
        }
        out.push(Located::new(p, at, k));
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> String {
        match parse(text, Path::new("bundle.toml")) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_bundle_names_its_models_and_defaults_its_image() {
        let b = parse(
            "[bundle]\nname = \"ocr\"\nversion = \"1.0.0\"\nmodels = [\"det/r.toml\", \"rec/r.toml\"]\n",
            Path::new("x/bundle.toml"),
        )
        .unwrap();
        assert_eq!(b.name, "ocr");
        assert_eq!(b.repository, "localhost/infer-build/ocr");
        assert_eq!(b.tag.value, DEFAULT_TAG);
        assert_eq!(b.user, super::super::DEFAULT_USER);
        assert_eq!(b.dir, Path::new("x"));
        let paths: Vec<_> = b.models.iter().map(|m| m.value.clone()).collect();
        assert_eq!(
            paths,
            [PathBuf::from("det/r.toml"), PathBuf::from("rec/r.toml")]
        );
        assert_eq!(b.models[1].key, "bundle.models[1]");
        assert!(is_bundle_text("[bundle]\nname = \"x\"\n"));
        assert!(!is_bundle_text("[model]\nname = \"x\"\n"));
        assert!(!is_bundle_text("not toml ["));
        // A command that takes a recipe says what the file is.
        let e = super::super::parse("[bundle]\nname = \"x\"\n", Path::new("b.toml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.toml:1:1: bundle: this is a bundle file"),
            "{e}"
        );
    }

    #[test]
    fn bundle_problems_name_line_and_key() {
        for (text, want) in [
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\n", "bundle.toml:1:2: bundle.models: missing required key `models`"),
            ("[bundle]\nname = \"OCR\"\nversion = \"1\"\nmodels = [\"a\"]\n", "bundle.toml:2:8: bundle.name: invalid bundle name \"OCR\""),
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodels = []\n", "bundle.toml:4:10: bundle.models: a bundle lists 1 to 64 recipes, not 0"),
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodels = [\"a\", \"a\"]\n", "bundle.toml:4:16: bundle.models[1]: \"a\" is listed twice"),
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodels = [\"a\", 3]\n", "bundle.toml:4:16: bundle.models[1]: expected a recipe path, found integer 3"),
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodel = [\"a\"]\n", "unknown key `model` in [bundle]; did you mean `models`?"),
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodels = [\"a\"]\n[image]\nrepository = \"Up/x\"\n", "bundle.toml:6:14: image.repository: invalid repository"),
            ("[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodels = [\"a\"]\n[image]\nuser = 0\n", "bundle.toml:6:8: image.user"),
            ("[model]\nname = \"x\"\n", "missing table [bundle]"),
            ("[bundle\n", "invalid TOML"),
        ] {
            let got = problems(text);
            assert!(got.contains(want), "{text:?}: {got}");
        }
    }
}
