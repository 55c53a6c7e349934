//! Slim GPU bases: start from a small base image and add only the files a running engine needs
//! from a (huge) builder image, with their shared-library closure.
//!
//! Owns: the definition format of `base-images/slim/*.toml` (`def`), the in-memory file tree
//! of an image (`tree`), the ELF facts used by the closure (`elf`), the selection and
//! closure computation with its checks (`closure`), the size report (`report`), and the
//! effectful edge that flattens OCI layouts and writes the slim layer and image (`image`).
//!
//! Must not: talk to registries (the images are pulled into OCI layouts by `registry` first),
//! decide which engine needs what (that comes from the engine metadata as [`def::Needs`] and
//! [`def::PlanCompat`]), or print (callers render [`report::SizeReport`] and the excluded list).
//!
//! Invariants:
//! - [`closure::compute`] is pure: it sees only the two trees and the definition, and returns
//!   every problem at once (missing dependency with its chain, conflict, unmatched glob);
//! - the libraries the NVIDIA container toolkit injects (`def::TOOLKIT_INJECTED`) are never
//!   copied, and every time one is needed it is listed in [`closure::SlimPlan::excluded`];
//! - everything that reaches bytes is ordered (`BTreeMap`, sorted entries), so the same inputs
//!   give the same slim layer digest.

pub(crate) mod closure;
pub(crate) mod def;
pub(crate) mod elf;
pub(crate) mod image;
pub(crate) mod report;
pub(crate) mod tree;

pub use closure::{compute, Excluded, Origin, Problem, SlimPlan, Spec};
pub use def::choose;
pub use def::{Definition, Needs, PlanCompat, Tactic, Winner};
pub use elf::ElfInfo;
pub use image::{
    build, flatten, flatten_within, load_definitions, read_layout, render_excluded,
    size_report_of_layout, Budget, BuildOptions, MAX_ENTRIES,
};
pub use report::{size_report, LayerSize, SizeReport};
pub use tree::Tree;
pub use tree::{File, Node, Source};

use std::path::PathBuf;

/// Errors of the `slim` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("slim definition {origin}: {message}")]
    Definition { origin: String, message: String },
    #[error("bad glob `{pattern}`: {message}")]
    Glob { pattern: String, message: String },
    #[error("no slim base definition serves {kind} engines of TensorRT {tensorrt}")]
    NoDefinition { kind: PlanCompat, tensorrt: String },
    #[error("no slim base definition `{name}` (known: {})", known.join(", "))]
    UnknownDefinition { name: String, known: Vec<String> },
    #[error("the slim closure cannot be built:\n  {}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n  "))]
    Closure { problems: Vec<Problem> },
    #[error("{image} is not pinned: no digest in the definition or the lock file; pull it once to record one, or allow unpinned images explicitly")]
    Unpinned { image: String },
    #[error("{path}: {message}")]
    Layout { path: PathBuf, message: String },
    #[error(transparent)]
    Oci(#[from] crate::oci::Error),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Definition { .. }
            | Error::Glob { .. }
            | Error::NoDefinition { .. }
            | Error::UnknownDefinition { .. }
            | Error::Closure { .. }
            | Error::Unpinned { .. }
            | Error::Layout { .. } => true,
            Error::Oci(e) => e.is_bad_input(),
            Error::Io { .. } => false,
        }
    }
}
