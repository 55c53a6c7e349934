//! Images in (`[vision]` of `runtime.toml`): an encoded image (JPEG, PNG, WebP) becomes one row
//! of the engine's pixel tensor, and the engine's output for it an answer (labels, boxes, a
//! vector or a text line). The core ([`crate::core`]) admits, charges and queues; this module owns the pixels:
//!
//! 1. [`VisionModel::probe`]: the format and the size the file declares, read from its header,
//!    so a request is refused (400) before anything is decoded when an image holds more than
//!    `max_pixels`, and charged for what decoding it will take.
//! 2. [`VisionModel::prepare`]: decoding (the EXIF orientation applied, as
//!    `ImageOps.exif_transpose`), converting to 8-bit RGB as PIL's `convert("RGB")`, resizing as
//!    `[vision] resize` says ([`resample`]: PIL's filters, the same bytes), then scale, mean
//!    and std, the channel order and layout, into the engine input's datatype.
//! 3. [`VisionModel::answer`]: the engine's output row for one image as labels (top-k of the
//!    scores), boxes (YOLOv8 rows decoded, class-aware non-maximum suppression, mapped back to
//!    the original image's pixels through the resize's [`Frame`]), a vector, or a text line
//!    (CTC probabilities decoded greedily, as PaddleOCR's `CTCLabelDecode`).
//!
//! A text-line recogniser's input has a dynamic width: each image is resized to the height,
//! its width kept in ratio, and padded on the right to the canvas width of the request's widest
//! image ([`Vision::canvas_width`]: a multiple of `width_multiple` within the input profile),
//! so a request's rows share one shape, as PaddleOCR pads a batch to its widest line.

mod jpeg;
pub(crate) mod resample;

use crate::error::ApiError;
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::text::Activation;
use infer_spec::vision::{Answer, Color, Layout, Resize, Vision};
use infer_spec::{DataType, TensorSpec};
use resample::{Rgb, Window};
use serde::Serialize;
use std::io::Cursor;
use std::time::{Duration, Instant};

/// The most bytes of EXIF metadata an image may carry: what a JPEG segment holds (64 KiB); a PNG or
/// WebP of a photograph carries the camera's; more is a file made to cost the server.
pub(crate) const MAX_EXIF_BYTES: usize = 64 << 10;

/// The formats an image may come in.
const FORMATS: &str = "JPEG, PNG or WebP";

/// An image model: its `[vision]` section and what it serves.
#[derive(Debug)]
pub struct VisionModel {
    cfg: Vision,
    /// The engine input's datatype.
    dtype: DataType,
    /// The index of `[vision] output` among the engine's outputs.
    output: usize,
    /// Normalised value of each 0-255 pixel value, per channel of the engine's order.
    lut: [[f32; 256]; 3],
    served_inputs: Vec<TensorSpec>,
    served_outputs: Vec<TensorSpec>,
}

/// What an image's header says, read before it is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub width: u32,
    pub height: u32,
}

impl Header {
    pub fn pixels(self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// Where the engine's pixels lie in the original image (after its EXIF orientation): engine
/// `x = original x * gain_x + left` (and `y` alike). Boxes map back through it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    pub width: u32,
    pub height: u32,
    pub gain_x: f64,
    pub gain_y: f64,
    pub left: f64,
    pub top: f64,
}

/// One image as the engine takes it: one row, and where its time went.
#[derive(Debug)]
pub struct Prepared {
    pub input: Tensor,
    pub frame: Frame,
    pub decode: Duration,
    pub resize: Duration,
}

/// An answer for one image.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Found {
    /// `classify`: the `top_k` best classes, best first.
    Labels(Vec<Scored>),
    /// `detect`: the boxes kept, best first.
    Boxes(Vec<Detection>),
    /// `embed`: the image's vector.
    Vector(Vec<f32>),
    /// `text`: the line's characters.
    Text(Read),
}

/// A text line read (PaddleOCR's `(text, score)`): the characters, and the mean of the best
/// probabilities of the steps they were read from (0 when none was).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Read {
    pub text: String,
    pub score: f32,
}

/// A class and its score (Hugging Face's image-classification answer).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scored {
    pub label: String,
    pub score: f32,
}

/// A detected object (Hugging Face's object-detection answer): its class, score and box in the
/// original image's pixels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    pub label: String,
    pub score: f32,
    #[serde(rename = "box")]
    pub bbox: BoundingBox,
}

/// Corners in pixels, `x` to the right and `y` down from the top-left corner.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BoundingBox {
    pub xmin: f32,
    pub ymin: f32,
    pub xmax: f32,
    pub ymax: f32,
}

