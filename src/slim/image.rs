//! The effectful edge of `slim`: read OCI image layouts, flatten their layers into a [`Tree`]
//! (whiteouts applied), extract the selected files, and write the slim image (the base's layers
//! plus one deterministic layer with the closure) as a new OCI layout.
//!
//! Registries are not touched here: images are pulled into layouts by `registry` first.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::closure::{self, CopyItem, SlimPlan, Spec};
use super::def::{Definition, Needs};
use super::elf::ElfInfo;
use super::report::{self, LayerSize, SizeReport};
use super::tree::{self, File, Node, Source, Tree};
use super::Error;
use crate::oci::digest::HashWriter;
use crate::oci::image::{Descriptor, Manifest};
use crate::oci::store::BlobStore;
use crate::oci::unpack::{self, LayerReader};
use crate::oci::Digest;

/// ELF objects larger than this are not parsed (their facts are marked unknown, and the build
/// fails only if the closure reaches one). TensorRT's largest runtime library is ~110 MB; the
/// 2 GB builder resources are never a dependency.
pub(crate) const ELF_PARSE_LIMIT: u64 = 1 << 30;

/// The most bytes a loader configuration file (`etc/ld.so.conf*`, kept in memory) may have.
const INLINE_LIMIT: u64 = 1 << 20;

/// The most entries slim holds of the images it reads, base and builder together, every layer
/// counted (with a layer's entries and whiteouts read but not yet applied). Real CUDA and
/// TensorRT images hold tens of thousands; each layer is bounded by its size alone
/// (`crate::oci::unpack::expansion_limit`), so without this a few small layers of millions
/// of directory entries would take gigabytes.
pub const MAX_ENTRIES: usize = 1_000_000;
/// The most bytes slim holds of those trees: paths, link targets, file facts (digest, ELF
/// dependencies) and a fixed cost per entry ([`tree::ENTRY_OVERHEAD`]).
pub(crate) const MAX_TREE_BYTES: u64 = 256 << 20;
/// The longest path or link target slim accepts in a layer (Linux's `PATH_MAX`).
pub(crate) const MAX_NAME: usize = 4096;
/// Test knob: lowers [`MAX_ENTRIES`] (a larger value is ignored), so that a test reaches the
/// bound with a few thousand entries. It cannot raise the bound.
const MAX_ENTRIES_ENV: &str = "INFER_BUILD_SLIM_MAX_ENTRIES";

/// What slim may still hold of the trees it reads: one budget for the base and the builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The bounds.
    pub max_entries: usize,
    pub max_bytes: u64,
    /// Held by trees already read.
    spent_entries: usize,
    spent_bytes: u64,
}

impl Default for Budget {
    fn default() -> Budget {
        let lowered = std::env::var(MAX_ENTRIES_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        Budget::new(
            lowered.map_or(MAX_ENTRIES, |n| n.min(MAX_ENTRIES)),
            MAX_TREE_BYTES,
        )
    }
}

impl Budget {
    pub fn new(max_entries: usize, max_bytes: u64) -> Budget {
        Budget {
            max_entries,
            max_bytes,
            spent_entries: 0,
            spent_bytes: 0,
        }
    }

    /// `None` when `entries` and `bytes` more fit; else which bound they pass.
    fn exceeded(&self, entries: usize, bytes: u64) -> Option<String> {
        if self.spent_entries.saturating_add(entries) > self.max_entries {
            Some(format!("more than {} entries", self.max_entries))
        } else if self.spent_bytes.saturating_add(bytes) > self.max_bytes {
            Some(format!(
                "more than {} bytes of paths and file facts",
                self.max_bytes
            ))
        } else {
            None
        }
    }

