//! The one integration-test binary (one link step). Each area has a module under `tests/it/`.
//!
//! Tests that need Docker, a registry or Python are marked in their names (`docker_`,
//! `registry_`, `py_`) and skip with a printed reason only when the tool is truly absent.
//! `.ci/run` installs every tool, so in CI nothing is skipped.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "tests start the binaries and tools they check, and print why they skip"
)]

mod it;
