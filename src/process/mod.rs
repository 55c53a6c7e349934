//! The one module that spawns processes (`trtexec`, `polygraphy`, `nvidia-smi`, …).
//!
//! Everything else describes a command as a [`Cmd`] value and hands it to a [`Runner`]. The real
//! [`SystemRunner`] spawns it; the [`RecordingRunner`] records it and answers from a script, so
//! tests check exact argument vectors (and simulate tools that cannot run here, such as trtexec
//! without a GPU) without spawning anything.
//!
//! This module knows nothing about what the tools do: it does not build arguments or parse
//! output. Commands get no shell: arguments are passed as a vector, never re-split.
#![allow(
    clippy::disallowed_methods,
    reason = "the one module that spawns processes"
)]

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// Errors of the `process` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program is not installed (not found on `PATH`).
    #[error("`{program}` was not found on PATH")]
    NotFound { program: String },
    #[error("cannot start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// The process ran past its deadline and was killed.
    #[error("`{command}` did not finish within {} s and was stopped", .after.as_secs_f64())]
    Timeout { command: String, after: Duration },
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        false
    }
}

/// A command to run: program, arguments, extra environment, working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    /// Extra environment variables (added to the inherited environment), in order.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Bytes written to the process's standard input (then closed); `None` = no input.
    pub stdin: Option<Vec<u8>>,
    /// Kill the process when it runs longer than this.
    pub timeout: Option<Duration>,
}

impl Cmd {
    pub fn new(program: impl Into<String>) -> Cmd {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            stdin: None,
            timeout: None,
        }
    }

    /// Feed `bytes` to the process's standard input.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Cmd {
        self.stdin = Some(bytes.into());
        self
    }

    /// Kill the process if it has not finished after `after`.
    pub fn timeout(mut self, after: Duration) -> Cmd {
        self.timeout = Some(after);
        self
    }

    pub fn arg(mut self, a: impl Into<String>) -> Cmd {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Cmd {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Cmd {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Cmd {
        self.cwd = Some(dir.into());
        self
    }

    /// The argument vector including the program, as recorded by the fake.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }
}

impl fmt::Display for Cmd {
    /// A shell-like rendering for messages and logs (quoted where needed; never executed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.argv().iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$`\\*?".contains(c)) {
                write!(f, "'{}'", a.replace('\'', r"'\''"))?;
            } else {
                f.write_str(a)?;
            }
        }
        Ok(())
    }
}