    fn spend(&mut self, t: &Tree) {
        let (n, bytes) = weight(t);
        self.spent_entries += n;
        self.spent_bytes += bytes;
    }
}

/// A tree's entries and bytes, with the fixed cost of each entry.
fn weight(t: &Tree) -> (usize, u64) {
    let (n, bytes) = t.weight();
    (n, bytes + n as u64 * tree::ENTRY_OVERHEAD)
}

/// Annotation prefix of everything this module records in manifests.
pub(crate) const ANNOTATION: &str = "dev.infer-build.slim.";
/// Layer descriptor annotation: the uncompressed size of the layer, for the size report.
pub(crate) const UNCOMPRESSED_SIZE: &str = "dev.infer-build.uncompressed-size";
/// Layer descriptor annotation written by `build`: the layer's role (`serve`, `model`…).
const LAYER_ROLE: &str = "dev.infer-build.layer";

use crate::oci::media::{CONFIG, LAYER_GZIP, MANIFEST};

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn layout_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Layout {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// An image read from an OCI layout.
#[derive(Clone, Debug)]
pub struct Image {
    pub layout: PathBuf,
    pub store: BlobStore,
    pub manifest_digest: Digest,
    pub manifest: Manifest,
    /// The config as JSON: the slim image's config is the base's with a layer and an
    /// environment added, every other field kept as found.
    pub config: Value,
}

impl Image {
    /// The layer descriptors, as found (fields infer-build does not model kept in `extra`).
    pub fn layers(&self) -> &[Descriptor] {
        &self.manifest.layers
    }
}

/// Read the image `want` from the OCI layout at `dir` (see `crate::oci::layout::select`: a
/// manifest or index digest, a ref name, or `None` for the only image; an index is followed to
/// its `linux/amd64` manifest). Every document is verified against its descriptor.
pub fn read_layout(dir: &Path, want: Option<&str>) -> Result<Image, Error> {
    let store = BlobStore::open(dir)?;
    let found = crate::oci::layout::select(&store, want)?;
    Ok(Image {
        layout: dir.to_path_buf(),
        store,
        manifest_digest: found.descriptor.digest,
        manifest: found.manifest,
        config: found.config,
    })
}

/// Open layer `i` of `img` as its uncompressed tar stream (the blob verified first).
fn open_layer(img: &Image, i: usize) -> Result<LayerReader, Error> {
    let l = &img.layers()[i];
    Ok(unpack::open(&img.store, &l.digest, l.size, &l.media_type)?)
}

/// A tar member name as text; not UTF-8 is an error naming the layer and showing the bytes.
fn utf8_name(raw: &[u8], layer: &Path, what: &str) -> Result<String, Error> {
    String::from_utf8(raw.to_vec()).map_err(|_| {
        layout_err(
            layer,
            format!(
                "{what} `{}` is not UTF-8; slim does not handle such names",
                raw.escape_ascii()
            ),
        )
    })
}

/// Files whose bytes the closure needs to read (the loader configuration of the base).
fn keep_inline(path: &str) -> bool {
    path == "etc/ld.so.conf" || path.starts_with("etc/ld.so.conf.d/")
}

enum Pending {
    Node(String, Node),
    Hardlink(String, String),
}

/// Flatten the layers of `img` into one tree, applying whiteouts (`.wh.NAME` removes `NAME`,
/// `.wh..wh..opq` empties its directory) to the layers below, as an overlay filesystem does.
/// Returns the tree and the uncompressed size of each layer. Bounded by a [`Budget`] of its
/// own; see [`flatten_within`].
pub fn flatten(img: &Image) -> Result<(Tree, Vec<u64>), Error> {
    flatten_within(img, "image", &mut Budget::default())
}

/// [`flatten`] within `budget`, shared with the other images of one slim build: the tree, and
/// the entries and whiteouts of the layer being read, are counted as they come, and the read
/// stops with an error naming the `role` (`base`, `builder`), the layout, the layer and the
/// bound once they would pass it. What is held is spent from `budget`.
pub fn flatten_within(
    img: &Image,
    role: &str,
    budget: &mut Budget,
) -> Result<(Tree, Vec<u64>), Error> {
    let mut t = Tree::new();
    let mut sizes = Vec::new();
    let layers = img.layers().len();
    for i in 0..layers {
        let layer = open_layer(img, i)?;
        let path = layer.path().to_path_buf();
        let errors = layer.errors();
        let bad = |e: io::Error| Error::from(errors.error("read layer", e));
        let mut archive = tar::Archive::new(layer);
        let mut pending = Vec::new();
        let mut whiteouts = Vec::new();
        let mut opaque = Vec::new();
        // What the tree holds plus what this layer has added so far.
        let (mut held_entries, mut held_bytes) = weight(&t);
        let mut hold = |bytes: u64| -> Result<(), Error> {
            held_entries += 1;
            held_bytes += bytes + tree::ENTRY_OVERHEAD;
            match budget.exceeded(held_entries, held_bytes) {
                None => Ok(()),
                Some(bound) => Err(layout_err(
                    &path,
                    format!(
                        "the {role} image in {} holds {bound} by its layer {} of {layers}; slim holds at most {} entries and {} bytes of the images it reads (real CUDA and TensorRT images hold tens of thousands of entries)",
                        img.layout.display(),
                        i + 1,
                        budget.max_entries,
                        budget.max_bytes
                    ),
                )),
            }
        };
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            let raw = entry.path_bytes().into_owned();
            if raw.len() > MAX_NAME {
                return Err(layout_err(
                    &path,
                    format!(
                        "an entry's path has {} bytes, more than the {MAX_NAME} accepted",
                        raw.len()
                    ),
                ));
            }
            // Names are compared and written as text: a name that is not UTF-8 is refused
            // rather than converted lossily (two names would merge into one).
            let name = utf8_name(&raw, &path, "path")?;
            let p = tree::normalize(&name);
            if p.is_empty() {
                continue;
            }
            let base = tree::file_name(&p);
            if base == ".wh..wh..opq" {
                hold(p.len() as u64)?;
                opaque.push(tree::parent(&p).to_string());
                continue;
            }
            if let Some(hidden) = base.strip_prefix(".wh.") {
                // `.wh..` and `.wh...` would name the directory itself or its parent.
                if hidden.is_empty() || hidden == "." || hidden == ".." {
                    return Err(layout_err(
                        &path,
                        format!("whiteout `{name}` names no file (only `.wh.<name>` and `.wh..wh..opq` exist)"),
                    ));
                }
                hold(p.len() as u64)?;
                whiteouts.push(tree::join(tree::parent(&p), hidden));
                continue;
            }
            let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
            let kind = entry.header().entry_type();
            let link = || -> Result<String, Error> {
                let l = entry
                    .link_name_bytes()
                    .ok_or_else(|| layout_err(&path, format!("link `{name}` without a target")))?;
                if l.len() > MAX_NAME {
                    return Err(layout_err(
                        &path,
                        format!("link `{name}` has a target of {} bytes, more than the {MAX_NAME} accepted", l.len()),
                    ));
                }
                utf8_name(&l, &path, "link target")
            };
            match kind {
                tar::EntryType::Directory => {
                    hold(p.len() as u64)?;
                    pending.push(Pending::Node(p, Node::Dir { mode }));
                }
                tar::EntryType::Symlink => {
                    let target = link()?;
                    hold((p.len() + target.len()) as u64)?;
                    pending.push(Pending::Node(p, Node::Symlink { target }));
                }
                tar::EntryType::Link => {
                    let target = tree::normalize(&link()?);
                    hold((p.len() + target.len()) as u64)?;
                    pending.push(Pending::Hardlink(p, target));
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let declared = entry.header().size().unwrap_or(0);
                    let file = read_file(&mut entry, &path, &errors, i, &p, mode, declared)?;
                    hold(p.len() as u64 + file.heap_bytes())?;
                    pending.push(Pending::Node(p, file.into()));
                }
                // Devices, fifos and the like are not library material.
                _ => {}
            }
        }
        sizes.push(archive.into_inner().finish()?);
        for d in opaque {
            t.clear_dir(&d);
        }
        for w in whiteouts {
            t.remove(&w);
        }
        for p in pending {
            match p {
                Pending::Node(path, node) => t.insert(&path, node),
                Pending::Hardlink(path, target) => {
                    if let Some(Node::File(f)) = t.get(&target).cloned() {
                        t.insert(&path, Node::File(f));
                    }
                }
            }
        }
    }
    budget.spend(&t);
    Ok((t, sizes))
}

fn read_file(
    entry: &mut impl Read,
    layer: &Path,
    errors: &unpack::LayerErrors,
    i: usize,
    p: &str,
    mode: u32,
    declared: u64,
) -> Result<File, Error> {
    if keep_inline(p) && declared > INLINE_LIMIT {
        return Err(layout_err(
            layer,
            format!("/{p} has {declared} bytes, over the {INLINE_LIMIT}-byte limit for a loader configuration file"),
        ));
    }
    let mut hash = crate::oci::digest::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut kept: Vec<u8> = Vec::new();
    let mut is_elf = false;
    let inline = keep_inline(p);
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| errors.error("read layer", e))?;
        if n == 0 {
            break;
        }
        if hash.count() == 0 {
            is_elf = ElfInfo::is_elf(&buf[..n]);
            // What is kept is at most one file of `ELF_PARSE_LIMIT` bytes, allocated once at
            // its declared size rather than grown by doubling.
            if (is_elf || inline) && declared <= ELF_PARSE_LIMIT {
                kept.reserve_exact(declared as usize);
            }
        }
        hash.update(&buf[..n]);
        if (is_elf || inline) && hash.count() <= ELF_PARSE_LIMIT {
            kept.extend_from_slice(&buf[..n]);
        }
    }
    let (digest, size) = hash.finish();
    let elf = if !is_elf {
        None
    } else if size > ELF_PARSE_LIMIT {
        Some(Err(format!(
            "larger than {ELF_PARSE_LIMIT} bytes, not parsed"
        )))
    } else {
        Some(ElfInfo::parse(&kept))
    };
    let source = if inline {
        Source::Inline(kept.into())
    } else {
        Source::Layer {
            layer: i,
            member: p.to_string(),
        }
    };
    Ok(File {
        mode,
        size,
        sha256: digest.hex().to_string(),
        elf,
        source,
    })
}

