//! `[vision]` of a recipe: read and checked against the model's declared input, every default
//! the recipe alone decides applied (the rest, once the model's outputs are known, in
//! `assemble::spec`). The keys are `docs/recipe.md`'s.

use std::path::PathBuf;

use toml::de::DeValue;

use super::check::{Checker, Table};
use super::diagnostic::Located;
use super::types::{Model, Tensor, Vision};
use super::validate::{one_of, output_key, relative_path, span_or, FileKind, FileRef};
use infer_spec::text::Activation;
use infer_spec::vision::{self as spec, Answer, Color, Interpolation, Layout, Resize};

pub(super) const VISION_KEYS: [&str; 22] = [
    "input",
    "layout",
    "color",
    "resize",
    "shorter",
    "interpolation",
    "pad",
    "scale",
    "mean",
    "std",
    "answer",
    "output",
    "activation",
    "top_k",
    "labels",
    "confidence",
    "iou",
    "max_detections",
    "normalize",
    "max_image_bytes",
    "max_pixels",
    "width_multiple",
];

/// The keys that bound requests, read with the rest.
const BOUND_KEYS: [&str; 1] = ["max_client_batch_size"];

#[allow(
    clippy::too_many_lines,
    reason = "the `[vision]` keys in file order, like every table of the recipe: a list of checks"
)]
pub(super) fn vision(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    model: &Model,
    files: &mut Vec<FileRef>,
) -> Option<Vision> {
    let allowed: Vec<&str> = VISION_KEYS.iter().chain(&BOUND_KEYS).copied().collect();
    cx.unknown_keys(t, &allowed);
    let at = span_or(Some(t));
    // The pixel input: named, or the model's only input.
    let named = cx.string(t, "input");
    let input = match &named {
        Some(n) => model.inputs.iter().find(|i| i.name == n.value).or_else(|| {
            cx.error_hint(
                n.span,
                &n.key,
                format!("the model has no input {:?}", n.value),
                format!(
                    "the model's inputs are {:?}",
                    model.inputs.iter().map(|i| &i.name).collect::<Vec<_>>()
                ),
            );
            None
        }),
        None => match model.inputs.as_slice() {
            [only] => Some(only),
            _ => {
                cx.error_hint(
                    at,
                    "vision.input",
                    "the model has several inputs: which takes the pixels?",
                    "name it: `input = \"images\"`",
                );
                None
            }
        },
    };
    let where_ = named.as_ref().map_or(at, |n| n.span);
    if let Some(other) = input.and_then(|i| model.inputs.iter().find(|o| o.name != i.name)) {
        cx.error_hint(
            where_,
            "vision.input",
            format!(
                "the model input {:?} is not the pixels: an image model takes one input",
                other.name
            ),
            "serve this model with tensors (no [vision] table), or export it with one input",
        );
    }
    let layout_key = one_of(cx, t, "layout", Layout::parse, "use \"nchw\" or \"nhwc\"");
    // [batch, 3, h, w] or [batch, h, w, 3], fixed sizes, or a dynamic width within the
    // profile (`pad` only); the layout from where the 3 is.
    let mut size = None;
    if let Some(i) = input {
        if !spec::pixel_datatype(i.datatype) {
            cx.error_hint(
                where_,
                "vision.input",
                format!(
                    "input {:?} is {}, not pixels",
                    i.name,
                    i.datatype.recipe_name()
                ),
                "an image input is fp32, fp16 or uint8",
            );
        }
        match pixel_shape(i, layout_key) {
            Some(g) => size = Some(g),
            None => cx.error_hint(
                where_,
                "vision.input",
                format!(
                    "input {:?} has shape {:?}: not [batch, 3, height, width] or [batch, height, width, 3] with fixed sizes, or a dynamic width within its profile{}",
                    i.name,
                    i.shape,
                    layout_key.map_or(String::new(), |l| format!(" ({})", l.as_str()))
                ),
                "export the model with a fixed image size (the batch dimension may stay -1), or a text-line recogniser with a dynamic width and a profile for it",
            ),
        }
    }
    let color =
        one_of(cx, t, "color", Color::parse, "use \"rgb\" or \"bgr\"").unwrap_or(Color::Rgb);
    let resize = match t.inner.get("resize") {
        None => {
            cx.missing(t, "resize", "\"crop\"");
            None
        }
        Some(_) => one_of(
            cx,
            t,
            "resize",
            Resize::parse,
            "use \"crop\" (shorter side, then the centre: classifiers), \"letterbox\" (fit and pad: YOLO), \"stretch\" or \"pad\" (keep the ratio, pad the width: OCR)",
        ),
    };
    let shorter = cx
        .int(
            t,
            "shorter",
            1,
            i64::from(spec::MAX_SIDE),
            "a side in pixels",
        )
        .map(|s| {
            if resize.is_some_and(|r| r != Resize::Crop) {
                cx.error_hint(
                    s.span,
                    &s.key,
                    "shorter applies to resize = \"crop\" only",
                    "remove it",
                );
            }
            s.value as u32
        })
        .unwrap_or(0);
    let interpolation = one_of(
        cx,
        t,
        "interpolation",
        Interpolation::parse,
        "use \"bilinear\" (PIL's and torchvision's default), \"bicubic\" or \"nearest\"",
    )
    .unwrap_or(Interpolation::Bilinear);
    let number = |cx: &mut Checker<'_>, name: &str, ok: &dyn Fn(f64) -> bool, what: &str| {
        let (v, key, span) = cx.get(t, name)?;
        let x = float(v.get_ref());
        match x {
            Some(x) if ok(x) => Some(Located::new(x, span, key)),
            _ => {
                cx.expected(v, &key, what);
                None
            }
        }
    };
    let pixel = |x: f64| (0.0..=255.0).contains(&x);
    let pad = number(cx, "pad", &pixel, "a pixel value from 0 to 255")
        .map(|p| p.value as f32)
        .unwrap_or(if resize == Some(Resize::Letterbox) {
            114.0
        } else {
            0.0
        });
    let finite = |x: f64| x.is_finite();
    let scale = number(
        cx,
        "scale",
        &finite,
        "a number (1/255 = 0.00392156862745098 maps 0-255 to 0-1)",
    )
    .map(|s| s.value as f32)
    .unwrap_or(1.0 / 255.0);
    let triple = |cx: &mut Checker<'_>, name: &str, default: [f32; 3], nonzero: bool| -> [f32; 3] {
        let Some((list, key, span)) =
            cx.array(t, name, "a list of three numbers", "[0.485, 0.456, 0.406]")
        else {
            return default;
        };
        let values: Vec<Option<f64>> = list.iter().map(|v| float(v.get_ref())).collect();
        match values.as_slice() {
            [Some(a), Some(b), Some(c)]
                if [a, b, c]
                    .iter()
                    .all(|x| x.is_finite() && (!nonzero || **x != 0.0)) =>
            {
                [*a as f32, *b as f32, *c as f32]
            }
            _ => {
                let what = if nonzero {
                    "three numbers, none 0 (one per channel, in the model's channel order)"
                } else {
                    "three numbers (one per channel, in the model's channel order)"
                };
                cx.error(span, &key, format!("expected {what}"));
                default
            }
        }
    };
    let mean = triple(cx, "mean", [0.0; 3], false);
    let std = triple(cx, "std", [1.0; 3], true);
    let answer = match t.inner.get("answer") {
        None => {
            cx.missing(t, "answer", "\"classify\"");
            None
        }
        Some(_) => one_of(
            cx,
            t,
            "answer",
            Answer::parse,
            "use \"classify\" (labels), \"detect\" (YOLOv8 boxes), \"embed\" (a vector) or \"text\" (a text line's characters, CTC)",
        ),
    };
    let output = output_key(cx, t, model);
    let activation = one_of(
        cx,
        t,
        "activation",
        Activation::parse,
        "use \"softmax\" (single-label), \"sigmoid\" (multi-label) or \"none\" (the model's scores as they are)",
    )
    // A recogniser's graph ends in its softmax (PaddleOCR's exports do).
    .unwrap_or(if answer == Some(Answer::Text) {
        Activation::None
    } else {
        Activation::Softmax
    });
    let top_k = cx
        .int(t, "top_k", 1, 100_000, "a count of labels")
        .map_or(5, |k| k.value as u32);
    let fraction = |x: f64| (0.0..=1.0).contains(&x);
    let confidence =
        number(cx, "confidence", &fraction, "a score from 0 to 1").map_or(0.25, |c| c.value as f32);
    let iou =
        number(cx, "iou", &fraction, "an overlap from 0 to 1").map_or(0.45, |c| c.value as f32);
    let max_detections = cx
        .int(t, "max_detections", 1, 100_000, "a count of boxes")
        .map_or(300, |k| k.value as u32);
    let normalize = cx.bool(t, "normalize").is_some_and(|b| b.value);
    let max_image_bytes = cx
        .int(
            t,
            "max_image_bytes",
            1,
            spec::MAX_IMAGE_BYTES as i64,
            &format!(
                "1 to {} (bytes of one encoded image)",
                spec::MAX_IMAGE_BYTES
            ),
        )
        .map_or(spec::DEFAULT_MAX_IMAGE_BYTES, |b| b.value as u64);
    let max_pixels = cx
        .int(
            t,
            "max_pixels",
            1,
            spec::MAX_PIXELS as i64,
            &format!("1 to {} (width x height of one image)", spec::MAX_PIXELS),
        )
        .map_or(spec::DEFAULT_MAX_PIXELS, |b| b.value as u64);
    let max_client_batch_size = cx
        .int(
            t,
            "max_client_batch_size",
            1,
            i64::from(spec::MAX_CLIENT_BATCH_SIZE),
            &format!(
                "1 to {} (images in one request)",
                spec::MAX_CLIENT_BATCH_SIZE
            ),
        )
        .map_or(spec::DEFAULT_MAX_CLIENT_BATCH_SIZE, |b| b.value as u32);
    let width_multiple = cx.int(
        t,
        "width_multiple",
        1,
        i64::from(spec::MAX_SIDE),
        "a width in pixels",
    );
    // Labels: a list, or a file beside the recipe read by `load`.
    let mut labels = Vec::new();
    let mut labels_file = None;
    if let Some((v, key, span)) = cx.get(t, "labels") {
        match v.get_ref() {
            DeValue::String(s) => {
                let p = Located::new(s.to_string(), span, key);
                if let Some(p) = relative_path(cx, p, "the labels file") {
                    files.push(FileRef {
                        path: p.clone(),
                        kind: FileKind::Labels,
                    });
                    labels_file = Some(p);
                }
            }
            DeValue::Array(list) => {
                for (i, v) in list.iter().enumerate() {
                    match v.get_ref() {
                        DeValue::String(s) => labels.push(s.to_string()),
                        _ => cx.expected(v, &format!("{key}[{i}]"), "a string (a label)"),
                    }
                }
            }
            _ => cx.expected(
                v,
                &key,
                "a file beside the recipe with one label per line, or a list of labels",
            ),
        }
    }
    let (layout, height, width, max_width) = size?;
    let dynamic = max_width != 0;
    if dynamic && resize.is_some_and(|r| r != Resize::Pad) {
        if let Some((_, key, span)) = cx.get(t, "resize") {
            cx.error_hint(
                span,
                &key,
                format!(
                    "input {:?} has a dynamic width: only resize = \"pad\" fills it",
                    input?.name
                ),
                "use resize = \"pad\" (the height fixed, the width the image's own), or fix the width in the input's shape",
            );
        }
    }
    let width_multiple = match width_multiple {
        Some(m) if !dynamic => {
            cx.error_hint(
                m.span,
                &m.key,
                "width_multiple applies to an input with a dynamic width only",
                "remove it",
            );
            0
        }
        Some(m) => m.value as u32,
        None if dynamic => DEFAULT_WIDTH_MULTIPLE,
        None => 0,
    };
    let answer = answer?;
    let output_name = output.as_ref().map(|o| o.value.as_str());
    if answer == Answer::Text {
        if labels.is_empty() && labels_file.is_none() {
            cx.error_hint(
                at,
                "vision.labels",
                "answer = \"text\" needs the characters of the recogniser's classes",
                "labels = \"characters.txt\": one character per line, the dictionary the model was trained with (PaddleOCR's dict file)",
            );
        }
        let out = answer_output(model, output_name);
        if let (Some(out), Some((_, key, span))) = (out, cx.get(t, "answer")) {
            if spec::ctc_classes(&out.shape).is_none() {
                cx.error_hint(
                    span,
                    &key,
                    format!(
                        "\"text\" answers from CTC probabilities [batch, steps, classes], but output {:?} has shape {:?}",
                        out.name, out.shape
                    ),
                    "name the recogniser's output in [vision] output, its classes fixed",
                );
            }
        }
    }
    if answer == Answer::Embed {
        embed_output(cx, t, model, output_name, layout);
    }
    if let (Some(classes), Some((_, key, span))) =
        (classes(model, output_name, answer), cx.get(t, "labels"))
    {
        if !labels.is_empty() && !spec::labels_fit(answer, classes, labels.len()) {
            cx.error_hint(
                span,
                &key,
                spec::labels_misfit(answer, classes, labels.len()),
                labels_hint(answer),
            );
        }
    }
    Some(Vision {
        section: spec::Vision {
            input: input?.name.clone(),
            layout,
            color,
            height,
            width,
            max_width,
            width_multiple,
            resize: resize?,
            shorter,
            interpolation,
            pad,
            scale,
            mean,
            std,
            output: output.as_ref().map(|o| o.value.clone()).unwrap_or_default(),
            answer,
            activation,
            top_k,
            labels,
            confidence,
            iou,
            max_detections,
            normalize,
            max_image_bytes,
            max_pixels,
            max_client_batch_size,
        },
        output,
        labels_file,
        at: Located::new((), at, "vision"),
    })
}

