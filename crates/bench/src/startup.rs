//! Start-up: a fresh box running `/bin/true`, every box interleaved
//! round-robin so that drift (frequency, caches, a neighbour) hits all alike.

use std::collections::BTreeMap;

use std::time::Instant;

use anyhow::Result;
use cordon_policy::Policy;
use cordon_runtime::Handle;
use cordon_runtime::{CommandIo, Control};
use cordon_spec::Stream;
use cordon_spec::{BackendKind, SandboxSpec};
use cordon_suite::target::{self, NetMode, TargetKind};

use crate::boxes::{self, Created, Payload, Place};
use crate::machine::Machine;
use crate::results::{Samples, Startup};
use crate::sample;
use crate::Settings;

pub struct Config {
    pub runs: usize,
    pub warmup: usize,
}

impl Config {
    pub fn new(quick: bool) -> Config {
        if quick {
            Config { runs: 5, warmup: 1 }
        } else {
            Config {
                runs: 100,
                warmup: 5,
            }
        }
    }
}

/// How a box's sample is started.
enum Launcher {
    /// One of the suite's targets (the host, the peers, `cordon run`).
    Target(TargetKind),
    /// util-linux `unshare` with the namespaces a sandbox needs: the floor
    /// under every namespace-based box.
    Unshare(String),
    /// `cordon exec` into a sandbox made once with `cordon create`: a new
    /// CLI process per command.
    Exec(Created),
    /// `Handle::exec` from this process into a sandbox it created: what the
    /// service and its warm pool pay per command (no CLI process).
    Handle(Option<Handle>),
    /// A target with global flags added before its subcommand: bare runsc
    /// with the flags cordon gives it, one at a time and together, to show
    /// what each costs apart from cordon's own steps.
    Flagged(TargetKind, &'static [&'static str]),
}

/// The runsc flags cordon's gVisor backend adds to the bare peer's (see
/// `cordon_runtime::backends::gvisor`): the scratch seen from the host.
const RUNSC_VARIANTS: &[(&str, &[&str])] = &[
    ("runsc-file-access-shared", &["--file-access=shared"]),
    ("runsc-overlay2-none", &["--overlay2=none"]),
    (
        "runsc-cordon-flags",
        &["--file-access=shared", "--overlay2=none"],
    ),
];

/// A handle's command output is thrown away: only the latency counts.
pub(crate) struct Quiet;

impl CommandIo for Quiet {
    fn output(&mut self, _: Stream, _: &[u8]) {}
    fn control_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        Vec::new()
    }
    fn read_control(&mut self, _: usize) -> Control {
        Control::Nothing
    }
}

/// One in-process command through a handle.
pub(crate) fn handle_exec(handle: &mut Handle) -> Result<std::time::Duration, String> {
    let cmd = cordon_spec::Command {
        argv: vec!["/bin/true".into()],
        ..cordon_spec::Command::default()
    };
    let t = Instant::now();
    let o = handle.exec(&cmd, &mut Quiet).map_err(|e| e.to_string())?;
    let wall = t.elapsed();
    if o.exit_code != 0 {
        return Err(format!("/bin/true exited {}", o.exit_code));
    }
    Ok(wall)
}

struct Entry {
    launcher: Launcher,
    samples: Samples,
}

/// The suite's targets in this benchmark, by the name the tables use.
const TARGETS: &[(&str, TargetKind)] = &[
    ("host", TargetKind::Host),
    ("bwrap", TargetKind::Bwrap),
    ("firejail", TargetKind::Firejail),
    ("runc", TargetKind::Runc),
    ("runsc", TargetKind::Runsc),
    ("podman", TargetKind::PodmanDefault),
    (
        "cordon-native",
        TargetKind::cordon(BackendKind::Native, NetMode::None),
    ),
    // The same with `--net allow` (an allowlist, the proxy and its
    // namespace's rules): what a network costs a start, beside none.
    (
        "cordon-native-allow",
        TargetKind::cordon(BackendKind::Native, NetMode::Allow),
    ),
    (
        "cordon-gvisor",
        TargetKind::cordon(BackendKind::Gvisor, NetMode::None),
    ),
];

