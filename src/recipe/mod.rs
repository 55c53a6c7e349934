//! Recipes: the TOML file a user writes (model, targets, batching, image, deploy), parsed and
//! validated into a plain [`Recipe`] value. The key-by-key reference is `docs/recipe.md`.
//!
//! # Two stages
//!
//! Like ripgrep's flags, a recipe is read in two stages:
//!
//! 1. **Spanned TOML** (`check.rs`): `toml`'s [`toml::de::DeTable`] keeps the byte range of every
//!    key and value. We walk it with typed accessors that *record* a [`Diagnostic`] and carry
//!    on, instead of failing at the first problem as `#[derive(Deserialize)]` with
//!    `deny_unknown_fields` would. That is the reason there is no serde mirror struct: serde
//!    stops at the first error, and the acceptance criterion is "every problem at once".
//! 2. **Schema** (`validate.rs`): per-table allowed keys (unknown ones are refused with the
//!    closest valid key suggested), required keys, ranges, defaults, and the rules that span
//!    several keys (preferred batch sizes ≤ `max_batch_size`, profile `min ≤ opt ≤ max` and dims
//!    count, queue delay below the timeout and the latency budget, a tag template that tells the
//!    targets apart, int8 needing calibration or a Q/DQ model).
//!
//! The values later stages check against the compatibility matrix (each GPU and precision, the
//! TensorRT and CUDA pins, compatibility flags, the node driver, the tag template, the base
//! image, the calibration path) are kept as [`Located`] values, so the plan can refuse them at
//! `file:line:col` with the same [`Diagnostic`] type and rendering.
//!
//! # What this module must not do
//!
//! - Know anything about GPUs, TensorRT, CUDA or drivers beyond syntax: `"H100"` is a product
//!   name and `"10.8"` a version here; whether they exist or fit together is the matrix's and
//!   the plan's business.
//! - Touch the filesystem in [`parse`]: it is a pure function of the text (and the file name it
//!   is reported under). Only [`load`] reads the recipe and checks the files it names (that they
//!   exist, are of the right kind, and resolve inside the recipe's directory even through
//!   symbolic links), reporting a missing model together with every other problem.
//! - Panic, on any input: invalid UTF-8, enormous numbers, deep nesting and garbage all end in
//!   diagnostics. `tests/it/recipe.rs` feeds thousands of mutated recipes to [`parse`] on
//!   stable Rust; `fuzz/fuzz_targets/recipe.rs` does the same with libFuzzer.

use std::io::Read;
use std::path::{Path, PathBuf};

pub(crate) mod bundle;
mod check;
mod diagnostic;
mod types;
mod validate;
mod vision;

pub use diagnostic::{render, sort as sort_diagnostics, Diagnostic, Located, Span};
pub use types::*;
pub use validate::{
    DEFAULT_DRAIN_DELAY_S, DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE_DELAY_US,
    DEFAULT_MIN_QUEUE_SIZE, DEFAULT_TAG, DEFAULT_TIMEOUT_MS, DEFAULT_USER,
};

use validate::{FileKind, FileRef};

/// Recipes larger than this are refused unread: a recipe is a page of TOML, and a limit keeps
/// `load` from reading a device or a multi-gigabyte file by mistake.
pub const MAX_RECIPE_BYTES: u64 = 1 << 20;

/// At most this many TOML syntax errors are shown: after the first few they are mostly echoes.
const MAX_SYNTAX_ERRORS: usize = 10;

/// Errors of the `recipe` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The recipe file could not be read.
    #[error("cannot read recipe {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The recipe path is not a regular file (a directory, a FIFO, a device…).
    #[error("recipe {} is {kind}, not a regular file", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },
    /// The recipe file is larger than [`MAX_RECIPE_BYTES`].
    #[error("recipe {} is larger than {} bytes", path.display(), MAX_RECIPE_BYTES)]
    TooLarge { path: PathBuf },
    /// The recipe has problems; every one found is listed, in file order.
    #[error("{}", render_invalid(file, diagnostics))]
    Invalid {
        file: PathBuf,
        diagnostics: Vec<Diagnostic>,
    },
}

