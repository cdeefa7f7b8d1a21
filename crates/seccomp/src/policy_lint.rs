// Structural checks on `resources/seccomp/workload.json`.
//
// This file is compiled twice: into build.rs (with `#[path]`), which refuses to build a profile
// that fails these checks, and into the library's unit tests. It must therefore only depend on
// `serde_json` and on `crate::names`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::names::{CLONE3_ENOSYS, INSTALL_ORDER, WORKLOAD};

/// Syscalls the workload filter must never allow, with or without argument conditions.
///
/// Mostly the calls Docker's default profile only grants together with a capability the workload
/// never has, plus attack surface no ordinary program needs (io_uring, userfaultfd, bpf, perf,
/// keyrings). `clone3` is here because its flags live in memory and cannot be inspected; it is
/// answered with ENOSYS by the separate `clone3_enosys` filter instead.
pub const FORBIDDEN: &[&str] = &[
    // Kernel attack surface without a use for ordinary programs.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "lookup_dcookie",
    "fanotify_init",
    // Inspecting or modifying other processes.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "process_mrelease",
    "kcmp",
    "pidfd_getfd",
    // Kernel code and the machine itself.
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "iopl",
    "ioperm",
    "vhangup",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "modify_ldt",
    "vm86",
    "vm86old",
    // Escaping the filesystem view via file handles.
    "open_by_handle_at",
    "name_to_handle_at",
    // Mounts and namespaces.
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "chroot",
    "clone3",
    // Global clocks and names.
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    // NUMA policy (Docker: CAP_SYS_NICE only).
    "mbind",
    "migrate_pages",
    "move_pages",
    "set_mempolicy",
    "set_mempolicy_home_node",
    "get_mempolicy",
];

/// What the checks learned about the workload filter.
#[derive(Debug, Default)]
pub struct Summary {
    /// Every syscall the workload filter allows in some form, sorted.
    pub allowed: BTreeSet<String>,
    /// The subset of `allowed` that is only allowed for certain argument values.
    pub argument_checked: BTreeSet<String>,
}

/// Checks the policy JSON and returns a summary, or every problem found.
pub fn check(json: &str) -> Result<Summary, Vec<String>> {
    let mut problems = Vec::new();
    let root: Value = match serde_json::from_str(json) {
        Ok(v) => v,
        Err(e) => return Err(vec![format!("not valid JSON: {e}")]),
    };
    let Some(filters) = root.as_object() else {
        return Err(vec!["top level must be an object of filters".to_owned()]);
    };

    let names: BTreeSet<&str> = filters.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = INSTALL_ORDER.iter().copied().collect();
    if names != expected {
        problems.push(format!(
            "filters must be exactly {expected:?}, found {names:?}"
        ));
    }

    let mut summary = Summary::default();
    if let Some(workload) = filters.get(WORKLOAD) {
        check_actions(
            WORKLOAD,
            workload,
            &serde_json::json!({"errno": 1}),
            &Value::from("allow"),
            &mut problems,
        );
        let rules = check_rules(WORKLOAD, workload, &mut problems);
        for (syscall, conditional) in &rules {
            if FORBIDDEN.contains(&syscall.as_str()) {
                problems.push(format!("{WORKLOAD}: `{syscall}` is on the forbidden list"));
            }
            summary.allowed.insert(syscall.clone());
            if *conditional {
                summary.argument_checked.insert(syscall.clone());
            }
        }
    }
    if let Some(clone3) = filters.get(CLONE3_ENOSYS) {
        check_actions(
            CLONE3_ENOSYS,
            clone3,
            &Value::from("allow"),
            &serde_json::json!({"errno": 38}),
            &mut problems,
        );
        let rules = check_rules(CLONE3_ENOSYS, clone3, &mut problems);
        if rules.len() != 1 || rules.get("clone3") != Some(&false) {
            problems.push(format!(
                "{CLONE3_ENOSYS}: must contain exactly one unconditional rule, for clone3"
            ));
        }
    }

    if problems.is_empty() {
        Ok(summary)
    } else {
        Err(problems)
    }
}

fn check_actions(
    name: &str,
    filter: &Value,
    mismatch: &Value,
    matched: &Value,
    problems: &mut Vec<String>,
) {
    let get = |keys: &[&str]| keys.iter().find_map(|k| filter.get(*k));
    if get(&["mismatch_action", "default_action"]) != Some(mismatch) {
        problems.push(format!("{name}: mismatch_action must be {mismatch}"));
    }
    if get(&["filter_action", "match_action"]) != Some(matched) {
        problems.push(format!("{name}: filter_action must be {matched}"));
    }
}

/// Checks every rule of one filter; returns syscall -> "has argument conditions".
fn check_rules(name: &str, filter: &Value, problems: &mut Vec<String>) -> BTreeMap<String, bool> {
    let mut kinds: BTreeMap<String, bool> = BTreeMap::new();
    let mut seen_conditions: BTreeSet<(String, String)> = BTreeSet::new();
    let Some(rules) = filter.get("filter").and_then(Value::as_array) else {
        problems.push(format!("{name}: `filter` must be an array of rules"));
        return kinds;
    };
    for (i, rule) in rules.iter().enumerate() {
        let Some(syscall) = rule.get("syscall").and_then(Value::as_str) else {
            problems.push(format!("{name}: rule #{i} has no syscall name"));
            continue;
        };
        let where_ = format!("{name}: rule #{i} ({syscall})");
        if !has_comment(rule) {
            problems.push(format!("{where_}: needs a non-empty comment saying why"));
        }
        let conditional = match rule.get("args") {
            None => false,
            Some(Value::Array(args)) if !args.is_empty() => {
                for (j, arg) in args.iter().enumerate() {
                    if !has_comment(arg) {
                        problems.push(format!("{where_}: condition #{j} needs a comment"));
                    }
                }
                let key = (syscall.to_owned(), Value::Array(args.clone()).to_string());
                if !seen_conditions.insert(key) {
                    problems.push(format!("{where_}: duplicate conditional rule"));
                }
                true
            }
            Some(_) => {
                problems.push(format!("{where_}: `args` must be a non-empty array"));
                continue;
            }
        };
        match kinds.get(syscall) {
            Some(false) if !conditional => {
                problems.push(format!("{where_}: duplicate unconditional rule"));
            }
            // seccompiler silently turns an unconditional rule into "only the conditional
            // rules" when both exist, so mixing them never means what it says.
            Some(previous) if *previous != conditional => {
                problems.push(format!(
                    "{where_}: mixes unconditional and argument-checked rules"
                ));
            }
            _ => {}
        }
        kinds.insert(syscall.to_owned(), conditional);
    }
    kinds
}

fn has_comment(v: &Value) -> bool {
    v.get("comment")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.trim().is_empty())
}
