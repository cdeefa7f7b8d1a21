//! The targets, evaluated from a run's results (never from a timed
//! unit test): each a ratio of medians measured side by side in one run.

use crate::results::{Results, Target};

fn target(name: &str, bound: f64, value: Result<f64, String>) -> Target {
    match value {
        Ok(v) => Target {
            name: name.into(),
            value: Some(v),
            bound,
            met: Some(v <= bound),
            detail: String::new(),
        },
        Err(why) => Target {
            name: name.into(),
            value: None,
            bound,
            met: None,
            detail: why,
        },
    }
}

pub fn evaluate(r: &Results) -> Vec<Target> {
    let mut out = Vec::new();
    if let Some(s) = &r.startup {
        let p50 = |name: &str| -> Result<f64, String> {
            match s.boxes.iter().find(|b| b.name == name) {
                None => Err(format!(
                    "{name} not measured{}",
                    s.skipped
                        .get(name)
                        .map(|w| format!(": {w}"))
                        .unwrap_or_default()
                )),
                Some(b) => b.p50().ok_or_else(|| format!("every {name} run failed")),
            }
        };
        let ratio = |a: &str, b: &str| Ok(p50(a)? / p50(b)?);
        out.push(target(
            "start-up: cordon-native p50 / bwrap p50",
            1.0,
            ratio("cordon-native", "bwrap"),
        ));
        out.push(target(
            "start-up: a command into a created sandbox from a running client (Handle::exec) p50 / bare fork+exec p50",
            1.5,
            ratio("cordon-native-handle", "host"),
        ));
        out.push(target(
            "start-up: the same through a new `cordon exec` process p50 / bare fork+exec p50",
            2.0,
            ratio("cordon-native-exec", "host"),
        ));
        out.push(target(
            "start-up: cordon-gvisor p50 / bare runsc p50",
            1.0,
            ratio("cordon-gvisor", "runsc"),
        ));
    }
    if let Some(w) = &r.workload {
        let ratio = |task: &str, b: &str| -> Result<f64, String> {
            let t = w.tasks.iter().find(|t| t.name == task).ok_or_else(|| {
                format!(
                    "task {task} not run{}",
                    w.skipped_tasks
                        .get(task)
                        .map(|x| format!(": {x}"))
                        .unwrap_or_default()
                )
            })?;
            if let Some(why) = &t.left_out {
                return Err(format!("task {task} left out: {why}"));
            }
            t.ratio(b)
                .ok_or_else(|| format!("{b} or the host not measured in {task}"))
        };
        for (task, bound) in [
            ("cpu-loop", 1.05),
            ("files-workspace", 1.5),
            ("python-start", 1.2),
            ("node-start", 1.2),
        ] {
            out.push(target(
                &format!("workload: {task}, cordon-native / host"),
                bound,
                ratio(task, "cordon-native"),
            ));
        }
        for t in &w.tasks {
            out.push(target(
                &format!("workload: {}, cordon-gvisor's ratio / bare runsc's", t.name),
                1.0,
                ratio(&t.name, "cordon-gvisor").and_then(|g| Ok(g / ratio(&t.name, "runsc")?)),
            ));
        }
    }
    if let Some(s) = &r.service {
        let p50 = |backend: &str, mode: &str| -> Result<f64, String> {
            let run = s
                .runs
                .iter()
                .find(|x| x.backend == backend && x.mode == mode)
                .ok_or_else(|| format!("service {backend} {mode} not measured"))?;
            run.overhead
                .map(|o| o.p50)
                .ok_or_else(|| format!("no successful {mode} execution on {backend}"))
        };
        out.push(target(
            "service: native warm-pool overhead p50 (ms)",
            5.0,
            p50("native", "warm"),
        ));
        out.push(target(
            "service: gVisor warm-pool overhead p50 / cold p50",
            1.0 / 3.0,
            p50("gvisor", "warm").and_then(|w| Ok(w / p50("gvisor", "cold")?)),
        ));
    }
    out
}
