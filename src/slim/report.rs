//! The size report: every layer of the slim image, the image, and the image the full builder
//! would have given, with the reduction factor (pure).

use serde::{Deserialize, Serialize};

/// One layer's sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerSize {
    pub digest: String,
    pub media_type: String,
    /// Bytes of the blob as stored and pulled (compressed).
    pub size: u64,
    /// Bytes of the uncompressed tar (what the layer takes on a node's disk).
    pub uncompressed: u64,
    /// Where the layer comes from: `"base"`, `"slim"` (the selected closure), `"builder"`.
    pub from: String,
}

/// Sizes of the slim image against the full builder image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SizeReport {
    pub layers: Vec<LayerSize>,
    /// Sum over `layers`.
    pub size: u64,
    pub uncompressed: u64,
    /// The same sums for the builder image every file was taken from; for an image built on
    /// a slim base, for that image on the full builder (the builder's layers plus the layers
    /// added on top of the slim base).
    pub builder_size: u64,
    pub builder_uncompressed: u64,
    /// `builder_size / size`: how many times smaller the pull is.
    pub reduction: f64,
    /// `builder_uncompressed / uncompressed`: how many times less disk on a node.
    pub reduction_uncompressed: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Build the report from the slim image's layers and the builder image's layers.
pub fn size_report(layers: &[LayerSize], builder: &[LayerSize]) -> SizeReport {
    let size = layers.iter().map(|l| l.size).sum();
    let uncompressed = layers.iter().map(|l| l.uncompressed).sum();
    let builder_size = builder.iter().map(|l| l.size).sum();
    let builder_uncompressed = builder.iter().map(|l| l.uncompressed).sum();
    SizeReport {
        layers: layers.to_vec(),
        size,
        uncompressed,
        builder_size,
        builder_uncompressed,
        reduction: ratio(builder_size, size),
        reduction_uncompressed: ratio(builder_uncompressed, uncompressed),
    }
}

/// True for the layers of the slim base itself (the base image's and the closure's).
pub(crate) fn from_slim_base(l: &LayerSize) -> bool {
    l.from == "base" || l.from == "slim"
}

/// Bytes for people: `1.4 GiB`, `310.2 KiB`, `512 B`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

impl SizeReport {
    /// The report as a table for the terminal (the caller decides where it goes).
    pub fn render(&self) -> String {
        let mut out =
            String::from("layer                    from        compressed  uncompressed\n");
        for l in &self.layers {
            let short = l.digest.strip_prefix("sha256:").unwrap_or(&l.digest);
            let short: String = short.chars().take(12).collect();
            out.push_str(&format!(
                "sha256:{short:<17} {:<8} {:>13} {:>13}\n",
                l.from,
                human(l.size),
                human(l.uncompressed)
            ));
        }
        out.push_str(&format!(
            "image                    {:<8} {:>13} {:>13}\n",
            "",
            human(self.size),
            human(self.uncompressed)
        ));
        let label = if self.layers.iter().all(from_slim_base) {
            "full builder image"
        } else {
            "same on full builder"
        };
        out.push_str(&format!(
            "{label:<24} {:<8} {:>13} {:>13}\n",
            "",
            human(self.builder_size),
            human(self.builder_uncompressed)
        ));
        out.push_str(&format!(
            "reduction                {:<8} {:>12.1}x {:>12.1}x\n",
            "", self.reduction, self.reduction_uncompressed
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(from: &str, size: u64, uncompressed: u64) -> LayerSize {
        LayerSize {
            digest: format!("sha256:{}", "ab".repeat(32)),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            size,
            uncompressed,
            from: from.into(),
        }
    }

    #[test]
    fn reduction_is_builder_over_slim() {
        let r = size_report(
            &[
                layer("base", 30 << 20, 80 << 20),
                layer("slim", 50 << 20, 120 << 20),
            ],
            &[
                layer("builder", 4 << 30, 9 << 30),
                layer("builder", 4 << 30, 9 << 30),
            ],
        );
        assert_eq!(r.size, 80 << 20);
        assert_eq!(r.builder_size, 8 << 30);
        assert!((r.reduction - 102.4).abs() < 1e-9);
        assert!((r.reduction_uncompressed - 92.16).abs() < 1e-9);
        let text = r.render();
        assert!(text.contains("full builder image"), "{text}");
        assert!(text.contains("102.4x"), "{text}");
        assert_eq!(size_report(&[], &[]).reduction, 0.0);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