fn render_invalid(file: &Path, diagnostics: &[Diagnostic]) -> String {
    match diagnostics.len() {
        1 => render(diagnostics),
        n => format!(
            "{n} problems in recipe {}\n{}",
            file.display(),
            render(diagnostics)
        ),
    }
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2): every recipe
    /// problem, a recipe path that does not exist or is not a file. Other I/O errors are
    /// failures of the environment.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Read { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::IsADirectory
            ),
            Error::NotAFile { .. } | Error::TooLarge { .. } | Error::Invalid { .. } => true,
        }
    }

    /// The diagnostics of an invalid recipe (empty for the other errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            Error::Invalid { diagnostics, .. } => diagnostics,
            _ => &[],
        }
    }
}

/// Read, parse and validate the recipe at `path`, and check the files it names: the ONNX model
/// (and calibration data and warm-up samples when given) must exist inside the recipe's
/// directory (symbolic links are resolved before that check) and be regular files (calibration
/// may be a directory). A missing model is reported together with every other problem.
pub fn load(path: &Path) -> Result<Recipe, Error> {
    let bytes = read_recipe(path)?;
    let (recipe, files, mut diagnostics) = match std::str::from_utf8(&bytes) {
        Ok(source) => run(source, path),
        Err(e) => return Err(invalid(path, vec![not_utf8(&bytes, e, path)])),
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    for f in &files {
        check_file(path, dir, f, &mut diagnostics);
    }
    let mut recipe = recipe;
    // A labels file, once it is known to be a regular file inside the recipe's directory.
    if diagnostics.is_empty() {
        if let Some(r) = recipe.as_mut() {
            let classes = r.vision.as_ref().and_then(|v| {
                let output = v.output.as_ref().map(|o| o.value.as_str());
                vision::classes(&r.model, output, v.section.answer)
            });
            if let Some(v) = r.vision.as_mut() {
                let answer = v.section.answer;
                if let Some(p) = &v.labels_file {
                    let shown = vision::shown(dir, p);
                    let misfit = |n: usize| {
                        classes.filter(|&c| !infer_spec::vision::labels_fit(answer, c, n))
                    };
                    match vision::read_labels(&shown) {
                        Ok(labels) if misfit(labels.len()).is_some() => diagnostics.push(
                            p.diagnostic(
                                path,
                                format!(
                                    "labels file {}: {}",
                                    shown.display(),
                                    infer_spec::vision::labels_misfit(
                                        answer,
                                        classes.unwrap_or_default(),
                                        labels.len()
                                    )
                                ),
                            )
                            .with_hint(vision::labels_hint(answer)),
                        ),
                        Ok(labels) => v.section.labels = labels,
                        Err(e) => diagnostics.push(
                            p.diagnostic(path, format!("labels file {}: {e}", shown.display())),
                        ),
                    }
                }
            }
        }
    }
    if let Some(int8) = recipe.as_mut().and_then(|r| r.int8.as_mut()) {
        // What the plan needs to know of the calibration input: a TensorRT calibration cache
        // (a file) or data (a directory) that infer-build can quantize with.
        int8.calibration_is_cache = int8
            .calibration
            .as_ref()
            .map(|c| dir.join(&c.value).is_file());
    }
    finish(path, recipe, diagnostics)
}

/// [`parse`] for raw bytes: invalid UTF-8 is reported as a diagnostic at its position. This is
/// what [`load`] does before checking files, and what the fuzz target feeds.
pub fn parse_bytes(bytes: &[u8], file: &Path) -> Result<Recipe, Error> {
    match std::str::from_utf8(bytes) {
        Ok(source) => parse(source, file),
        Err(e) => Err(invalid(file, vec![not_utf8(bytes, e, file)])),
    }
}

fn not_utf8(bytes: &[u8], e: std::str::Utf8Error, file: &Path) -> Diagnostic {
    let (line, col) = diagnostic::byte_position(bytes, e.valid_up_to());
    Diagnostic {
        file: file.to_path_buf(),
        line,
        col,
        key: String::new(),
        message: "the recipe is not valid UTF-8".into(),
        hint: Some("save the file as UTF-8".into()),
    }
}

/// Parse and validate recipe text without touching the filesystem. `file` is the name
/// diagnostics report and the base for relative paths in the [`Recipe`]; the files the recipe
/// names are checked lexically only (relative, inside the recipe's directory).
pub fn parse(source: &str, file: &Path) -> Result<Recipe, Error> {
    let (recipe, _files, diagnostics) = run(source, file);
    finish(file, recipe, diagnostics)
}

/// The most diagnostics one error lists; the rest are counted in a last line, so a recipe full
/// of junk keys cannot turn into an error many times its size.
pub const MAX_DIAGNOSTICS: usize = 100;

fn invalid(file: &Path, mut diagnostics: Vec<Diagnostic>) -> Error {
    diagnostic::sort(&mut diagnostics);
    if diagnostics.len() > MAX_DIAGNOSTICS {
        let more = diagnostics.len() - MAX_DIAGNOSTICS;
        diagnostics.truncate(MAX_DIAGNOSTICS);
        let last = &diagnostics[MAX_DIAGNOSTICS - 1];
        diagnostics.push(Diagnostic {
            file: file.to_path_buf(),
            line: last.line,
            col: last.col,
            key: String::new(),
            message: format!(
                "{more} more problems not shown (the first {MAX_DIAGNOSTICS} are above)"
            ),
            hint: Some("fix these and run again to see the rest".into()),
        });
    }
    Error::Invalid {
        file: file.to_path_buf(),
        diagnostics,
    }
}

fn finish(
    file: &Path,
    recipe: Option<Recipe>,
    diagnostics: Vec<Diagnostic>,
) -> Result<Recipe, Error> {
    match recipe {
        Some(r) if diagnostics.is_empty() => Ok(r),
        _ if !diagnostics.is_empty() => Err(invalid(file, diagnostics)),
        // Validation builds a recipe whenever it recorded no problem; this is a safety net
        // so that a gap there is an error, not a panic.
        _ => Err(invalid(
            file,
            vec![Diagnostic::new(
                file,
                Span::START,
                "",
                "the recipe could not be validated (this is a bug in infer-build; please report it)",
            )],
        )),
    }
}

/// Both stages over one text: the recipe when valid, the files it names, the problems.
fn run(source: &str, file: &Path) -> (Option<Recipe>, Vec<FileRef>, Vec<Diagnostic>) {
    let mut cx = check::Checker::new(file, source);
    let (doc, errors) = toml::de::DeTable::parse_recoverable(source);
    if !errors.is_empty() {
        // A document with syntax errors is not validated: the parser's recovery leaves keys
        // out, and "missing key" echoes of a typo would bury the real problem.
        let mut lines = Vec::new();
        for e in errors {
            let span = cx.span(e.span().unwrap_or(0..0));
            if lines.contains(&span.line) || lines.len() >= MAX_SYNTAX_ERRORS {
                continue;
            }
            lines.push(span.line);
            let message = e.message().trim().replace('\n', "; ");
            cx.error_hint(
                span,
                "",
                format!("invalid TOML: {message}"),
                "see https://toml.io/en/v1.0.0 for the syntax",
            );
        }
        return (None, Vec::new(), cx.diagnostics);
    }
    if doc.get_ref().contains_key("bundle") {
        cx.error_hint(
            Span::START,
            "bundle",
            "this is a bundle file (it has a [bundle] table), not a recipe",
            "`infer-build check`, `plan`, `build` and `deploy` take a bundle file; other commands take one of its recipes",
        );
        return (None, Vec::new(), cx.diagnostics);
    }
    let outcome = validate::validate(&mut cx, doc.get_ref(), file);
    (outcome.recipe, outcome.files, cx.diagnostics)
}

fn read_recipe(path: &Path) -> Result<Vec<u8>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    // Look before opening: opening a FIFO would block, and reading a device would not end.
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: path.to_path_buf(),
            kind: file_kind(&meta.file_type()),
        });
    }
    if meta.len() > MAX_RECIPE_BYTES {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_RECIPE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_RECIPE_BYTES {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_char_device() {
            return "a character device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Check one file the recipe names, on disk, adding a diagnostic at its key when it is
/// missing, of the wrong kind, or outside the recipe's directory.
fn check_file(recipe: &Path, dir: &Path, f: &FileRef, out: &mut Vec<Diagnostic>) {
    let what = match f.kind {
        FileKind::Model => "model file",
        FileKind::Calibration | FileKind::CalibrationBatches => "calibration data",
        FileKind::Samples => "warm-up samples file",
        FileKind::Evaluation => "evaluation data",
        FileKind::Tokenizer => "tokenizer",
        FileKind::Labels => "labels file",
    };
    let shown = dir.join(&f.path.value);
    let base = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let diag = |message: String, hint: &str| f.path.diagnostic(recipe, message).with_hint(hint);
    let base = match std::fs::canonicalize(base) {
        Ok(b) => b,
        Err(e) => {
            out.push(diag(
                format!("cannot resolve the recipe's directory: {e}"),
                "check the recipe's path",
            ));
            return;
        }
    };
    let resolved = match std::fs::canonicalize(base.join(&f.path.value)) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let hint = match f.kind {
                FileKind::Model => "export the model to this path, or point `onnx` at your export (relative to the recipe)",
                FileKind::Calibration => "put the calibration data (a directory of samples or a calibration cache) at this path",
                FileKind::CalibrationBatches => "put the calibration batches (*.npy / *.npz) in this directory",
                FileKind::Samples => "write the warm-up requests file at this path, or remove `samples` to warm up with synthetic data",
                FileKind::Evaluation => "put the evaluation batches (*.npy / *.npz) in this directory, or remove `data` to evaluate on the calibration data",
                FileKind::Tokenizer => "put the model's tokenizer.json (as Hugging Face models ship it) at this path",
                FileKind::Labels => "write the class names at this path, one per line in the model's class order",
            };
            out.push(diag(format!("{what} not found: {}", shown.display()), hint));
            return;
        }
        Err(e) => {
            out.push(diag(
                format!("cannot read {what} {}: {e}", shown.display()),
                "check the file's permissions",
            ));
            return;
        }
    };
    if !resolved.starts_with(&base) {
        out.push(diag(
            format!(
                "{what} {} resolves to {}, outside the recipe's directory",
                shown.display(),
                resolved.display()
            ),
            "copy the file into the recipe's directory; symbolic links may not lead out of it, so that the recipe's directory is everything a build depends on",
        ));
        return;
    }
    match std::fs::metadata(&resolved) {
        Ok(meta) => {
            let ok = match f.kind {
                FileKind::Calibration => meta.is_file() || meta.is_dir(),
                FileKind::Evaluation | FileKind::CalibrationBatches => meta.is_dir(),
                FileKind::Model | FileKind::Samples | FileKind::Tokenizer | FileKind::Labels => {
                    meta.is_file()
                }
            };
            if !ok {
                let expected = match f.kind {
                    FileKind::Calibration => "a regular file or a directory",
                    FileKind::Evaluation | FileKind::CalibrationBatches => "a directory",
                    FileKind::Model
                    | FileKind::Samples
                    | FileKind::Tokenizer
                    | FileKind::Labels => "a regular file",
                };
                out.push(diag(
                    format!(
                        "{what} {} is {}, not {expected}",
                        shown.display(),
                        file_kind(&meta.file_type())
                    ),
                    "point the key at the file itself",
                ));
            }
        }
        Err(e) => out.push(diag(
            format!("cannot read {what} {}: {e}", shown.display()),
            "check the file's permissions",
        )),
    }
}
