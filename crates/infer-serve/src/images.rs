//! The image route, `POST /predictions/{model}` (TorchServe's path): an image model's images
//! in the body, its answers (labels, boxes, vectors or text lines, [`crate::vision::Found`]) out as JSON.
//! A transport only: the body is read and split here, everything else is [`crate::core`]'s.
//!
//! The body is the image file itself (any `Content-Type` but multipart: what `curl
//! --data-binary @cat.jpg`, Hugging Face's image clients and TorchServe's examples send), or
//! `multipart/form-data` with one file per image (`curl -F data=@cat.jpg`, a browser form):
//! one image answers its answer (a list of labels or boxes, or a vector), several answer a list
//! with one answer per image, in their order. Where the time went is in `Server-Timing`
//! (decode, resize, queue, inference, postprocess, total; milliseconds).

use crate::core::{self, Output, Timing, Work};
use crate::error::ApiError;
use crate::model::Model;
use bytes::Bytes;
use std::time::Instant;

/// The most parts a multipart body may have (files and fields together).
const MAX_PARTS: usize = 4096;

/// The answer to an image request: its JSON body and where its time went.
pub(crate) struct Reply {
    pub body: Bytes,
    pub timing: Timing,
}

/// The images of a body: the body itself, or a multipart body's file parts (`content_type`
/// says which). `multi`: the request sent a multipart body with more than one image.
pub(crate) fn split(
    content_type: Option<&str>,
    body: Bytes,
) -> Result<(Vec<Bytes>, bool), ApiError> {
    let Some(boundary) = content_type.and_then(multipart_boundary) else {
        return Ok((vec![body], false));
    };
    let parts = multipart(&body, &boundary)?;
    // Parts naming a file are the images; with none, every part is (`-F data=<cat.jpg`).
    let files: Vec<&Part> = parts.iter().filter(|p| p.file).collect();
    let chosen: Vec<Bytes> = if files.is_empty() {
        parts.iter().map(|p| p.body.clone()).collect()
    } else {
        files.iter().map(|p| p.body.clone()).collect()
    };
    if chosen.is_empty() {
        return Err(ApiError::BadRequest(
            "the multipart body holds no part: send the image as a file (-F data=@image.jpg)"
                .into(),
        ));
    }
    let multi = chosen.len() > 1;
    Ok((chosen, multi))
}

/// One part of a multipart body.
struct Part {
    /// Its `Content-Disposition` names a file.
    file: bool,
    body: Bytes,
}

/// `boundary` of a `multipart/form-data` content type.
fn multipart_boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The parts of a multipart body (RFC 7578), sharing its bytes.
fn multipart(body: &Bytes, boundary: &str) -> Result<Vec<Part>, ApiError> {
    let bad = |why: &str| ApiError::BadRequest(format!("a malformed multipart body: {why}"));
    if boundary.is_empty() || boundary.len() > 70 {
        return Err(bad("its boundary must be 1 to 70 characters"));
    }
    let delimiter = format!("--{boundary}");
    let finder = memchr::memmem::Finder::new(delimiter.as_bytes());
    let mut parts = Vec::new();
    let Some(first) = finder.find(body) else {
        return Err(bad("no boundary line"));
    };
    let mut at = first + delimiter.len();
    loop {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        let Some(rest) = rest.strip_prefix(b"\r\n") else {
            return Err(bad("a boundary line not followed by CRLF"));
        };
        let start = body.len() - rest.len();
        // The headers end at a blank line (at once, for a part without headers).
        let (head, content) = if rest.starts_with(b"\r\n") {
            (&rest[..0], start + 2)
        } else {
            let Some(head_end) = memchr::memmem::find(rest, b"\r\n\r\n") else {
                return Err(bad("a part without the blank line after its headers"));
            };
            (&rest[..head_end], start + head_end + 4)
        };
        let Some(len) = finder.find(&body[content..]) else {
            return Err(bad("a part without a closing boundary"));
        };
        // The CRLF before the delimiter belongs to it.
        let end = (content + len)
            .checked_sub(2)
            .filter(|&e| e >= content && &body[e..e + 2] == b"\r\n")
            .ok_or_else(|| bad("a boundary not at the start of a line"))?;
        if parts.len() == MAX_PARTS {
            return Err(ApiError::TooLarge(format!(
                "the multipart body has more than {MAX_PARTS} parts"
            )));
        }
        let head = String::from_utf8_lossy(head);
        let file = head.lines().any(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with("content-disposition:") && l.contains("filename")
        });
        parts.push(Part {
            file,
            body: body.slice(content..end),
        });
        at = content + len + delimiter.len();
    }
}

/// `POST /predictions/{model}`: the images of `body` through the core, their answers as JSON.
pub(crate) async fn predictions(
    app: &crate::server::Server,
    model: &Model,
    content_type: Option<&str>,
    body: Bytes,
    start: Instant,
    charge: crate::budget::Reservation,
) -> Result<Reply, ApiError> {
    if model.vision().is_none() {
        return Err(ApiError::BadRequest(format!(
            "model {:?} does not take images (its recipe has no [vision] table): send tensors to /v2/models/{}/infer",
            model.name(),
            model.name()
        )));
    }
    let (images, multi) = split(content_type, body)?;
    let answer = core::infer(
        app,
        core::Request {
            model,
            work: Work::Images { images },
            timeout_us: None,
            start,
            charge,
        },
    )
    .await?;
    let Output::Found(found) = &answer.output else {
        return Err(ApiError::Internal(
            "the core answered an image request without answers".into(),
        ));
    };
    let json = if multi {
        serde_json::to_vec(&**found)
    } else {
        serde_json::to_vec(&found[0])
    }
    .map_err(|e| ApiError::Internal(format!("encoding the answer: {e}")))?;
    Ok(Reply {
        body: Bytes::from(json),
        timing: answer.timing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_body_is_one_image_and_a_multipart_body_its_files() {
        let (one, multi) = split(Some("image/jpeg"), Bytes::from_static(b"JPEG")).unwrap();
        assert_eq!((one, multi), (vec![Bytes::from_static(b"JPEG")], false));
        let body = Bytes::from_static(
            b"--xyz\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n\
              --xyz\r\nContent-Disposition: form-data; name=\"data\"; filename=\"a.png\"\r\n\
              Content-Type: image/png\r\n\r\nPNG\r\n--x\r\nDATA\r\n\
              --xyz\r\nContent-Disposition: form-data; name=\"data\"; filename=\"b.png\"\r\n\r\nB\r\n\
              --xyz--\r\n",
        );
        let (files, multi) = split(Some("multipart/form-data; boundary=\"xyz\""), body).unwrap();
        assert_eq!(
            files,
            vec![
                Bytes::from_static(b"PNG\r\n--x\r\nDATA"),
                Bytes::from_static(b"B")
            ]
        );
        assert!(multi);
    }

    #[test]
    fn malformed_multipart_bodies_are_a_400_saying_why() {
        for (body, want) in [
            (&b"no boundary here"[..], "no boundary line"),
            (b"--b\r\nContent-Disposition: form-data\r\n", "blank line"),
            (b"--b\r\n\r\nunterminated", "closing boundary"),
            (b"--bX", "not followed by CRLF"),
        ] {
            let e = split(
                Some("multipart/form-data; boundary=b"),
                Bytes::copy_from_slice(body),
            )
            .err()
            .unwrap();
            assert!(e.to_string().contains(want), "{want:?} not in {e}");
        }
    }
}
