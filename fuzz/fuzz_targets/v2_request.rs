//! Any body and any `Inference-Header-Content-Length` given to infer-serve's V2 request
//! decoder end in a request or a 400 (`ApiError::BadRequest`) with a message: never a panic,
//! never another error class. A decoded request is encoded back as a response, which must not
//! panic either.
//!
//! The first input byte picks the header length: 0 → none (the whole body is JSON),
//! 1 → `0` (raw binary body), otherwise the next two bytes (little endian) taken modulo the
//! body length + 2, so lengths past the end are exercised too.

#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use infer_serve::error::ApiError;
use infer_serve::v2::decode_request;
use infer_spec::RuntimeConfig;
use libfuzzer_sys::fuzz_target;

fn cfg() -> &'static RuntimeConfig {
    static CFG_ONCE: OnceLock<RuntimeConfig> = OnceLock::new();
    CFG_ONCE.get_or_init(|| infer_serve::fixtures::decoder_model("INT64", true))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (header, body) = match mode {
        0 => (None, rest),
        1 => (Some(0), rest),
        _ if rest.len() >= 2 => {
            let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
            let body = &rest[2..];
            (Some(n % (body.len() + 2)), body)
        }
        _ => return,
    };
    match decode_request(cfg(), header, &Bytes::copy_from_slice(body)) {
        Ok(_) => {}
        Err(ApiError::BadRequest(m)) => assert!(!m.is_empty()),
        Err(e) => panic!("the decoder answered {e:?}, not a 400"),
    }
});