impl VisionModel {
    /// The model `cfg` (already checked against the engine's tensors, `RuntimeConfig::problems`)
    /// serves images.
    pub fn new(
        cfg: &Vision,
        inputs: &[TensorSpec],
        outputs: &[TensorSpec],
    ) -> Result<VisionModel, String> {
        let input = inputs
            .iter()
            .find(|t| t.name == cfg.input)
            .ok_or_else(|| format!("vision.input: no engine input {:?}", cfg.input))?;
        let output = outputs
            .iter()
            .position(|t| t.name == cfg.output)
            .ok_or_else(|| format!("vision.output: no engine output {:?}", cfg.output))?;
        let mut lut = [[0f32; 256]; 3];
        for (c, table) in lut.iter_mut().enumerate() {
            // The engine's channel c is the image's channel c (RGB) or 2 - c (BGR); mean and
            // std are given in the engine's order.
            for (v, out) in table.iter_mut().enumerate() {
                *out = (v as f32 * cfg.scale - cfg.mean[c]) / cfg.std[c];
            }
        }
        Ok(VisionModel {
            dtype: input.datatype,
            output,
            lut,
            served_inputs: cfg.served_inputs(),
            served_outputs: outputs.to_vec(),
            cfg: cfg.clone(),
        })
    }

    pub fn config(&self) -> &Vision {
        &self.cfg
    }

    /// The index of the output answers come from, among the engine's outputs.
    pub fn output_index(&self) -> usize {
        self.output
    }

    /// The served inputs (`image`).
    pub fn served_inputs(&self) -> &[TensorSpec] {
        &self.served_inputs
    }

    /// The served outputs: the engine's.
    pub fn served_outputs(&self) -> &[TensorSpec] {
        &self.served_outputs
    }

    /// The bytes one engine row takes at most (the widest canvas under a dynamic width).
    pub fn row_bytes(&self) -> u64 {
        u64::from(self.cfg.height)
            * u64::from(self.cfg.widest())
            * 3
            * self.dtype.size().unwrap_or(4) as u64
    }

    /// Memory decoding and preparing an image of `h` takes at its peak: the decoded image (up to
    /// 8 bytes a pixel, 16-bit RGBA), its 8-bit RGB copy, an oriented copy, the resize's
    /// intermediate and the row.
    pub fn cost(&self, h: Header) -> u64 {
        h.pixels()
            .saturating_mul(14)
            .saturating_add(self.row_bytes() * 2)
    }

    /// The encoded image's format and declared size, from its header: a 400 when it is none of
    /// the formats, malformed, or larger than `max_pixels`.
    pub fn probe(&self, i: usize, bytes: &[u8]) -> Result<Header, ApiError> {
        let (_, header, _) = self.decoder(i, bytes)?;
        Ok(header)
    }