/// The canvas width multiple of a dynamic width when the recipe names none: PaddleOCR's
/// recognisers see a step per 8 pixels, and widths of 32 share batches often enough.
pub(super) const DEFAULT_WIDTH_MULTIPLE: u32 = 32;

/// How to write labels that fit, for a hint.
pub(super) fn labels_hint(answer: Answer) -> &'static str {
    match answer {
        Answer::Text => "one character per line, in the order of the output's classes after the blank (PaddleOCR's dict file as it is)",
        _ => "give one label per class of the output, in the model's class order",
    }
}

/// The layout, height, width and widest width of a pixel input: `[batch, 3, h, w]` or
/// `[batch, h, w, 3]`, the sizes fixed (widest 0), or the width dynamic with the profile's range
/// (least, widest); `layout` decides a shape that could be either.
fn pixel_shape(i: &Tensor, layout: Option<Layout>) -> Option<(Layout, u32, u32, u32)> {
    let side = |d: i64| {
        (1..=i64::from(spec::MAX_SIDE))
            .contains(&d)
            .then_some(d as u32)
    };
    // A dynamic dimension's range: the profile's min and max at `at` (after the batch).
    let range = |at: usize| -> Option<(u32, u32)> {
        let p = i.profile.as_ref()?;
        let (lo, hi) = (side(*p.min.get(at)?)?, side(*p.max.get(at)?)?);
        Some((lo, hi))
    };
    let dim = |d: i64, at: usize| -> Option<(u32, u32)> {
        match d {
            -1 => range(at),
            d => side(d).map(|s| (s, 0)),
        }
    };
    match (i.shape.as_slice(), layout) {
        ([_, 3, h, w], None | Some(Layout::Nchw)) => {
            let (h, (w, widest)) = (side(*h)?, dim(*w, 2)?);
            Some((Layout::Nchw, h, w, widest))
        }
        ([_, h, w, 3], None | Some(Layout::Nhwc)) => {
            let (h, (w, widest)) = (side(*h)?, dim(*w, 1)?);
            Some((Layout::Nhwc, h, w, widest))
        }
        _ => None,
    }
}

