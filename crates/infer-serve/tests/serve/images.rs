//! Images in, against the binary: the image route (raw and multipart bodies), V2 `BYTES` over
//! HTTP, the answers' shape, timing and metrics, and every bound with hostile images (too many,
//! too large, declaring too many pixels, truncated, of a format the model does not take), the
//! server answering `/v2/health/live` throughout.
//!
//! The model is a synthetic one (the `synthetic` engine computes nothing: each row of its output
//! is the row's first input value), so what is checked is the path in front of and after the
//! engine; the real models' answers are checked against PIL and onnxruntime in
//! `tests/it/vision.rs`.

use super::*;

/// The synthetic image model: 8 x 8 RGB in (stretched, scale 1: the first value is the top-left
/// pixel's red), three scores out, labels, `extra` added to `[vision]`.
fn config(extra: &str) -> String {
    format!(
        r#"[model]
name = "pixels"

[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, 8, 8]

[[outputs]]
name = "y"
datatype = "FP32"
dims = [-1, 3]

[batching]
max_batch_size = 8
max_queue_delay_us = 2000
max_queue_size = 64
default_timeout_ms = 5000

[engine]
kind = "synthetic"
synthetic = {{ base_ms = 1.0, per_row_ms = 0.0 }}

[warmup]
batch_sizes = [1]

[vision]
input = "x"
layout = "nchw"
color = "rgb"
height = 8
width = 8
resize = "stretch"
interpolation = "bilinear"
scale = 1.0
mean = [0.0, 0.0, 0.0]
std = [1.0, 1.0, 1.0]
output = "y"
answer = "classify"
activation = "none"
top_k = 2
labels = ["red", "green", "blue"]
max_client_batch_size = 4
max_image_bytes = 200000
max_pixels = 1000000
{extra}

[server]
host = "127.0.0.1"
port = 0
drain_delay_s = 0
"#
    )
}