    /// The file's decoder (its header read), declared size and format.
    fn decoder<'b>(
        &self,
        i: usize,
        bytes: &'b [u8],
    ) -> Result<(impl image::ImageDecoder + 'b, Header, image::ImageFormat), ApiError> {
        let bad = |why: String| ApiError::BadRequest(format!("image {i}: {why}"));
        if bytes.is_empty() {
            return Err(bad("empty: send the image file's bytes".into()));
        }
        let limit = self.cfg.max_image_bytes;
        if bytes.len() as u64 > limit {
            return Err(ApiError::TooLarge(format!(
                "image {i} has {} bytes, more than the model takes ({limit}, vision.max_image_bytes)",
                bytes.len()
            )));
        }
        let mut reader = image::ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| bad(format!("unreadable ({e})")))?;
        let format = match reader.format() {
            Some(
                f @ (image::ImageFormat::Jpeg | image::ImageFormat::Png | image::ImageFormat::WebP),
            ) => f,
            Some(f) => {
                return Err(bad(format!(
                    "{} is not a format this model takes: send {FORMATS}",
                    f.extensions_str().first().unwrap_or(&"this")
                )))
            }
            None => return Err(bad(format!("not a {FORMATS} image"))),
        };
        let mut limits = image::Limits::default();
        limits.max_alloc = Some(
            self.cfg
                .max_pixels
                .saturating_mul(8)
                .saturating_add(1 << 20),
        );
        reader.limits(limits);
        let decoder = reader
            .into_decoder()
            .map_err(|e| bad(format!("a malformed {FORMATS} header ({e})")))?;
        let (width, height) = image::ImageDecoder::dimensions(&decoder);
        let header = Header { width, height };
        if width == 0 || height == 0 {
            return Err(bad(format!("declares {width} x {height} pixels")));
        }
        if header.pixels() > self.cfg.max_pixels {
            return Err(bad(format!(
                "declares {width} x {height} = {} pixels, more than the model takes ({}, vision.max_pixels)",
                header.pixels(),
                self.cfg.max_pixels
            )));
        }
        Ok((decoder, header, format))
    }

    /// Image `i` of its request decoded, oriented, resized and normalised into one engine row.
    pub fn prepare(&self, i: usize, bytes: &[u8]) -> Result<Prepared, ApiError> {
        let started = Instant::now();
        let rgb = self.decode(i, bytes)?;
        let decode = started.elapsed();
        let started = Instant::now();
        let (input, frame) = self.tensor(&rgb);
        Ok(Prepared {
            input,
            frame,
            decode,
            resize: started.elapsed(),
        })
    }

    /// A request's images, each prepared into one engine row; `check` runs before each (the
    /// deadline). Under a dynamic width every row takes the canvas width of the widest image,
    /// so the images are all decoded first (the request was charged for holding them:
    /// [`VisionModel::cost`] per image); a fixed width prepares them one at a time.
    pub fn prepare_all(
        &self,
        images: &[Bytes],
        check: impl Fn() -> Result<(), ApiError>,
    ) -> Result<Vec<Prepared>, ApiError> {
        if !self.cfg.dynamic_width() {
            return images
                .iter()
                .enumerate()
                .map(|(i, img)| {
                    check()?;
                    self.prepare(i, img)
                })
                .collect();
        }
        let mut decoded = Vec::with_capacity(images.len());
        for (i, img) in images.iter().enumerate() {
            check()?;
            let started = Instant::now();
            let rgb = self.decode(i, img)?;
            decoded.push((rgb, started.elapsed()));
        }
        let canvas = decoded
            .iter()
            .map(|(rgb, _)| self.canvas_width(rgb.width, rgb.height))
            .max()
            .unwrap_or(self.cfg.width as usize);
        let mut out = Vec::with_capacity(images.len());
        for (rgb, decode) in decoded {
            check()?;
            let started = Instant::now();
            let (input, frame) = self.tensor_at(&rgb, canvas);
            out.push(Prepared {
                input,
                frame,
                decode,
                resize: started.elapsed(),
            });
        }
        Ok(out)
    }

    /// The canvas width an image of `width` x `height` (oriented) needs: `[vision] width`, or
    /// under a dynamic width its own resized width rounded up ([`Vision::canvas_width`]).
    pub fn canvas_width(&self, width: usize, height: usize) -> usize {
        let resized = self.pad_width(width, height, self.cfg.widest() as usize);
        self.cfg.canvas_width(resized as u32) as usize
    }

    /// `pad`'s resized width (PaddleOCR): `ceil(H * w / h)`, 1 to `most`.
    fn pad_width(&self, width: usize, height: usize, most: usize) -> usize {
        let th = self.cfg.height as f64;
        ((th * width as f64 / height as f64).ceil() as usize).clamp(1, most)
    }

    /// The image as 8-bit RGB, its EXIF orientation applied. A JPEG's pixels are libjpeg-turbo's
    /// ([`jpeg`]: PIL's), a PNG's and a WebP's `image`'s (exact formats: the same everywhere).
    pub fn decode(&self, i: usize, bytes: &[u8]) -> Result<Rgb, ApiError> {
        let (mut decoder, header, format) = self.decoder(i, bytes)?;
        let exif = image::ImageDecoder::exif_metadata(&mut decoder)
            .ok()
            .flatten()
            .map_or(0, |e| e.len());
        if exif > MAX_EXIF_BYTES {
            return Err(ApiError::BadRequest(format!(
                "image {i}: its EXIF metadata has {exif} bytes, more than an image may carry ({MAX_EXIF_BYTES}: what a JPEG segment holds)"
            )));
        }
        let orientation = image::ImageDecoder::orientation(&mut decoder)
            .unwrap_or(image::metadata::Orientation::NoTransforms);
        let broken =
            |why: String| ApiError::BadRequest(format!("image {i}: cannot be decoded ({why})"));
        let libjpeg = match format {
            image::ImageFormat::Jpeg => jpeg::decode_rgb(bytes, broken)?,
            _ => None,
        };
        let mut img = match libjpeg {
            Some((width, height, pixels)) => {
                if (width, height) != (header.width, header.height) {
                    return Err(broken(format!(
                        "{width} x {height} pixels decoded, its header declares {} x {}",
                        header.width, header.height
                    )));
                }
                image::RgbImage::from_raw(width, height, pixels)
                    .map(image::DynamicImage::ImageRgb8)
                    .ok_or_else(|| broken("its pixels do not fill its size".into()))?
            }
            // PNG, WebP, and a CMYK JPEG (libjpeg gives no RGB of it).
            None => {
                image::DynamicImage::from_decoder(decoder).map_err(|e| broken(e.to_string()))?
            }
        };
        img.apply_orientation(orientation);
        let rgb = img.into_rgb8();
        Ok(Rgb {
            width: rgb.width() as usize,
            height: rgb.height() as usize,
            data: rgb.into_raw(),
        })
    }

    /// `img` resized as `[vision] resize` says, placed on the engine's canvas, normalised.
    pub fn tensor(&self, img: &Rgb) -> (Tensor, Frame) {
        self.tensor_at(img, self.canvas_width(img.width, img.height))
    }

    /// [`VisionModel::tensor`] on a canvas `w` wide (`[vision] width`, or under a dynamic width
    /// at least the image's [`VisionModel::canvas_width`]).
    fn tensor_at(&self, img: &Rgb, w: usize) -> (Tensor, Frame) {
        let h = self.cfg.height as usize;
        let (window, left, top, gain_x, gain_y) = self.geometry(img.width, img.height, w);
        let resized = resample::resize(img, self.cfg.interpolation, window);
        let frame = Frame {
            width: img.width as u32,
            height: img.height as u32,
            gain_x,
            gain_y,
            left: left as f64 - window.x as f64,
            top: top as f64 - window.y as f64,
        };
        // The canvas: the pad value everywhere, the resized window at (left, top).
        let pad = self.cfg.pad;
        let size = self.dtype.size().unwrap_or(4);
        let mut data = vec![0u8; h * w * 3 * size];
        let order: [usize; 3] = match self.cfg.color {
            Color::Rgb => [0, 1, 2],
            Color::Bgr => [2, 1, 0],
        };
        let value = |c: usize, v: Option<u8>| -> f32 {
            match v {
                Some(v) => self.lut[c][usize::from(v)],
                None => (pad * self.cfg.scale - self.cfg.mean[c]) / self.cfg.std[c],
            }
        };
        let put = |data: &mut [u8], at: usize, c: usize, v: Option<u8>| match self.dtype {
            DataType::U8 => data[at] = v.unwrap_or(pad.round() as u8),
            DataType::F16 => data[at * 2..at * 2 + 2]
                .copy_from_slice(&half::f16::from_f32(value(c, v)).to_le_bytes()),
            _ => data[at * 4..at * 4 + 4].copy_from_slice(&value(c, v).to_le_bytes()),
        };
        for y in 0..h {
            let ry = y.checked_sub(top).filter(|&r| r < resized.height);
            for x in 0..w {
                let rx = x.checked_sub(left).filter(|&r| r < resized.width);
                let px = match (rx, ry) {
                    (Some(rx), Some(ry)) => {
                        let at = (ry * resized.width + rx) * 3;
                        Some(&resized.data[at..at + 3])
                    }
                    _ => None,
                };
                for (c, &src) in order.iter().enumerate() {
                    let v = px.map(|p| p[src]);
                    let at = match self.cfg.layout {
                        Layout::Nchw => (c * h + y) * w + x,
                        Layout::Nhwc => (y * w + x) * 3 + c,
                    };
                    put(&mut data, at, c, v);
                }
            }
        }
        let shape = match self.cfg.layout {
            Layout::Nchw => vec![1, 3, h, w],
            Layout::Nhwc => vec![1, h, w, 3],
        };
        (
            Tensor {
                dtype: self.dtype,
                shape,
                data: Bytes::from(data),
            },
            frame,
        )
    }

    /// For an image of `width` x `height` on a canvas `tw` wide: the window of the resized image
    /// to compute, where it goes on the canvas (left, top), and the scale from the original to
    /// the resized image.
    fn geometry(&self, width: usize, height: usize, tw: usize) -> (Window, usize, usize, f64, f64) {
        let th = self.cfg.height as usize;
        let (wf, hf) = (width as f64, height as f64);
        let gains = |ow: usize, oh: usize| (ow as f64 / wf, oh as f64 / hf);
        match self.cfg.resize {
            Resize::Stretch => {
                let (gx, gy) = gains(tw, th);
                (Window::whole(tw, th), 0, 0, gx, gy)
            }
            Resize::Crop => {
                // torchvision's Resize(shorter): the shorter side to `shorter`, the longer to
                // int(shorter * long / short); then CenterCrop's offsets, rounded half to even
                // as Python's round().
                let s = self.cfg.crop_shorter() as usize;
                let (short, long) = if width <= height { (wf, hf) } else { (hf, wf) };
                let new_long = ((s as f64) * long / short) as usize;
                let (ow, oh) = if width <= height {
                    (s, new_long.max(1))
                } else {
                    (new_long.max(1), s)
                };
                let (gx, gy) = gains(ow, oh);
                let off = |big: usize, small: usize| -> (usize, usize, usize) {
                    // (offset into the resized image, offset on the canvas, extent)
                    if big >= small {
                        let o = ((big - small) as f64 / 2.0).round_ties_even() as usize;
                        (o, 0, small)
                    } else {
                        // Smaller than the crop: torchvision pads around it (fill 0).
                        let pad = ((small - big) as f64 / 2.0) as usize;
                        (0, pad, big)
                    }
                };
                let (x, left, cw) = off(ow, tw);
                let (y, top, ch) = off(oh, th);
                let window = Window {
                    out_width: ow,
                    out_height: oh,
                    x,
                    y,
                    width: cw,
                    height: ch,
                };
                (window, left, top, gx, gy)
            }
            Resize::Letterbox => {
                // Ultralytics' LetterBox: r = min(H/h, W/w), the unpadded size rounded, the
                // padding split with round(d - 0.1) before and round(d + 0.1) after.
                let r = (th as f64 / hf).min(tw as f64 / wf);
                let nw = ((wf * r).round_ties_even() as usize).clamp(1, tw);
                let nh = ((hf * r).round_ties_even() as usize).clamp(1, th);
                let dw = (tw - nw) as f64 / 2.0;
                let dh = (th - nh) as f64 / 2.0;
                let left = (dw - 0.1).round_ties_even().max(0.0) as usize;
                let top = (dh - 0.1).round_ties_even().max(0.0) as usize;
                (Window::whole(nw, nh), left, top, r, r)
            }
            Resize::Pad => {
                // PaddleOCR: the height to H, the width ceil(H * w / h) at most W, placed left.
                let rw = self.pad_width(width, height, tw);
                let (gx, gy) = gains(rw, th);
                (Window::whole(rw, th), 0, 0, gx, gy)
            }
        }
    }

    /// The answer for one image from `output` (the engine's `[vision] output`, one row).
    pub fn answer(&self, output: &Tensor, frame: &Frame) -> Result<Found, ApiError> {
        let values = output.floats(0..output.elements())?;
        match self.cfg.answer {
            Answer::Classify => Ok(Found::Labels(self.classify(values))),
            Answer::Detect => {
                let rows = output.shape.get(1).copied().unwrap_or(0);
                Ok(Found::Boxes(self.detect(&values, rows, frame)))
            }
            Answer::Embed => {
                let mut v = pool(values, &output.shape, self.cfg.layout);
                if self.cfg.normalize {
                    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                    v.iter_mut().for_each(|x| *x /= norm);
                }
                Ok(Found::Vector(v))
            }
            Answer::Text => {
                let classes = output.shape.last().copied().unwrap_or(0);
                Ok(Found::Text(self.read(values, classes)))
            }
        }
    }

    /// CTC probabilities (`values` of `[steps, classes]`) to a text line, as PaddleOCR's
    /// `CTCLabelDecode`: each step's best class (the first of equal ones), a class repeating the
    /// step before it merged, the blank (class 0) dropped, class `c` the label `c - 1` (past
    /// the labels: a space, PaddleOCR's `use_space_char`); the score the mean of the kept
    /// steps' best values, after the activation.
    pub fn read(&self, mut values: Vec<f32>, classes: usize) -> Read {
        if classes == 0 || values.len() % classes != 0 {
            return Read {
                text: String::new(),
                score: 0.0,
            };
        }
        let mut text = String::new();
        let (mut sum, mut kept) = (0f64, 0usize);
        let mut before = None;
        for step in values.chunks_exact_mut(classes) {
            activate(self.cfg.activation, step);
            let (mut best, mut class) = (step[0], 0);
            for (c, &p) in step.iter().enumerate().skip(1) {
                if p > best {
                    (best, class) = (p, c);
                }
            }
            if class != 0 && before != Some(class) {
                match self.cfg.labels.get(class - 1) {
                    Some(l) => text.push_str(l),
                    None => text.push(' '),
                }
                sum += f64::from(best);
                kept += 1;
            }
            before = Some(class);
        }
        let score = if kept == 0 {
            0.0
        } else {
            (sum / kept as f64) as f32
        };
        Read { text, score }
    }

    fn label(&self, class: usize) -> String {
        self.cfg
            .labels
            .get(class)
            .cloned()
            .unwrap_or_else(|| class.to_string())
    }

    /// The `top_k` best classes of one row of scores, after the activation.
    pub fn classify(&self, mut scores: Vec<f32>) -> Vec<Scored> {
        activate(self.cfg.activation, &mut scores);
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order
            .into_iter()
            .take(self.cfg.top_k as usize)
            .map(|c| Scored {
                label: self.label(c),
                score: scores[c],
            })
            .collect()
    }

    /// YOLOv8 rows (`values` of `[4 + classes, boxes]`) to boxes: each box's best class above
    /// `confidence`, class-aware non-maximum suppression at `iou` (as Ultralytics'
    /// `non_max_suppression`, torchvision's `nms` per class), the best `max_detections`, mapped
    /// back to the original image and clipped to it.
    pub fn detect(&self, values: &[f32], rows: usize, frame: &Frame) -> Vec<Detection> {
        if rows <= 4 || values.len() % rows != 0 {
            return Vec::new();
        }
        let n = values.len() / rows;
        let at = |r: usize, j: usize| values[r * n + j];
        let mut found: Vec<(f32, usize, [f32; 4])> = Vec::new();
        for j in 0..n {
            let (mut best, mut class) = (f32::NEG_INFINITY, 0);
            for c in 0..rows - 4 {
                let s = at(4 + c, j);
                if s > best {
                    (best, class) = (s, c);
                }
            }
            if best > self.cfg.confidence {
                let (cx, cy, w, h) = (at(0, j), at(1, j), at(2, j), at(3, j));
                found.push((
                    best,
                    class,
                    [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0],
                ));
            }
        }
        // Best first (a stable sort: equal scores keep the engine's order, as torch's sort
        // does on CPU for these sizes).
        found.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut kept: Vec<(f32, usize, [f32; 4])> = Vec::new();
        for cand in found {
            if kept.len() >= self.cfg.max_detections as usize {
                break;
            }
            let suppressed = kept
                .iter()
                .any(|k| k.1 == cand.1 && iou(&k.2, &cand.2) > self.cfg.iou);
            if !suppressed {
                kept.push(cand);
            }
        }
        let (w, h) = (frame.width as f64, frame.height as f64);
        kept.into_iter()
            .map(|(score, class, b)| {
                let x = |v: f32| ((f64::from(v) - frame.left) / frame.gain_x).clamp(0.0, w) as f32;
                let y = |v: f32| ((f64::from(v) - frame.top) / frame.gain_y).clamp(0.0, h) as f32;
                Detection {
                    label: self.label(class),
                    score,
                    bbox: BoundingBox {
                        xmin: x(b[0]),
                        ymin: y(b[1]),
                        xmax: x(b[2]),
                        ymax: y(b[3]),
                    },
                }
            })
            .collect()
    }
}

