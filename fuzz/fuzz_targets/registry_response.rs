//! What a registry (or a credentials file) says, through every parser that reads it:
//! `WWW-Authenticate` challenges, `Range` answers, `Location` origins, manifests and indexes
//! with their bounds, Docker/containers credentials files. None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    infer_build::registry::fuzz_registry_response(data);
});
