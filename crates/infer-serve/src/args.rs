//! Flags and environment, parsed by hand: `--config PATH` (or `INFER_CONFIG`, default
//! `/etc/infer/runtime.toml`), `--host ADDR` / `INFER_HOST`, `--port N` / `INFER_PORT`,
//! `--grpc-port N` / `INFER_GRPC_PORT` (0 = no gRPC; see [`grpc_port`] for the default),
//! `--busy-poll-us N` / `INFER_BUSY_POLL_US`, `--threads N` / `INFER_THREADS`.
//! Flags win over the environment, which wins over `runtime.toml`.

use std::path::PathBuf;

/// What the command line and environment ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(Args),
    Help,
    Version,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub config: PathBuf,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// The gRPC port given (`Some(0)`: gRPC off); `None`: the default ([`grpc_port`]).
    pub grpc_port: Option<u16>,
    /// How long a lone request's handler polls for its answer, in µs (`None`: the default).
    pub busy_poll_us: Option<u64>,
    /// The intra-op threads of every instance of every model whose engine has threads of its
    /// own (ONNX Runtime), over `runtime.toml` (`None`: decided at start,
    /// [`infer_spec::RuntimeConfig::threads`]).
    pub threads: Option<u32>,
}

/// The busy-poll window when none is given: long enough for a small model's batch, and off
/// where only one CPU is available (the poll would compete with the backend thread).
pub fn default_busy_poll_us(cpus: usize) -> u64 {
    if cpus >= 2 {
        100
    } else {
        0
    }
}

pub use infer_spec::runtime::DEFAULT_GRPC_PORT;

/// The port to bind gRPC on, `None` for no gRPC: the one given (0 = off), else
/// [`DEFAULT_GRPC_PORT`], except that an HTTP port of 0 (any free one: tests, benchmarks,
/// several servers on one host) makes the default any free port too.
pub fn grpc_port(given: Option<u16>, http_port: u16) -> Option<u16> {
    match given {
        Some(0) => None,
        Some(p) => Some(p),
        None if http_port == 0 => Some(0),
        None => Some(DEFAULT_GRPC_PORT),
    }
}

pub const USAGE: &str =
    "usage: infer-serve [--config PATH] [--host ADDR] [--port N] [--grpc-port N] [--busy-poll-us N]
                   [--threads N]

Serves the model described by runtime.toml over the KServe V2 protocol, HTTP and gRPC.

  --config PATH   runtime configuration (env INFER_CONFIG; default /etc/infer/runtime.toml)
  --host ADDR     address to bind (env INFER_HOST; default from runtime.toml, 0.0.0.0)
  --port N        port to bind, 0 for any free one (env INFER_PORT; default from runtime.toml, 8000)
  --grpc-port N   gRPC port, 0 = no gRPC (env INFER_GRPC_PORT; default 8001, or any free
                  one when the HTTP port is 0)
  --busy-poll-us N  when a request is alone on the server, poll for its answer up to N µs
                  before parking (env INFER_BUSY_POLL_US; default 100 with 2+ CPUs, 0 = off)
  --threads N     intra-op threads of each instance, for engines with threads of their own
                  (ONNX Runtime; env INFER_THREADS; default: engine.threads, else the CPUs
                  this container may use, its CPU quota included, over the instances)
  --help, --version
";

