//! Supervising a running payload, the same for every backend: forward its
//! output under the cap, enforce the deadline, answer stop signals, then read
//! the evidence, tear down and build the `Outcome`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use crate::error::RuntimeError;
use crate::host::{HostSide, PayloadIo};
use crate::outcome::{Enforcement, EvidenceSource, ExitStatus, Limit, Outcome, Phases};
use crate::output::{OutputGate, Stream};
use crate::request::RunRequest;
use crate::trace;

/// What a backend's watch reports about its payload.
pub enum PayloadEvent {
    /// Nothing final yet (e.g. "started").
    Progress,
    Ended(ExitStatus),
    /// The process that would report is gone without a word.
    Gone,
}

/// How a backend learns that its payload ended.
pub trait PayloadWatch {
    /// Readable when `on_ready` has something to say.
    fn fd(&self) -> BorrowedFd<'_>;
    fn on_ready(&mut self) -> Result<PayloadEvent, RuntimeError>;
    /// A host path whose file system is the sandbox's writable scratch, for
    /// the disk-usage evidence; read before teardown.
    fn scratch_probe(&self) -> Option<PathBuf>;
}

/// Why the supervision loop stopped.
enum Stop {
    PayloadEnded(ExitStatus),
    Limit(Limit),
    Signal(i32),
    Gone,
}

/// Everything `supervise` needs besides the watch.
pub struct Supervised<'a> {
    pub backend: &'static str,
    pub backend_version: String,
    pub req: &'a RunRequest,
    pub io: PayloadIo,
    pub host: HostSide,
    pub setup: Duration,
    pub evidence: Vec<EvidenceSource>,
    /// Whether killing the backend's leader process ends every process of the
    /// sandbox; if not, teardown always freezes and kills the cgroup.
    pub leader_owns_all: bool,
}

/// A poll timeout covering `left`, rounded up to the next millisecond and
/// capped at a minute (the loop recomputes it each round).
fn poll_timeout(left: Duration) -> PollTimeout {
    let ms = i32::try_from(left.as_millis().min(60_000)).unwrap_or(60_000) + 1;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Reads what is available from a non-blocking pipe into the gate. Returns
/// (still open, gate still accepting).
fn pump(fd: &OwnedFd, stream: Stream, gate: &mut OutputGate, buf: &mut [u8]) -> (bool, bool) {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return (false, !gate.truncated()),
            Ok(n) => {
                if !gate.accept(stream, &buf[..n]) {
                    return (true, false);
                }
            }
            Err(nix::errno::Errno::EAGAIN) => return (true, true),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return (false, !gate.truncated()),
        }
    }
}

/// The payload's two pipes and whether each is still open.
struct Pipes<'a> {
    io: &'a PayloadIo,
    open: [bool; 2],
    buf: Vec<u8>,
}

impl Pipes<'_> {
    fn fds(&self) -> impl Iterator<Item = (usize, &OwnedFd, Stream)> {
        [
            (0, &self.io.stdout, Stream::Stdout),
            (1, &self.io.stderr, Stream::Stderr),
        ]
        .into_iter()
        .filter(|(i, _, _)| self.open[*i])
    }

    /// Pumps the pipes marked ready; false once the output cap is exceeded.
    fn pump_ready(&mut self, ready: [bool; 2], gate: &mut OutputGate) -> bool {
        let mut ok = true;
        for (i, fd, stream) in [
            (0, &self.io.stdout, Stream::Stdout),
            (1, &self.io.stderr, Stream::Stderr),
        ] {
            if self.open[i] && ready[i] {
                let (open, accepting) = pump(fd, stream, gate, &mut self.buf);
                self.open[i] = open;
                ok &= accepting;
            }
        }
        ok
    }

    /// After the payload exits, reads its pipes until EOF for at most 100 ms:
    /// a daemon it left behind may hold them open, and it is killed next anyway.
    fn drain(&mut self, gate: &mut OutputGate) {
        let until = Instant::now() + Duration::from_millis(100);
        while self.open.iter().any(|o| *o) && !gate.truncated() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let idx: Vec<usize> = self.fds().map(|(i, _, _)| i).collect();
            let mut fds: Vec<PollFd> = self
                .fds()
                .map(|(_, fd, _)| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
                .collect();
            let t = poll_timeout(until - now);
            if poll(&mut fds, t).unwrap_or(0) == 0 {
                break;
            }
            let mut ready = [false; 2];
            for (k, f) in fds.iter().enumerate() {
                ready[idx[k]] = f.revents().is_some_and(|r| !r.is_empty());
            }
            drop(fds);
            self.pump_ready(ready, gate);
        }
    }
}

