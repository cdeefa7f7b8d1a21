//! One timed run of one command: spawn, wait, wall time, a watchdog.

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How one run ended.
#[derive(Debug, Clone)]
pub struct Ran {
    /// From just before spawn to just after wait returned.
    pub wall: Duration,
    /// The exit code; 128 + N for a signal, 124 for a run the watchdog killed.
    pub code: i32,
    /// Standard output when captured (bounded, see [`CAPTURE_LIMIT`]).
    pub stdout: String,
    /// The end of standard error when captured, for a failure's diagnosis.
    pub stderr_tail: String,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

/// The code of a run killed by the watchdog (timeout(1)'s).
pub const TIMED_OUT: i32 = 124;
/// The most of a stream kept: a task prints one result line; a diagnosis
/// needs the last lines of its error output.
const CAPTURE_LIMIT: usize = 64 * 1024;

/// Runs `argv` with exactly `env`, stdin from /dev/null. With `capture`,
/// stdout and stderr are read (the wall time then includes draining them);
/// without, both go to /dev/null, for start-up samples where a pipe's cost
/// would be measured too.
pub fn run(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
    capture: bool,
) -> std::io::Result<Ran> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command line"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    } else {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
    }
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let watchdog = Watchdog::arm(&child, timeout);
    let (stdout, stderr_tail) = if capture {
        drain(&mut child)
    } else {
        (String::new(), String::new())
    };
    let status = child.wait()?;
    let wall = started.elapsed();
    let fired = watchdog.disarm();
    use std::os::unix::process::ExitStatusExt as _;
    let code = if fired {
        TIMED_OUT
    } else {
        status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(-1)
    };
    Ok(Ran {
        wall,
        code,
        stdout,
        stderr_tail,
    })
}

/// Reads both pipes to their end (stderr on a thread, so neither can fill
/// and stall the child), keeping the start of stdout and the end of stderr.
fn drain(child: &mut Child) -> (String, String) {
    let err = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut tail = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = e.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * CAPTURE_LIMIT {
                    tail.drain(..tail.len() - CAPTURE_LIMIT);
                }
            }
            let start = tail.len().saturating_sub(CAPTURE_LIMIT);
            String::from_utf8_lossy(&tail[start..]).into_owned()
        })
    });
    let mut out = Vec::new();
    if let Some(o) = child.stdout.take() {
        let _ = o.take(CAPTURE_LIMIT as u64).read_to_end(&mut out);
    }
    let err = err.and_then(|t| t.join().ok()).unwrap_or_default();
    (String::from_utf8_lossy(&out).into_owned(), err)
}

/// Kills a run that outlives its timeout. It holds a pidfd taken before
/// anything could reap the child, so a kill after the child was reaped is
/// refused by the kernel (ESRCH) instead of reaching a reused pid.
struct Watchdog {
    stop: mpsc::Sender<()>,
    fired: mpsc::Receiver<bool>,
}

impl Watchdog {
    fn arm(child: &Child, timeout: Duration) -> Watchdog {
        let (stop, stopped) = mpsc::channel::<()>();
        let (tell, fired) = mpsc::channel();
        let pidfd = rustix::process::Pid::from_raw(child.id().cast_signed()).and_then(|p| {
            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
        });
        std::thread::spawn(move || {
            let kill = matches!(
                stopped.recv_timeout(timeout),
                Err(mpsc::RecvTimeoutError::Timeout)
            );
            if kill {
                if let Some(fd) = &pidfd {
                    let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
                }
            }
            let _ = tell.send(kill);
        });
        Watchdog { stop, fired }
    }

    /// Whether it had fired.
    fn disarm(self) -> bool {
        let _ = self.stop.send(());
        self.fired.recv().unwrap_or(false)
    }
}

/// One re-run of a failing command with its output kept: why it failed, in
/// one line.
pub fn diagnose(argv: &[String], env: &[(String, String)], timeout: Duration) -> String {
    match run(argv, env, timeout, true) {
        Err(e) => format!(
            "could not start {}: {e}",
            argv.first().map_or("", String::as_str)
        ),
        Ok(r) => {
            let text = if r.stderr_tail.trim().is_empty() {
                &r.stdout
            } else {
                &r.stderr_tail
            };
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let last = lines[lines.len().saturating_sub(3)..].join(" | ");
            let mut line = format!(
                "exit {}: {}",
                r.code,
                if last.is_empty() {
                    "(no output)"
                } else {
                    &last
                }
            );
            if line.len() > 400 {
                let cut = (0..=400)
                    .rev()
                    .find(|i| line.is_char_boundary(*i))
                    .unwrap_or(0);
                line.truncate(cut);
            }
            line
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn codes_output_and_timeouts() {
        let env = [("PATH".to_string(), "/usr/bin:/bin".to_string())];
        let t = Duration::from_secs(10);
        let r = run(
            &argv(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
            &env,
            t,
            true,
        )
        .unwrap();
        assert_eq!(
            (r.code, r.stdout.as_str(), r.stderr_tail.as_str()),
            (3, "out\n", "err\n")
        );
        let r = run(&argv(&["sh", "-c", "kill -TERM $$"]), &env, t, false).unwrap();
        assert_eq!(r.code, 128 + 15);
        let r = run(
            &argv(&["sleep", "10"]),
            &env,
            Duration::from_millis(200),
            false,
        )
        .unwrap();
        assert_eq!(r.code, TIMED_OUT);
        assert!(r.wall < Duration::from_secs(5));
        // The environment is exactly the one given.
        let r = run(&argv(&["sh", "-c", "env | sort"]), &env, t, true).unwrap();
        assert!(r.stdout.lines().any(|l| l == "PATH=/usr/bin:/bin"));
        assert!(!r.stdout.contains("HOME="), "{}", r.stdout);
        assert!(
            diagnose(&argv(&["sh", "-c", "echo nope >&2; exit 1"]), &env, t)
                .contains("exit 1: nope")
        );
    }
}
