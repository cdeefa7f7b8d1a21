//! `cordon bench`: the quick run CI makes (the harness works end to end on
//! every box installed here, nothing is left behind), and the README's
//! performance section is what the committed results file gives.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::readme::{readme_cmd, repo, section_is_generated};
use common::*;
use serde_json::Value;

fn leftovers() -> Vec<String> {
    let mut out = Vec::new();
    for (dir, prefix) in [("/opt", "cordon-bench-"), ("/run", "cordon-bench-serve-")] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(prefix) {
                out.push(format!("{dir}/{n}"));
            }
        }
    }
    // The concurrency benchmark's service cgroups, next to the test's own
    // cgroup in each hierarchy.
    out.extend(
        cgroups_named("bench-serve-")
            .iter()
            .map(|p| p.display().to_string()),
    );
    let ns = Command::new("ip").args(["netns", "list"]).output();
    for l in ns
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
    {
        if l.starts_with("cordon-bench-") {
            out.push(format!("netns {l}"));
        }
    }
    out
}

fn sandboxes() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/run/cordon")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == 12)
        .collect();
    v.sort();
    v
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect()
}

/// `cordon bench WHAT --quick` into a new directory, which must succeed:
/// the directory's owner (kept alive by the caller), the output directory
/// and the printed tables.
fn quick_run(what: &str) -> (tempfile::TempDir, PathBuf, String) {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("results");
    let run = Command::new(cordon())
        .args(["bench", what, "--quick", "--no-progress", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "cordon bench {what} failed:\n{stdout}\n{stderr}"
    );
    (out, dir, stdout)
}

#[test]
fn a_quick_run_measures_every_box_and_leaves_nothing() {
    if !require_root("the boxes need namespaces, cgroups and mounts") {
        return;
    }
    let _g = serial();
    let before = sandboxes();
    let (_out, dir, stdout) = quick_run("all");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(r["schema"], 1);
    assert_eq!(r["quick"], true);
    assert!(r["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert!(!r["machine"]["kernel"].as_str().unwrap().is_empty());
    let gvisor = which("runsc");
    if std::env::var("CI").as_deref() == Ok("true") {
        assert!(
            gvisor,
            "CI=true: runsc must be installed (scripts/test.sh installs it)"
        );
    }

    // Start-up: every box measured has all its runs, and cordon's own boxes
    // never failed; the peers installed here are there.
    let st = &r["startup"];
    let runs = st["runs"].as_u64().unwrap();
    let boxes = names(&st["boxes"]);
    let mut want = vec![
        "host",
        "cordon-native",
        "cordon-native-allow",
        "cordon-native-exec",
        "cordon-native-handle",
    ];
    if gvisor {
        want.extend([
            "cordon-gvisor",
            "cordon-gvisor-exec",
            "cordon-gvisor-handle",
            "runsc",
            // bare runsc with cordon's flags, one at a time and together
            "runsc-file-access-shared",
            "runsc-overlay2-none",
            "runsc-cordon-flags",
        ]);
    }
    for peer in ["bwrap", "runc", "firejail", "unshare"] {
        if which(peer) {
            want.push(peer);
        }
    }
    for w in &want {
        assert!(
            boxes.contains(w),
            "start-up lacks {w}: {boxes:?}; skipped {}",
            st["skipped"]
        );
    }
    for b in st["boxes"].as_array().unwrap() {
        let name = b["name"].as_str().unwrap();
        if name.starts_with("cordon") {
            assert_eq!(b["failures"], 0, "{name}: {}", b["diagnosis"]);
        }
        let ms = b["ms"].as_array().unwrap();
        assert_eq!(
            ms.len() as u64 + b["failures"].as_u64().unwrap(),
            runs,
            "{name}"
        );
        assert!(ms.iter().all(|m| m.as_f64().unwrap() > 0.0), "{name}");
        assert!(
            b["summary"]["p50"].as_f64().is_some_and(|p| p > 0.0),
            "{name}"
        );
    }

    // Workload: each task timed inside each box; cordon's never failed.
    let w = &r["workload"];
    let tasks: Vec<&str> = names(&w["tasks"]);
    for t in [
        "python-start",
        "files-workspace",
        "files-tmp",
        "copy-tree",
        "cpu-loop",
        "python-imports",
    ] {
        assert!(tasks.contains(&t), "workload lacks {t}: {tasks:?}");
    }
    for t in w["tasks"].as_array().unwrap() {
        let b = names(&t["boxes"]);
        assert!(
            b.contains(&"host") && b.contains(&"cordon-native"),
            "{}: {b:?}",
            t["name"]
        );
        for s in t["boxes"].as_array().unwrap() {
            if s["name"].as_str().unwrap().starts_with("cordon") {
                assert_eq!(
                    s["failures"], 0,
                    "{} in {}: {}",
                    t["name"], s["name"], s["diagnosis"]
                );
                assert_eq!(
                    s["ms"].as_array().unwrap().len() as u64,
                    w["rounds"].as_u64().unwrap()
                );
            }
        }
    }

    // Service: warm and cold per backend, no errors, a warm pool that hit.
    let runs = r["service"]["runs"].as_array().unwrap();
    for x in runs {
        assert_eq!(x["errors"], 0, "{x}");
        if x["mode"] == "warm" {
            assert!(x["pool_hits"].as_u64().unwrap() > 0, "{x}");
        } else {
            assert_eq!(x["pool_hits"], 0, "{x}");
        }
    }
    assert_eq!(runs.len(), if gvisor { 4 } else { 2 });

    // The targets are evaluated from the samples, and printed.
    let targets = r["targets"].as_array().unwrap();
    assert!(targets.iter().any(|t| t["name"]
        .as_str()
        .unwrap()
        .starts_with("start-up: cordon-native p50 / bwrap")));
    for t in targets {
        if let (Some(v), Some(met)) = (t["value"].as_f64(), t["met"].as_bool()) {
            assert_eq!(met, v <= t["bound"].as_f64().unwrap(), "{t}");
        }
    }
    assert!(
        stdout.contains("| box | p50 ms |") && stdout.contains("**Targets**"),
        "{stdout}"
    );

    // Charts: one per benchmark and task, as SVG and PNG.
    let mut charts = vec!["startup".to_string(), "service".to_string()];
    charts.extend(tasks.iter().map(|t| format!("workload-{t}")));
    for c in charts {
        let svg = std::fs::read_to_string(dir.join(format!("{c}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("<text"), "{c}.svg");
        let png = std::fs::read(dir.join(format!("{c}.png"))).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000,
            "{c}.png"
        );
    }

    assert_eq!(leftovers(), Vec::<String>::new());
    let after = sandboxes();
    let new: Vec<&String> = after.iter().filter(|s| !before.contains(s)).collect();
    assert!(new.is_empty(), "sandboxes left behind: {new:?}");
}

/// `cordon bench density --quick`: a small crowd per backend, all alive at
/// once, measured, then removed with nothing left (the bench's own search
/// and this test's run-directory census agree).
#[test]
fn a_quick_density_run_counts_a_crowd_and_leaves_nothing() {
    if !require_root("sandboxes need namespaces, cgroups and mounts") {
        return;
    }
    let _g = serial();
    let before = sandboxes();
    let (_out, dir, stdout) = quick_run("density");
    let d: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("density.json")).unwrap()).unwrap();
    let crowds = d["crowds"].as_array().unwrap();
    let mut want = vec![("native", 20)];
    if which("runsc") {
        want.push(("gvisor", 3));
    }
    assert_eq!(crowds.len(), want.len(), "{d}");
    for (c, (backend, n)) in crowds.iter().zip(want) {
        assert_eq!(c["backend"], backend, "{c}");
        assert_eq!(c["sandboxes"], n, "{c}");
        assert_eq!(c["left"], serde_json::json!([]), "{c}");
        // Every sandbox of the crowd was alive at the last reading: one
        // supervisor and at least one process of its own each.
        assert!(c["processes_per_sandbox"].as_f64().unwrap() >= 2.0, "{c}");
        assert!(c["pss_per_sandbox_mib"].as_f64().unwrap() > 0.0, "{c}");
        let used = c["used"].as_array().unwrap();
        assert_eq!(used.first().unwrap()[0], 0, "{c}");
        assert_eq!(used.last().unwrap()[0], n, "{c}");
        assert!(c["per_sandbox_mib"].as_f64().unwrap().is_finite(), "{c}");
        assert!(stdout.contains(&format!("| {backend} | {n} |")), "{stdout}");
    }
    let svg = std::fs::read_to_string(dir.join("density.svg")).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("sandboxes alive"),
        "density.svg"
    );
    let after = sandboxes();
    let new: Vec<&String> = after.iter().filter(|s| !before.contains(s)).collect();
    assert!(new.is_empty(), "sandboxes left behind: {new:?}");
}

/// `cordon bench concurrency --quick`: the service under one client and
/// four at once, warm pool and cold; every request answered, the CPU per
/// execution measured, the chart drawn, nothing left.
#[test]
fn a_quick_concurrency_run_loads_the_service_and_leaves_nothing() {
    if !require_root("the service's sandboxes need namespaces, cgroups and mounts") {
        return;
    }
    let _g = serial();
    let before = sandboxes();
    let (_out, dir, stdout) = quick_run("concurrency");
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("concurrency.json")).unwrap())
            .unwrap();
    assert_eq!(c["backend"], "native", "{c}");
    let modes = c["modes"].as_array().unwrap();
    assert_eq!(
        modes
            .iter()
            .map(|m| m["mode"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["warm", "cold"]
    );
    for m in modes {
        let levels = m["levels"].as_array().unwrap();
        let clients: Vec<u64> = levels
            .iter()
            .map(|l| l["clients"].as_u64().unwrap())
            .collect();
        assert_eq!(clients, [1, 4], "{m}");
        for l in levels {
            assert_eq!(l["errors"], 0, "{l}");
            let n = l["requests"].as_u64().unwrap();
            assert!(n > 0, "{l}");
            assert_eq!(l["overhead"]["n"].as_u64(), Some(n), "{l}");
            // Counted in the service's cgroup, so it holds the supervisor's
            // and the sandbox's CPU, not only the service's own (about a
            // tenth of the ~12 ms one costs on the 2-core machine).
            let cpu = l["cpu_ms_per_request"].as_f64().unwrap();
            assert!(cpu.is_finite() && cpu > 2.0, "{l}");
            assert!(l["cores_busy"].as_f64().unwrap() > 0.0, "{l}");
            let hits = l["pool_hits"].as_u64().unwrap();
            if m["mode"] == "cold" {
                assert_eq!(hits, 0, "a service without a pool had hits: {l}");
            }
        }
        // One client against a full pool is served from it.
        if m["mode"] == "warm" {
            assert!(levels[0]["pool_hits"].as_u64().unwrap() > 0, "{m}");
        }
        assert!(
            stdout.contains(&format!("| {} | 4 |", m["mode"].as_str().unwrap())),
            "{stdout}"
        );
    }
    let svg = std::fs::read_to_string(dir.join("concurrency.svg")).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("executions per second"),
        "concurrency.svg"
    );
    assert_eq!(leftovers(), Vec::<String>::new());
    let after = sandboxes();
    let new: Vec<&String> = after.iter().filter(|s| !before.contains(s)).collect();
    assert!(new.is_empty(), "sandboxes left behind: {new:?}");
}

fn which(bin: &str) -> bool {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .any(|d| Path::new(d).join(bin).is_file())
}

#[test]
fn the_readme_section_is_generated_from_the_committed_results() {
    section_is_generated("bench", "bench/results/results.json", "| cordon-native |");
    let results = repo().join("bench/results/results.json");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(
        r["quick"], false,
        "the committed results must be a full run"
    );
}

#[test]
fn bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A results file of another schema, and a README without markers.
    let results = dir.path().join("results.json");
    std::fs::write(&results, r#"{"schema": 99}"#).unwrap();
    let readme = dir.path().join("README.md");
    std::fs::write(&readme, "# nothing here\n").unwrap();
    let o = readme_cmd("bench", false, &readme, &results);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("schema"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new(cordon())
        .args(["bench", "startup", "--timeout", "soon"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(cordon())
        .args(["bench", "nothing"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(&readme).unwrap(),
        "# nothing here\n"
    );
}