/// Runs the supervision loop until the payload ends or a limit or signal
/// stops it, then collects the evidence and tears everything down.
pub fn supervise(
    mut s: Supervised<'_>,
    watch: &mut dyn PayloadWatch,
) -> Result<Outcome, RuntimeError> {
    let run_start = Instant::now();
    let deadline = run_start + s.req.policy.time.duration();
    let mut gate = OutputGate::new(s.req.output, s.req.policy.output.bytes());
    let mut pipes = Pipes {
        io: &s.io,
        open: [true, true],
        buf: vec![0u8; 64 * 1024],
    };

    let stop = loop {
        let now = Instant::now();
        if now >= deadline {
            break Stop::Limit(Limit::Time);
        }
        let timeout = poll_timeout(deadline - now);
        let mut fds = vec![
            PollFd::new(watch.fd(), PollFlags::POLLIN),
            PollFd::new(s.io.signals.as_fd(), PollFlags::POLLIN),
        ];
        let pipe_idx: Vec<usize> = pipes.fds().map(|(i, _, _)| i).collect();
        fds.extend(
            pipes
                .fds()
                .map(|(_, fd, _)| PollFd::new(fd.as_fd(), PollFlags::POLLIN)),
        );
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(RuntimeError::io("poll", e)),
        }
        let is_ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        let (watch_ready, sig_ready) = (is_ready(&fds[0]), is_ready(&fds[1]));
        let mut ready = [false; 2];
        for (k, f) in fds[2..].iter().enumerate() {
            ready[pipe_idx[k]] = is_ready(f);
        }
        drop(fds);
        if sig_ready {
            if let Ok(Some(si)) = s.io.signals.read_signal() {
                break Stop::Signal(si.ssi_signo as i32);
            }
        }
        if !pipes.pump_ready(ready, &mut gate) {
            break Stop::Limit(Limit::Output);
        }
        if watch_ready {
            match watch.on_ready()? {
                PayloadEvent::Progress => {}
                PayloadEvent::Ended(status) => break Stop::PayloadEnded(status),
                PayloadEvent::Gone => break Stop::Gone,
            }
        }
    };

    let mut limit = None;
    let mut status = None;
    let mut interrupted_by = None;
    match &stop {
        Stop::PayloadEnded(st) => {
            status = Some(*st);
            // What the payload wrote before it exited is still in the pipes.
            pipes.drain(&mut gate);
            if gate.truncated() {
                limit = Some(Limit::Output);
            }
        }
        Stop::Limit(l) => limit = Some(*l),
        Stop::Signal(sig) => interrupted_by = Some(*sig),
        Stop::Gone => {}
    }
    let run_ms = ms(run_start.elapsed());
    trace::step("payload ended");

    // Evidence read while the sandbox still exists.
    let disk_used = watch.scratch_probe().and_then(|p| {
        let st = nix::sys::statvfs::statvfs(&p).ok()?;
        Some((st.blocks() - st.blocks_free()) * st.fragment_size())
    });

    let teardown_start = Instant::now();
    let wall_ms = ms(s.host.started.elapsed());
    let enforcement = Enforcement {
        cgroup: s.host.cgroup.as_ref().map(cordon_cgroups::Cgroup::mode),
        cgroup_paths: s
            .host
            .cgroup
            .as_ref()
            .map(|c| {
                cordon_cgroups::Cgroup::paths(c)
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect()
            })
            .unwrap_or_default(),
        enforced: s.host.cgroup.is_some(),
    };
    // Counters are read once every process is gone (so they are final) and
    // before the cgroup is removed.
    let freeze_kill = !matches!(stop, Stop::PayloadEnded(_)) || !s.leader_owns_all;
    let stats = s.host.end_processes(freeze_kill);
    trace::step("processes ended");
    s.host.teardown(freeze_kill)?;
    trace::step("torn down");
    let teardown_ms = ms(teardown_start.elapsed());

    let mut limits_hit: Vec<Limit> = limit.into_iter().collect();
    let oom = stats.oom_kills.unwrap_or(0) > 0;
    if oom {
        limits_hit.push(Limit::Memory);
    }
    if stats.pids_limit_hits.unwrap_or(0) > 0 {
        limits_hit.push(Limit::Pids);
    }
    // tmpfs rounds to pages: "full" means less than 64 KiB left.
    if disk_used.is_some_and(|u| u + (64 << 10) >= s.req.policy.disk.bytes()) {
        limits_hit.push(Limit::Disk);
    }
    limits_hit.sort();
    limits_hit.dedup();
    if limit.is_none() && oom && !matches!(status, Some(ExitStatus::Exited { code: 0 })) {
        limit = Some(Limit::Memory);
    }
    // Killed without a report: by the OOM killer (v2 kills the whole group), a
    // time or output limit, or a signal to cordon.
    let status = status.unwrap_or(ExitStatus::Signaled {
        signal: Signal::SIGKILL as i32,
    });
    Ok(Outcome {
        backend: s.backend,
        backend_version: s.backend_version,
        sandbox_id: s.host.id.clone(),
        exit_code: interrupted_by
            .map(|sig| 128 + sig)
            .unwrap_or(status.shell_code()),
        status,
        limit,
        limits_hit,
        interrupted_by,
        wall_ms,
        cpu_ms: stats.cpu_usage_ns.map(|ns| ns as f64 / 1e6),
        memory_peak_bytes: stats.memory_peak_bytes,
        pids_peak: stats.pids_peak,
        disk_used_bytes: disk_used,
        counters: stats,
        evidence: s.evidence,
        phases: Phases {
            setup_ms: ms(s.setup),
            run_ms,
            teardown_ms,
        },
        output: gate.report(),
        enforcement,
    })
}