/// Write the content of every regular file of `plan.copy` under `staging`, reading each builder
/// layer at most once. Returns builder path → staged file.
fn extract(
    builder: &Image,
    plan: &SlimPlan,
    staging: &Path,
) -> Result<BTreeMap<String, PathBuf>, Error> {
    let mut out = BTreeMap::new();
    // layer → member → builder paths that take their bytes from it.
    let mut wanted: BTreeMap<usize, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (n, item) in plan.copy.values().enumerate() {
        let Node::File(f) = &item.node else { continue };
        match &f.source {
            Source::Inline(bytes) => {
                let p = staging.join(format!("inline-{n}"));
                fs::write(&p, bytes).map_err(io_err("write", &p))?;
                out.insert(item.from.clone(), p);
            }
            Source::Layer { layer, member } => {
                wanted
                    .entry(*layer)
                    .or_default()
                    .entry(member.clone())
                    .or_default()
                    .push(item.from.clone());
            }
        }
    }
    for (layer, members) in wanted {
        let reader = open_layer(builder, layer)?;
        let errors = reader.errors();
        let bad = |e: io::Error| Error::from(errors.error("read layer", e));
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            // `flatten` refused names that are not UTF-8; none can be wanted here.
            let Ok(name) = std::str::from_utf8(&entry.path_bytes()).map(str::to_string) else {
                continue;
            };
            let p = tree::normalize(&name);
            let Some(froms) = members.get(&p) else {
                continue;
            };
            if !matches!(
                entry.header().entry_type(),
                tar::EntryType::Regular | tar::EntryType::Continuous
            ) {
                continue;
            }
            let staged = staging.join(format!(
                "l{layer}-{}",
                crate::oci::Digest::of(p.as_bytes()).hex()
            ));
            let mut f = fs::File::create(&staged).map_err(io_err("create", &staged))?;
            io::copy(&mut entry, &mut f).map_err(io_err("extract", &staged))?;
            for from in froms {
                out.insert(from.clone(), staged.clone());
            }
        }
    }
    for item in plan.copy.values() {
        if matches!(item.node, Node::File(_)) && !out.contains_key(&item.from) {
            return Err(layout_err(
                &builder.layout,
                format!("/{} vanished from its layer", item.from),
            ));
        }
    }
    Ok(out)
}