/// What a finished process left.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// Exit code; `None` when the process was killed by a signal.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    /// An output with exit code 0 and the given stdout.
    pub fn ok(stdout: impl Into<Vec<u8>>) -> Output {
        Output {
            code: Some(0),
            stdout: stdout.into(),
            stderr: Vec::new(),
        }
    }

    /// An output with the given exit code and stderr.
    pub fn failed(code: i32, stderr: impl Into<Vec<u8>>) -> Output {
        Output {
            code: Some(code),
            stdout: Vec::new(),
            stderr: stderr.into(),
        }
    }

    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    pub(crate) fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub(crate) fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The last `n` lines of stderr then stdout, for error messages.
    pub fn tail(&self, n: usize) -> String {
        let text = format!("{}{}", self.stderr_text(), self.stdout_text());
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Runs commands. Implementations must be usable from several threads.
pub trait Runner: Send + Sync {
    /// Run `cmd` to completion, capturing stdout and stderr. A non-zero exit is an `Ok` output;
    /// `Err` means the process could not be started at all.
    fn run(&self, cmd: &Cmd) -> Result<Output, Error>;

    /// True when `program` can be found (on `PATH`, or as a path).
    fn available(&self, program: &str) -> bool;
}

/// Spawns real processes.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemRunner;

impl Runner for SystemRunner {
    fn run(&self, cmd: &Cmd) -> Result<Output, Error> {
        let exe = which(&cmd.program).ok_or_else(|| Error::NotFound {
            program: cmd.program.clone(),
        })?;
        let mut c = std::process::Command::new(exe);
        c.args(&cmd.args);
        for (k, v) in &cmd.env {
            c.env(k, v);
        }
        if let Some(dir) = &cmd.cwd {
            c.current_dir(dir);
        }
        if cmd.stdin.is_none() && cmd.timeout.is_none() {
            c.stdin(std::process::Stdio::null());
            let out = c.output().map_err(|source| Error::Spawn {
                command: cmd.to_string(),
                source,
            })?;
            return Ok(Output {
                code: out.status.code(),
                stdout: out.stdout,
                stderr: out.stderr,
            });
        }
        run_piped(c, cmd)
    }

    fn available(&self, program: &str) -> bool {
        which(program).is_some()
    }
}

/// A process left running in the background (a server a benchmark drives), both of its
/// outputs appended to a log file; killed and reaped when dropped.
#[derive(Debug)]
pub(crate) struct Background {
    child: std::process::Child,
}

impl Background {
    /// Starts `cmd` (no input; `cmd.stdin` and `cmd.timeout` do not apply) with its standard
    /// output and error going to `log`.
    pub(crate) fn start(cmd: &Cmd, log: &std::fs::File) -> Result<Background, Error> {
        let exe = which(&cmd.program).ok_or_else(|| Error::NotFound {
            program: cmd.program.clone(),
        })?;
        let spawn_error = |source| Error::Spawn {
            command: cmd.to_string(),
            source,
        };
        let mut c = std::process::Command::new(exe);
        c.args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().map_err(spawn_error)?)
            .stderr(log.try_clone().map_err(spawn_error)?);
        if let Some(dir) = &cmd.cwd {
            c.current_dir(dir);
        }
        let child = c.spawn().map_err(spawn_error)?;
        Ok(Background { child })
    }

    /// How the process ended, once it has.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Output kept per stream of a process run with input or a deadline; the rest is discarded.
const MAX_CAPTURE: u64 = 16 << 20;

/// Run with piped standard streams: write `cmd.stdin`, read both outputs on threads, and kill
/// the process (and its process group, so helpers it started cannot hold the pipes open) when
/// it outlives `cmd.timeout`.
fn run_piped(mut c: std::process::Command, cmd: &Cmd) -> Result<Output, Error> {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    c.stdin(if cmd.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let mut child = c.spawn().map_err(|source| Error::Spawn {
        command: cmd.to_string(),
        source,
    })?;
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(MAX_CAPTURE).read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), cmd.stdin.clone()) {
        // A process that exits without reading its input closes the pipe: not an error here.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let start = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                return Err(Error::Spawn {
                    command: cmd.to_string(),
                    source,
                })
            }
        }
        if let Some(limit) = cmd.timeout {
            if start.elapsed() >= limit {
                kill_group(&mut child);
                return Err(Error::Timeout {
                    command: cmd.to_string(),
                    after: limit,
                });
            }
        }
        std::thread::sleep(
            Duration::from_millis(5)
                .max(start.elapsed() / 50)
                .min(Duration::from_millis(50)),
        );
    };
    Ok(Output {
        code: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Kill a child started in its own process group, and the group with it.
fn kill_group(child: &mut std::process::Child) {
    // The group id is the child's pid (`process_group(0)`); `kill -- -PID` reaches every
    // process it started. The child itself is killed and reaped through std either way.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

/// Resolve `program` on `PATH` (or as a path when it contains a `/`).
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_executable(&p).then_some(p);
    }
    let path: OsString = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

type Responder = dyn Fn(&Cmd) -> Output + Send + Sync;

/// A fake [`Runner`] for tests: records every command and answers with a scripted responder.
/// The responder may have side effects (write the file a real tool would write).
pub struct RecordingRunner {
    calls: Mutex<Vec<Cmd>>,
    respond: Box<Responder>,
    installed: Vec<String>,
}

impl RecordingRunner {
    /// Every program counts as installed; `respond` produces each command's output.
    pub fn new(respond: impl Fn(&Cmd) -> Output + Send + Sync + 'static) -> Self {
        RecordingRunner {
            calls: Mutex::new(Vec::new()),
            respond: Box::new(respond),
            installed: Vec::new(),
        }
    }

    /// Only the listed programs count as installed; running any other returns `NotFound`.
    pub fn with_installed(mut self, programs: &[&str]) -> Self {
        self.installed = programs.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The commands run so far, in order.
    pub fn calls(&self) -> Vec<Cmd> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

impl Runner for RecordingRunner {
    fn run(&self, cmd: &Cmd) -> Result<Output, Error> {
        if !self.available(&cmd.program) {
            return Err(Error::NotFound {
                program: cmd.program.clone(),
            });
        }
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(cmd.clone());
        }
        Ok((self.respond)(cmd))
    }

    fn available(&self, program: &str) -> bool {
        self.installed.is_empty() || self.installed.iter().any(|p| p == program)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_runner_captures_output_and_exit_code() {
        let out = SystemRunner
            .run(&Cmd::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]))
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout_text(), "out\n");
        assert_eq!(out.stderr_text(), "err\n");
        assert!(!out.success());
        assert_eq!(out.tail(1), "out");
    }

    #[test]
    fn system_runner_passes_env_and_cwd_without_a_shell() {
        let dir = tempfile::tempdir().unwrap();
        let out = SystemRunner
            .run(
                &Cmd::new("sh")
                    .args([
                        "-c",
                        "printf '%s|%s|%s' \"$X\" \"$1\" \"$(pwd)\"",
                        "sh",
                        "a b; c",
                    ])
                    .env("X", "x y")
                    .cwd(dir.path()),
            )
            .unwrap();
        let want = format!(
            "x y|a b; c|{}",
            dir.path().canonicalize().unwrap().display()
        );
        assert_eq!(out.stdout_text(), want);
    }

    #[test]
    fn stdin_is_fed_and_a_deadline_kills_the_whole_group() {
        let out = SystemRunner
            .run(
                &Cmd::new("sh")
                    .args(["-c", "read x; echo \"got $x\""])
                    .stdin(b"r.io\n".to_vec())
                    .timeout(Duration::from_secs(30)),
            )
            .unwrap();
        assert_eq!(out.stdout_text(), "got r.io\n");
        // A grandchild holding the output pipe open must not keep us waiting either.
        let start = std::time::Instant::now();
        let e = SystemRunner
            .run(
                &Cmd::new("sh")
                    .args(["-c", "sleep 60 & sleep 60"])
                    .timeout(Duration::from_millis(300)),
            )
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn missing_program_is_not_found() {
        let e = SystemRunner
            .run(&Cmd::new("infer-build-no-such-tool"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`infer-build-no-such-tool` was not found on PATH"
        );
        assert!(!SystemRunner.available("infer-build-no-such-tool"));
        assert!(SystemRunner.available("sh"));
    }

    #[test]
    fn recording_runner_records_and_scripts() {
        let r = RecordingRunner::new(|c| Output::ok(c.args.join(","))).with_installed(&["trtexec"]);
        let out = r.run(&Cmd::new("trtexec").args(["--a", "--b=1"])).unwrap();
        assert_eq!(out.stdout_text(), "--a,--b=1");
        assert!(matches!(
            r.run(&Cmd::new("nvidia-smi")),
            Err(Error::NotFound { .. })
        ));
        assert_eq!(r.calls().len(), 1);
        assert_eq!(r.calls()[0].argv(), ["trtexec", "--a", "--b=1"]);
    }

    #[test]
    fn display_quotes_what_a_shell_would_split() {
        let c = Cmd::new("trtexec").args(["--onnx=/a b/m.onnx", "--fp16", "it's"]);
        assert_eq!(
            c.to_string(),
            r"trtexec '--onnx=/a b/m.onnx' --fp16 'it'\''s'"
        );
    }
}
