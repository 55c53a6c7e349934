//! Any bytes given to infer-serve's gRPC request decoder, as a whole request body (the
//! 5-byte message prefix included) or as the bare `ModelInferRequest` message, end in a request
//! or a refusal (`INVALID_ARGUMENT`, `NOT_FOUND`, or `UNIMPLEMENTED` for a compressed message)
//! with a message: never a panic, never another error class. A decoded request is encoded back
//! as a response, which must not panic either.
//!
//! The first input byte picks the mode: even → the rest is a request body (prefix + message),
//! odd → the rest is the message alone.

#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use infer_serve::error::ApiError;
use infer_serve::grpc::codec::{decode_infer, encode_infer, frame, unframe};
use infer_spec::RuntimeConfig;
use libfuzzer_sys::fuzz_target;

fn cfg() -> &'static RuntimeConfig {
    static CFG_ONCE: OnceLock<RuntimeConfig> = OnceLock::new();
    CFG_ONCE.get_or_init(|| infer_serve::fixtures::decoder_model("INT8", true))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let rest = Bytes::copy_from_slice(rest);
    let msg = if mode % 2 == 0 {
        match unframe(&rest) {
            Ok(m) => m,
            Err(ApiError::BadRequest(m)) | Err(ApiError::Unimplemented(m)) => {
                assert!(!m.is_empty());
                return;
            }
            Err(e) => panic!("unframing answered {e:?}"),
        }
    } else {
        rest
    };
    match decode_infer(cfg(), msg) {
        Ok(req) => {
            let outputs: Vec<_> = req
                .outputs
                .iter()
                .filter_map(|r| req.inputs.first().map(|t| (*r, t)))
                .collect();
            let _ = frame(&encode_infer(cfg(), req.id.as_deref(), &outputs));
        }
        Err(ApiError::BadRequest(m)) | Err(ApiError::NotFound(m)) => assert!(!m.is_empty()),
        Err(e) => panic!("the decoder answered {e:?}, not INVALID_ARGUMENT or NOT_FOUND"),
    }
});