/// The uncompressed tar of the slim layer: every planned entry plus the parent directories the
/// base lacks, sorted by path, root-owned, mtime 0.
fn write_tar(
    w: impl Write,
    base: &Tree,
    builder: &Tree,
    plan: &SlimPlan,
    staged: &BTreeMap<String, PathBuf>,
) -> Result<(), Error> {
    let mut entries: BTreeMap<String, Option<&CopyItem>> = BTreeMap::new();
    for (dest, item) in &plan.copy {
        let mut d = tree::parent(dest);
        while !d.is_empty() && base.resolve(d, true).is_err() {
            entries.entry(d.to_string()).or_insert(None);
            d = tree::parent(d);
        }
        entries.insert(dest.clone(), Some(item));
    }
    let mut b = tar::Builder::new(w);
    b.follow_symlinks(false);
    let err = |e: io::Error| Error::Io {
        op: "write slim layer",
        path: PathBuf::from("(slim layer)"),
        source: e,
    };
    for (path, item) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        match item.map(|i| (&i.node, i)) {
            None => {
                let mode = match builder.get(&path) {
                    Some(Node::Dir { mode }) => *mode,
                    _ => 0o755,
                };
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(mode);
                h.set_size(0);
                b.append_data(&mut h, format!("{path}/"), io::empty())
                    .map_err(err)?;
            }
            Some((Node::Symlink { target }, _)) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, &path, target).map_err(err)?;
            }
            Some((Node::File(f), item)) => {
                let src = &staged[&item.from];
                let file = fs::File::open(src).map_err(io_err("open", src))?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(f.mode);
                h.set_size(f.size);
                b.append_data(&mut h, &path, file.take(f.size))
                    .map_err(err)?;
            }
            Some((Node::Dir { .. }, _)) => {}
        }
    }
    b.into_inner().map_err(err)?.flush().map_err(err)?;
    Ok(())
}

/// How to run a slim build.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Digests recorded at first pull (the recipe's lock file), for images the definition names
    /// without a digest.
    pub lock: crate::plan::lock::Lock,
    /// Build even when an image has neither a digest in the definition nor one in the lock
    /// (the result is then not reproducible from the definition alone).
    pub allow_unpinned: bool,
    /// What the engine needs (tactic sources).
    pub needs: Needs,
}

/// The result of a slim build.
#[derive(Clone, Debug)]
pub struct Built {
    /// The output layout and the digest of the slim image's manifest in it.
    pub layout: PathBuf,
    pub manifest_digest: Digest,
    pub plan: SlimPlan,
    pub report: SizeReport,
}

