//! Where an image is pulled from: the `registries.conf` that skopeo, podman and buildah read
//! (containers-registries.conf(5), version 2, and the version 1 lists), so a team's mirrors,
//! pull-through caches, remapped namespaces, plain-HTTP registries and blocked names apply to
//! infer-build's base pulls as they do to those tools.
//!
//! Files, as containers/image reads them (`pkg/sysregistriesv2`): `--registries-conf FILE` or
//! `$CONTAINERS_REGISTRIES_CONF`, else `$HOME/.config/containers/registries.conf` when it
//! exists, else `/etc/containers/registries.conf`; then the drop-ins `*.conf` of
//! `registries.conf.d/` beside the user file (when the user file is used), else of
//! `/etc/containers/registries.conf.d/` and `$HOME/.config/containers/registries.conf.d/`, in
//! name order. A later `[[registry]]` with the same prefix replaces an earlier one. Missing
//! files are no error; a malformed one is bad input naming the file, line and key.
//!
//! For a reference, the `[[registry]]` whose `prefix` is the longest match of its written form
//! (`docker.io/library/ubuntu:24.04`) is chosen; its mirrors are tried in order (those its
//! `pull-from-mirror` / `mirror-by-digest-only` allow for a tag or a digest), then its
//! `location`. Mirrors only serve reads: pushes always go to the named registry.
//!
//! Pure: reading files and deciding sources; no network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::host::{Host, RegistryHost};
use super::reference::Reference;
use super::{Error, Result};

/// The environment variable naming the registries.conf file (as for podman and skopeo).
pub(crate) const ENV_REGISTRIES_CONF: &str = "CONTAINERS_REGISTRIES_CONF";
/// The system file.
pub(crate) const SYSTEM_FILE: &str = "/etc/containers/registries.conf";
/// The system drop-in directory.
pub(crate) const SYSTEM_DIR: &str = "/etc/containers/registries.conf.d";
/// The per-user file and drop-in directory, under `$HOME`.
const USER_FILE: &str = ".config/containers/registries.conf";
const USER_DIR: &str = ".config/containers/registries.conf.d";

/// One place to try for a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The reference as that place names it (prefix rewritten to the location).
    pub reference: Reference,
    /// Plain HTTP to that place (`insecure = true`).
    pub insecure: bool,
    /// A mirror (else the primary location).
    pub mirror: bool,
}

impl Source {
    /// `host/repository`, for messages.
    pub fn place(&self) -> String {
        format!(
            "{}/{}",
            self.reference.endpoint(),
            self.reference.repository
        )
    }
}

/// Which pulls a mirror serves (`pull-from-mirror`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PullFromMirror {
    All,
    DigestOnly,
    TagOnly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Mirror {
    /// `host[:port][/namespace]`, the host canonical.
    location: String,
    insecure: bool,
    pull_from: PullFromMirror,
}

/// The most `[[registry.mirror]]` tables one `[[registry]]` may have: each is tried in turn
/// before the primary location, so a long list of dead mirrors would hold every pull.
pub(crate) const MAX_MIRRORS: usize = 16;

/// One `[[registry]]` table, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Table {
    /// The prefix, host canonical ([`RegistryHost`]), or `*.domain` for a wildcard: the key
    /// tables are merged and matched by.
    prefix: String,
    /// The physical location, host canonical (empty for a wildcard: the matched host itself).
    location: String,
    insecure: bool,
    blocked: bool,
    mirrors: Vec<Mirror>,
    /// The file it came from, for messages.
    file: PathBuf,
}

