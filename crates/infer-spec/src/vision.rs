//! `[vision]` of `runtime.toml`: how the runtime turns an encoded image (JPEG, PNG, WebP) into
//! the engine's pixel tensor, and the engine's outputs into answers (labels, boxes, vectors).
//!
//! The recipe's `[vision]` table says the same in the builder's words; the builder checks it
//! against the ONNX and writes this section. The runtime then serves an `image` input (V2
//! `BYTES`, one encoded image per row, and the image routes' raw or multipart bodies) instead of
//! the engine's pixel tensor.
//!
//! ```toml
//! [vision]
//! input = "images"
//! layout = "nchw"
//! color = "rgb"
//! height = 224
//! width = 224
//! resize = "crop"
//! shorter = 256
//! interpolation = "bilinear"
//! scale = 0.00392156862745098
//! mean = [0.485, 0.456, 0.406]
//! std = [0.229, 0.224, 0.225]
//! output = "logits"
//! answer = "classify"
//! activation = "softmax"
//! top_k = 5
//! labels = ["tench", "goldfish", "..."]
//! ```
//!
//! Each step is defined as the Python tools people check against define it, so a model trained
//! with them sees the same pixels: resizing is PIL's (`Image.resize`, whose bilinear and bicubic
//! filters widen when shrinking: antialiased), `crop` is torchvision's `Resize(shorter)` then
//! `CenterCrop`, `letterbox` is Ultralytics' `LetterBox` (centred, padded), and the EXIF
//! orientation is applied first (`ImageOps.exif_transpose`).

use crate::text::Activation;
use crate::{DataType, TensorSpec};
use serde::{Deserialize, Serialize};

/// The served input that carries encoded images (V2 `BYTES`, one image per row).
pub const IMAGE_INPUT: &str = "image";

/// The default `max_image_bytes`: a 12-megapixel phone photograph is 3 to 8 MB as JPEG.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 20 << 20;
/// The largest `max_image_bytes`.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;
/// The default `max_pixels`: 40 megapixels (a 48-megapixel sensor's full frame is refused; its
/// usual 12-megapixel output is not). PIL warns at 89 megapixels and refuses twice that.
pub const DEFAULT_MAX_PIXELS: u64 = 40_000_000;
/// The largest `max_pixels`.
pub const MAX_PIXELS: u64 = 1 << 30;
/// The default `max_client_batch_size` of an image model: images one request may carry.
pub const DEFAULT_MAX_CLIENT_BATCH_SIZE: u32 = 64;
/// The largest `max_client_batch_size`.
pub const MAX_CLIENT_BATCH_SIZE: u32 = 4096;
/// The largest side the engine's input may have.
pub const MAX_SIDE: u32 = 8192;

/// `[vision]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vision {
    /// The engine input that takes the pixels.
    pub input: String,
    /// Where the channels are in the engine's input.
    pub layout: Layout,
    /// The channels' order.
    pub color: Color,
    /// The engine input's height and width, in pixels. With a dynamic width (`max_width` not
    /// 0), `width` is the least width of the canvas (the input profile's `min`).
    pub height: u32,
    pub width: u32,
    /// `pad` into an input whose width is dynamic: the most the canvas may be (the input
    /// profile's `max`). 0: the width is fixed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_width: u32,
    /// With a dynamic width: the canvas width is the resized width rounded up to a multiple of
    /// this, at least `width`, at most `max_width`, and the same for every image of a request
    /// (its widest), as PaddleOCR pads a batch to its widest line.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub width_multiple: u32,
    /// How an image of any size becomes `height` x `width`.
    pub resize: Resize,
    /// `crop`: the shorter side's length before the centre crop (torchvision's `Resize(shorter)`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shorter: u32,
    /// How pixels are resampled.
    pub interpolation: Interpolation,
    /// The value of the pixels `letterbox` and `pad` add, on the 0-255 scale, before `scale`,
    /// `mean` and `std` apply (114: Ultralytics' grey; 127.5 with mean 0.5 and std 0.5 after
    /// scale 1/255 makes a normalised 0, as PaddleOCR pads).
    #[serde(default)]
    pub pad: f32,
    /// Each pixel value `v` (0-255) becomes `(v * scale - mean[c]) / std[c]`.
    pub scale: f32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// The engine output the answer comes from.
    pub output: String,
    /// What the output means.
    pub answer: Answer,
    /// `classify`: what turns the output into scores.
    #[serde(default)]
    pub activation: Activation,
    /// `classify`: how many labels an answer holds, best first.
    #[serde(default = "default_top_k")]
    pub top_k: u32,
    /// A label per class (output column); empty: the class's index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// `detect`: the least score a box is kept with.
    #[serde(default = "default_confidence")]
    pub confidence: f32,
    /// `detect`: boxes of one class overlapping more than this (intersection over union) keep
    /// only the best.
    #[serde(default = "default_iou")]
    pub iou: f32,
    /// `detect`: the most boxes one image's answer holds.
    #[serde(default = "default_max_detections")]
    pub max_detections: u32,
    /// `embed`: L2-normalise the vector.
    #[serde(default, skip_serializing_if = "is_false")]
    pub normalize: bool,
    /// The most bytes one encoded image may have (413 past it).
    #[serde(default = "default_max_image_bytes")]
    pub max_image_bytes: u64,
    /// The most pixels (width x height, as the file declares them) one image may have: refused
    /// with 400 before anything is decoded.
    #[serde(default = "default_max_pixels")]
    pub max_pixels: u64,
    /// The most images one request may carry, on every route; more is refused with 413.
    #[serde(default = "default_max_client_batch_size")]
    pub max_client_batch_size: u32,
}

