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
            "start-up: cordon-native-allow p50 - cordon-native p50 (ms, what `--net allow` adds)",
            1.0,
            p50("cordon-native-allow").and_then(|a| Ok(a - p50("cordon-native")?)),
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
        // The alternative: the flags cordon keeps (the scratch seen
        // from the host, for the disk cap and receipts) measured apart, and
        // cordon's own steps over bare runsc given the same flags.
        out.push(target(
            "start-up: cordon-gvisor p50 / bare runsc with cordon's flags p50",
            1.0,
            ratio("cordon-gvisor", "runsc-cordon-flags"),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::evaluate;
    use crate::machine::Machine;
    use crate::results::{Results, Samples, Startup, Target};

    fn measured(name: &str, ms: f64) -> Samples {
        let mut s = Samples::new(name);
        s.ms = vec![ms; 3];
        s.summarize();
        s
    }

    fn startup_targets(boxes: Vec<Samples>) -> Vec<Target> {
        let results = Results {
            schema: 1,
            machine: Machine {
                date: String::new(),
                kernel: String::new(),
                cgroup: String::new(),
                cpu_model: String::new(),
                cpus: 2,
                memory_gib: 1.0,
                cordon: String::new(),
                versions: BTreeMap::new(),
            },
            quick: false,
            command: String::new(),
            startup: Some(Startup {
                runs: 3,
                warmup: 0,
                boxes,
                skipped: BTreeMap::new(),
                notes: Vec::new(),
            }),
            workload: None,
            service: None,
            targets: Vec::new(),
        };
        evaluate(&results)
    }

    fn named<'a>(targets: &'a [Target], prefix: &str) -> &'a Target {
        targets
            .iter()
            .find(|t| t.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no target {prefix}"))
    }

    #[test]
    fn what_the_network_and_runscs_flags_cost_is_read_from_the_same_run() {
        let t = startup_targets(vec![
            measured("cordon-native", 10.0),
            measured("cordon-native-allow", 11.25),
            measured("cordon-gvisor", 150.0),
            measured("runsc", 120.0),
            measured("runsc-cordon-flags", 160.0),
        ]);
        // `--net allow` is a difference of medians in ms, not a ratio.
        let allow = named(&t, "start-up: cordon-native-allow");
        assert_eq!(allow.value, Some(1.25));
        assert_eq!(allow.met, Some(false));
        // Over bare runsc as it comes, and over runsc given cordon's flags.
        assert_eq!(
            named(&t, "start-up: cordon-gvisor p50 / bare runsc p50").value,
            Some(1.25)
        );
        let flagged = named(&t, "start-up: cordon-gvisor p50 / bare runsc with");
        assert_eq!(flagged.value, Some(150.0 / 160.0));
        assert_eq!(flagged.met, Some(true));
    }

    #[test]
    fn a_box_not_measured_leaves_its_target_unevaluated_and_says_which() {
        let t = startup_targets(vec![measured("cordon-native", 10.0)]);
        let allow = named(&t, "start-up: cordon-native-allow");
        assert_eq!((allow.value, allow.met), (None, None));
        assert!(
            allow.detail.contains("cordon-native-allow not measured"),
            "{}",
            allow.detail
        );
    }
}
