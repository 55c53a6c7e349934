//! `infer-serve`: the image entrypoint. See the crate docs in `lib.rs`; start-up is
//! [`infer_serve::start`], which this only calls, logging why it failed and exiting with the
//! code it says.
//!
//! Start-up order: parse flags → read `runtime.toml` → bind the HTTP and gRPC ports and serve
//! (live at once, ready later) → load the engine → warm up every instance → start the batcher
//! → ready. SIGTERM/SIGINT: readiness 503 at once, HTTP responses say `Connection: close` and
//! gRPC connections get GOAWAY, keep serving for `drain_delay_s` (a second signal cuts it
//! short), stop accepting, finish in-flight requests within `exit_timeout_s`, exit 0 (1 when
//! the timeout forced the exit). Exit 2: bad flags or config; 1: the engine failed to
//! load or warm up.

use infer_serve::args::{self, Command};
use infer_serve::log;
use serde_json::json;

#[allow(
    clippy::disallowed_macros,
    reason = "the runtime's own command line: --help, --version and usage errors; logs go through `log`"
)]
fn main() {
    let args = match args::parse(std::env::args().skip(1), |k| std::env::var(k).ok()) {
        Ok(Command::Run(a)) => a,
        Ok(Command::Help) => {
            print!("{}", args::USAGE);
            return;
        }
        Ok(Command::Version) => {
            println!("infer-serve {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Err(e) => {
            eprint!("infer-serve: {e}\n{}", args::USAGE);
            std::process::exit(2);
        }
    };
    // A panic (an engine's, contained to its batch by the batcher) is logged as every other
    // line is, one JSON object, instead of the default hook's text on stderr.
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        log::error(
            "panic",
            &[
                ("thread", json!(thread.name().unwrap_or("?"))),
                ("error", json!(info.to_string())),
            ],
        );
    }));
    let running = match infer_serve::start(args) {
        Ok(running) => running,
        Err(e) => {
            log::error(e.msg, &e.fields);
            std::process::exit(e.code);
        }
    };
    if running.wait() {
        log::info("exiting", &[("code", json!(0))]);
        std::process::exit(0);
    }
    log::error(
        "exit timeout reached with requests still in flight",
        &[("code", json!(1))],
    );
    std::process::exit(1);
}