/// `embed` reads a vector or a feature map (`spec::embeds`, the rule the builder applies to the
/// engine's output): an output the recipe declares otherwise is refused at `answer`.
fn embed_output(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    model: &Model,
    output: Option<&str>,
    layout: Layout,
) {
    let Some(out) = answer_output(model, output) else {
        return;
    };
    if spec::embeds(&out.shape, layout) {
        return;
    }
    if let Some((_, key, span)) = cx.get(t, "answer") {
        cx.error_hint(
            span,
            &key,
            format!(
                "\"embed\" answers from {}, but output {:?} has shape {:?}",
                spec::embed_shapes(layout),
                out.name,
                out.shape
            ),
            "name the model's pooled output in [vision] output (a feature map is averaged over its positions)",
        );
    }
}

/// The output the answer reads, as the recipe declares it: `output`, else the first.
fn answer_output<'m>(model: &'m Model, output: Option<&str>) -> Option<&'m Tensor> {
    match output {
        Some(name) => model.outputs.iter().find(|o| o.name == name),
        None => model.outputs.first(),
    }
}

/// The classes of the answer's output as the recipe declares it (its columns, its rows past
/// the four box values, or a CTC output's last dimension), when it does.
pub(super) fn classes(model: &Model, output: Option<&str>, answer: Answer) -> Option<usize> {
    let out = answer_output(model, output)?;
    let d = *out.shape.get(1)?;
    match answer {
        Answer::Classify if d > 0 => Some(d as usize),
        Answer::Detect if d > 4 => Some(d as usize - 4),
        Answer::Text => spec::ctc_classes(&out.shape),
        _ => None,
    }
}

/// A TOML number (integer or float) as f64.
fn float(v: &DeValue<'_>) -> Option<f64> {
    match v {
        DeValue::Integer(i) => i.as_str().parse::<f64>().ok().filter(|_| i.radix() == 10),
        DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
        _ => None,
    }
}

/// The most bytes a labels file may have (ImageNet-21k's 21,843 names are about 400 KB).
pub(super) const MAX_LABELS_BYTES: u64 = 4 << 20;

/// The labels of a labels file: one per line, blank lines at the end dropped, each trimmed of
/// its line ending.
pub(super) fn read_labels(path: &std::path::Path) -> Result<Vec<String>, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > MAX_LABELS_BYTES {
        return Err(format!(
            "{} bytes, more than a labels file may have ({MAX_LABELS_BYTES})",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    let mut labels: Vec<String> = text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_owned())
        .collect();
    while labels.last().is_some_and(|l| l.trim().is_empty()) {
        labels.pop();
    }
    if labels.is_empty() {
        return Err("empty: write one label per line, in the model's class order".into());
    }
    Ok(labels)
}

/// Where a labels path resolves, for messages.
pub(super) fn shown(dir: &std::path::Path, p: &Located<PathBuf>) -> PathBuf {
    dir.join(&p.value)
}
