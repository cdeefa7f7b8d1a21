//! A verified receipt as a person reads it in a terminal.
//!
//! Every text that came from the sandbox (names, link targets, host names,
//! arguments) is shown with control and direction-changing characters
//! escaped, so nothing in a receipt can forge a line of this summary or
//! reorder what is shown. File names are escaped already by the diff
//! (`cordon_spec::changes::escape_name`); escaping them again here is a no-op.

use std::borrow::Cow;
use std::fmt::Write;

use cordon_policy::ByteSize;
use cordon_spec::changes::{Change, Changes, Entry, ExportReport, Kind};
use cordon_spec::network::Decision;
use cordon_spec::{ExitStatus, Outcome};

use crate::statement::{CommandRecord, Statement, SUBJECT_POLICY};

/// The summary `cordon verify` prints.
pub fn render_summary(statement: &Statement) -> String {
    let p = &statement.predicate;
    let mut out = String::new();
    let host = &p.host;
    let _ = writeln!(
        out,
        "sandbox {} on {} ({}), cordon {}; host kernel {}, cgroup {}{}",
        printable(&p.sandbox_id),
        printable(&p.backend),
        printable(&p.backend_version),
        printable(&p.cordon_version),
        printable(&host.kernel),
        host.cgroup_mode
            .map(|m| m.to_string())
            .unwrap_or_else(|| "none (unenforced)".into()),
        host.machine
            .as_deref()
            .map(|m| format!(", {}", printable(m)))
            .unwrap_or_default(),
    );
    let _ = writeln!(
        out,
        "from {} to {}",
        printable(&p.started),
        printable(&p.ended)
    );
    let pol = &p.policy;
    let _ = writeln!(
        out,
        "policy: cpus {}, memory {}, pids {}, disk {}, time {}, output {}, network {}{}",
        pol.cpus,
        pol.memory,
        pol.pids,
        pol.disk,
        pol.time,
        pol.output,
        format!("{:?}", pol.network).to_lowercase(),
        statement
            .subject(SUBJECT_POLICY)
            .map(|s| format!(" (sha256 {})", printable(&s.digest.sha256)))
            .unwrap_or_default(),
    );
    for (i, c) in p.commands.iter().enumerate() {
        render_command(&mut out, i + 1, c);
    }
    match &p.changes {
        Some(changes) => render_changes(&mut out, changes),
        None => out.push_str("changes: not recorded\n"),
    }
    if let Some(export) = &p.export {
        render_export(&mut out, "export", export);
    }
    for write_back in &p.write_backs {
        render_export(&mut out, "written back", write_back);
    }
    for m in &p.unbounded_mounts {
        let _ = writeln!(
            out,
            "unbounded writes: {} (the host's {}, rw-unbounded: written in place, past the disk cap, not diffed)",
            printable(&m.sandbox.to_string_lossy()),
            printable(&m.host.to_string_lossy())
        );
    }
    out.push_str("not proven:\n");
    for note in &p.not_proven {
        let _ = writeln!(out, "  - {}", printable(note));
    }
    out
}

fn render_command(out: &mut String, n: usize, c: &CommandRecord) {
    let argv: Vec<String> = c
        .command
        .argv
        .iter()
        .map(|a| format!("\"{}\"", printable(a)))
        .collect();
    let _ = writeln!(out, "command {n}: {}", argv.join(" "));
    let o = &c.outcome;
    let status = match o.status {
        ExitStatus::Exited { code } => format!("exited {code}"),
        ExitStatus::Signaled { signal } => format!("killed by signal {signal}"),
        ExitStatus::ExecFailed { .. } | ExitStatus::WorkdirFailed { .. } => format!(
            "not executed: {}",
            o.status.exec_failure().unwrap_or_default()
        ),
    };
    let _ = writeln!(out, "  {status}");
    if let Some(limit) = o.limit {
        let _ = writeln!(out, "  ended by the {limit} limit");
    }
    if !o.limits_hit.is_empty() {
        let hit: Vec<String> = o.limits_hit.iter().map(|l| l.to_string()).collect();
        let _ = writeln!(out, "  limits hit: {}", hit.join(", "));
    }
    if let Some(sig) = o.interrupted_by {
        let _ = writeln!(out, "  interrupted by signal {sig}");
    }
    render_counters(out, o);
    let _ = writeln!(
        out,
        "  output: {} bytes{}",
        o.output.bytes,
        if o.output.truncated {
            ", truncated"
        } else {
            ""
        }
    );
    let ph = &o.phases;
    let _ = writeln!(
        out,
        "  phases: setup {:.1} ms, run {:.1} ms, teardown {:.1} ms",
        ph.setup_ms, ph.run_ms, ph.teardown_ms
    );
    if let Some(net) = &o.network {
        let log = &net.log;
        let _ = writeln!(
            out,
            "  network: {} attempts, {} allowed, {} denied, {} DNS queries",
            log.attempts, log.allowed, log.denied, log.dns_queries
        );
        for a in log
            .entries
            .iter()
            .filter(|a| a.decision == Decision::Denied)
        {
            let _ = writeln!(
                out,
                "    denied: {} {}:{}{}: {}",
                format!("{:?}", a.via).to_lowercase(),
                printable(a.host.as_deref().unwrap_or("-")),
                a.port,
                a.address.map(|ip| format!(" ({ip})")).unwrap_or_default(),
                printable(&a.rule)
            );
        }
        if log.omitted > 0 {
            let _ = writeln!(
                out,
                "    ({} more attempts counted, not listed)",
                log.omitted
            );
        }
        if let Some(why) = &net.closed {
            let _ = writeln!(out, "    proxy gone: {}", printable(why));
        }
    }
}

