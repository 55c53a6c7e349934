//! What `infer-build slim` runs: a slim base from its definition. The pin policy (an image is
//! pinned by the definition's digest or the lock file, or pinned at its first pull into
//! `--lock`, or allowed unpinned), each image's layout (given, or pulled), then
//! [`crate::slim::image::build`] into the output layout. It prints nothing: progress goes to the
//! [`Notes`] sink, the result comes back as a [`Slimmed`] for the caller to render.

use std::path::{Path, PathBuf};

use super::Notes;
use crate::error::Error;
use crate::plan::lock::Lock;
use crate::registry::{self, pull::PullOptions, ClientOptions};
use crate::slim::def::{Definition, ImageRef, Needs};
use crate::slim::image::{self, BuildOptions, Built};

/// One `slim` build, as values.
pub(crate) struct SlimRequest {
    pub definition: Definition,
    pub needs: Needs,
    /// The lock file that pins (or records at first pull) images the definition gives no
    /// digest for.
    pub lock: Option<PathBuf>,
    pub update_lock: bool,
    pub allow_unpinned: bool,
    /// Layouts holding image A (base) and image B (builder); `None`: pull the reference.
    pub base_layout: Option<PathBuf>,
    pub builder_layout: Option<PathBuf>,
    /// Where pulled images are kept (`DIR/base`, `DIR/builder`); `None`: a temporary directory
    /// inside `out`, removed afterwards.
    pub pull_dir: Option<PathBuf>,
    /// The OCI layout written, tagged with the definition's name.
    pub out: PathBuf,
    pub client: ClientOptions,
}

/// Where one image of the definition came from.
pub(crate) struct ImageSource {
    pub layout: PathBuf,
    pub pulled: Option<registry::pull::PulledImage>,
}

/// A built slim base and what went into it.
pub(crate) struct Slimmed {
    /// The definition, with the digests that were actually read.
    pub definition: Definition,
    pub needs: Needs,
    pub base: ImageSource,
    pub builder: ImageSource,
    /// The base's and the builder's manifest digests, as the slim image's annotations say.
    pub base_digest: String,
    pub builder_digest: String,
    pub built: Built,
}

/// Builds the slim base `req` describes.
pub(crate) fn slim(req: SlimRequest, note: &Notes) -> Result<Slimmed, Error> {
    let mut definition = req.definition.clone();
    let needs = req.needs.clone();
    let file_lock = match &req.lock {
        Some(p) => crate::plan::lock::read(p)
            .map_err(crate::plan::Error::from)?
            .unwrap_or_default(),
        None => Lock::default(),
    };
    refuse_unpinned(&req, &definition, &file_lock)?;
    std::fs::create_dir_all(&req.out).map_err(|source| crate::slim::Error::Io {
        op: "create",
        path: req.out.clone(),
        source,
    })?;
    let tmp;
    let pull_root = match &req.pull_dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new()
                .prefix(".slim-pull-")
                .tempdir_in(&req.out)
                .map_err(|source| crate::slim::Error::Io {
                    op: "create pull dir in",
                    path: req.out.clone(),
                    source,
                })?;
            tmp.path().to_path_buf()
        }
    };
    let mut opts = BuildOptions {
        lock: file_lock,
        allow_unpinned: req.allow_unpinned,
        needs,
    };
    let base = source(
        &req,
        "base",
        &mut definition.base,
        &req.base_layout,
        &pull_root,
        &mut opts,
        note,
    )?;
    let builder = source(
        &req,
        "builder",
        &mut definition.builder,
        &req.builder_layout,
        &pull_root,
        &mut opts,
        note,
    )?;
    note(&format!(
        "building slim base {} into {}",
        definition.name,
        req.out.display()
    ));
    let built = image::build(&definition, &base.layout, &builder.layout, &req.out, &opts)?;
    let manifest = image::read_layout(&req.out, Some(built.manifest_digest.as_str()))?.manifest;
    let ann = |k: &str| manifest.annotations.get(k).cloned().unwrap_or_default();
    let base_digest = ann("org.opencontainers.image.base.digest");
    let builder_digest = ann(&format!("{}builder", image::ANNOTATION))
        .rsplit_once('@')
        .map(|(_, d)| d.to_string())
        .unwrap_or_default();
    Ok(Slimmed {
        definition,
        needs: opts.needs,
        base,
        builder,
        base_digest,
        builder_digest,
        built,
    })
}

/// An image that nothing pins is refused before anything is downloaded, unless the lock file
/// will pin it at its first pull or the request allows it unpinned.
fn refuse_unpinned(req: &SlimRequest, def: &Definition, file_lock: &Lock) -> Result<(), Error> {
    for (r, layout) in [
        (&def.base, &req.base_layout),
        (&def.builder, &req.builder_layout),
    ] {
        let pinned = r.digest.is_some() || file_lock.digest(&r.reference).is_some();
        let pins_at_pull = layout.is_none() && req.lock.is_some();
        if !pinned && !pins_at_pull && !req.allow_unpinned {
            return Err(Error::Usage(format!(
                "{} is not pinned: the definition gives no digest and {}; pass --lock FILE \
                 (an image pulled without a pin is pinned there at its first pull), or \
                 --allow-unpinned",
                r.reference,
                match &req.lock {
                    Some(p) => format!("{} does not pin it", p.display()),
                    None => "no --lock FILE pins it".to_string(),
                }
            )));
        }
    }
    Ok(())
}

/// The layout of one image: the one given, or a fresh pull of its reference.
fn source(
    req: &SlimRequest,
    role: &'static str,
    r: &mut ImageRef,
    layout: &Option<PathBuf>,
    pull_root: &Path,
    opts: &mut BuildOptions,
    note: &Notes,
) -> Result<ImageSource, Error> {
    if let Some(dir) = layout {
        if !dir.join("index.json").is_file() {
            return Err(Error::Usage(format!(
                "--{role}-layout {}: not an OCI image layout (no index.json)",
                dir.display()
            )));
        }
        return Ok(ImageSource {
            layout: dir.clone(),
            pulled: None,
        });
    }
    let dest = pull_root.join(role);
    // A digest in the definition is pulled as such; otherwise the lock file pins (or records).
    let (reference, lock) = match &r.digest {
        Some(d) => (format!("{}@{d}", r.reference), None),
        None => (r.reference.clone(), req.lock.clone()),
    };
    let pull_opts = PullOptions {
        client: req.client.clone(),
        pin: None,
        platform: None,
        name_by_digest: false,
        registries: None,
    };
    note(&format!("pulling {role} {reference}"));
    let pulled = super::pull::pull_locked(
        &reference,
        &dest,
        pull_opts,
        lock.as_deref(),
        req.update_lock,
    )?;
    note(&format!(
        "pulled {role} {} ({} bytes downloaded, {} blobs reused)",
        pulled.digest, pulled.bytes_downloaded, pulled.blobs_reused
    ));
    // The build reads exactly what was pulled: the platform manifest (a pinned index digest
    // resolves to it), also when the image was allowed unpinned.
    match &r.digest {
        Some(_) => r.digest = Some(pulled.digest.to_string()),
        None => opts.lock.set(&r.reference, pulled.digest.as_str()),
    }
    Ok(ImageSource {
        layout: dest,
        pulled: Some(pulled),
    })
}