/// Where the channels are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `[batch, channels, height, width]` (PyTorch, ONNX exports of it).
    Nchw,
    /// `[batch, height, width, channels]` (TensorFlow, Keras).
    Nhwc,
}

/// The channels' order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Color {
    Rgb,
    /// OpenCV's order (Caffe models, PaddleOCR).
    Bgr,
}

/// How an image becomes the engine's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resize {
    /// The shorter side to `shorter`, keeping the ratio, then the centre `height` x `width`
    /// (torchvision's `Resize` + `CenterCrop`, the ImageNet evaluation transform).
    Crop,
    /// Scaled to fit `height` x `width` keeping the ratio, centred, the rest `pad` (YOLO).
    Letterbox,
    /// Scaled to `height` x `width` whatever the ratio.
    Stretch,
    /// Scaled to `height` keeping the ratio, at most `width` wide (`max_width` when the width is
    /// dynamic), placed left, the rest of the width `pad` (PaddleOCR's classifier and
    /// recogniser).
    Pad,
}

/// How pixels are resampled: PIL's filters (bilinear and bicubic widen with the scale when
/// shrinking, so every source pixel counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    Nearest,
    Bilinear,
    Bicubic,
}

/// What the engine's output means, and so what an answer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// Scores per class, `[batch, classes]`: `[{label, score}]`, the `top_k` best.
    Classify,
    /// YOLOv8-style rows, `[batch, 4 + classes, boxes]` (centre x, centre y, width, height in
    /// the engine's input pixels, then a score per class): `[{label, score, box}]` in the
    /// original image's pixels, after class-aware non-maximum suppression.
    Detect,
    /// A vector per image, `[batch, dims]`, or a feature map `[batch, C, H, W]` (`[batch, H, W,
    /// C]` under NHWC) the runtime averages over its positions.
    Embed,
    /// A text line's characters, CTC probabilities `[batch, steps, classes]` (PaddleOCR's
    /// recognisers): `{text, score}`, decoded greedily (the best class of each step, repeats
    /// merged, the blank, class 0, dropped), the score the mean of the kept steps' best
    /// probabilities. `labels` are the characters of classes 1, 2, ...; an output with one
    /// class more than the blank and the labels ends in a space (PaddleOCR's `use_space_char`).
    Text,
}

macro_rules! names {
    ($t:ty { $($v:ident = $s:literal),* $(,)? }) => {
        impl $t {
            pub const ALL: &'static [$t] = &[$(<$t>::$v),*];
            pub fn as_str(self) -> &'static str {
                match self { $(<$t>::$v => $s),* }
            }
            pub fn parse(s: &str) -> Option<$t> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }
    };
}
names!(Layout { Nchw = "nchw", Nhwc = "nhwc" });
names!(Color { Rgb = "rgb", Bgr = "bgr" });
names!(Resize { Crop = "crop", Letterbox = "letterbox", Stretch = "stretch", Pad = "pad" });
names!(Interpolation { Nearest = "nearest", Bilinear = "bilinear", Bicubic = "bicubic" });
names!(Answer { Classify = "classify", Detect = "detect", Embed = "embed", Text = "text" });

