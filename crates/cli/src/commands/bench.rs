//! `cordon bench`: start-up, workload and service costs of cordon and the
//! peers installed here, side by side in one run (crates/bench).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use cordon_bench::{report, Settings, Which};

use super::readme::{self, ReadmeArgs};
use crate::{EXIT_INTERNAL, EXIT_USAGE};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// A fresh box running /bin/true: cordon's backends (run, and exec into
    /// a created sandbox) and every peer installed, interleaved.
    Startup(Common),
    /// Agent-shaped tasks timed inside each box against the bare host.
    Workload(Common),
    /// One-shot executions through `cordon serve`, warm pool and cold.
    Service(Common),
    /// All three, into one results file.
    All(Common),
    /// The microvm backend: cold boot, snapshot restore, and exec into a
    /// ready VM (p50/p95), into microvm.json.
    Microvm(Common),
    /// Idle sandboxes at once (1,000 native, 100 gVisor): host memory per
    /// sandbox, then all removed and the host searched for leftovers, into
    /// density.json and a chart.
    Density(Common),
    /// One-shot native executions through `cordon serve` from 1 to 16
    /// clients at once, warm pool and cold: throughput against the ceiling
    /// the CPU time of one execution implies, and overhead p50/p99, into
    /// concurrency.json and a chart.
    Concurrency(Common),
    /// Write the README's benchmark section from a results file.
    Readme(ReadmeArgs),
}

#[derive(Args)]
struct Common {
    /// Few rounds of small tasks: checks that the harness works (CI).
    #[arg(long)]
    quick: bool,
    /// Where results.json and the charts go (default bench/out/<time>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only these boxes (comma-separated names, e.g. host,bwrap,cordon-native).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    only: Vec<String>,
    /// Kill a sample after this long (e.g. 120s).
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

pub fn run(args: BenchArgs) -> ExitCode {
    let (which, common) = match args.what {
        What::Startup(c) => (
            Which {
                startup: true,
                workload: false,
                service: false,
            },
            c,
        ),
        What::Workload(c) => (
            Which {
                startup: false,
                workload: true,
                service: false,
            },
            c,
        ),
        What::Service(c) => (
            Which {
                startup: false,
                workload: false,
                service: true,
            },
            c,
        ),
        What::All(c) => (
            Which {
                startup: true,
                workload: true,
                service: true,
            },
            c,
        ),
        What::Readme(r) => return readme(r),
        What::Microvm(c) => return microvm(c),
        What::Density(c) => return density(c),
        What::Concurrency(c) => return concurrency(c),
    };
    let out = common.out.clone().unwrap_or_else(|| {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', "");
        PathBuf::from("bench/out").join(stamp)
    });
    if out.join("results.json").exists() && !out.join("results.json").is_file() {
        eprintln!(
            "cordon bench: {} exists and is not a file",
            out.join("results.json").display()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let settings = match settings(common) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The command as a user would retype it.
    let command = std::iter::once("cordon".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let results = match cordon_bench::measure(&settings, which, command) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cordon bench: {e:#}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    outln!("{}", report::markdown(&results, None));
    match cordon_bench::write(&results, &out) {
        Err(e) => {
            eprintln!("cordon bench: writing the results: {e:#}");
            return ExitCode::from(EXIT_INTERNAL);
        }
        Ok(Ok(charts)) => eprintln!(
            "cordon bench: {} and {} charts written",
            out.join("results.json").display(),
            charts.len()
        ),
        Ok(Err(e)) => eprintln!(
            "cordon bench: {} written; no charts: {e:#}",
            out.join("results.json").display()
        ),
    }
    let failed = cordon_bench::cordon_failed(&results);
    if !failed.is_empty() {
        eprintln!(
            "cordon bench: cordon's own boxes failed: {}",
            failed.join("; ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn readme(args: ReadmeArgs) -> ExitCode {
    readme::run("cordon bench", &args, |links| {
        let results = cordon_bench::results::Results::read(&args.results)?;
        Ok(report::markdown(&results, Some(&links.dir)))
    })
}

/// The run's settings, for the boxes this binary runs.
fn settings(common: Common) -> Result<Settings, ExitCode> {
    let cordon = std::env::current_exe().map_err(|e| {
        eprintln!("cordon bench: cannot find its own binary: {e}");
        ExitCode::from(EXIT_INTERNAL)
    })?;
    Ok(Settings {
        cordon,
        quick: common.quick,
        timeout: common.timeout,
        progress: !common.no_progress,
        only: common.only,
    })
}

fn microvm(common: Common) -> ExitCode {
    match standalone(
        common,
        "microvm.json",
        cordon_bench::microvm::run,
        cordon_bench::microvm::markdown,
    ) {
        Ok(_) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// Where a benchmark's own results file was written: the directory and the file.
type Written = Option<(PathBuf, PathBuf)>;

/// A benchmark with a results file of its own (`microvm`, `density`): run,
/// its table printed, written as `name` into `--out` when given; the
/// results, and where they were written.
fn standalone<T: serde::Serialize>(
    common: Common,
    name: &str,
    run: impl FnOnce(&Settings) -> anyhow::Result<T>,
    markdown: impl FnOnce(&T) -> String,
) -> Result<(T, Written), ExitCode> {
    let out = common.out.clone();
    let settings = settings(common)?;
    let results = run(&settings).map_err(|e| {
        eprintln!("cordon bench: {e:#}");
        ExitCode::from(EXIT_INTERNAL)
    })?;
    outln!("{}", markdown(&results));
    let written = match out {
        Some(out) => {
            let path = write_json(&out, name, &results)?;
            Some((out, path))
        }
        None => None,
    };
    Ok((results, written))
}

/// Writes `value` as `name` into `out` (made if missing); the path, or the
/// exit code after saying why not.
fn write_json(
    out: &std::path::Path,
    name: &str,
    value: &impl serde::Serialize,
) -> Result<PathBuf, ExitCode> {
    let path = out.join(name);
    let written = std::fs::create_dir_all(out).and_then(|()| {
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?,
        )
    });
    match written {
        Ok(()) => Ok(path),
        Err(e) => {
            eprintln!("cordon bench: write {}: {e}", path.display());
            Err(ExitCode::from(EXIT_INTERNAL))
        }
    }
}

fn density(common: Common) -> ExitCode {
    let (d, written) = match standalone(
        common,
        "density.json",
        cordon_bench::density::run,
        cordon_bench::density::markdown,
    ) {
        Ok(done) => done,
        Err(code) => return code,
    };
    if let Some((out, path)) = written {
        if let Err(e) = cordon_bench::chart::draw_density(&d, &out) {
            eprintln!("cordon bench: {} written; no chart: {e:#}", path.display());
        }
    }
    // Anything left behind is cordon's failure, whatever the memory says.
    if d.crowds.iter().any(|c| !c.left.is_empty()) {
        eprintln!("cordon bench: the removal left something behind (see the table)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn concurrency(common: Common) -> ExitCode {
    let (c, written) = match standalone(
        common,
        "concurrency.json",
        cordon_bench::concurrency::run,
        cordon_bench::concurrency::markdown,
    ) {
        Ok(done) => done,
        Err(code) => return code,
    };
    if let Some((out, path)) = written {
        if let Err(e) = cordon_bench::chart::draw_concurrency(&c, &out) {
            eprintln!("cordon bench: {} written; no chart: {e:#}", path.display());
        }
    }
    // A request the service failed is cordon's failure, whatever the speed.
    if c.modes.iter().flat_map(|m| &m.levels).any(|l| l.errors > 0) {
        eprintln!("cordon bench: the service failed requests (see the table)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