/// Parses `args` (without the program name) and the environment through `env`.
pub fn parse(
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, String> {
    let port = |s: &str, from: &str| {
        s.parse::<u16>()
            .map_err(|_| format!("{from}: {s:?} is not a port number"))
    };
    let micros = |s: &str, from: &str| {
        s.parse::<u64>()
            .ok()
            .filter(|&us| us <= 1_000_000)
            .ok_or_else(|| format!("{from}: {s:?} is not a number of microseconds up to 1000000"))
    };
    let threads = |s: &str, from: &str| {
        s.parse::<u32>()
            .ok()
            .filter(|t| (1..=infer_spec::runtime::MAX_THREADS).contains(t))
            .ok_or_else(|| {
                format!(
                    "{from}: {s:?} is not a thread count from 1 to {}",
                    infer_spec::runtime::MAX_THREADS
                )
            })
    };
    let mut out = Args {
        config: PathBuf::from(
            env("INFER_CONFIG").unwrap_or_else(|| infer_spec::DEFAULT_CONFIG_PATH.to_owned()),
        ),
        host: env("INFER_HOST").filter(|h| !h.is_empty()),
        port: env("INFER_PORT")
            .filter(|p| !p.is_empty())
            .map(|p| port(&p, "INFER_PORT"))
            .transpose()?,
        grpc_port: env("INFER_GRPC_PORT")
            .filter(|p| !p.is_empty())
            .map(|p| port(&p, "INFER_GRPC_PORT"))
            .transpose()?,
        busy_poll_us: env("INFER_BUSY_POLL_US")
            .filter(|v| !v.is_empty())
            .map(|v| micros(&v, "INFER_BUSY_POLL_US"))
            .transpose()?,
        threads: env("INFER_THREADS")
            .filter(|v| !v.is_empty())
            .map(|v| threads(&v, "INFER_THREADS"))
            .transpose()?,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--config" => out.config = PathBuf::from(value()?),
            "--host" => out.host = Some(value()?),
            "--port" => out.port = Some(port(&value()?, "--port")?),
            "--grpc-port" => out.grpc_port = Some(port(&value()?, "--grpc-port")?),
            "--busy-poll-us" => out.busy_poll_us = Some(micros(&value()?, "--busy-poll-us")?),
            "--threads" => out.threads = Some(threads(&value()?, "--threads")?),
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Ok(Command::Run(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str], env: &[(&str, &str)], expected: Result<Command, &str>) {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let got = parse(args.iter().map(|s| s.to_string()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        });
        assert_eq!(got, expected.map_err(str::to_owned), "{args:?} {env:?}");
    }

    /// The arguments with nothing given.
    fn defaults() -> Args {
        Args {
            config: "/etc/infer/runtime.toml".into(),
            host: None,
            port: None,
            grpc_port: None,
            busy_poll_us: None,
            threads: None,
        }
    }

    fn run(config: &str, host: Option<&str>, port: Option<u16>) -> Result<Command, &'static str> {
        Ok(Command::Run(Args {
            config: config.into(),
            host: host.map(Into::into),
            port,
            grpc_port: None,
            busy_poll_us: None,
            threads: None,
        }))
    }

    #[test]
    fn flags_and_env() {
        check(&[], &[], run("/etc/infer/runtime.toml", None, None));
        check(
            &["--config", "a.toml", "--port=9"],
            &[("INFER_PORT", "8")],
            run("a.toml", None, Some(9)),
        );
        check(
            &[],
            &[
                ("INFER_PORT", "8"),
                ("INFER_HOST", "127.0.0.1"),
                ("INFER_CONFIG", "c"),
            ],
            run("c", Some("127.0.0.1"), Some(8)),
        );
        check(
            &["--port", "x"],
            &[],
            Err("--port: \"x\" is not a port number"),
        );
        check(
            &[],
            &[("INFER_PORT", "70000")],
            Err("INFER_PORT: \"70000\" is not a port number"),
        );
        check(&["--config"], &[], Err("--config needs a value"));
        let poll = |us| {
            Ok(Command::Run(Args {
                busy_poll_us: Some(us),
                ..defaults()
            }))
        };
        check(
            &["--busy-poll-us", "0"],
            &[("INFER_BUSY_POLL_US", "50")],
            poll(0),
        );
        check(&[], &[("INFER_BUSY_POLL_US", "50")], poll(50));
        check(
            &["--busy-poll-us=2000000"],
            &[],
            Err("--busy-poll-us: \"2000000\" is not a number of microseconds up to 1000000"),
        );
        assert_eq!(default_busy_poll_us(1), 0);
        assert!(default_busy_poll_us(2) > 0);
        check(&["serve"], &[], Err("unknown argument \"serve\""));
        let threads = |t| {
            Ok(Command::Run(Args {
                threads: t,
                ..defaults()
            }))
        };
        check(&[], &[("INFER_THREADS", "3")], threads(Some(3)));
        check(
            &["--threads=2"],
            &[("INFER_THREADS", "3")],
            threads(Some(2)),
        );
        check(&[], &[("INFER_THREADS", "")], threads(None));
        for bad in ["0", "1025", "-1", "two"] {
            check(
                &["--threads", bad],
                &[],
                Err(&format!(
                    "--threads: {bad:?} is not a thread count from 1 to 1024"
                )),
            );
        }
        check(
            &[],
            &[("INFER_THREADS", "0")],
            Err("INFER_THREADS: \"0\" is not a thread count from 1 to 1024"),
        );
        let grpc = |port| {
            Ok(Command::Run(Args {
                grpc_port: port,
                ..defaults()
            }))
        };
        check(&[], &[("INFER_GRPC_PORT", "9001")], grpc(Some(9001)));
        check(&[], &[("INFER_GRPC_PORT", "0")], grpc(Some(0)));
        check(&["--grpc-port", "0"], &[], grpc(Some(0)));
        check(
            &["--grpc-port=7"],
            &[("INFER_GRPC_PORT", "0")],
            grpc(Some(7)),
        );
        check(
            &["--grpc-port", "x"],
            &[],
            Err("--grpc-port: \"x\" is not a port number"),
        );
        assert_eq!(grpc_port(None, 8000), Some(DEFAULT_GRPC_PORT));
        assert_eq!(grpc_port(None, 0), Some(0));
        assert_eq!(grpc_port(Some(0), 8000), None);
        assert_eq!(grpc_port(Some(9), 0), Some(9));
        check(&["--help"], &[], Ok(Command::Help));
    }
}