fn default_top_k() -> u32 {
    5
}
fn default_confidence() -> f32 {
    0.25
}
fn default_iou() -> f32 {
    0.45
}
fn default_max_detections() -> u32 {
    300
}
fn default_max_image_bytes() -> u64 {
    DEFAULT_MAX_IMAGE_BYTES
}
fn default_max_pixels() -> u64 {
    DEFAULT_MAX_PIXELS
}
fn default_max_client_batch_size() -> u32 {
    DEFAULT_MAX_CLIENT_BATCH_SIZE
}
fn is_zero(v: &u32) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

/// Whether `embed` reads an output of `dims`: a vector `[batch, dims]`, or a feature map the
/// runtime pools, its channels known where `layout` puts them (`[batch, C, H, W]` or
/// `[batch, H, W, C]`).
pub fn embeds(dims: &[i64], layout: Layout) -> bool {
    match (dims, layout) {
        ([_, d], _) | ([_, d, _, _], Layout::Nchw) | ([_, _, _, d], Layout::Nhwc) => *d > 0,
        _ => false,
    }
}

/// The shapes [`embeds`] takes, in words.
pub fn embed_shapes(layout: Layout) -> &'static str {
    match layout {
        Layout::Nchw => "[batch, dims] or [batch, C, H, W]",
        Layout::Nhwc => "[batch, dims] or [batch, H, W, C]",
    }
}

/// Whether `labels` labels fit an output of `classes` classes under `answer`: one per class,
/// except `text`'s, which are the characters after the CTC blank, a space perhaps after them.
pub fn labels_fit(answer: Answer, classes: usize, labels: usize) -> bool {
    match answer {
        Answer::Text => labels + 1 == classes || labels + 2 == classes,
        _ => labels == classes,
    }
}

/// `labels` labels for `classes` classes, in words, for an error (`labels_fit` false).
pub fn labels_misfit(answer: Answer, classes: usize, labels: usize) -> String {
    match answer {
        Answer::Text => format!(
            "{labels} character{} for {classes} classes: a CTC output's classes are the blank, then one per character, then perhaps a space ({} or {} characters)",
            if labels == 1 { "" } else { "s" },
            classes.saturating_sub(1),
            classes.saturating_sub(2)
        ),
        _ => format!("{labels} labels for {classes} classes"),
    }
}

/// The classes of a CTC output of `dims` (`[batch, steps, classes]`, the classes fixed and
/// more than the blank), the shape `text` reads.
pub fn ctc_classes(dims: &[i64]) -> Option<usize> {
    match dims {
        [_, _, c] if *c > 1 => Some(*c as usize),
        _ => None,
    }
}

/// The datatypes a pixel input may take: normalised floats, or raw 0-255 bytes.
pub fn pixel_datatype(d: DataType) -> bool {
    matches!(d, DataType::F32 | DataType::F16 | DataType::U8)
}

impl Vision {
    /// The engine input's dims for `[batch]` images: `[-1, 3, h, w]` or `[-1, h, w, 3]`.
    pub fn input_dims(&self) -> Vec<i64> {
        let h = i64::from(self.height);
        let w = if self.dynamic_width() {
            -1
        } else {
            i64::from(self.width)
        };
        match self.layout {
            Layout::Nchw => vec![-1, 3, h, w],
            Layout::Nhwc => vec![-1, h, w, 3],
        }
    }

    /// Whether the engine input's width is dynamic (`pad` to the image's own width).
    pub fn dynamic_width(&self) -> bool {
        self.max_width != 0
    }

    /// The widest canvas an image may become: `max_width`, else `width`.
    pub fn widest(&self) -> u32 {
        if self.dynamic_width() {
            self.max_width
        } else {
            self.width
        }
    }

    /// The canvas width of an image resized to `resized` pixels wide under a dynamic width:
    /// rounded up to `width_multiple`, at least `width`, at most `max_width`. A fixed width is
    /// `width` whatever the image.
    pub fn canvas_width(&self, resized: u32) -> u32 {
        if !self.dynamic_width() {
            return self.width;
        }
        let m = self.width_multiple.max(1);
        resized
            .div_ceil(m)
            .saturating_mul(m)
            .clamp(self.width, self.max_width)
    }