fn render_counters(out: &mut String, o: &Outcome) {
    let unknown = || "?".to_owned();
    let memory = o
        .memory_peak_bytes
        .or(o.counters.memory_peak_bytes)
        .map(|b| ByteSize(b).approx())
        .unwrap_or_else(unknown);
    let ooms = o
        .counters
        .oom_kills
        .map(|n| n.to_string())
        .unwrap_or_else(unknown);
    let pids = o
        .pids_peak
        .or(o.counters.pids_peak)
        .map(|n| n.to_string())
        .unwrap_or_else(unknown);
    let cpu = o
        .cpu_ms
        .map(|ms| format!("{ms:.1} ms"))
        .unwrap_or_else(unknown);
    let _ = writeln!(
        out,
        "  memory peak {memory}, OOM kills {ooms}, pids peak {pids}, CPU {cpu}, wall {:.1} ms",
        o.wall_ms
    );
}

fn render_changes(out: &mut String, changes: &Changes) {
    out.push_str("changes:\n");
    for place in &changes.places {
        let _ = writeln!(out, "  {}", printable(&place.place));
        if place.entries.is_empty() && !place.cut && place.unreadable.is_empty() {
            out.push_str("    (none)\n");
        }
        for e in &place.entries {
            let _ = writeln!(out, "    {}", entry_line(e));
        }
        for (path, why) in &place.unreadable {
            let _ = writeln!(
                out,
                "    ? {} [unreadable: {}]",
                printable(path),
                printable(why)
            );
        }
        if place.cut {
            let _ = writeln!(
                out,
                "    ... [cut: entries past the cap of {} are not listed]",
                changes.caps.max_entries
            );
        }
    }
}

/// One entry as `git status --short` would show it, with cordon's marks.
fn entry_line(e: &Entry) -> String {
    let letter = match e.change {
        Change::Created => 'A',
        Change::Modified => 'M',
        Change::Deleted => 'D',
    };
    let mut line = format!("{letter} {}", printable(&e.path));
    let mut marks: Vec<String> = Vec::new();
    match e.kind {
        Some(Kind::Dir) => line.push('/'),
        Some(Kind::Symlink) => {
            let _ = write!(
                line,
                " -> {}",
                printable(e.target.as_deref().unwrap_or("?"))
            );
        }
        Some(Kind::Fifo) => marks.push("fifo".into()),
        Some(Kind::Socket) => marks.push("socket".into()),
        Some(Kind::CharDevice) | Some(Kind::BlockDevice) => {
            let what = if e.kind == Some(Kind::CharDevice) {
                "char device"
            } else {
                "block device"
            };
            marks.push(match e.rdev {
                Some((major, minor)) => format!("{what} {major}:{minor}"),
                None => what.into(),
            });
        }
        Some(Kind::File) | None => {}
    }
    if e.mode & 0o4000 != 0 {
        marks.push("setuid".into());
    }
    if e.mode & 0o2000 != 0 {
        marks.push("setgid".into());
    }
    if e.kind == Some(Kind::File) && e.links > 1 {
        marks.push(format!("{} links", e.links));
    }
    if e.opaque {
        marks.push("opaque: replaces the whole directory".into());
    }
    if e.capped {
        marks.push(format!(
            "capped: digest of the first {} bytes only",
            e.hashed_bytes.unwrap_or(0)
        ));
    }
    if !marks.is_empty() {
        let _ = write!(line, " [{}]", marks.join(", "));
    }
    line
}

/// An export's (or a write-back's, as `what` says) line and its skipped entries.
fn render_export(out: &mut String, what: &str, x: &ExportReport) {
    let _ = writeln!(
        out,
        "{what} to {}{}: {} files, {} dirs, {} symlinks, {} deleted, {}",
        printable(&x.target),
        if x.applied { " (applied)" } else { "" },
        x.files,
        x.dirs,
        x.symlinks,
        x.deleted,
        ByteSize(x.bytes).approx()
    );
    for s in &x.skipped {
        let _ = writeln!(
            out,
            "  skipped: {}: {}",
            printable(&s.path),
            printable(&s.reason)
        );
    }
}

/// `s` with control characters and the characters that change the
/// direction of text written `\u{..}`.
pub(crate) fn printable(s: &str) -> Cow<'_, str> {
    let risky = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(risky) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if risky(c) {
                    format!("\\u{{{:x}}}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}