/// The merged configuration: every `[[registry]]` table of the files read, by prefix (a
/// later file's table replaces an earlier one of the same prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registries {
    tables: BTreeMap<String, Table>,
    /// The files read, in order (for messages and `--json`).
    pub files: Vec<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct FileDoc {
    #[serde(default)]
    registry: Vec<Spanned<RegistryDoc>>,
    /// Version 1: `[registries.search]`, `[registries.insecure]`, `[registries.block]`.
    registries: Option<Spanned<V1Doc>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RegistryDoc {
    prefix: Option<Spanned<String>>,
    location: Option<Spanned<String>>,
    insecure: Option<bool>,
    blocked: Option<bool>,
    mirror_by_digest_only: Option<Spanned<bool>>,
    #[serde(default)]
    mirror: Vec<MirrorDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MirrorDoc {
    location: Option<Spanned<String>>,
    insecure: Option<bool>,
    pull_from_mirror: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
struct V1Doc {
    insecure: Option<V1List>,
    block: Option<V1List>,
}

#[derive(Deserialize, Default)]
struct V1List {
    #[serde(default)]
    registries: Vec<String>,
}

impl Registries {
    /// The configuration the process environment names (`var` reads it): `explicit` (a
    /// `--registries-conf FILE`), else the files described in the module documentation.
    pub fn load(explicit: Option<&Path>, var: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let home = var("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        let mut dirs = Vec::new();
        let named = explicit.map(Path::to_path_buf).or_else(|| {
            var(ENV_REGISTRIES_CONF)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let main = match named.clone() {
            Some(p) => {
                dirs.push(PathBuf::from(SYSTEM_DIR));
                dirs.extend(home.as_ref().map(|h| h.join(USER_DIR)));
                p
            }
            None => match home.as_ref().map(|h| h.join(USER_FILE)) {
                Some(user) if user.exists() => {
                    dirs.extend(home.as_ref().map(|h| h.join(USER_DIR)));
                    user
                }
                _ => {
                    dirs.push(PathBuf::from(SYSTEM_DIR));
                    dirs.extend(home.as_ref().map(|h| h.join(USER_DIR)));
                    PathBuf::from(SYSTEM_FILE)
                }
            },
        };
        let mut files = Vec::new();
        // A file named on purpose must exist; the default ones may be absent.
        if named.is_some() || main.exists() {
            files.push(main);
        }
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect();
            names.sort();
            files.extend(names);
        }
        let mut out = Registries::default();
        for file in files {
            let text = read_bounded(&file)?;
            out.merge(parse(&file, &text)?);
            out.files.push(file);
        }
        Ok(out)
    }

    /// Parse one file's text (`file` names it in errors).
    pub fn parse(file: &Path, text: &str) -> Result<Self> {
        let mut out = Registries {
            files: vec![file.to_path_buf()],
            ..Registries::default()
        };
        out.merge(parse(file, text)?);
        Ok(out)
    }

    /// Add a later file's tables: one with the same prefix replaces the earlier one. By key,
    /// so merging many files of many tables stays near-linear.
    fn merge(&mut self, tables: Vec<Table>) {
        for t in tables {
            self.tables.insert(t.prefix.clone(), t);
        }
    }

    /// The table whose prefix is the longest match of `written` (a reference's canonical
    /// text, whose registry is `registry`) and where the rest of `written` (what follows the
    /// prefix) starts, as containers/image's `refMatchingPrefix`: a prefix followed by the end,
    /// `/`, `:` or `@`; a `*.domain` prefix matches a host name under that domain, any port
    /// (the rest then follows the registry, port included, so a mirror's location replaces
    /// both). Each candidate is looked up by key: the cost grows with the reference, not the
    /// tables.
    fn matching(&self, written: &str, registry: &RegistryHost) -> Option<(&Table, usize)> {
        let ends = written
            .char_indices()
            .filter(|(_, c)| matches!(c, '/' | ':' | '@'))
            .map(|(i, _)| i)
            .chain(std::iter::once(written.len()));
        let exact = ends
            .filter_map(|n| self.tables.get(&written[..n]).map(|t| (t, n)))
            .max_by_key(|(_, n)| *n);
        let wildcard = match registry.host() {
            Host::Name(name) => name
                .char_indices()
                .filter(|(_, c)| *c == '.')
                .find_map(|(i, _)| self.tables.get(&format!("*{}", &name[i..])))
                .map(|t| (t, name.len())),
            _ => None,
        };
        match (exact, wildcard) {
            (Some(e), Some((w, len))) if len > e.1 => Some((w, registry.as_str().len())),
            (Some(e), _) => Some(e),
            (None, Some((w, _))) => Some((w, registry.as_str().len())),
            (None, None) => None,
        }
    }

    /// True when no table applies to anything.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The places to try for `r`: the mirrors that serve this kind of pull, in order, then
    /// the primary location. Without a matching table, `r` itself. A blocked name is an error.
    pub fn sources(&self, r: &Reference) -> Result<Sources> {
        let written = r.to_string();
        let Some((table, matched)) = self.matching(&written, &r.registry) else {
            return Ok(Sources {
                mirrors: Vec::new(),
                primary: Source {
                    reference: r.clone(),
                    insecure: false,
                    mirror: false,
                },
            });
        };
        if table.blocked {
            return Err(Error::Blocked {
                reference: written,
                file: table.file.clone(),
                prefix: table.prefix.clone(),
            });
        }
        let rest = &written[matched..];
        let at = |location: &str| -> Result<Reference> {
            if location.is_empty() {
                return Ok(r.clone());
            }
            Reference::parse_at_host(&format!("{location}{rest}")).map_err(|e| Error::Config {
                file: table.file.clone(),
                line: 0,
                key: "location".into(),
                reason: format!("`{location}` does not make a reference of {written}: {e}"),
            })
        };
        let by_digest = r.digest.is_some();
        let mut mirrors = Vec::new();
        for m in &table.mirrors {
            let serves = match m.pull_from {
                PullFromMirror::All => true,
                PullFromMirror::DigestOnly => by_digest,
                PullFromMirror::TagOnly => !by_digest,
            };
            if serves {
                mirrors.push(Source {
                    reference: at(&m.location)?,
                    insecure: m.insecure,
                    mirror: true,
                });
            }
        }
        Ok(Sources {
            mirrors,
            primary: Source {
                reference: at(&table.location)?,
                insecure: table.insecure,
                mirror: false,
            },
        })
    }
}

/// Where to pull one reference from: the mirrors to try first, then the primary location,
/// which is always there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    pub mirrors: Vec<Source>,
    pub primary: Source,
}

impl Sources {
    #[cfg(test)]
    /// Every place, in the order they are tried.
    pub(crate) fn in_order(&self) -> impl Iterator<Item = &Source> {
        self.mirrors.iter().chain(std::iter::once(&self.primary))
    }
}

/// The largest registries.conf file read.
const MAX_FILE: u64 = 1 << 20;

fn read_bounded(file: &Path) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(file).map_err(|e| Error::Config {
        file: file.to_path_buf(),
        line: 0,
        key: String::new(),
        reason: format!("cannot be read: {e}"),
    })?;
    let meta = f.metadata().map_err(|e| Error::io(file, e))?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(Error::Config {
            file: file.to_path_buf(),
            line: 0,
            key: String::new(),
            reason: format!("not a regular file of at most {MAX_FILE} bytes"),
        });
    }
    let mut text = String::new();
    f.take(MAX_FILE)
        .read_to_string(&mut text)
        .map_err(|e| Error::io(file, e))?;
    Ok(text)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// A prefix or location as containers/image accepts it: `host[:port][/namespace…]`, no
/// scheme, no user, no trailing `/`; the host made canonical ([`RegistryHost`]), so every
/// spelling of a registry is one key.
fn host_path(value: &str) -> std::result::Result<String, String> {
    let v = value.trim_end_matches('/');
    if v.is_empty() {
        return Err("is empty".into());
    }
    if v.contains("://") {
        return Err(format!(
            "`{v}` has a URL scheme; write host[:port][/namespace] (set `insecure = true` for plain HTTP)"
        ));
    }
    let (host, path) = match v.find('/') {
        Some(i) => v.split_at(i),
        None => (v, ""),
    };
    let host = RegistryHost::parse(host)
        .map_err(|why| format!("`{v}` is not host[:port][/namespace]: {why}"))?;
    let odd = path
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '?' | '#' | '\\'));
    if odd.is_some() || (path.contains('@') && !path.contains("@sha256:")) {
        return Err(format!("`{v}` is not host[:port][/namespace]"));
    }
    Ok(format!("{host}{path}"))
}

/// A wildcard prefix, `*.domain`: the domain a host name, canonical.
fn wildcard(prefix: &str) -> std::result::Result<String, String> {
    let bad = || format!("`{prefix}`: a wildcard prefix is `*.domain`, a host pattern alone");
    let domain = prefix.strip_prefix("*.").ok_or_else(bad)?;
    if domain.contains(['*', '/', ':']) {
        return Err(bad());
    }
    match Host::parse(domain) {
        Ok(Host::Name(name)) => Ok(format!("*.{name}")),
        Ok(_) => Err(bad()),
        Err(why) => Err(format!("`{prefix}`: {why}")),
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "a line-oriented parser: one match over the kinds of line"
)]
fn parse(file: &Path, text: &str) -> Result<Vec<Table>> {
    let bad = |span: std::ops::Range<usize>, key: &str, reason: String| Error::Config {
        file: file.to_path_buf(),
        line: line_of(text, span.start),
        key: key.to_string(),
        reason,
    };
    let doc: FileDoc = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        bad(span, "", e.message().to_string())
    })?;
    let mut tables = Vec::new();
    if let Some(v1) = &doc.registries {
        let v1_span = v1.span();
        if !doc.registry.is_empty() {
            return Err(bad(
                v1.span(),
                "registries",
                "mixes the version 1 `[registries.*]` lists with version 2 `[[registry]]` tables"
                    .into(),
            ));
        }
        let v1 = v1.get_ref();
        let mut index = BTreeMap::new();
        let mut add = |key: &str, h: &str, insecure: bool, blocked: bool| -> Result<()> {
            let host = host_path(h).map_err(|r| bad(v1_span.clone(), key, r))?;
            match index.get(&host) {
                Some(&i) => {
                    let t: &mut Table = &mut tables[i];
                    t.insecure |= insecure;
                    t.blocked |= blocked;
                }
                None => {
                    index.insert(host.clone(), tables.len());
                    tables.push(Table {
                        prefix: host.clone(),
                        location: host,
                        insecure,
                        blocked,
                        mirrors: Vec::new(),
                        file: file.to_path_buf(),
                    });
                }
            }
            Ok(())
        };
        for h in v1.insecure.iter().flat_map(|l| &l.registries) {
            add("registries.insecure", h, true, false)?;
        }
        for h in v1.block.iter().flat_map(|l| &l.registries) {
            add("registries.block", h, false, true)?;
        }
        return Ok(tables);
    }
    for reg in doc.registry {
        let table_span = reg.span();
        let reg = reg.into_inner();
        let location = match &reg.location {
            Some(l) if !l.get_ref().is_empty() => {
                Some(host_path(l.get_ref()).map_err(|r| bad(l.span(), "location", r))?)
            }
            _ => None,
        };
        let prefix = match &reg.prefix {
            Some(p) if p.get_ref().contains('*') => {
                wildcard(p.get_ref()).map_err(|r| bad(p.span(), "prefix", r))?
            }
            Some(p) if !p.get_ref().is_empty() => {
                host_path(p.get_ref()).map_err(|r| bad(p.span(), "prefix", r))?
            }
            _ => location.clone().ok_or_else(|| {
                bad(
                    table_span.clone(),
                    "location",
                    "a [[registry]] needs a prefix or a location".into(),
                )
            })?,
        };
        let wildcard = prefix.starts_with("*.");
        if wildcard && location.is_some() {
            let span = reg.location.as_ref().map_or(0..0, |l| l.span());
            return Err(bad(
                span,
                "location",
                format!("`{prefix}` is a wildcard prefix: it cannot have a location"),
            ));
        }
        if reg.mirror.len() > MAX_MIRRORS {
            return Err(bad(
                table_span.clone(),
                "mirror",
                format!(
                    "`{prefix}` has {} [[registry.mirror]] tables; at most {MAX_MIRRORS} are allowed (each is tried before the registry)",
                    reg.mirror.len()
                ),
            ));
        }
        let by_digest_only = reg
            .mirror_by_digest_only
            .as_ref()
            .is_some_and(|b| *b.get_ref());
        let mut mirrors = Vec::new();
        for m in &reg.mirror {
            let location = match &m.location {
                Some(l) => {
                    host_path(l.get_ref()).map_err(|r| bad(l.span(), "mirror.location", r))?
                }
                None => {
                    return Err(bad(
                        table_span.clone(),
                        "mirror.location",
                        format!("a [[registry.mirror]] of `{prefix}` has no location"),
                    ))
                }
            };
            let pull_from = match &m.pull_from_mirror {
                None => PullFromMirror::All,
                Some(p) => {
                    if by_digest_only {
                        return Err(bad(
                            p.span(),
                            "mirror.pull-from-mirror",
                            "cannot be set when the registry sets `mirror-by-digest-only = true`"
                                .into(),
                        ));
                    }
                    match p.get_ref().as_str() {
                        "" | "all" => PullFromMirror::All,
                        "digest-only" => PullFromMirror::DigestOnly,
                        "tag-only" => PullFromMirror::TagOnly,
                        other => {
                            return Err(bad(
                                p.span(),
                                "mirror.pull-from-mirror",
                                format!(
                                    "`{other}` is not one of \"all\", \"digest-only\", \"tag-only\""
                                ),
                            ))
                        }
                    }
                }
            };
            mirrors.push(Mirror {
                location,
                insecure: m.insecure.unwrap_or(false),
                pull_from: if by_digest_only {
                    PullFromMirror::DigestOnly
                } else {
                    pull_from
                },
            });
        }
        tables.push(Table {
            location: if wildcard {
                String::new()
            } else {
                location.unwrap_or_else(|| prefix.clone())
            },
            prefix,
            insecure: reg.insecure.unwrap_or(false),
            blocked: reg.blocked.unwrap_or(false),
            mirrors,
            file: file.to_path_buf(),
        });
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn conf(text: &str) -> Registries {
        Registries::parse(Path::new("registries.conf"), text).unwrap()
    }

    fn places(c: &Registries, r: &str) -> Vec<String> {
        c.sources(&Reference::parse(r).unwrap())
            .unwrap()
            .in_order()
            .map(|s| {
                format!(
                    "{}{}{}",
                    s.reference,
                    if s.mirror { " mirror" } else { "" },
                    if s.insecure { " insecure" } else { "" }
                )
            })
            .collect()
    }

    /// The example of containers-registries.conf(5), and the docker.io rule it states: a
    /// Docker Hub prefix matches the normalized name, `library/` included.
    #[test]
    fn rewrites_and_mirrors_as_the_manual_says() {
        let c = conf(
            r#"
unqualified-search-registries = ["example.com"]
short-name-mode = "enforcing"

[[registry]]
prefix = "example.com/foo"
insecure = false
blocked = false
location = "internal-registry-for-example.com/bar"

[[registry.mirror]]
location = "example-mirror-0.local/mirror-for-foo"

[[registry.mirror]]
location = "example-mirror-1.local/mirrors/foo"
insecure = true

[[registry]]
prefix = "docker.io/library"
location = "hub-cache.local:5000/library"

[aliases]
"ubuntu" = "docker.io/library/ubuntu"
"#,
        );
        assert_eq!(
            places(&c, "example.com/foo/image:latest"),
            [
                "example-mirror-0.local/mirror-for-foo/image:latest mirror",
                "example-mirror-1.local/mirrors/foo/image:latest mirror insecure",
                "internal-registry-for-example.com/bar/image:latest",
            ]
        );
        // `example.com/foobar` does not match the prefix `example.com/foo`.
        assert_eq!(places(&c, "example.com/foobar:1"), ["example.com/foobar:1"]);
        assert_eq!(
            places(&c, "ubuntu:24.04"),
            ["hub-cache.local:5000/library/ubuntu:24.04"]
        );
        assert_eq!(
            places(&c, "docker.io/nvidia/cuda:12"),
            ["docker.io/nvidia/cuda:12"]
        );
    }

    #[test]
    fn mirrors_serve_the_pulls_they_are_set_for() {
        let c = conf(
            r#"
[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "by-digest.local"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "by-tag.local"
pull-from-mirror = "tag-only"
[[registry.mirror]]
location = "any.local"

[[registry]]
prefix = "nvcr.io"
location = "nvcr.io"
mirror-by-digest-only = true
[[registry.mirror]]
location = "ngc-cache.local"
"#,
        );
        assert_eq!(
            places(&c, "docker.io/nvidia/cuda:12"),
            [
                "by-tag.local/nvidia/cuda:12 mirror",
                "any.local/nvidia/cuda:12 mirror",
                "docker.io/nvidia/cuda:12",
            ]
        );
        assert_eq!(
            places(&c, &format!("docker.io/nvidia/cuda@{D}")),
            [
                format!("by-digest.local/nvidia/cuda@{D} mirror"),
                format!("any.local/nvidia/cuda@{D} mirror"),
                format!("docker.io/nvidia/cuda@{D}"),
            ]
        );
        assert_eq!(
            places(&c, "nvcr.io/nvidia/cuda:12"),
            ["nvcr.io/nvidia/cuda:12"]
        );
        assert_eq!(
            places(&c, &format!("nvcr.io/nvidia/cuda:12@{D}")),
            [
                format!("ngc-cache.local/nvidia/cuda:12@{D} mirror"),
                format!("nvcr.io/nvidia/cuda:12@{D}"),
            ]
        );
    }

    #[test]
    fn the_longest_prefix_wins_and_wildcards_match_hosts() {
        let c = conf(
            r#"
[[registry]]
prefix = "r.io"
location = "a.local"
[[registry]]
prefix = "r.io/team"
location = "b.local/t"
[[registry]]
prefix = "r.io/team/img:1"
location = "c.local/pinned:2"
[[registry]]
prefix = "*.corp.example"
insecure = true
[[registry.mirror]]
location = "cache.corp.example:5000"
[[registry]]
prefix = "blocked.io/evil"
blocked = true
"#,
        );
        assert_eq!(places(&c, "r.io/x:1"), ["a.local/x:1"]);
        assert_eq!(places(&c, "r.io/team/img:3"), ["b.local/t/img:3"]);
        assert_eq!(places(&c, "r.io/team/img:1"), ["c.local/pinned:2"]);
        assert_eq!(
            places(&c, "reg.corp.example/ml/base:1"),
            [
                "cache.corp.example:5000/ml/base:1 mirror",
                "reg.corp.example/ml/base:1 insecure"
            ]
        );
        assert_eq!(places(&c, "corp.example/x:1"), ["corp.example/x:1"]);
        // A wildcard matches any port of the host; the mirror's location replaces host and port.
        assert_eq!(
            places(&c, "REG.corp.example.:8443/ml/base:1"),
            [
                "cache.corp.example:5000/ml/base:1 mirror",
                "reg.corp.example:8443/ml/base:1 insecure"
            ]
        );
        let e = c
            .sources(&Reference::parse("blocked.io/evil/x:1").unwrap())
            .unwrap_err();
        assert!(e.is_bad_input());
        assert!(e.to_string().contains("blocked"), "{e}");
        assert_eq!(places(&c, "blocked.io/good:1"), ["blocked.io/good:1"]);
    }

    /// `blocked`, mirrors and wildcards match the canonical name: no spelling of a blocked
    /// registry gets past it (case, trailing dot, default port, IPv4 forms, IPv4-mapped IPv6).
    #[test]
    fn every_spelling_of_a_blocked_registry_is_blocked() {
        let c = conf(
            r#"
[[registry]]
prefix = "127.0.0.1:5301"
blocked = true
[[registry]]
prefix = "localhost:5301"
blocked = true
[[registry]]
prefix = "EVIL.example.com."
blocked = true
[[registry]]
prefix = "*.Wild.Example"
blocked = true
[[registry]]
prefix = "[::FFFF:10.0.0.1]:443/team"
location = "mirror.local"
"#,
        );
        for spelling in [
            "127.0.0.1:5301",
            "127.1:5301",
            "127.0.0.01:5301",
            "[::ffff:127.0.0.1]:5301",
            "2130706433:5301",
            "0x7f.1:5301",
            "0177.0.0.1:5301",
            "localhost:5301",
            "LOCALHOST:5301",
            "localhost.:5301",
            "evil.example.com",
            "EVIL.example.com",
            "evil.example.com.:443",
            "evil.example.com:5000",
            "a.wild.example",
            "A.WILD.EXAMPLE",
            "a.wild.example:443",
            "a.b.wild.example.",
        ] {
            let r = Reference::parse(&format!("{spelling}/x/y:1")).unwrap();
            let e = c.sources(&r).expect_err(spelling);
            assert!(matches!(e, Error::Blocked { .. }), "{spelling}: {e}");
            assert!(e.is_bad_input());
        }
        for open in [
            "127.0.0.2:5301",
            "127.0.0.1:5302",
            "wild.example",
            "evil.example.co",
        ] {
            let r = Reference::parse(&format!("{open}/x/y:1")).unwrap();
            assert!(c.sources(&r).is_ok(), "{open}");
        }
        assert_eq!(places(&c, "10.0.0.1/team/x:1"), ["mirror.local/x:1"]);
        assert_eq!(
            places(&c, "[::ffff:10.0.0.1]:443/team/x:1"),
            ["mirror.local/x:1"]
        );
    }

    /// Locations and prefixes that are not `host[:port][/namespace]` are refused when the file
    /// is read, naming the line, instead of making broken URLs at pull time.
    #[test]
    fn malformed_locations_are_refused_at_the_line() {
        for (value, says) in [
            ("host?x=1", "`?`"),
            ("host#f", "`#`"),
            ("host:99999", "out of range"),
            ("host:0", "out of range"),
            ("host:", "empty"),
            ("r.io/ns?x=1", "not host[:port]"),
            ("r.io/ns#f", "not host[:port]"),
            ("r.io/n s", "not host[:port]"),
            ("::1", "brackets"),
        ] {
            for key in ["location", "prefix", "mirror.location"] {
                let text = match key {
                    "mirror.location" => format!(
                        "[[registry]]\nprefix = \"r.io\"\n[[registry.mirror]]\nlocation = \"{value}\"\n"
                    ),
                    _ => format!("[[registry]]\n{key} = \"{value}\"\n"),
                };
                let e = Registries::parse(Path::new("r.conf"), &text).expect_err(&text);
                let shown = e.to_string();
                assert!(e.is_bad_input(), "{shown}");
                assert!(shown.contains(says), "{key} = {value}: {shown}");
                assert!(shown.contains(&format!("`{key}`")), "{shown}");
            }
        }
        let e = Registries::parse(
            Path::new("r.conf"),
            "[registries.block]\nregistries = ['ok.io', 'bad.io:99999']\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }

    #[test]
    fn mirrors_per_registry_are_bounded() {
        let many = |n: usize| {
            let mut t = String::from("[[registry]]\nprefix = \"r.io\"\n");
            for i in 0..n {
                t.push_str(&format!("[[registry.mirror]]\nlocation = \"m{i}.local\"\n"));
            }
            t
        };
        let c = conf(&many(MAX_MIRRORS));
        assert_eq!(places(&c, "r.io/x:1").len(), MAX_MIRRORS + 1);
        let e = Registries::parse(Path::new("r.conf"), &many(MAX_MIRRORS + 1)).unwrap_err();
        let shown = e.to_string();
        assert!(e.is_bad_input() && shown.contains("at most 16"), "{shown}");
        assert!(shown.starts_with("r.conf:1: `mirror`"), "{shown}");
    }

    /// Tens of thousands of tables in several files merge by key: the last file's table of a
    /// prefix wins, and lookups do not scan them.
    #[test]
    fn many_tables_merge_by_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(".config/containers/registries.conf.d");
        std::fs::create_dir_all(&dir).unwrap();
        let main = tmp.path().join("main.conf");
        let tables = |tag: &str| {
            let mut t = String::new();
            for i in 0..12_000 {
                t.push_str(&format!(
                    "[[registry]]\nprefix = \"h{i}.example/ns\"\nlocation = \"{tag}{i}.local\"\n"
                ));
            }
            t
        };
        std::fs::write(&main, tables("main")).unwrap();
        for n in 0..3 {
            std::fs::write(dir.join(format!("{n}.conf")), tables(&format!("drop{n}-"))).unwrap();
        }
        let h = tmp.path().display().to_string();
        let env = move |k: &str| (k == "HOME").then(|| h.clone());
        let start = std::time::Instant::now();
        let c = Registries::load(Some(&main), &env).unwrap();
        assert_eq!(c.tables.len(), 12_000);
        assert_eq!(
            places(&c, "h11999.example/ns/x:1"),
            ["drop2-11999.local/x:1"]
        );
        assert_eq!(places(&c, "h7.example/other:1"), ["h7.example/other:1"]);
        // Quadratic merging took minutes here; linear takes well under a second in release
        // and a few in a debug build.
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn version_1_lists_still_apply() {
        let c = conf(
            "[registries.search]\nregistries = ['docker.io']\n[registries.insecure]\nregistries = ['127.0.0.1:5000']\n[registries.block]\nregistries = ['bad.io']\n",
        );
        assert_eq!(
            places(&c, "127.0.0.1:5000/x:1"),
            ["127.0.0.1:5000/x:1 insecure"]
        );
        assert!(c.sources(&Reference::parse("bad.io/x:1").unwrap()).is_err());
    }

    /// Every refusal names the file, the line and the key.
    #[test]
    fn malformed_files_name_file_line_and_key() {
        for (text, line, key, says) in [
            ("[[registry]]\nlocation = \"https://r.io\"\n", 2, "location", "scheme"),
            ("\n[[registry]]\ninsecure = true\n", 2, "location", "prefix or a location"),
            (
                "[[registry]]\nlocation = \"r.io\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"some\"\n",
                5,
                "mirror.pull-from-mirror",
                "not one of",
            ),
            (
                "[[registry]]\nlocation = \"r.io\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"all\"\n",
                6,
                "mirror.pull-from-mirror",
                "mirror-by-digest-only",
            ),
            ("[[registry]]\nprefix = \"*.a.io\"\nlocation = \"b.io\"\n", 3, "location", "wildcard"),
            ("[[registry]]\nprefix = \"a.*.io\"\n", 2, "prefix", "wildcard"),
            ("[[registry]]\nlocation = 5\n", 2, "", "string"),
            ("[registries.block]\nregistries = ['x']\n[[registry]]\nlocation = \"r\"\n", 1, "registries", "mixes"),
        ] {
            let e = Registries::parse(Path::new("/etc/containers/registries.conf"), text)
                .expect_err(text);
            let Error::Config { line: l, key: k, .. } = &e else {
                panic!("{text}: {e}")
            };
            assert!(e.is_bad_input(), "{text}");
            assert_eq!((*l, k.as_str()), (line, key), "{text}: {e}");
            let shown = e.to_string();
            assert!(shown.starts_with("/etc/containers/registries.conf"), "{shown}");
            assert!(shown.contains(says), "{text}: {shown}");
        }
    }

    #[test]
    fn files_are_found_as_containers_image_finds_them() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let user_dir = home.join(USER_DIR);
        std::fs::create_dir_all(&user_dir).unwrap();
        let explicit = tmp.path().join("explicit.conf");
        std::fs::write(
            &explicit,
            "[[registry]]\nprefix = \"r.io\"\nlocation = \"first.local\"\n",
        )
        .unwrap();
        // A later drop-in replaces the table of the same prefix; other files are not read.
        std::fs::write(
            user_dir.join("50-late.conf"),
            "[[registry]]\nprefix = \"r.io\"\nlocation = \"late.local\"\n",
        )
        .unwrap();
        std::fs::write(
            user_dir.join("10-early.conf"),
            "[[registry]]\nlocation = \"e.io\"\ninsecure = true\n",
        )
        .unwrap();
        std::fs::write(user_dir.join("notes.txt"), "not toml").unwrap();
        let h = home.display().to_string();
        let e = explicit.display().to_string();
        let env = move |k: &str| match k {
            "HOME" => Some(h.clone()),
            ENV_REGISTRIES_CONF => Some(e.clone()),
            _ => None,
        };
        let c = Registries::load(None, &env).unwrap();
        assert_eq!(places(&c, "r.io/x:1"), ["late.local/x:1"]);
        assert_eq!(places(&c, "e.io/x:1"), ["e.io/x:1 insecure"]);
        assert_eq!(c.files.first(), Some(&explicit));
        assert!(c
            .files
            .iter()
            .all(|f| f.extension().is_some_and(|x| x == "conf")));
        // An explicit file that is missing is an error; the default files may be absent.
        let missing = tmp.path().join("missing.conf");
        assert!(Registries::load(Some(&missing), &env).is_err());
        let none = |_: &str| None;
        assert!(Registries::load(None, &none).is_ok());
    }
}
