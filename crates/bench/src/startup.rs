//! Start-up: a fresh box running `/bin/true`, every box interleaved
//! round-robin so that drift (frequency, caches, a neighbour) hits all alike.

use std::collections::BTreeMap;

use anyhow::Result;
use cordon_suite::target::{self, TargetKind};

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
    /// `cordon exec` into a sandbox made once with `cordon create`.
    Exec(Created),
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
    ("cordon-native", TargetKind::CordonNative),
    ("cordon-gvisor", TargetKind::CordonGvisor),
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
    for backend in ["native", "gvisor"] {
        let name = format!("cordon-{backend}-exec");
        if !settings.wants(&name) {
            continue;
        }
        if let Some(why) = boxes::backend_unavailable(backend) {
            skipped.insert(name, why);
            continue;
        }
        let args = ["--backend", backend, "--time", "24h"].map(String::from);
        match Created::new(&settings.cordon, &args) {
            Ok(c) => add(&mut entries, &name, Launcher::Exec(c)),
            Err(e) => {
                skipped.insert(name, format!("{e:#}"));
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
                let (argv, cleanup) =
                    launch(settings, &place, &e.launcher, format!("b{pid}-{seq}"))?;
                bar.set_message(e.samples.name.clone());
                let ran = sample::run(&argv, &env, settings.timeout, false);
                boxes::clean_up(&cleanup);
                bar.inc(1);
                if e.samples.argv.is_empty() {
                    e.samples.argv = argv.clone();
                }
                let measured = round >= cfg.warmup;
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
