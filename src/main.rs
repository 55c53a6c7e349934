//! The `infer-build` command line. All logic lives in the library; this file only hands the
//! process arguments to [`infer_build::run_cli`] and exits with the code it returns.
fn main() {
    std::process::exit(infer_build::run_cli());
}
