//! Image encoding and the on-disk OCI layout: everything that turns files into bytes whose
//! digests are the product.
//!
//! `oci` owns the canonical tar writer (`tar`), the compressors (`compress`), the one-pass
//! layer writer (`layer`: tar → sha256 diff_id → compressor → sha256 digest → temp file →
//! fsync → atomic rename), the content-addressed blob store with its lock and build cache
//! (`store`), canonical JSON (`cjson`), the config/manifest/index types (`image`),
//! OCI layout / archive reading and writing with image selection (`layout`) and the one
//! layer reader (`unpack`) that every module decoding a layer blob goes through.
//!
//! It knows nothing about recipes, plans, engines or the terminal: callers hand it entries
//! (paths inside the image, modes, sources) and get descriptors back. Invariants:
//! - every byte that gets hashed comes from sorted data (`BTreeMap`, sorted entries), never from
//!   `HashMap` iteration; every JSON blob is written through `cjson`;
//! - a blob becomes visible under `blobs/sha256/` only complete, verified and fsynced, by rename;
//! - layers are streamed: memory use does not grow with layer size;
//! - any change to the bytes produced for the same inputs bumps [`LAYER_RECIPE`], and the golden
//!   digests in the tests say when that is needed.

pub(crate) mod cjson;
pub(crate) mod compress;
pub(crate) mod digest;
pub(crate) mod dir;
pub(crate) mod image;
pub(crate) mod layer;
pub(crate) mod layout;
pub(crate) mod store;
pub(crate) mod tar;
pub(crate) mod unpack;

use std::path::PathBuf;

pub use compress::Compression;
pub use digest::{hex_of, Digest};
pub use dir::{write_atomic, Dir};
pub use image::Platform;
pub use layer::{write_layer, LayerOptions};
pub use layout::{read_index, walk, write_archive};
pub use store::{BlobStore, LayerRecord};
pub use tar::{canonicalize, Entry, Source};
pub use unpack::open as open_layer;

/// The most bytes a JSON document read from a layout may have (`index.json`, manifests,
/// indexes, configs): the bound `registry::pull` applies to manifests.
pub const MAX_DOCUMENT: u64 = 4 << 20;

/// Version of the "layer recipe": the tar header policy, entry order, the compressors with
/// their versions, levels and block sizes. It goes into every build-cache key and into the
/// `dev.infer-build.layer-recipe` manifest annotation. Bump it whenever the same inputs would
/// give different layer bytes (the golden-digest tests fail when that happens), or the image
/// config or manifest change for the same inputs.
///
/// v2: the image config exposes 8001/tcp (gRPC) next to 8000/tcp; layer bytes are as in v1.
pub const LAYER_RECIPE: &str = "infer-build.layer.v2";

/// The reverse-DNS prefix of every annotation and label infer-build defines.
pub(crate) const ANNOTATION_PREFIX: &str = "dev.infer-build.";

/// Media types (image-spec v1.1).
pub(crate) mod media {
    pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub(crate) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub(crate) const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub(crate) const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    pub(crate) const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub(crate) const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub(crate) const DOCKER_LIST: &str =
        "application/vnd.docker.distribution.manifest.list.v2+json";
    pub(crate) const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    pub(crate) const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    /// The empty descriptor's media type (the config of artifact manifests).
    pub(crate) const EMPTY: &str = "application/vnd.oci.empty.v1+json";

    /// The `Accept` header for manifest requests: every manifest kind infer-build reads.
    pub(crate) const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

    /// An image index or a Docker manifest list.
    pub(crate) fn is_index(media_type: &str) -> bool {
        media_type == INDEX || media_type == DOCKER_LIST
    }

    /// An OCI or Docker image manifest.
    pub(crate) fn is_manifest(media_type: &str) -> bool {
        media_type == MANIFEST || media_type == DOCKER_MANIFEST
    }
}

/// Standard annotation keys (image-spec `annotations.md`).
pub(crate) mod annotation {
    pub(crate) const CREATED: &str = "org.opencontainers.image.created";
    pub(crate) const VERSION: &str = "org.opencontainers.image.version";
    pub(crate) const REVISION: &str = "org.opencontainers.image.revision";
    pub(crate) const SOURCE: &str = "org.opencontainers.image.source";
    pub(crate) const TITLE: &str = "org.opencontainers.image.title";
    pub(crate) const REF_NAME: &str = "org.opencontainers.image.ref.name";
    pub(crate) const BASE_NAME: &str = "org.opencontainers.image.base.name";
    pub(crate) const BASE_DIGEST: &str = "org.opencontainers.image.base.digest";
    /// containerd's import reads the full image name from this one.
    pub(crate) const CONTAINERD_IMAGE_NAME: &str = "io.containerd.image.name";
}

