//! Image tags from the recipe's template: `{version}-{target}` → `1.4.0-sm90-fp16`.
//!
//! Tags are deterministic, use only OCI tag characters (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`)
//! and are at most 128 characters. Characters outside that set are replaced by `-` and the
//! target gets a note saying so; a tag longer than 128 characters, an empty tag, or two
//! targets with the same tag are refused (truncating would make tags collide silently).

use crate::recipe::{Diagnostic, Recipe};

use super::types::{TargetKind, TargetPlan};

/// The longest tag OCI allows.
pub(crate) const MAX_TAG: usize = 128;

/// The value of each placeholder for one target.
fn value(recipe: &Recipe, t: &TargetPlan, name: &str) -> Option<String> {
    let gpu = t.gpu.as_ref();
    Some(match name {
        "model" => recipe.model.name.clone(),
        "version" => recipe.model.version.clone(),
        "target" => t.id.clone(),
        "sm" => gpu.map_or_else(|| "cpu".into(), |g| g.sm.clone()),
        "gpu" => match (t.kind, gpu.and_then(|g| g.products.first())) {
            (TargetKind::Gpu, Some(p)) => p.to_ascii_lowercase(),
            (TargetKind::Gpu, None) => gpu.map_or_else(String::new, |g| g.sm.clone()),
            (TargetKind::Cpu, _) => "cpu".into(),
        },
        "precision" => t.precision.to_string(),
        "tensorrt" => t
            .tensorrt
            .as_ref()
            .map_or_else(|| "none".into(), |r| r.version.to_string()),
        "cuda" => t
            .cuda
            .as_ref()
            .map_or_else(|| "none".into(), |c| c.to_string()),
        "platform" => t.platform.to_string(),
        _ => return None,
    })
}

/// Render `template` for one target: `Ok((tag, sanitized))` or the problem with the template.
pub(crate) fn render(
    template: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(String, bool), String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err(format!("unmatched `}}` in tag template \"{template}\""));
        }
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("unclosed `{{` in tag template \"{template}\""))?;
        let name = &after[..close];
        let v = lookup(name).ok_or_else(|| {
            format!("unknown placeholder {{{name}}} in tag template \"{template}\"")
        })?;
        out.push_str(&v);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(sanitize(&out))
}

/// Replace characters OCI tags do not allow with `-` (a leading `.` or `-` with `_`).
pub(crate) fn sanitize(s: &str) -> (String, bool) {
    let mut changed = false;
    let out: String = s
        .chars()
        .enumerate()
        .map(|(i, c)| {
            let ok = c.is_ascii_alphanumeric() || c == '_' || (i > 0 && (c == '.' || c == '-'));
            if ok {
                c
            } else {
                changed = true;
                if i == 0 {
                    '_'
                } else {
                    '-'
                }
            }
        })
        .collect();
    (out, changed)
}

/// A bundle's tags, for the targets its models share (`first` is its first model's recipe):
/// the bundle's template, `{model}` and `{version}` the bundle's name and version, the other
/// placeholders the target's; refused as a recipe's template is, at the bundle's key.
pub(crate) fn apply_bundle(
    bundle: &crate::recipe::bundle::Bundle,
    first: &Recipe,
    targets: &mut [TargetPlan],
) -> Result<(), super::Error> {
    let mut out = Vec::new();
    apply(&bundle.as_recipe(first), targets, &mut out);
    if out.is_empty() {
        Ok(())
    } else {
        Err(super::Error::Refused {
            file: bundle.file.clone(),
            diagnostics: out,
        })
    }
}

/// Render every target's tag and image reference; refusals go to `out`.
pub(super) fn apply(recipe: &Recipe, targets: &mut [TargetPlan], out: &mut Vec<Diagnostic>) {
    let tpl = &recipe.image.tag;
    let file = recipe.file.as_path();
    let repo = &recipe.image.repository.value;
    for t in targets.iter_mut() {
        match render(&tpl.value, |n| value(recipe, t, n)) {
            Err(e) => {
                out.push(tpl.diagnostic(file, format!("{e} [rule: tag-template]")).with_hint(
                    "use the placeholders {model} {version} {target} {sm} {gpu} {precision} {tensorrt} {cuda} {platform}",
                ));
                return;
            }
            Ok((tag, _)) if tag.is_empty() => {
                out.push(
                    tpl.diagnostic(
                        file,
                        "tag template renders an empty tag [rule: tag-template]",
                    )
                    .with_hint("the default \"{version}-{target}\" is a good start"),
                );
                return;
            }
            Ok((tag, _)) if tag.chars().count() > MAX_TAG => {
                out.push(
                    tpl.diagnostic(
                        file,
                        format!("tag of target {} is {} characters long, more than the {MAX_TAG} OCI allows: \"{tag}\" [rule: tag-length]", t.id, tag.chars().count()),
                    )
                    .with_hint("shorten the template: {version}-{target} identifies every target"),
                );
            }
            Ok((tag, sanitized)) => {
                if sanitized {
                    t.notes
                        .push(format!("tag sanitized to OCI tag characters: \"{tag}\""));
                }
                t.image = format!("{repo}:{tag}");
                t.tag = tag;
            }
        }
    }
    // Two targets must never share a tag: the second push would overwrite the first.
    for i in 0..targets.len() {
        for j in 0..i {
            if !targets[i].tag.is_empty() && targets[i].tag == targets[j].tag {
                out.push(
                    tpl.diagnostic(
                        file,
                        format!(
                            "targets {} and {} both get the tag \"{}\" [rule: tag-unique]",
                            targets[j].id, targets[i].id, targets[i].tag
                        ),
                    )
                    .with_hint("put {target} in image.tag, such as \"{version}-{target}\""),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(template: &str, want: Result<(&str, bool), &str>) {
        let lookup = |n: &str| match n {
            "version" => Some("1.4.0+build.7".to_string()),
            "target" => Some("sm90-fp16".to_string()),
            "model" => Some("resnet50".to_string()),
            "gpu" => Some("rtx 4090".to_string()),
            _ => None,
        };
        let got = render(template, lookup);
        match want {
            Ok((tag, s)) => assert_eq!(got, Ok((tag.to_string(), s)), "{template}"),
            Err(e) => assert!(got.as_ref().unwrap_err().contains(e), "{template}: {got:?}"),
        }
    }

    #[test]
    fn tags_render_and_sanitize() {
        check("{model}-{target}", Ok(("resnet50-sm90-fp16", false)));
        check("{version}-{target}", Ok(("1.4.0-build.7-sm90-fp16", true)));
        check("{gpu}", Ok(("rtx-4090", true)));
        check(".{target}", Ok(("_sm90-fp16", true)));
        check("v{target}", Ok(("vsm90-fp16", false)));
        check("{nope}", Err("unknown placeholder {nope}"));
        check("{target", Err("unclosed `{`"));
        check("a}b", Err("unmatched `}`"));
        check("", Ok(("", false)));
    }

    #[test]
    fn sanitized_tags_match_the_oci_grammar() {
        for s in [
            "a b",
            "-x",
            ".x",
            "ü",
            "a/b:c@d",
            "_ok.-",
            "x".repeat(3).as_str(),
        ] {
            let (t, _) = sanitize(s);
            let mut chars = t.chars();
            let first = chars.next().unwrap();
            assert!(first.is_ascii_alphanumeric() || first == '_', "{t}");
            assert!(
                chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
                "{t}"
            );
        }
    }
}
