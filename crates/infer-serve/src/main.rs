//! `infer-serve`: the image entrypoint. See the crate docs in `lib.rs`.
fn main() {
    eprintln!("infer-serve: not yet implemented");
    std::process::exit(1);
}
