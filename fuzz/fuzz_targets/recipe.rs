//! Any bytes given to the recipe parser end in a recipe or in diagnostics that point inside
//! the input: never a panic, never a position past the end.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file = Path::new("fuzz.toml");
    if let Err(e) = infer_build::recipe::parse_bytes(data, file) {
        let lines = data.split(|&b| b == b'\n').count() as u32;
        assert!(!e.diagnostics().is_empty());
        for d in e.diagnostics() {
            assert!(d.line >= 1 && d.line <= lines && d.col >= 1, "{d}");
            assert!(!d.message.is_empty());
        }
        // Rendering is part of the contract too.
        let _ = e.to_string();
    }
});