fn image_digest<'a>(
    img_ref: &'a super::def::ImageRef,
    opts: &'a BuildOptions,
) -> Result<Option<&'a str>, Error> {
    match (&img_ref.digest, opts.lock.digest(&img_ref.reference)) {
        (Some(d), _) => Ok(Some(d.as_str())),
        (None, Some(d)) => Ok(Some(d)),
        (None, None) if opts.allow_unpinned => Ok(None),
        (None, None) => Err(Error::Unpinned {
            image: img_ref.reference.clone(),
        }),
    }
}

fn open_pinned(
    layout: &Path,
    img_ref: &super::def::ImageRef,
    opts: &BuildOptions,
) -> Result<Image, Error> {
    let want = image_digest(img_ref, opts)?;
    // The layout must hold the pinned digest (an index, or a manifest listed in one).
    let img = read_layout(layout, want)?;
    Ok(img)
}

/// Build the slim image of `def` from the base and builder images found in the given OCI
/// layouts, into a new OCI layout at `out` (tagged `def.name`).
pub fn build(
    def: &Definition,
    base_layout: &Path,
    builder_layout: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<Built, Error> {
    let base = open_pinned(base_layout, &def.base, opts)?;
    let builder = open_pinned(builder_layout, &def.builder, opts)?;
    let mut budget = Budget::default();
    let (base_tree, base_sizes) = flatten_within(&base, "base", &mut budget)?;
    let (builder_tree, builder_sizes) = flatten_within(&builder, "builder", &mut budget)?;
    let selections = def.selections_for(&opts.needs);
    let plan = closure::compute(
        &base_tree,
        &builder_tree,
        Spec {
            selections: &selections,
            closure: &def.closure,
        },
    )?;

    // The output is an `oci` blob store: other images already in it keep their tags.
    let store = crate::oci::store::BlobStore::create(out)?;
    let staging = tempfile::Builder::new()
        .prefix(".slim-staging-")
        .tempdir_in(out)
        .map_err(io_err("create staging dir in", out))?;
    let staged = extract(&builder, &plan, staging.path())?;

    // One pass: tar → sha256 (diff_id) → gzip → sha256 (digest) → temp file → rename.
    let tmp = staging.path().join("layer.tar.gz");
    let file = fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    let gz_out = HashWriter::new(io::BufWriter::new(file));
    let gz = flate2::write::GzEncoder::new(gz_out, flate2::Compression::new(6));
    let mut tar_out = HashWriter::new(gz);
    write_tar(&mut tar_out, &base_tree, &builder_tree, &plan, &staged)?;
    let (gz, diff_id, uncompressed) = tar_out.into_parts();
    let mut gz_out = gz.finish().map_err(io_err("compress", &tmp))?;
    gz_out.flush().map_err(io_err("write", &tmp))?;
    let (buffered, layer_digest, layer_size) = gz_out.into_parts();
    // Durable before it becomes visible under its digest.
    let file = buffered.into_inner().map_err(|e| Error::Io {
        op: "write",
        path: tmp.clone(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err("sync", &tmp))?;
    drop(file);
    store.adopt(
        &crate::oci::Dir::open(staging.path())?,
        "layer.tar.gz",
        &layer_digest,
    )?;

    for l in base.layers() {
        store.import(&base.store, &l.digest, l.size, true)?;
    }

    let mut config = base.config.clone();
    let diff_ids = config
        .pointer_mut("/rootfs/diff_ids")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| layout_err(base_layout, "base config has no rootfs.diff_ids"))?;
    diff_ids.push(Value::String(diff_id.to_string()));
    if let Some(h) = config.get_mut("history").and_then(Value::as_array_mut) {
        h.push(json!({ "created_by": format!("infer-build slim {}", def.name), "comment": format!("files from {}", def.builder.reference) }));
    }
    if !def.closure.search_dirs.is_empty() {
        set_library_path(&mut config, &def.closure.search_dirs);
    }
    let config_bytes = crate::oci::cjson::value_to_vec(&config);
    let config_digest = store.put(&config_bytes)?;

    let mut layers: Vec<Descriptor> = base
        .layers()
        .iter()
        .zip(&base_sizes)
        .map(|(l, size)| {
            let mut d = l.clone();
            d.annotations
                .insert(UNCOMPRESSED_SIZE.into(), size.to_string());
            d.annotations
                .insert(format!("{ANNOTATION}from"), "base".into());
            d
        })
        .collect();
    let mut slim_layer = Descriptor::new(LAYER_GZIP, layer_digest, layer_size);
    slim_layer.annotations = BTreeMap::from([
        (UNCOMPRESSED_SIZE.to_string(), uncompressed.to_string()),
        (format!("{ANNOTATION}from"), "slim".to_string()),
    ]);
    layers.push(slim_layer);
    let builder_layers = layer_sizes_of(&builder, &builder_sizes, "builder");
    let builder_total =
        |size: fn(&LayerSize) -> u64| builder_layers.iter().map(size).sum::<u64>().to_string();
    let manifest = Manifest {
        schema_version: 2,
        media_type: MANIFEST.into(),
        artifact_type: None,
        config: Descriptor::new(CONFIG, config_digest, config_bytes.len() as u64),
        layers,
        subject: None,
        annotations: BTreeMap::from([
            (
                "org.opencontainers.image.base.name".to_string(),
                def.base.reference.clone(),
            ),
            (
                "org.opencontainers.image.base.digest".to_string(),
                base.manifest_digest.to_string(),
            ),
            (format!("{ANNOTATION}definition"), def.name.clone()),
            (
                format!("{ANNOTATION}builder"),
                format!("{}@{}", def.builder.reference, builder.manifest_digest),
            ),
            (
                format!("{ANNOTATION}builder-size"),
                builder_total(|l| l.size),
            ),
            (
                format!("{ANNOTATION}builder-uncompressed-size"),
                builder_total(|l| l.uncompressed),
            ),
            (
                format!("{ANNOTATION}excluded"),
                plan.excluded
                    .iter()
                    .map(|e| e.name.clone())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]),
    };
    let manifest_bytes = crate::oci::image::encode("slim manifest", &manifest)?;
    let digest = store.put(&manifest_bytes)?;
    let manifest_digest = digest.clone();
    let mut desc = Descriptor::new(MANIFEST, digest, manifest_bytes.len() as u64);
    desc.annotations.insert(
        crate::oci::annotation::REF_NAME.to_string(),
        def.name.clone(),
    );
    crate::oci::layout::write_index(&store, vec![desc])?;

    let report = report_from_manifest(&manifest)
        .ok_or_else(|| layout_err(out, "size report missing from the manifest just written"))?;
    Ok(Built {
        layout: out.to_path_buf(),
        manifest_digest,
        plan,
        report,
    })
}

fn layer_sizes_of(img: &Image, uncompressed: &[u64], from: &str) -> Vec<LayerSize> {
    img.layers()
        .iter()
        .zip(uncompressed)
        .map(|(l, u)| LayerSize {
            digest: l.digest.to_string(),
            media_type: l.media_type.clone(),
            size: l.size,
            uncompressed: *u,
            from: from.to_string(),
        })
        .collect()
}

/// The size report recorded in a slim image's manifest (for `inspect` and the build summary).
/// `None` when the manifest is not a slim image's.
pub(crate) fn report_from_manifest(manifest: &Manifest) -> Option<SizeReport> {
    let ann = |k: &str| -> Option<u64> { manifest.annotations.get(k)?.parse().ok() };
    let builder_size = ann(&format!("{ANNOTATION}builder-size"))?;
    let builder_uncompressed = ann(&format!("{ANNOTATION}builder-uncompressed-size"))?;
    let layers: Vec<LayerSize> = manifest
        .layers
        .iter()
        .map(|l| {
            let a = &l.annotations;
            Some(LayerSize {
                digest: l.digest.to_string(),
                media_type: l.media_type.clone(),
                size: l.size,
                uncompressed: a.get(UNCOMPRESSED_SIZE)?.parse().ok()?,
                // Layers an image built on the slim base added on top: their role.
                from: a
                    .get(&format!("{ANNOTATION}from"))
                    .or_else(|| a.get(LAYER_ROLE))
                    .cloned()
                    .unwrap_or_default(),
            })
        })
        .collect::<Option<_>>()?;
    // An image built on the slim base is compared with the same image on the full builder:
    // the builder's layers plus the layers added on top of the slim base.
    let mut builder = vec![LayerSize {
        digest: String::new(),
        media_type: String::new(),
        size: builder_size,
        uncompressed: builder_uncompressed,
        from: "builder".into(),
    }];
    builder.extend(
        layers
            .iter()
            .filter(|l| !report::from_slim_base(l))
            .cloned(),
    );
    Some(report::size_report(&layers, &builder))
}

/// The manifest annotations of a slim base that an image built on it keeps, so that its size
/// report ([`report_from_manifest`]) still compares it with the full builder. Empty when the
/// base is not a slim image.
pub(crate) fn carried_annotations(base: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    if !base.contains_key(&format!("{ANNOTATION}builder-size")) {
        return BTreeMap::new();
    }
    base.iter()
        .filter(|(k, _)| k.starts_with(ANNOTATION))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The layer descriptor annotations of a slim base's layer that the built image keeps.
pub(crate) fn carried_layer_annotations(
    layer: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    layer
        .iter()
        .filter(|(k, _)| *k == UNCOMPRESSED_SIZE || *k == &format!("{ANNOTATION}from"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The definitions of `base-images/slim/` under `dir` (`--matrix DIR`), else the embedded ones.
pub(crate) fn definitions(dir: Option<&Path>) -> Result<Vec<Definition>, Error> {
    match dir {
        Some(d) => load_definitions(&d.join("base-images/slim")),
        None => super::def::embedded(),
    }
}

/// Read the size report of the slim image `want` in the layout at `dir`.
pub fn size_report_of_layout(dir: &Path, want: Option<&str>) -> Result<Option<SizeReport>, Error> {
    Ok(report_from_manifest(&read_layout(dir, want)?.manifest))
}

/// Prepend `dirs` to the `LD_LIBRARY_PATH` of an image config.
fn set_library_path(config: &mut Value, dirs: &[String]) {
    let Some(cfg) = config.as_object_mut() else {
        return;
    };
    let c = cfg.entry("config").or_insert_with(|| json!({}));
    let Some(c) = c.as_object_mut() else { return };
    let env = c.entry("Env").or_insert_with(|| json!([]));
    let Some(env) = env.as_array_mut() else {
        return;
    };
    let mut value = dirs.join(":");
    if let Some(pos) = env.iter().position(|e| {
        e.as_str()
            .is_some_and(|s| s.starts_with("LD_LIBRARY_PATH="))
    }) {
        let old = env.remove(pos);
        let old = old
            .as_str()
            .and_then(|s| s.strip_prefix("LD_LIBRARY_PATH="))
            .unwrap_or("");
        if !old.is_empty() {
            value = format!("{value}:{old}");
        }
    }
    env.push(Value::String(format!("LD_LIBRARY_PATH={value}")));
}

/// The excluded libraries as lines for the build output.
pub fn render_excluded(plan: &SlimPlan) -> String {
    plan.excluded
        .iter()
        .map(|e| {
            if e.needed_by.is_empty() {
                format!("excluded {}: {}\n", e.name, e.reason)
            } else {
                format!(
                    "excluded {} (needed by {}): {}\n",
                    e.name,
                    e.needed_by.join(" → "),
                    e.reason
                )
            }
        })
        .collect()
}

/// Read every `*.toml` of a definitions directory (`base-images/slim`), sorted by file name;
/// names must be unique.
pub fn load_definitions(dir: &Path) -> Result<Vec<Definition>, Error> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err("read directory", dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut defs: Vec<Definition> = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).map_err(io_err("read", &f))?;
        let def = Definition::parse(&f.display().to_string(), &text)?;
        if let Some(other) = defs.iter().find(|d| d.name == def.name) {
            return Err(Error::Definition {
                origin: f.display().to_string(),
                message: format!(
                    "name `{}` is already used by another definition",
                    other.name
                ),
            });
        }
        defs.push(def);
    }
    Ok(defs)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::oci::media::INDEX;

    fn put(dir: &Path, bytes: &[u8]) -> String {
        BlobStore::create(dir)
            .unwrap()
            .put(bytes)
            .unwrap()
            .to_string()
    }

    /// A gzip layer from (path, kind) entries: `f:content`, `l:symlink target`, `h:hardlink`, `d`.
    fn layer(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (path, spec) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            let (kind, arg) = spec.split_at(1);
            let arg = arg.trim_start_matches(':');
            match kind {
                "f" => {
                    h.set_size(arg.len() as u64);
                    b.append_data(&mut h, path, arg.as_bytes()).unwrap();
                }
                "l" | "h" => {
                    h.set_entry_type(if kind == "l" {
                        tar::EntryType::Symlink
                    } else {
                        tar::EntryType::Link
                    });
                    h.set_size(0);
                    b.append_link(&mut h, path, arg).unwrap();
                }
                _ => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, path, io::empty()).unwrap();
                }
            }
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    /// A layout whose index.json lists an index that lists the image manifest.
    fn layout(dir: &Path, layers: &[Vec<u8>]) -> String {
        let descs: Vec<Value> = layers
            .iter()
            .map(|l| json!({"mediaType": LAYER_GZIP, "digest": put(dir, l), "size": l.len()}))
            .collect();
        let config =
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": put(dir, config), "size": config.len()},
            "layers": descs,
        }))
        .unwrap();
        let m = put(dir, &manifest);
        let index = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
            {"mediaType": MANIFEST, "digest": m, "size": manifest.len(), "platform": {"architecture": "amd64", "os": "linux"}}
        ]}))
        .unwrap();
        let i = put(dir, &index);
        let top = json!({"schemaVersion": 2, "manifests": [{"mediaType": INDEX, "digest": i, "size": index.len()}]});
        fs::write(dir.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
        m
    }

    #[test]
    fn flattens_layers_with_whiteouts_opaque_dirs_and_hardlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let m = layout(
            tmp.path(),
            &[
                layer(&[
                    ("a/", "d"),
                    ("a/keep", "f:1"),
                    ("a/gone", "f:2"),
                    ("o/", "d"),
                    ("o/old", "f:3"),
                    ("x", "f:4"),
                ]),
                layer(&[
                    ("a/.wh.gone", "f:"),
                    ("o/.wh..wh..opq", "f:"),
                    ("o/new", "f:5"),
                    ("x2", "h:x"),
                    ("s", "l:a/keep"),
                ]),
            ],
        );
        // Found by the platform manifest's digest, through the index that lists it.
        let img = read_layout(tmp.path(), Some(&m)).unwrap();
        assert_eq!(img.manifest_digest, m);
        let (t, sizes) = flatten(&img).unwrap();
        let paths: Vec<&String> = t.iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["a", "a/keep", "o", "o/new", "s", "x", "x2"]);
        assert_eq!(
            t.file("x2").unwrap().1.sha256,
            t.file("x").unwrap().1.sha256
        );
        assert_eq!(t.file("s").unwrap().0.path, "a/keep");
        assert_eq!(sizes.len(), 2);
        assert!(sizes.iter().all(|s| *s >= 1024));
        // Also found without naming it (only image) and refused under a digest it lacks.
        assert!(read_layout(tmp.path(), None).is_ok());
        let other = format!("sha256:{}", "0".repeat(64));
        assert_eq!(
            read_layout(tmp.path(), Some(&other))
                .unwrap_err()
                .to_string(),
            format!("{}: no image `{other}` in the layout", tmp.path().display())
        );
    }

    #[test]
    fn report_of_an_image_built_on_a_slim_base_counts_the_added_layers_on_both_sides() {
        let d = |c: &str| format!("sha256:{}", c.repeat(64));
        let layer = |c: &str, size: u64, ann: Value| json!({"mediaType": LAYER_GZIP, "digest": d(c), "size": size, "annotations": ann});
        let slim_ann = json!({
            "dev.infer-build.slim.builder-size": "1000",
            "dev.infer-build.slim.builder-uncompressed-size": "3000",
            "dev.infer-build.slim.definition": "t",
            "org.opencontainers.image.title": "other",
        });
        let mut manifest: Manifest = serde_json::from_value(json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": d("f"), "size": 2},
            "layers": [
                layer("a", 10, json!({UNCOMPRESSED_SIZE: "30", "dev.infer-build.slim.from": "base"})),
                layer("b", 40, json!({UNCOMPRESSED_SIZE: "90", "dev.infer-build.slim.from": "slim"})),
            ],
            "annotations": slim_ann,
        }))
        .unwrap();
        let slim = report_from_manifest(&manifest).unwrap();
        assert_eq!((slim.size, slim.builder_size), (50, 1000));
        assert!(slim.render().contains("full builder image"));
        manifest.layers.push(
            serde_json::from_value(layer(
                "c",
                50,
                json!({UNCOMPRESSED_SIZE: "60", LAYER_ROLE: "model"}),
            ))
            .unwrap(),
        );
        let r = report_from_manifest(&manifest).unwrap();
        assert_eq!(r.layers[2].from, "model");
        assert_eq!((r.size, r.builder_size), (100, 1050));
        assert_eq!((r.uncompressed, r.builder_uncompressed), (180, 3060));
        assert!((r.reduction - 10.5).abs() < 1e-9);
        assert!(
            r.render().contains("same on full builder"),
            "{}",
            r.render()
        );
        // A layer without its uncompressed size: no report rather than a wrong one.
        manifest.layers[2].annotations.clear();
        assert!(report_from_manifest(&manifest).is_none());

        let ann = manifest.annotations.clone();
        let kept = carried_annotations(&ann);
        assert_eq!(kept.len(), 3);
        assert!(!kept.contains_key("org.opencontainers.image.title"));
        let mut plain = ann.clone();
        plain.remove("dev.infer-build.slim.builder-size");
        assert!(carried_annotations(&plain).is_empty());
    }

    #[test]
    fn a_corrupted_blob_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let m = layout(tmp.path(), &[layer(&[("f", "f:1")])]);
        let img = read_layout(tmp.path(), Some(&m)).unwrap();
        let p = img.store.blob_path(&img.layers()[0].digest);
        // Same size, other bytes: caught by the digest.
        let mut bytes = fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&p, &bytes).unwrap();
        let err = flatten(&img).unwrap_err().to_string();
        assert!(err.contains("is corrupt"), "{err}");
        // Another size: caught before reading.
        fs::write(&p, b"tampered").unwrap();
        let err = flatten(&img).unwrap_err().to_string();
        assert!(err.contains("its descriptor says"), "{err}");
    }
}