    /// `crop`'s shorter side: `shorter`, or when 0 the crop's shorter side scaled by 256/224
    /// (torchvision's ImageNet evaluation ratio).
    pub fn crop_shorter(&self) -> u32 {
        match self.shorter {
            0 => self.height.min(self.width) * 8 / 7,
            s => s,
        }
    }

    /// The served signature: an `image` `BYTES` input, one encoded image per row, and the
    /// engine's outputs as they are (the raw tensors stay available through V2).
    pub fn served_inputs(&self) -> Vec<TensorSpec> {
        vec![TensorSpec {
            name: IMAGE_INPUT.to_owned(),
            datatype: DataType::Bytes,
            dims: vec![-1, 1],
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        }]
    }

    /// The classes of a `classify` or `detect` output (its columns, or its rows past the four
    /// box values), when its dims say.
    pub fn classes(&self, outputs: &[TensorSpec]) -> Option<usize> {
        let out = outputs.iter().find(|t| t.name == self.output)?;
        let d = |i: usize| out.dims.get(i).copied().filter(|&d| d > 0);
        match self.answer {
            Answer::Classify => {
                let rest: Vec<i64> = out.dims.iter().skip(1).copied().collect();
                match rest.as_slice() {
                    [c] | [c, 1, 1] if *c > 0 => Some(*c as usize),
                    _ => None,
                }
            }
            Answer::Detect => d(1).filter(|&r| r > 4).map(|r| r as usize - 4),
            Answer::Embed => None,
            Answer::Text => ctc_classes(&out.dims),
        }
    }