/// Errors of the `oci` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid digest `{0}` (expected sha256:<64 lowercase hex>)")]
    BadDigest(String),
    #[error("tar cannot represent the path `{path}`: {why}")]
    BadEntryName { path: String, why: &'static str },
    #[error("duplicate entry `{0}` in one layer")]
    DuplicateEntry(String),
    #[error("`{path}` is not a regular file")]
    NotAFile { path: PathBuf },
    #[error(
        "`{path}` is a symbolic link; links inside layouts, outputs and caches are not followed"
    )]
    Symlink { path: PathBuf },
    #[error("`{path}` ({what}) has {size} bytes, over the limit of {limit}")]
    TooBig {
        path: PathBuf,
        what: String,
        size: u64,
        limit: u64,
    },
    #[error("blob {digest} in {layout} has {actual} bytes, its descriptor says {expected}")]
    WrongSize {
        layout: PathBuf,
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error("`{path}` changed while it was read ({what}); the build stopped rather than record a wrong digest")]
    ChangedWhileRead { path: PathBuf, what: String },
    #[error("blob {digest} in {layout} is corrupt: its content hashes to {actual}")]
    Corrupt {
        layout: PathBuf,
        digest: Digest,
        actual: Digest,
    },
    #[error("layer {digest} in {layout} uncompresses to {actual}, but the image config says its diff_id is {diff_id}")]
    WrongDiffId {
        layout: PathBuf,
        digest: Digest,
        diff_id: Digest,
        actual: Digest,
    },
    #[error("blob {digest} is missing from {layout}")]
    MissingBlob { layout: PathBuf, digest: Digest },
    #[error("{path} is not an OCI image layout: {why}")]
    NotALayout { path: PathBuf, why: String },
    /// A document JSON could not encode (never the fault of a layout: see [`Error::Malformed`]).
    #[error("invalid JSON in {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A document of a layout (`index.json`, a manifest, an index, a config) that does not
    /// parse as one: not JSON, not UTF-8, a digest that is not `sha256:<64 lowercase hex>`, a
    /// size that is not a `u64`. Bad input, naming the layout it was read from.
    #[error("{layout}: {what} is malformed: {why}")]
    Malformed {
        layout: PathBuf,
        what: String,
        why: String,
    },
    /// A layer blob (its digest already verified) whose content cannot be decoded: corrupt
    /// compression, a broken tar, or a decompression bomb stopped at its bound. Bad input,
    /// naming the layout the layer came from.
    #[error("layer {digest} of {layout} cannot be read: {why}")]
    BadLayer {
        layout: PathBuf,
        digest: Digest,
        why: String,
    },
    #[error("no image tagged `{tag}` in {layout} (tags: {known})")]
    NoSuchTag {
        layout: PathBuf,
        tag: String,
        known: String,
    },
    #[error("layer {digest} in {layout} has media type `{media_type}`, not a layer infer-build can read (tar, tar+gzip, tar+zstd)")]
    UnsupportedLayer {
        layout: PathBuf,
        digest: Digest,
        media_type: String,
    },
    #[error("{layout}: {why}")]
    NoImage { layout: PathBuf, why: String },
    #[error("layer pipeline failed: {0}")]
    Pipeline(String),
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::BadDigest(_)
                | Error::BadEntryName { .. }
                | Error::DuplicateEntry(_)
                | Error::NotAFile { .. }
                | Error::Symlink { .. }
                | Error::TooBig { .. }
                | Error::WrongSize { .. }
                | Error::WrongDiffId { .. }
                | Error::Corrupt { .. }
                | Error::MissingBlob { .. }
                | Error::NotALayout { .. }
                | Error::Malformed { .. }
                | Error::BadLayer { .. }
                | Error::NoSuchTag { .. }
                | Error::UnsupportedLayer { .. }
                | Error::NoImage { .. }
        )
    }

    /// This error as an `io::Error`, for modules whose own error wraps one: the underlying
    /// I/O error when there is one, else the message (a refused link, a non-regular file).
    pub(crate) fn into_io(self) -> std::io::Error {
        match self {
            Error::Io { source, .. } => source,
            e => std::io::Error::other(e.to_string()),
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}