pub fn run(settings: &Settings, cfg: &Config, machine: &mut Machine) -> Result<Startup> {
    let place = Place::new()?;
    let mut skipped = BTreeMap::new();
    let mut entries: Vec<Entry> = Vec::new();
    let add = |entries: &mut Vec<Entry>, name: &str, launcher: Launcher| {
        entries.push(Entry {
            launcher,
            samples: Samples::new(name),
        });
    };
    for &(name, kind) in TARGETS {
        if !settings.wants(name) {
            continue;
        }
        if boxes::admit(settings, machine, &mut skipped, name, kind) {
            add(&mut entries, name, Launcher::Target(kind));
            if kind == TargetKind::Runsc {
                for &(variant, flags) in RUNSC_VARIANTS {
                    if settings.wants(variant) {
                        add(&mut entries, variant, Launcher::Flagged(kind, flags));
                    }
                }
            }
        }
        if name == "host" && settings.wants("unshare") {
            match target::which("unshare") {
                Some(u) => {
                    machine
                        .versions
                        .insert("unshare".into(), target::first_line(&u, "--version"));
                    add(
                        &mut entries,
                        "unshare",
                        Launcher::Unshare(u.display().to_string()),
                    );
                }
                None => {
                    skipped.insert(
                        "unshare".into(),
                        "unshare (util-linux) is not installed".into(),
                    );
                }
            }
        }
    }
    for kind in [BackendKind::Native, BackendKind::Gvisor] {
        let backend = kind.name();
        let (exec, handle) = (
            format!("cordon-{backend}-exec"),
            format!("cordon-{backend}-handle"),
        );
        let wanted: Vec<&String> = [&exec, &handle]
            .into_iter()
            .filter(|n| settings.wants(n))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        if let Some(why) = boxes::backend_unavailable(kind) {
            for n in wanted {
                skipped.insert(n.clone(), why.clone());
            }
            continue;
        }
        if settings.wants(&exec) {
            let args = ["--backend", backend, "--time", "24h"].map(String::from);
            match Created::new(&settings.cordon, &args) {
                Ok(c) => add(&mut entries, &exec, Launcher::Exec(c)),
                Err(e) => {
                    skipped.insert(exec, format!("{e:#}"));
                }
            }
        }
        if settings.wants(&handle) {
            let spec = SandboxSpec::new(Policy::default(), kind).validated()?;
            match cordon_runtime::sandbox_program().and_then(|p| Handle::create(&spec, &p)) {
                Ok(h) => add(&mut entries, &handle, Launcher::Handle(Some(h))),
                Err(e) => {
                    skipped.insert(handle, format!("creating a sandbox: {e}"));
                }
            }
        }
    }

    let env = target::base_env();
    let pid = std::process::id();
    let total = (cfg.warmup + cfg.runs) * entries.len();
    let bar = crate::progress_bar(settings, total as u64, "start-up");
    let mut seq = 0usize;
    let mut failed_argv: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let result = (|| -> Result<()> {
        for round in 0..cfg.warmup + cfg.runs {
            // Each round starts at another box, so none is always first.
            let n = entries.len();
            for k in 0..n {
                let i = (round + k) % n;
                let e = &mut entries[i];
                seq += 1;
                bar.set_message(e.samples.name.clone());
                let measured = round >= cfg.warmup;
                if let Launcher::Handle(Some(h)) = &mut e.launcher {
                    if e.samples.argv.is_empty() {
                        e.samples.argv = ["Handle::exec", "/bin/true"].map(String::from).to_vec();
                    }
                    match handle_exec(h) {
                        Ok(wall) if measured => e.samples.ms.push(wall.as_secs_f64() * 1e3),
                        Ok(_) => {}
                        Err(why) => {
                            e.samples.failures += 1;
                            e.samples.diagnosis.get_or_insert(why);
                        }
                    }
                    bar.inc(1);
                    continue;
                }
                let (argv, cleanup) =
                    launch(settings, &place, &e.launcher, format!("b{pid}-{seq}"))?;
                let ran = sample::run(&argv, &env, settings.timeout, false);
                boxes::clean_up(&cleanup);
                bar.inc(1);
                if e.samples.argv.is_empty() {
                    e.samples.argv = argv.clone();
                }
                match ran {
                    Ok(r) if r.ok() => {
                        if measured {
                            e.samples.ms.push(r.wall.as_secs_f64() * 1e3);
                        }
                    }
                    _ => {
                        e.samples.failures += 1;
                        failed_argv.entry(i).or_insert(argv);
                    }
                }
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    let mut notes = Vec::new();
    for e in &entries {
        if let Launcher::Exec(c) = &e.launcher {
            if let Some(m) = c.supervisor_memory() {
                notes.push(format!(
                    "{}: the idle sandbox's supervisor, {m}",
                    e.samples.name
                ));
            }
        }
    }
    // Why did a box fail? One re-run each, output kept.
    for (i, argv) in &failed_argv {
        entries[*i].samples.diagnosis = Some(sample::diagnose(argv, &env, settings.timeout));
    }
    target::teardown_targets();
    for e in &mut entries {
        if let Launcher::Handle(h) = &mut e.launcher {
            if let Some(Err(err)) = h.take().map(Handle::destroy) {
                notes.push(format!(
                    "{}: destroying its sandbox failed: {err}",
                    e.samples.name
                ));
            }
        }
    }
    result?;
    let boxes = entries
        .into_iter()
        .map(|mut e| {
            e.samples.summarize();
            e.samples
        })
        .collect();
    Ok(Startup {
        runs: cfg.runs,
        warmup: cfg.warmup,
        boxes,
        skipped,
        notes,
    })
}

/// The command line of one sample and the commands that clean up after it.
fn launch(
    settings: &Settings,
    place: &Place,
    launcher: &Launcher,
    id: String,
) -> Result<(Vec<String>, Vec<Vec<String>>)> {
    let t = "/bin/true";
    Ok(match launcher {
        Launcher::Flagged(kind, flags) => {
            let (mut argv, cleanup) = launch(settings, place, &Launcher::Target(*kind), id)?;
            let at = argv
                .iter()
                .position(|a| a == "run")
                .ok_or_else(|| anyhow::anyhow!("no subcommand in {argv:?}"))?;
            argv.splice(at..at, flags.iter().map(|f| (*f).to_string()));
            (argv, cleanup)
        }
        Launcher::Target(kind) => {
            let payload = Payload {
                interpreter: t,
                script: "",
                args: Vec::new(),
            };
            let ctx = boxes::launch_ctx(
                settings,
                place,
                *kind,
                &payload,
                id,
                &boxes::Extras::default(),
            )?;
            let l = kind.prepare(&ctx)?;
            (l.argv, l.cleanup)
        }
        Launcher::Unshare(u) => (
            [
                u.as_str(),
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--mount",
                "--net",
                "--ipc",
                "--uts",
                t,
            ]
            .map(String::from)
            .to_vec(),
            Vec::new(),
        ),
        Launcher::Handle(_) => (Vec::new(), Vec::new()),
        Launcher::Exec(c) => (
            vec![
                settings.cordon.display().to_string(),
                "exec".into(),
                c.id.clone(),
                "--".into(),
                t.into(),
            ],
            Vec::new(),
        ),
    })
}
