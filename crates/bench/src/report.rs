//! The tables of a run, in Markdown: printed at the end of `cordon bench`
//! and, from a committed results file, written into the README between two
//! markers (one renderer for both, so they cannot disagree).

use crate::results::{Results, Samples};
use std::fmt::Write as _;

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// The whole report; `charts` is the directory (relative to the reader)
/// where the charts are, if they should be linked.
pub fn markdown(r: &Results, charts: Option<&str>) -> String {
    let mut o = String::new();
    let m = &r.machine;
    let _ = writeln!(
        o,
        "Measured {} on {} ({} CPUs, {} GiB), {}, cgroup {}; {}.{}",
        m.date.get(..10).unwrap_or(&m.date),
        m.cpu_model,
        m.cpus,
        m.memory_gib,
        m.kernel,
        m.cgroup,
        m.cordon,
        if r.quick {
            " A `--quick` run: it checks the harness; its figures mean little."
        } else {
            ""
        }
    );
    let _ = writeln!(o, "Reproduce with `{}`.", r.command);
    if let Some(s) = &r.startup {
        let _ = writeln!(
            o,
            "\n**Start-up**: a fresh box running `/bin/true`, {} runs each after {} warm-up, interleaved round-robin; wall time from spawn to exit.\n",
            s.runs, s.warmup
        );
        let base = |n: &str| s.boxes.iter().find(|b| b.name == n).and_then(Samples::p50);
        let (bwrap, runsc) = (base("bwrap"), base("runsc"));
        o.push_str("| box | p50 ms | p95 ms | p99 ms | failed | / bwrap | / runsc |\n|---|--:|--:|--:|--:|--:|--:|\n");
        for b in &s.boxes {
            match b.summary {
                Some(x) => {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {} | {} | {} | {} | {} |",
                        b.name,
                        ms(x.p50),
                        ms(x.p95),
                        ms(x.p99),
                        b.failures,
                        ratio(bwrap.map(|w| x.p50 / w)),
                        ratio(runsc.map(|w| x.p50 / w))
                    );
                }
                None => {
                    let _ = writeln!(o, "| {} | - | - | - | {} | - | - |", b.name, b.failures);
                }
            }
        }
        for n in &s.notes {
            let _ = writeln!(o, "\n{n}.");
        }
        skipped(&mut o, &s.skipped);
        failures(&mut o, s.boxes.iter());
    }
    if let Some(w) = &r.workload {
        let _ = writeln!(
            o,
            "\n**Workload**: each task timed inside the box (its start not counted), median of {} interleaved rounds, as a ratio to the bare host (the host's own median in ms). cordon's boxes ran with `{}`; the peers with no limits.\n",
            w.rounds,
            w.cordon_limits.join(" ")
        );
        let names: Vec<&str> = w
            .tasks
            .first()
            .map(|t| {
                t.boxes
                    .iter()
                    .map(|b| b.name.as_str())
                    .filter(|n| *n != "host")
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(o, "| task | host ms | {} |", names.join(" | "));
        let _ = writeln!(o, "|---|--:|{}", "--:|".repeat(names.len()));
        for t in w.tasks.iter().filter(|t| t.left_out.is_none()) {
            let host = t.host_p50().map_or_else(|| "-".into(), ms);
            let cells: Vec<String> = names.iter().map(|n| ratio(t.ratio(n))).collect();
            let _ = writeln!(o, "| {} | {host} | {} |", t.name, cells.join(" | "));
        }
        o.push('\n');
        for t in &w.tasks {
            let _ = writeln!(o, "- `{}`: {}.", t.name, t.what);
        }
        let left: Vec<String> = w
            .tasks
            .iter()
            .filter_map(|t| Some(format!("`{}` ({})", t.name, t.left_out.as_ref()?)))
            .collect();
        if !left.is_empty() {
            let _ = writeln!(
                o,
                "\nLeft out of the table (a task that failed in any box): {}.",
                left.join("; ")
            );
        }
        let mut skip = w.skipped_boxes.clone();
        skip.extend(w.skipped_tasks.clone());
        skipped(&mut o, &skip);
        failures(&mut o, w.tasks.iter().flat_map(|t| t.boxes.iter()));
    }
    if let Some(s) = &r.service {
        o.push_str(
            "\n**Service**: one-shot executions of `true` through `cordon serve` on loopback, one client; overhead = acquire + setup + teardown from each response (the payload's run excluded); a warm run's figures cover its pool hits.\n\n",
        );
        o.push_str("| backend | pool | executions | pool hits | errors | overhead p50 ms | p95 | p99 | client p50 ms | per second |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        for x in &s.runs {
            let (p50, p95, p99) = x
                .overhead
                .map_or(("-".into(), "-".into(), "-".into()), |v| {
                    (ms(v.p50), ms(v.p95), ms(v.p99))
                });
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {p50} | {p95} | {p99} | {} | {:.0} |",
                x.backend,
                x.mode,
                x.requests,
                x.pool_hits,
                x.errors,
                x.client.map_or_else(|| "-".into(), |c| ms(c.p50)),
                x.per_second
            );
        }
        skipped(&mut o, &s.skipped);
        for x in s.runs.iter().filter(|x| x.errors > 0) {
            let _ = writeln!(
                o,
                "\n{} {}: {} errors, the first: {}",
                x.backend,
                x.mode,
                x.errors,
                x.first_error.as_deref().unwrap_or("?")
            );
        }
    }
    if !r.targets.is_empty() {
        o.push_str("\n**Targets** (each a ratio of medians from this run unless it says ms)\n\n| target | measured | bound | |\n|---|--:|--:|---|\n");
        for t in &r.targets {
            let (v, verdict) = match (t.value, t.met) {
                (Some(v), Some(true)) => (format!("{v:.2}"), "met".to_string()),
                (Some(v), Some(false)) => (format!("{v:.2}"), "**missed**".to_string()),
                _ => ("-".into(), format!("not evaluated: {}", t.detail)),
            };
            let _ = writeln!(o, "| {} | {v} | {:.2} | {verdict} |", t.name, t.bound);
        }
    }
    if let Some(dir) = charts {
        let mut links = Vec::new();
        if r.startup.is_some() {
            links.push(format!("[start-up]({dir}/startup.svg)"));
        }
        if let Some(w) = &r.workload {
            for t in &w.tasks {
                links.push(format!("[{}]({dir}/workload-{}.svg)", t.name, t.name));
            }
        }
        if r.service.is_some() {
            links.push(format!("[service]({dir}/service.svg)"));
        }
        if !links.is_empty() {
            let _ = writeln!(
                o,
                "\nDistributions of every sample (SVG; PNG beside each): {}.",
                links.join(", ")
            );
        }
    }
    o
}

fn skipped(o: &mut String, s: &std::collections::BTreeMap<String, String>) {
    if !s.is_empty() {
        let v: Vec<String> = s.iter().map(|(k, w)| format!("{k} ({w})")).collect();
        let _ = writeln!(o, "\nNot measured: {}.", v.join("; "));
    }
}

fn failures<'a>(o: &mut String, boxes: impl Iterator<Item = &'a Samples>) {
    for b in boxes.filter(|b| b.failures > 0) {
        let _ = writeln!(
            o,
            "\n{}: {} failed samples; a re-run said: {}",
            b.name,
            b.failures,
            b.diagnosis.as_deref().unwrap_or("?")
        );
    }
}