/// Intersection over union of two `[x1, y1, x2, y2]` boxes.
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    let area = |r: &[f32; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union <= 0.0 {
        0.0
    } else {
        inter / union
    }
}

/// Scores from logits.
fn activate(a: Activation, v: &mut [f32]) {
    match a {
        Activation::None => {}
        Activation::Sigmoid => v.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
        Activation::Softmax => {
            let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for x in v.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            if sum > 0.0 {
                v.iter_mut().for_each(|x| *x /= sum);
            }
        }
    }
}

/// An `embed` answer's vector from one image's output row (`shape` with the batch of one first):
/// a vector (`[1, dims]`) as it is; a feature map (`[1, C, H, W]`, or `[1, H, W, C]` when the
/// input's layout is NHWC) averaged over its H x W positions (global average pooling), summed
/// in f64.
fn pool(values: Vec<f32>, shape: &[usize], layout: Layout) -> Vec<f32> {
    let [_, a, b, c] = *shape else {
        return values;
    };
    let (channels, positions) = match layout {
        Layout::Nchw => (a, b * c),
        Layout::Nhwc => (c, a * b),
    };
    if positions <= 1 || values.len() != channels * positions {
        return values;
    }
    let n = positions as f64;
    (0..channels)
        .map(|k| {
            let sum: f64 = match layout {
                Layout::Nchw => values[k * positions..(k + 1) * positions]
                    .iter()
                    .map(|&x| f64::from(x))
                    .sum(),
                Layout::Nhwc => (0..positions)
                    .map(|p| f64::from(values[p * channels + k]))
                    .sum(),
            };
            (sum / n) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_spec::vision::Interpolation;

    fn model(extra: &str) -> VisionModel {
        let color = if extra.contains("color") {
            ""
        } else {
            "color = \"rgb\"\n"
        };
        let cfg: Vision = toml::from_str(&format!(
            "input = \"x\"\nlayout = \"nchw\"\n{color}height = 4\nwidth = 6\n\
             interpolation = \"bilinear\"\nscale = 1.0\nmean = [0.0, 0.0, 0.0]\n\
             std = [1.0, 1.0, 1.0]\noutput = \"y\"\n{extra}"
        ))
        .unwrap();
        let input = TensorSpec {
            name: "x".into(),
            datatype: DataType::F32,
            dims: cfg.input_dims(),
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        };
        let output = TensorSpec {
            name: "y".into(),
            datatype: DataType::F32,
            dims: vec![-1, 3],
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        };
        VisionModel::new(&cfg, &[input], &[output]).unwrap()
    }

    fn flat(width: usize, height: usize, v: u8) -> Rgb {
        Rgb {
            width,
            height,
            data: vec![v; width * height * 3],
        }
    }

    fn pixels(t: &Tensor) -> Vec<f32> {
        t.floats(0..t.elements()).unwrap()
    }

    #[test]
    fn letterbox_centres_the_image_and_pads_the_rest() {
        let m = model("resize = \"letterbox\"\npad = 114.0\nanswer = \"detect\"\n");
        // 12 x 4 into 6 x 4: r = 0.5, 6 x 2, one row of padding above and below.
        let (t, frame) = m.tensor(&flat(12, 4, 10));
        assert_eq!(t.shape, vec![1, 3, 4, 6]);
        let p = pixels(&t);
        let row = |c: usize, y: usize| p[(c * 4 + y) * 6..(c * 4 + y) * 6 + 6].to_vec();
        assert_eq!(row(0, 0), vec![114.0; 6]);
        assert_eq!(row(1, 1), vec![10.0; 6]);
        assert_eq!(row(2, 2), vec![10.0; 6]);
        assert_eq!(row(2, 3), vec![114.0; 6]);
        assert_eq!((frame.gain_x, frame.left, frame.top), (0.5, 0.0, 1.0));
    }

    #[test]
    fn crop_takes_the_centre_of_the_image_resized_by_its_shorter_side() {
        // 4 x 6 target, shorter 4: a 20 x 8 image becomes 10 x 4, its columns 2..8 kept.
        let m = model("resize = \"crop\"\nshorter = 4\nanswer = \"classify\"\n");
        let mut img = flat(20, 8, 0);
        for y in 0..8 {
            for x in 0..20 {
                img.data[(y * 20 + x) * 3] = (x * 10) as u8;
            }
        }
        let (t, frame) = m.tensor(&img);
        let p = pixels(&t);
        let whole = resample::resize(&img, Interpolation::Bilinear, Window::whole(10, 4));
        let want: Vec<f32> = (2..8).map(|x| f32::from(whole.data[x * 3])).collect();
        assert_eq!(p[..6].to_vec(), want);
        assert_eq!((frame.gain_x, frame.left), (0.5, -2.0));
    }

    #[test]
    fn pad_keeps_the_ratio_places_the_image_left_and_bgr_swaps_channels() {
        let m = model("resize = \"pad\"\npad = 7.0\ncolor = \"bgr\"\nanswer = \"classify\"\n");
        let mut img = flat(3, 4, 0);
        for px in img.data.chunks_exact_mut(3) {
            px.copy_from_slice(&[1, 2, 3]);
        }
        let (t, _) = m.tensor(&img);
        let p = pixels(&t);
        // Height 4 kept, width 3 of 6: columns 0..3 the image, 3..6 the pad; B first.
        assert_eq!(p[..6].to_vec(), vec![3.0, 3.0, 3.0, 7.0, 7.0, 7.0]);
        assert_eq!(p[24..27].to_vec(), vec![2.0; 3]);
        assert_eq!(p[48..51].to_vec(), vec![1.0; 3]);
    }

    #[test]
    fn embed_pools_a_feature_map_over_its_positions_and_keeps_a_vector() {
        // Two channels over 2 x 2 positions: NCHW holds each channel's four values together.
        let nchw = vec![1.0, 2.0, 3.0, 6.0, 10.0, 10.0, 10.0, 30.0];
        assert_eq!(pool(nchw, &[1, 2, 2, 2], Layout::Nchw), vec![3.0, 15.0]);
        // NHWC interleaves them: position by position, channel by channel.
        let nhwc = vec![1.0, 10.0, 2.0, 10.0, 3.0, 10.0, 6.0, 30.0];
        assert_eq!(pool(nhwc, &[1, 2, 2, 2], Layout::Nhwc), vec![3.0, 15.0]);
        // A vector, and a map of one position, are the vector.
        assert_eq!(pool(vec![1.0, 2.0], &[1, 2], Layout::Nchw), vec![1.0, 2.0]);
        assert_eq!(
            pool(vec![1.0, 2.0], &[1, 2, 1, 1], Layout::Nchw),
            vec![1.0, 2.0]
        );
    }

    #[test]
    fn classify_answers_the_top_k_labels_best_first() {
        let mut m = model(
            "resize = \"stretch\"\nanswer = \"classify\"\nactivation = \"softmax\"\ntop_k = 2\n",
        );
        m.cfg.labels = vec!["cat".into(), "dog".into(), "fox".into()];
        let got = m.classify(vec![1.0, 3.0, 2.0]);
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].label.as_str(), got[1].label.as_str()),
            ("dog", "fox")
        );
        let e = [1f32.exp(), 3f32.exp(), 2f32.exp()];
        let sum: f32 = e.iter().sum();
        assert!((got[0].score - e[1] / sum).abs() < 1e-6);
    }

    #[test]
    fn detect_keeps_the_best_of_overlapping_boxes_per_class_and_maps_them_back() {
        let m = model("resize = \"letterbox\"\nanswer = \"detect\"\niou = 0.5\n");
        // Four boxes (columns), two classes: 0 and 1 overlap in class 0 (1 suppressed), 2
        // overlaps 0 but is class 1 (kept), 3 is under the confidence.
        let cx = [10.0, 11.0, 10.0, 50.0];
        let cy = [10.0, 10.0, 10.0, 50.0];
        let w = [8.0, 8.0, 8.0, 8.0];
        let h = [8.0, 8.0, 8.0, 8.0];
        let c0 = [0.9, 0.8, 0.1, 0.1];
        let c1 = [0.1, 0.1, 0.7, 0.2];
        let values: Vec<f32> = [cx, cy, w, h, c0, c1].concat();
        let frame = Frame {
            width: 100,
            height: 100,
            gain_x: 0.5,
            gain_y: 0.5,
            left: 0.0,
            top: 2.0,
        };
        let got = m.detect(&values, 6, &frame);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].label.as_str(), got[0].score), ("0", 0.9));
        assert_eq!(got[1].label, "1");
        assert_eq!(
            got[0].bbox,
            BoundingBox {
                xmin: 12.0,
                ymin: 8.0,
                xmax: 28.0,
                ymax: 24.0
            }
        );
    }

    #[test]
    fn text_decodes_ctc_steps_as_paddleocr_does() {
        let mut m = model("resize = \"pad\"\nanswer = \"text\"\nactivation = \"none\"\n");
        m.cfg.labels = vec!["a".into(), "b".into()];
        // Classes: the blank, "a", "b", then a space. Steps' best: a a _ a b ' ' ' ' _.
        let best = [1, 1, 0, 1, 2, 3, 3, 0];
        let probs = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.9, 0.3];
        let mut values = Vec::new();
        for (&c, &p) in best.iter().zip(&probs) {
            let mut step = vec![(1.0 - p) / 3.0; 4];
            step[c] = p;
            values.extend(step);
        }
        let got = m.read(values.clone(), 4);
        assert_eq!(got.text, "aab ");
        // The kept steps: 0 (a), 3 (a), 4 (b), 5 (space).
        let want = (0.9 + 0.6 + 0.5 + 0.4) / 4.0;
        assert!((got.score - want).abs() < 1e-6, "{}", got.score);
        // Nothing but blanks reads nothing, with PaddleOCR's score 0.
        let blank = m.read(vec![0.9, 0.05, 0.03, 0.02], 4);
        assert_eq!((blank.text.as_str(), blank.score), ("", 0.0));
        let out = Tensor {
            dtype: DataType::F32,
            shape: vec![1, 8, 4],
            data: Bytes::from(
                values
                    .iter()
                    .flat_map(|v: &f32| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        };
        let frame = Frame {
            width: 1,
            height: 1,
            gain_x: 1.0,
            gain_y: 1.0,
            left: 0.0,
            top: 0.0,
        };
        let json = serde_json::to_string(&m.answer(&out, &frame).unwrap()).unwrap();
        assert!(
            json.starts_with("{\"text\":\"aab \",\"score\":0.6"),
            "{json}"
        );
    }

    fn png(width: u32, height: u32) -> Bytes {
        let mut out = std::io::Cursor::new(Vec::new());
        image::RgbImage::from_pixel(width, height, image::Rgb([9, 9, 9]))
            .write_to(&mut out, image::ImageFormat::Png)
            .unwrap();
        Bytes::from(out.into_inner())
    }

    /// A dynamic width: each image resized to the height, its width in ratio, and a request's
    /// images padded to the canvas of its widest (a multiple, within the profile's range).
    #[test]
    fn a_dynamic_width_pads_a_requests_images_to_its_widest() {
        let mut m =
            model("resize = \"pad\"\nmax_width = 40\nwidth_multiple = 4\nanswer = \"classify\"\n");
        assert_eq!(m.cfg.input_dims(), vec![-1, 3, 4, -1]);
        // 3 x 4 stays 3 wide, rounded up to 4, the canvas its least, 6 (where the profile
        // starts); 18 x 4 is 18, rounded up to 20; 16 x 2 becomes 32 x 4.
        assert_eq!(m.canvas_width(3, 4), 6);
        assert_eq!(m.canvas_width(18, 4), 20);
        assert_eq!(m.canvas_width(16, 2), 32);
        assert_eq!(m.canvas_width(400, 4), 40, "at most max_width");
        let shapes = |imgs: &[Bytes], m: &VisionModel| -> Vec<Vec<usize>> {
            m.prepare_all(imgs, || Ok(()))
                .unwrap()
                .into_iter()
                .map(|p| p.input.shape)
                .collect()
        };
        assert_eq!(shapes(&[png(3, 4)], &m), vec![vec![1, 3, 4, 6]]);
        assert_eq!(
            shapes(&[png(3, 4), png(18, 4)], &m),
            vec![vec![1, 3, 4, 20]; 2]
        );
        // The narrow image's columns past its own width are the pad value.
        let p = m.prepare_all(&[png(3, 4), png(18, 4)], || Ok(())).unwrap();
        let row = pixels(&p[0].input)[..20].to_vec();
        assert_eq!(row[..3].to_vec(), vec![9.0; 3]);
        assert_eq!(row[3..].to_vec(), vec![0.0; 17]);
        // The deadline is checked before each image.
        let e = m
            .prepare_all(&[png(3, 4)], || Err(ApiError::NotReady))
            .unwrap_err();
        assert!(matches!(e, ApiError::NotReady), "{e:?}");
        // A fixed width pads every image to it.
        m.cfg.max_width = 0;
        m.cfg.width_multiple = 0;
        assert_eq!(
            shapes(&[png(3, 4), png(18, 4)], &m),
            vec![vec![1, 3, 4, 6]; 2]
        );
    }

    #[test]
    fn hostile_files_are_refused_with_a_reason_before_decoding() {
        let m = model("resize = \"stretch\"\nanswer = \"classify\"\nmax_pixels = 1000000\n");
        let cases: [(&[u8], &str); 3] = [
            (b"", "empty"),
            (
                b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
                "not a format this model takes",
            ),
            (b"hello, world", "not a JPEG, PNG or WebP image"),
        ];
        for (bytes, want) in cases {
            let e = m.probe(0, bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
        // A 1 x 1 PNG whose header declares 100,000 x 100,000 pixels: refused on its header.
        let mut png = std::io::Cursor::new(Vec::new());
        image::RgbImage::new(1, 1)
            .write_to(&mut png, image::ImageFormat::Png)
            .unwrap();
        let mut png = png.into_inner();
        png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32fast::hash(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        let e = m.probe(0, &png).unwrap_err();
        assert!(matches!(e, ApiError::BadRequest(_)), "{e:?}");
        assert!(e.to_string().contains("vision.max_pixels"), "{e}");
    }
}