/// A `width` x `height` PNG of one colour.
fn png(width: u32, height: u32, rgb: [u8; 3]) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(width, height, image::Rgb(rgb));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn multipart(files: &[&[u8]]) -> (String, Vec<u8>) {
    let mut body = Vec::new();
    for (i, f) in files.iter().enumerate() {
        body.extend_from_slice(
            format!(
                "--b0undary\r\nContent-Disposition: form-data; name=\"data\"; filename=\"{i}.png\"\r\nContent-Type: image/png\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(f);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"--b0undary--\r\n");
    ("multipart/form-data; boundary=b0undary".to_owned(), body)
}

#[test]
fn images_are_answered_on_the_image_route_and_over_v2_with_their_timing() {
    let s = Server::ready(&config(""));
    // Raw body: one image, its labels best first (the engine's scores are the first pixel's
    // red, plus 1 and 2: "blue" first).
    let r = s.post(
        "/predictions/pixels",
        &[("Content-Type", "image/png")],
        &png(32, 16, [200, 0, 0]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        (v[0]["label"].as_str(), v[0]["score"].as_f64()),
        (Some("blue"), Some(202.0)),
        "{v}"
    );
    assert_eq!(v[1]["label"], "green", "{v}");
    let timing = r.header("server-timing").unwrap_or_default().to_owned();
    for stage in [
        "decode;dur=",
        "resize;dur=",
        "queue;dur=",
        "inference;dur=",
        "postprocess;dur=",
    ] {
        assert!(timing.contains(stage), "{stage} not in {timing:?}");
    }
    // Multipart: one answer per file, in order.
    let (ct, body) = multipart(&[&png(8, 8, [10, 0, 0]), &png(100, 50, [30, 0, 0])]);
    let r = s.post("/predictions/pixels", &[("Content-Type", &ct)], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v[0][0]["score"].as_f64(), Some(12.0), "{v}");
    assert_eq!(v[1][0]["score"].as_f64(), Some(32.0), "{v}");
    // The metrics count the images and each stage.
    let m = s.get("/metrics").text();
    assert_eq!(metric(&m, "infer_serve_images_total"), 3.0, "{m}");
    for name in [
        "infer_serve_image_decode_duration_us",
        "infer_serve_image_resize_duration_us",
        "infer_serve_postprocess_duration_us",
    ] {
        assert!(m.contains(name), "{name} not in the metrics");
    }
    // The served signature: an `image` BYTES input.
    let meta = s.get("/v2/models/pixels").json();
    assert_eq!(meta["inputs"][0]["name"], "image", "{meta}");
    assert_eq!(meta["inputs"][0]["datatype"], "BYTES", "{meta}");
    // V2 with the binary extension: the image's bytes as the BYTES element, the raw output.
    let img = png(4, 4, [77, 0, 0]);
    let json = r#"{"inputs":[{"name":"image","shape":[1,1],"datatype":"BYTES","parameters":{"binary_data_size":LEN}}]}"#
        .replace("LEN", &(img.len() + 4).to_string());
    let mut body = json.clone().into_bytes();
    body.extend_from_slice(&(img.len() as u32).to_le_bytes());
    body.extend_from_slice(&img);
    let len = json.len().to_string();
    let r = s.post(
        "/v2/models/pixels/infer",
        &[("Inference-Header-Content-Length", &len)],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["outputs"][0]["name"], "y", "{v}");
    assert_eq!(v["outputs"][0]["data"][0].as_f64(), Some(77.0), "{v}");
}

#[test]
fn hostile_images_are_refused_naming_the_bound_and_the_server_stays_live() {
    let s = Server::ready(&config(""));
    // The server's peak memory after its warm-up: refused before allocation, the hostile
    // images below raise it by little (1.7 MiB measured: buffers, the bodies themselves), far
    // from what decoding a declared 100,000 x 100,000 image would take.
    let peak_before = bounds::memory(s.child.id(), "VmHWM");
    let probe = bounds::Probe::start(&s.addr);
    let post = |body: &[u8]| {
        s.post(
            "/predictions/pixels",
            &[("Content-Type", "image/png")],
            body,
        )
    };
    // A PNG declaring 100,000 x 100,000 pixels in 33 bytes: refused on its header.
    let mut bomb = png(1, 1, [0, 0, 0]);
    bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32fast::hash(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    bounds::assert_refused(
        &post(&bomb),
        400,
        &["declares 100000 x 100000", "vision.max_pixels"],
    );
    // Just over max_pixels (1,000,000): 1001 x 1000.
    bounds::assert_refused(
        &post(&png(1001, 1000, [1, 2, 3])),
        400,
        &["vision.max_pixels"],
    );
    // Over max_image_bytes (200,000): noise does not compress.
    let noisy = image::RgbImage::from_fn(400, 400, |x, y| {
        let v = (x * 7919 + y * 104_729) as u8 ^ (x * y) as u8;
        image::Rgb([v, v.wrapping_mul(31), v.wrapping_add(77)])
    });
    let mut big = std::io::Cursor::new(Vec::new());
    noisy.write_to(&mut big, image::ImageFormat::Png).unwrap();
    let big = big.into_inner();
    assert!(big.len() > 200_000, "{}", big.len());
    bounds::assert_refused(&post(&big), 413, &["vision.max_image_bytes"]);
    // A PNG carrying 150 KB of EXIF (an eXIf chunk before its pixels): refused, naming it.
    let small = png(4, 4, [1, 2, 3]);
    let exif = vec![0x4du8; 150_000];
    let mut chunk = (exif.len() as u32).to_be_bytes().to_vec();
    chunk.extend_from_slice(b"eXIf");
    chunk.extend_from_slice(&exif);
    let crc = crc32fast::hash(&chunk[4..]);
    chunk.extend_from_slice(&crc.to_be_bytes());
    // After the signature and the IHDR chunk (8 + 25 bytes).
    let mut with_exif = small[..33].to_vec();
    with_exif.extend_from_slice(&chunk);
    with_exif.extend_from_slice(&small[33..]);
    bounds::assert_refused(&post(&with_exif), 400, &["EXIF metadata has 150000 bytes"]);
    // Truncated, another format, not an image at all, empty.
    let whole = png(64, 64, [5, 6, 7]);
    bounds::assert_refused(&post(&whole[..whole.len() - 20]), 400, &["image 0"]);
    bounds::assert_refused(
        &post(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"),
        400,
        &["not a format this model takes"],
    );
    bounds::assert_refused(&post(b"hello"), 400, &["not a JPEG, PNG or WebP image"]);
    bounds::assert_refused(&post(b""), 400, &["empty"]);
    // More images than max_client_batch_size (4), on the route and over V2.
    let one = png(2, 2, [1, 1, 1]);
    let files: Vec<&[u8]> = vec![&one; 5];
    let (ct, body) = multipart(&files);
    bounds::assert_refused(
        &s.post("/predictions/pixels", &[("Content-Type", &ct)], &body),
        413,
        &["5 images", "vision.max_client_batch_size"],
    );
    // A text route on a server whose model takes images.
    bounds::assert_refused(
        &s.post("/embed", &[], br#"{"inputs":"hi"}"#),
        404,
        &["takes text"],
    );
    let grown = bounds::memory(s.child.id(), "VmHWM").saturating_sub(peak_before);
    eprintln!("hostile images: peak memory grew {} KiB", grown >> 10);
    assert!(
        grown < 8 << 20,
        "the hostile images raised the server's peak memory by {grown} bytes"
    );
    // Still answering, and fast.
    let r = post(&png(8, 8, [9, 0, 0]));
    assert_eq!(r.status, 200, "{}", r.text());
    let worst = probe.finish();
    assert!(
        worst < Duration::from_millis(500),
        "liveness took {worst:?}"
    );
}