    /// How images become tensors and tensors answers, as flat key/value pairs for image
    /// annotations (keys without the reverse-DNS prefix, sorted), so `inspect` shows them.
    pub fn annotations(&self) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(format!("vision.{k}"), v);
        };
        put("input", self.input.clone());
        if self.dynamic_width() {
            put(
                "size",
                format!("{}..{}x{}", self.width, self.max_width, self.height),
            );
            put("width_multiple", self.width_multiple.max(1).to_string());
        } else {
            put("size", format!("{}x{}", self.width, self.height));
        }
        put("layout", self.layout.as_str().into());
        put("color", self.color.as_str().into());
        put("resize", self.resize.as_str().into());
        if self.resize == Resize::Crop {
            put("shorter", self.crop_shorter().to_string());
        }
        put("interpolation", self.interpolation.as_str().into());
        put("scale", self.scale.to_string());
        put("mean", format!("{:?}", self.mean));
        put("std", format!("{:?}", self.std));
        put("answer", self.answer.as_str().into());
        put("output", self.output.clone());
        match self.answer {
            Answer::Classify => {
                put("activation", self.activation.as_str().into());
                put("top_k", self.top_k.to_string());
            }
            Answer::Detect => {
                put("confidence", self.confidence.to_string());
                put("iou", self.iou.to_string());
            }
            Answer::Embed => put("normalize", self.normalize.to_string()),
            Answer::Text => {}
        }
        if !self.labels.is_empty() {
            put("labels", self.labels.len().to_string());
        }
        m
    }

    /// Everything wrong with the section against the engine's tensors, each as one sentence.
    pub fn problems(&self, inputs: &[TensorSpec], outputs: &[TensorSpec]) -> Vec<String> {
        let mut p = Vec::new();
        if !(1..=MAX_SIDE).contains(&self.height) || !(1..=MAX_SIDE).contains(&self.width) {
            p.push(format!(
                "vision: height {} and width {} must be 1 to {MAX_SIDE}",
                self.height, self.width
            ));
        }
        if self.dynamic_width() {
            if self.resize != Resize::Pad {
                p.push(format!(
                    "vision: a dynamic width needs resize = \"pad\", not {:?}",
                    self.resize.as_str()
                ));
            }
            if !(self.width..=MAX_SIDE).contains(&self.max_width) {
                p.push(format!(
                    "vision.max_width {} must be {} (width) to {MAX_SIDE}",
                    self.max_width, self.width
                ));
            }
        } else if self.width_multiple != 0 {
            p.push("vision.width_multiple applies to a dynamic width only".to_owned());
        }
        match inputs.iter().find(|t| t.name == self.input) {
            None => p.push(format!(
                "vision.input: the engine has no input {:?} (its inputs are {:?})",
                self.input,
                inputs.iter().map(|t| &t.name).collect::<Vec<_>>()
            )),
            Some(t) => {
                if !pixel_datatype(t.datatype) {
                    p.push(format!(
                        "vision.input: input {:?} is {}, not FP32, FP16 or UINT8",
                        t.name, t.datatype
                    ));
                }
                if t.dims != self.input_dims() {
                    p.push(format!(
                        "vision.input: input {:?} has dims {:?}, not {:?} ({} {}x{})",
                        t.name,
                        t.dims,
                        self.input_dims(),
                        self.layout.as_str(),
                        self.width,
                        self.height
                    ));
                } else if self.dynamic_width() {
                    // The canvas widths are the profile's range: the engine is built and warmed
                    // for them.
                    let at = match self.layout {
                        Layout::Nchw => 2,
                        Layout::Nhwc => 1,
                    };
                    let range = t
                        .profile
                        .as_ref()
                        .and_then(|r| Some((*r.min.get(at)?, *r.max.get(at)?)));
                    let want = (i64::from(self.width), i64::from(self.max_width));
                    if range != Some(want) {
                        p.push(format!(
                            "vision: widths {}..={} are not input {:?}'s profile ({range:?})",
                            want.0, want.1, t.name
                        ));
                    }
                }
            }
        }
        if let Some(other) = inputs.iter().find(|t| t.name != self.input) {
            p.push(format!(
                "vision: the engine input {:?} is not the pixels (an image model takes one input)",
                other.name
            ));
        }
        if self.resize == Resize::Crop && self.crop_shorter() < self.height.min(self.width) {
            p.push(format!(
                "vision.shorter {} is less than the crop's shorter side {}",
                self.shorter,
                self.height.min(self.width)
            ));
        }
        if !(self.pad.is_finite() && (0.0..=255.0).contains(&self.pad)) {
            p.push(format!("vision.pad {} is not 0 to 255", self.pad));
        }
        let finite = |v: f32| v.is_finite();
        if !finite(self.scale)
            || !self.mean.iter().copied().all(finite)
            || !self.std.iter().all(|&s| finite(s) && s != 0.0)
        {
            p.push("vision: scale, mean and std must be finite numbers, std not 0".to_owned());
        }
        match crate::runtime::float_output("vision.output", &self.output, outputs) {
            Err(problem) => p.push(problem),
            Ok(t) => {
                let shape = match self.answer {
                    Answer::Classify => self.classes(outputs).is_some(),
                    Answer::Detect => t.dims.len() == 3 && self.classes(outputs).is_some(),
                    Answer::Embed => embeds(&t.dims, self.layout),
                    Answer::Text => self.classes(outputs).is_some(),
                };
                if !shape {
                    let want = match self.answer {
                        Answer::Classify => "[batch, classes]",
                        Answer::Detect => "[batch, 4 + classes, boxes]",
                        Answer::Embed => embed_shapes(self.layout),
                        Answer::Text => "[batch, steps, classes]",
                    };
                    p.push(format!(
                        "vision.output: output {:?} has dims {:?}, not {want} as answer = {:?} reads it",
                        t.name,
                        t.dims,
                        self.answer.as_str()
                    ));
                }
            }
        }
        if let Some(c) = self.classes(outputs) {
            let n = self.labels.len();
            if n != 0 && !labels_fit(self.answer, c, n) {
                p.push(format!(
                    "vision.labels: {}",
                    labels_misfit(self.answer, c, n)
                ));
            }
        }
        if self.answer == Answer::Text && self.labels.is_empty() {
            p.push(
                "vision.labels: answer = \"text\" needs the characters (the recogniser's dictionary)"
                    .to_owned(),
            );
        }
        if self.top_k == 0 {
            p.push("vision.top_k must be at least 1".to_owned());
        }
        if !(0.0..=1.0).contains(&self.confidence) || !(0.0..=1.0).contains(&self.iou) {
            p.push("vision: confidence and iou must be 0 to 1".to_owned());
        }
        if !(1..=MAX_IMAGE_BYTES).contains(&self.max_image_bytes) {
            p.push(format!(
                "vision.max_image_bytes must be 1 to {MAX_IMAGE_BYTES}"
            ));
        }
        if !(1..=MAX_PIXELS).contains(&self.max_pixels) {
            p.push(format!("vision.max_pixels must be 1 to {MAX_PIXELS}"));
        }
        if !(1..=MAX_CLIENT_BATCH_SIZE).contains(&self.max_client_batch_size) {
            p.push(format!(
                "vision.max_client_batch_size must be 1 to {MAX_CLIENT_BATCH_SIZE}"
            ));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            datatype,
            dims: dims.to_vec(),
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        }
    }

    fn classifier() -> Vision {
        toml::from_str(
            "input = \"x\"\nlayout = \"nchw\"\ncolor = \"rgb\"\nheight = 224\nwidth = 224\n\
             resize = \"crop\"\ninterpolation = \"bilinear\"\nscale = 0.00392156862745098\n\
             mean = [0.485, 0.456, 0.406]\nstd = [0.229, 0.224, 0.225]\noutput = \"y\"\n\
             answer = \"classify\"\nactivation = \"softmax\"\n",
        )
        .unwrap()
    }

    #[test]
    fn a_classifier_section_reads_with_its_defaults_and_fits_its_engine() {
        let v = classifier();
        assert_eq!(v.crop_shorter(), 256, "224 * 256 / 224");
        assert_eq!(v.top_k, 5);
        assert_eq!(v.max_pixels, DEFAULT_MAX_PIXELS);
        let inputs = [spec("x", DataType::F32, &[-1, 3, 224, 224])];
        let outputs = [spec("y", DataType::F32, &[-1, 1000])];
        assert_eq!(v.problems(&inputs, &outputs), Vec::<String>::new());
        assert_eq!(v.classes(&outputs), Some(1000));
        let text = toml::to_string(&v).unwrap();
        assert_eq!(toml::from_str::<Vision>(&text).unwrap(), v, "{text}");
    }

    #[test]
    fn each_mismatch_with_the_engine_is_one_sentence_naming_its_key() {
        let mut v = classifier();
        v.labels = vec!["a".into(); 3];
        v.shorter = 100;
        v.std = [0.0, 1.0, 1.0];
        let inputs = [
            spec("x", DataType::I64, &[-1, 224, 224, 3]),
            spec("z", DataType::F32, &[-1, 1]),
        ];
        let outputs = [spec("y", DataType::F32, &[-1, 10, 7])];
        let p = v.problems(&inputs, &outputs).join("\n");
        for want in [
            "vision.input: input \"x\" is INT64",
            "vision.input: input \"x\" has dims [-1, 224, 224, 3], not [-1, 3, 224, 224]",
            "the engine input \"z\" is not the pixels",
            "vision.shorter 100",
            "std not 0",
            "vision.output: output \"y\" has dims [-1, 10, 7], not [batch, classes]",
        ] {
            assert!(p.contains(want), "{want:?} missing in:\n{p}");
        }
        v.answer = Answer::Detect;
        let p = v.problems(&inputs, &outputs).join("\n");
        assert!(p.contains("vision.labels: 3 labels for 6 classes"), "{p}");
    }

    /// `embed` reads a vector or a feature map with its channels known, where the layout puts
    /// them; nothing else.
    #[test]
    fn an_embedding_reads_a_vector_or_a_feature_map() {
        let mut v = classifier();
        v.answer = Answer::Embed;
        let inputs = [spec("x", DataType::F32, &[-1, 3, 224, 224])];
        for dims in [
            &[-1, 1280][..],
            &[-1, 1280, 7, 7],
            &[-1, 1280, 1, 1],
            &[-1, 1280, -1, -1],
        ] {
            let outputs = [spec("y", DataType::F32, dims)];
            assert_eq!(
                v.problems(&inputs, &outputs),
                Vec::<String>::new(),
                "{dims:?}"
            );
        }
        for dims in [&[-1, 49, 1280][..], &[-1, -1], &[-1, -1, 7, 7]] {
            let outputs = [spec("y", DataType::F32, dims)];
            let p = v.problems(&inputs, &outputs).join("\n");
            assert!(
                p.contains("not [batch, dims] or [batch, C, H, W] as answer = \"embed\""),
                "{dims:?}: {p}"
            );
        }
        // Channels last under NHWC.
        v.layout = Layout::Nhwc;
        let inputs = [spec("x", DataType::F32, &[-1, 224, 224, 3])];
        let outputs = [spec("y", DataType::F32, &[-1, 7, 7, 1280])];
        assert_eq!(v.problems(&inputs, &outputs), Vec::<String>::new());
    }

    fn recogniser() -> Vision {
        let mut v = classifier();
        (v.height, v.width, v.max_width, v.width_multiple) = (48, 64, 1280, 32);
        (v.resize, v.answer, v.color) = (Resize::Pad, Answer::Text, Color::Bgr);
        v.labels = vec!["a".into(), "b".into()];
        v
    }

    fn with_profile(mut t: TensorSpec, min: i64, max: i64) -> TensorSpec {
        t.profile = Some(crate::runtime::DimProfile {
            min: vec![3, 48, min],
            opt: vec![3, 48, 320],
            max: vec![3, 48, max],
        });
        t
    }

    /// A recogniser's input has a dynamic width: the canvas is the image's own width rounded up
    /// to the multiple, within the input profile's range; its CTC output has a blank, the
    /// characters and perhaps a space.
    #[test]
    fn a_recogniser_pads_to_a_multiple_within_its_profile_and_reads_ctc_classes() {
        let v = recogniser();
        assert_eq!(v.input_dims(), vec![-1, 3, 48, -1]);
        let x = with_profile(spec("x", DataType::F32, &[-1, 3, 48, -1]), 64, 1280);
        for (classes, ok) in [(3, true), (4, true), (2, false), (5, false)] {
            let y = [spec("y", DataType::F32, &[-1, -1, classes])];
            let p = v.problems(std::slice::from_ref(&x), &y);
            assert_eq!(p.is_empty(), ok, "{classes} classes: {p:?}");
        }
        let y = [spec("y", DataType::F32, &[-1, -1, 5])];
        let p = v.problems(std::slice::from_ref(&x), &y).join("\n");
        assert!(
            p.contains(
                "vision.labels: 2 characters for 5 classes: a CTC output's classes are the blank"
            ),
            "{p}"
        );
        assert_eq!(
            [1, 64, 65, 100, 1270, 5000].map(|w| v.canvas_width(w)),
            [64, 64, 96, 128, 1280, 1280]
        );
        // The widths must be the profile's; a dynamic width pads, and has characters.
        let narrow = with_profile(spec("x", DataType::F32, &[-1, 3, 48, -1]), 32, 1280);
        let y = [spec("y", DataType::F32, &[-1, -1, 4])];
        let p = v.problems(&[narrow], &y).join("\n");
        assert!(
            p.contains("vision: widths 64..=1280 are not input \"x\"'s profile (Some((32, 1280)))"),
            "{p}"
        );
        let mut w = v.clone();
        (w.resize, w.labels) = (Resize::Crop, Vec::new());
        let p = w.problems(std::slice::from_ref(&x), &y).join("\n");
        assert!(
            p.contains("a dynamic width needs resize = \"pad\", not \"crop\""),
            "{p}"
        );
        assert!(p.contains("answer = \"text\" needs the characters"), "{p}");
        let text = toml::to_string(&v).unwrap();
        assert_eq!(toml::from_str::<Vision>(&text).unwrap(), v, "{text}");
        // A fixed width takes no multiple.
        let mut f = classifier();
        f.width_multiple = 8;
        let x = [spec("x", DataType::F32, &[-1, 3, 224, 224])];
        let p = f
            .problems(&x, &[spec("y", DataType::F32, &[-1, 10])])
            .join("\n");
        assert!(
            p.contains("width_multiple applies to a dynamic width only"),
            "{p}"
        );
    }

    /// `[vision]` and `[text]` check the output they read with one rule, naming their own key.
    #[test]
    fn the_output_read_must_exist_and_be_fp32_or_fp16() {
        let v = classifier();
        let inputs = [spec("x", DataType::F32, &[-1, 3, 224, 224])];
        let ints = [spec("y", DataType::I64, &[-1, 1000])];
        let p = v.problems(&inputs, &ints).join("\n");
        assert!(
            p.contains("vision.output: output \"y\" is INT64, not FP32 or FP16"),
            "{p}"
        );
        let other = [spec("logits", DataType::F32, &[-1, 1000])];
        let p = v.problems(&inputs, &other).join("\n");
        assert!(
            p.contains(
                "vision.output: the engine has no output \"y\" (its outputs are [\"logits\"])"
            ),
            "{p}"
        );
        let half = [spec("y", DataType::F16, &[-1, 1000])];
        assert_eq!(v.problems(&inputs, &half), Vec::<String>::new());
        let e = crate::runtime::float_output("text.output", "y", &ints).unwrap_err();
        assert_eq!(e, "text.output: output \"y\" is INT64, not FP32 or FP16");
    }
}
