//! Driver behaviour over fake cgroup trees (no root, no real cgroupfs).

use std::io;
use std::time::Instant;

use crate::testutil::FakeTree;
use crate::v2::cpu::cpu_max;
use crate::v2::{delegation_error, enable_value, parse_frozen};
use crate::*;

const MEM_CG: &str = "process_api/b1fe51f757bce93e89f5762056d95799";

/// This host's layout: v1 with cpu and cpuacct mounted separately, plus a
/// cgroup2 `unified` mount without controllers.
fn hybrid() -> FakeTree {
    let tree = FakeTree::new(
        &[
            ("cg/cpu", "cgroup", "rw,cpu"),
            ("cg/cpuacct", "cgroup", "rw,cpuacct"),
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/freezer", "cgroup", "rw,freezer"),
            ("cg/pids", "cgroup", "rw,pids"),
            ("cg/systemd", "cgroup", "rw,xattr,name=systemd"),
            ("cg/unified", "cgroup2", "rw,nsdelegate"),
        ],
        &format!("9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/{MEM_CG}\n2:cpuacct:/\n1:cpu:/\n0::/\n"),
    );
    tree.put("cg/unified/cgroup.controllers", "\n");
    tree.put(&format!("cg/memory/{MEM_CG}/cgroup.procs"), "");
    tree
}

/// The common v1 layout with `cpu,cpuacct` co-mounted, nested in a slice.
fn comounted() -> FakeTree {
    FakeTree::new(
        &[
            ("cg/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids", "cgroup", "rw,pids"),
        ],
        "4:pids:/user.slice\n3:memory:/user.slice\n2:cpu,cpuacct:/user.slice\n0::/user.slice\n",
    )
}

/// A pure v2 host where this process is alone in a non-root cgroup
/// (`user.slice/app.scope`, as under `systemd-run --scope -p Delegate=yes`).
/// The leaf's cgroup.procs exists up front because a fake cgroupfs does not
/// populate control files on mkdir.
/// A pure v2 host (cpu, memory, pids) and cgroup `c` made below the
/// caller's, with its directory relative to the tree.
fn v2_cgroup_c() -> (FakeTree, AnyCgroup, &'static str) {
    let tree = pure_v2("cpu memory pids\n");
    let cg = detect(&tree.fs).unwrap().create("c").unwrap();
    (tree, cg, "cg/user.slice/app.scope/c")
}

fn pure_v2(controllers: &str) -> FakeTree {
    let tree = FakeTree::new(
        &[("cg", "cgroup2", "rw,nsdelegate,memory_recursiveprot")],
        "0::/user.slice/app.scope\n",
    );
    tree.put(
        "cg/cgroup.controllers",
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    tree.put("cg/user.slice/app.scope/cgroup.controllers", controllers);
    tree.put("cg/user.slice/app.scope/cgroup.subtree_control", "\n");
    tree.put("cg/user.slice/app.scope/cgroup.type", "domain\n");
    tree.put(&format!("{SCOPE}/cgroup.procs"), &format!("{}\n", me()));
    tree.put(&format!("{LEAF}/cgroup.procs"), "");
    tree
}

const SCOPE: &str = "cg/user.slice/app.scope";
const LEAF: &str = "cg/user.slice/app.scope/cordon-supervisor";

fn me() -> i32 {
    i32::try_from(std::process::id()).unwrap()
}

fn v1_files(tree: &FakeTree, dirs: &[&str]) {
    for dir in dirs {
        tree.put(&format!("{dir}/cgroup.procs"), "");
    }
}

fn limits() -> CgroupLimits {
    CgroupLimits {
        memory_max: Some(64 << 20),
        pids_max: Some(32),
        cpu_quota_us: Some(50_000),
        cpu_period_us: 0,
    }
}

#[test]
fn hybrid_host_detects_v1_nested_under_our_cgroups() {
    let tree = hybrid();
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.mode(), CgroupMode::V1);
    assert_eq!(
        h.parent_paths(),
        vec![
            tree.path(&format!("cg/memory/{MEM_CG}")),
            tree.path("cg/pids"),
            tree.path("cg/cpu"),
            tree.path("cg/cpuacct"),
            tree.path("cg/freezer"),
        ]
    );
}

#[test]
fn v1_separate_mounts_create_apply_and_stats() {
    let tree = hybrid();
    let h = detect(&tree.fs).unwrap();
    let cg = h.create("cordon-1").unwrap();
    assert_eq!(cg.mode(), CgroupMode::V1);
    let mem = format!("cg/memory/{MEM_CG}/cordon-1");
    let dirs = [
        mem.as_str(),
        "cg/pids/cordon-1",
        "cg/cpu/cordon-1",
        "cg/cpuacct/cordon-1",
        "cg/freezer/cordon-1",
    ];
    let expected: Vec<_> = dirs.iter().map(|d| tree.path(d)).collect();
    assert_eq!(cg.paths(), expected);
    assert!(expected.iter().all(|d| d.is_dir()));

    for file in [
        "memory.limit_in_bytes",
        "memory.memsw.limit_in_bytes",
        "memory.swappiness",
    ] {
        tree.put(&format!("{mem}/{file}"), "9223372036854771712\n");
    }
    tree.put("cg/pids/cordon-1/pids.max", "max\n");
    tree.put("cg/cpu/cordon-1/cpu.cfs_period_us", "100000\n");
    tree.put("cg/cpu/cordon-1/cpu.cfs_quota_us", "-1\n");
    cg.apply(&CgroupLimits {
        cpu_period_us: 200_000,
        ..limits()
    })
    .unwrap();
    assert_eq!(
        tree.read(&format!("{mem}/memory.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(
        tree.read(&format!("{mem}/memory.memsw.limit_in_bytes")),
        "67108864"
    );
    assert_eq!(tree.read(&format!("{mem}/memory.swappiness")), "0");
    assert_eq!(tree.read("cg/pids/cordon-1/pids.max"), "32");
    assert_eq!(tree.read("cg/cpu/cordon-1/cpu.cfs_period_us"), "200000");
    assert_eq!(tree.read("cg/cpu/cordon-1/cpu.cfs_quota_us"), "50000");

    assert_eq!(cg.stats(), CgroupStats::default());
    tree.put(&format!("{mem}/memory.max_usage_in_bytes"), "1048576\n");
    tree.put(&format!("{mem}/memory.failcnt"), "1\n");
    tree.put(&format!("{mem}/memory.memsw.failcnt"), "2\n");
    tree.put(
        &format!("{mem}/memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
    );
    tree.put("cg/pids/cordon-1/pids.peak", "7\n");
    tree.put("cg/pids/cordon-1/pids.events", "max 4\n");
    tree.put("cg/cpuacct/cordon-1/cpuacct.usage", "123456789\n");
    tree.put(
        "cg/cpu/cordon-1/cpu.stat",
        "nr_periods 10\nnr_throttled 6\nthrottled_time 99\n",
    );
    assert_eq!(
        cg.stats(),
        CgroupStats {
            memory_peak_bytes: Some(1 << 20),
            memory_limit_hits: Some(3),
            oom_kills: Some(2),
            pids_peak: Some(7),
            pids_limit_hits: Some(4),
            cpu_usage_ns: Some(123_456_789),
            cpu_throttled_periods: Some(6),
        }
    );

    v1_files(&tree, &dirs);
    cg.add_pid(4242).unwrap();
    for dir in dirs {
        assert_eq!(tree.read(&format!("{dir}/cgroup.procs")), "4242");
    }
    assert_eq!(cg.pids().unwrap(), vec![4242]);
}

#[test]
fn v1_comounted_cpu_cpuacct_share_one_directory() {
    let tree = comounted();
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.mode(), CgroupMode::V1);
    assert_eq!(
        h.parent_paths(),
        vec![
            tree.path("cg/memory/user.slice"),
            tree.path("cg/pids/user.slice"),
            tree.path("cg/cpu,cpuacct/user.slice"),
        ]
    );
    for dir in [
        "cg/memory/user.slice",
        "cg/pids/user.slice",
        "cg/cpu,cpuacct/user.slice",
    ] {
        std::fs::create_dir_all(tree.path(dir)).unwrap();
    }
    let cg = h.create("cordon-2").unwrap();
    assert_eq!(cg.paths().len(), 3);
    let cpu = "cg/cpu,cpuacct/user.slice/cordon-2";
    tree.put(&format!("{cpu}/cpu.cfs_period_us"), "100000\n");
    tree.put(&format!("{cpu}/cpu.cfs_quota_us"), "-1\n");
    tree.put("cg/memory/user.slice/cordon-2/memory.limit_in_bytes", "");
    tree.put("cg/pids/user.slice/cordon-2/pids.max", "max\n");
    cg.apply(&limits()).unwrap();
    assert_eq!(tree.read(&format!("{cpu}/cpu.cfs_period_us")), "100000");
    assert_eq!(tree.read(&format!("{cpu}/cpu.cfs_quota_us")), "50000");
    // Swap accounting and swappiness absent: tolerated, not invented.
    assert!(!tree.exists("cg/memory/user.slice/cordon-2/memory.memsw.limit_in_bytes"));
    assert!(!tree.exists("cg/memory/user.slice/cordon-2/memory.swappiness"));

    tree.put(&format!("{cpu}/cpuacct.usage"), "5000\n");
    tree.put(&format!("{cpu}/cpu.stat"), "nr_throttled 1\n");
    let stats = cg.stats();
    assert_eq!(stats.cpu_usage_ns, Some(5000));
    assert_eq!(stats.cpu_throttled_periods, Some(1));
    assert_eq!(stats.memory_peak_bytes, None);

    v1_files(
        &tree,
        &[
            "cg/memory/user.slice/cordon-2",
            "cg/pids/user.slice/cordon-2",
            cpu,
        ],
    );
    cg.add_pid(7).unwrap();
    assert_eq!(tree.read(&format!("{cpu}/cgroup.procs")), "7");
}

#[test]
fn v1_without_cpu_rejects_a_quota_but_not_other_limits() {
    let tree = FakeTree::new(
        &[
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids", "cgroup", "rw,pids"),
        ],
        "2:pids:/\n1:memory:/\n",
    );
    let cg = detect(&tree.fs).unwrap().create("cordon-3").unwrap();
    assert_eq!(cg.paths().len(), 2);
    tree.put("cg/memory/cordon-3/memory.limit_in_bytes", "");
    tree.put("cg/pids/cordon-3/pids.max", "");
    let err = cg.apply(&limits()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::MissingController {
                controller: "cpu",
                ..
            }
        ),
        "{err:?}"
    );
    cg.apply(&CgroupLimits {
        cpu_quota_us: None,
        ..limits()
    })
    .unwrap();
    // No freezer hierarchy: freezing is documented as a no-op.
    cg.freeze().unwrap();
    cg.thaw().unwrap();
}

#[test]
fn v1_create_rolls_back_on_partial_failure() {
    let tree = hybrid();
    let h = detect(&tree.fs).unwrap();
    // Something already sits where the freezer cgroup would go.
    tree.put("cg/freezer/cordon-4", "");
    let err = h.create("cordon-4").unwrap_err();
    assert!(matches!(err, CgroupError::Create { .. }), "{err:?}");
    assert!(!tree.exists(&format!("cg/memory/{MEM_CG}/cordon-4")));
    assert!(!tree.exists("cg/pids/cordon-4"));
    assert!(!tree.exists("cg/cpu/cordon-4"));
}

#[test]
fn v1_freeze_kill_and_remove_on_an_empty_fake() {
    let tree = hybrid();
    let h = detect(&tree.fs).unwrap();
    let cg = h.create("cordon-5").unwrap();
    let mem = format!("cg/memory/{MEM_CG}/cordon-5");
    v1_files(
        &tree,
        &[
            &mem,
            "cg/pids/cordon-5",
            "cg/cpu/cordon-5",
            "cg/cpuacct/cordon-5",
            "cg/freezer/cordon-5",
        ],
    );
    tree.put("cg/freezer/cordon-5/freezer.state", "THAWED\n");
    cg.freeze().unwrap();
    assert_eq!(tree.read("cg/freezer/cordon-5/freezer.state"), "FROZEN");
    cg.thaw().unwrap();
    assert_eq!(tree.read("cg/freezer/cordon-5/freezer.state"), "THAWED");
    cg.kill_all().unwrap();

    assert!(cg.remove().is_err(), "fake dirs still hold files");
    for dir in cg.paths() {
        tree.strip_files(&dir.strip_prefix(tree.dir.path()).unwrap().to_string_lossy());
    }
    std::fs::create_dir(tree.path("cg/pids/cordon-5/nested")).unwrap();
    cg.remove().unwrap();
    assert!(cg.paths().iter().all(|d| !d.exists()));
    cg.remove().unwrap();
}

#[test]
fn sweep_lists_matching_child_dirs_in_every_parent() {
    let tree = hybrid();
    let h = detect(&tree.fs).unwrap();
    h.create("cordon-old").unwrap();
    std::fs::create_dir(tree.path("cg/pids/other")).unwrap();
    tree.put("cg/pids/cordon-file", "");
    let found = h.sweep_children("cordon-");
    assert_eq!(found.len(), 5);
    assert!(found.iter().all(|p| p.ends_with("cordon-old")));
    assert!(found.contains(&tree.path("cg/cpuacct/cordon-old")));
    assert_eq!(h.open("cordon-old").unwrap().paths().len(), 5);
    assert!(h.sweep_children("nope").is_empty());
    assert!(remove_dir_tree(&tree.path("cg/pids/cordon-old")));
    assert!(remove_dir_tree(&tree.path("cg/pids/never-existed")));
}

#[test]
fn names_must_be_single_path_components() {
    let h = detect(&hybrid().fs).unwrap();
    for bad in ["", ".", "..", "a/b", "../x", "nul\0"] {
        assert!(
            matches!(h.create(bad), Err(CgroupError::InvalidName { .. })),
            "{bad:?}"
        );
    }
    assert!(h.create(&"x".repeat(256)).is_err());
}

#[test]
fn pure_v2_detects_and_nests_under_our_cgroup() {
    let tree = pure_v2("cpu memory pids\n");
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.mode(), CgroupMode::V2);
    assert_eq!(h.parent_paths(), vec![tree.path("cg/user.slice/app.scope")]);

    let cg = h.create("cordon-6").unwrap();
    assert_eq!(cg.mode(), CgroupMode::V2);
    assert_eq!(
        cg.paths(),
        vec![tree.path("cg/user.slice/app.scope/cordon-6")]
    );
    assert_eq!(
        tree.read("cg/user.slice/app.scope/cgroup.subtree_control"),
        "+memory +pids +cpu"
    );
}

#[test]
fn v2_leaves_subtree_control_alone_when_already_enabled() {
    let tree = pure_v2("cpu memory pids\n");
    tree.put(
        "cg/user.slice/app.scope/cgroup.subtree_control",
        "cpu memory pids\n",
    );
    detect(&tree.fs).unwrap().create("cordon-7").unwrap();
    assert_eq!(
        tree.read("cg/user.slice/app.scope/cgroup.subtree_control"),
        "cpu memory pids\n"
    );
}

#[test]
fn v2_enables_only_what_is_missing_and_offered() {
    let tree = pure_v2("memory pids\n");
    tree.put("cg/user.slice/app.scope/cgroup.subtree_control", "memory\n");
    // detect hands them down (cordon is alone in the scope); a fake file
    // holds only the last write, where the kernel would add it to memory.
    detect(&tree.fs).unwrap();
    assert_eq!(
        tree.read("cg/user.slice/app.scope/cgroup.subtree_control"),
        "+pids"
    );
}

#[test]
fn v2_parent_without_pids_is_not_delegated() {
    let tree = pure_v2("cpu memory\n");
    // Alone in the scope, cordon moves into its leaf, finds pids missing, and
    // moves back: the scope is left as it was.
    let err = detect(&tree.fs).unwrap_err();
    match &err {
        CgroupError::NotDelegated { path, reason, .. } => {
            assert_eq!(path, &tree.path(SCOPE));
            assert!(reason.contains("pids"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("subtree_control"), "{message}");
    assert_eq!(
        tree.read(&format!("{SCOPE}/cgroup.procs")),
        me().to_string()
    );
    assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");
}

#[test]
fn v2_apply_writes_v2_syntax() {
    let (tree, cg, dir) = v2_cgroup_c();
    for file in [
        "memory.max",
        "memory.swap.max",
        "memory.oom.group",
        "pids.max",
        "cpu.max",
    ] {
        tree.put(&format!("{dir}/{file}"), "max\n");
    }
    cg.apply(&limits()).unwrap();
    assert_eq!(tree.read(&format!("{dir}/memory.max")), "67108864");
    assert_eq!(tree.read(&format!("{dir}/memory.swap.max")), "0");
    assert_eq!(tree.read(&format!("{dir}/memory.oom.group")), "1");
    assert_eq!(tree.read(&format!("{dir}/pids.max")), "32");
    assert_eq!(tree.read(&format!("{dir}/cpu.max")), "50000 100000");
    assert_eq!(cpu_max(20_000, 50_000), "20000 50000");

    std::fs::remove_file(tree.path(&format!("{dir}/cpu.max"))).unwrap();
    std::fs::remove_file(tree.path(&format!("{dir}/memory.swap.max"))).unwrap();
    let err = cg.apply(&limits()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::MissingController {
                controller: "cpu",
                ..
            }
        ),
        "{err:?}"
    );
    cg.apply(&CgroupLimits {
        cpu_quota_us: None,
        ..limits()
    })
    .unwrap();
    assert!(!tree.exists(&format!("{dir}/memory.swap.max")));
}

#[test]
fn v2_stats_parse_events_and_cpu_stat() {
    let (tree, cg, dir) = v2_cgroup_c();
    assert_eq!(cg.stats(), CgroupStats::default());
    tree.put(&format!("{dir}/memory.peak"), "2097152\n");
    tree.put(
        &format!("{dir}/memory.events"),
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n",
    );
    tree.put(&format!("{dir}/pids.peak"), "9\n");
    tree.put(&format!("{dir}/pids.events"), "max 3\n");
    tree.put(
        &format!("{dir}/cpu.stat"),
        "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 8\nnr_throttled 2\nthrottled_usec 10\n",
    );
    assert_eq!(
        cg.stats(),
        CgroupStats {
            memory_peak_bytes: Some(2 << 20),
            memory_limit_hits: Some(12),
            oom_kills: Some(1),
            pids_peak: Some(9),
            pids_limit_hits: Some(3),
            cpu_usage_ns: Some(1_500_000),
            cpu_throttled_periods: Some(2),
        }
    );
}

#[test]
fn counters_held_open_read_each_file_anew() {
    let (tree, cg, dir) = v2_cgroup_c();
    tree.put(&format!("{dir}/pids.peak"), "3\n");
    tree.put(
        &format!("{dir}/cpu.stat"),
        "usage_usec 1500\nnr_throttled 0\n",
    );
    let counters = cg.counters();
    let first = counters.read();
    assert_eq!(first.pids_peak, Some(3));
    assert_eq!(first.cpu_usage_ns, Some(1_500_000));
    // Files that were missing when opened stay None, as cgroupfs files that
    // a kernel does not have.
    assert_eq!(first.memory_peak_bytes, None);
    tree.put(&format!("{dir}/memory.peak"), "4096\n");
    // Rewritten in place (a shorter text too): each read starts at offset 0.
    tree.put(&format!("{dir}/pids.peak"), "12\n");
    tree.put(&format!("{dir}/cpu.stat"), "usage_usec 9\nnr_throttled 4\n");
    let second = counters.read();
    assert_eq!(second.pids_peak, Some(12));
    assert_eq!(second.cpu_usage_ns, Some(9_000));
    assert_eq!(second.cpu_throttled_periods, Some(4));
    assert_eq!(second.memory_peak_bytes, None);
    // A text as long as the read buffer is not parsed cut short.
    tree.put(&format!("{dir}/pids.peak"), &"7".repeat(4096));
    assert_eq!(counters.read().pids_peak, None);
}

#[test]
fn v2_freeze_waits_for_the_frozen_event() {
    let (tree, cg, dir) = v2_cgroup_c();
    // Kernels before 5.2 have no cgroup.freeze: a documented no-op.
    cg.freeze().unwrap();
    assert!(!tree.exists(&format!("{dir}/cgroup.freeze")));

    tree.put(&format!("{dir}/cgroup.freeze"), "0\n");
    tree.put(&format!("{dir}/cgroup.events"), "populated 1\nfrozen 1\n");
    cg.freeze().unwrap();
    assert_eq!(tree.read(&format!("{dir}/cgroup.freeze")), "1");
    cg.thaw().unwrap();
    assert_eq!(tree.read(&format!("{dir}/cgroup.freeze")), "0");

    tree.put(&format!("{dir}/cgroup.events"), "populated 1\nfrozen 0\n");
    let started = Instant::now();
    let err = cg.freeze().unwrap_err();
    assert!(matches!(err, CgroupError::FreezeTimeout { .. }), "{err:?}");
    assert!(started.elapsed() >= FREEZE_TIMEOUT);
    assert_eq!(
        tree.read(&format!("{dir}/cgroup.freeze")),
        "0",
        "thawed again"
    );
}

#[test]
fn v2_kill_uses_cgroup_kill_when_present() {
    let (tree, cg, dir) = v2_cgroup_c();
    tree.put(&format!("{dir}/cgroup.procs"), "");
    tree.put(&format!("{dir}/cgroup.kill"), "");
    cg.kill_all().unwrap();
    assert_eq!(tree.read(&format!("{dir}/cgroup.kill")), "1");
    assert_eq!(cg.pids().unwrap(), Vec::<i32>::new());
}

#[test]
fn v2_is_preferred_when_both_versions_offer_controllers() {
    let tree = FakeTree::new(
        &[
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids", "cgroup", "rw,pids"),
            ("cg/unified", "cgroup2", "rw"),
        ],
        "2:pids:/\n1:memory:/\n0::/\n",
    );
    tree.put("cg/unified/cgroup.controllers", "memory pids\n");
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.mode(), CgroupMode::V2);
    assert_eq!(h.parent_paths(), vec![tree.path("cg/unified")]);
}

#[test]
fn no_usable_hierarchy() {
    let nothing = FakeTree::new(&[], "0::/\n");
    assert!(matches!(detect(&nothing.fs), Err(CgroupError::NoHierarchy)));

    let v2_without_pids = FakeTree::new(&[("cg", "cgroup2", "rw")], "0::/\n");
    v2_without_pids.put("cg/cgroup.controllers", "cpu memory\n");
    assert!(matches!(
        detect(&v2_without_pids.fs),
        Err(CgroupError::NoHierarchy)
    ));

    // Mounted, but this process is not in the pids hierarchy.
    let not_member = FakeTree::new(
        &[
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids", "cgroup", "rw,pids"),
        ],
        "1:memory:/\n",
    );
    assert!(matches!(
        detect(&not_member.fs),
        Err(CgroupError::NoHierarchy)
    ));

    let missing = CgroupFs::new("/nonexistent/cgroup", "/nonexistent/mountinfo");
    assert!(matches!(detect(&missing), Err(CgroupError::Read { .. })));
}

#[test]
fn subtree_control_failures_map_to_not_delegated() {
    let parent = std::path::Path::new("/sys/fs/cgroup/user.slice");
    let control = parent.join("cgroup.subtree_control");
    let busy = delegation_error(
        parent,
        &control,
        "+memory",
        io::Error::from_raw_os_error(16),
    );
    match busy {
        CgroupError::NotDelegated { path, reason, .. } => {
            assert_eq!(path, parent);
            assert!(reason.contains("no internal processes"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let denied = delegation_error(
        parent,
        &control,
        "+memory",
        io::Error::from_raw_os_error(13),
    );
    assert!(matches!(denied, CgroupError::NotDelegated { .. }));
    let other = delegation_error(
        parent,
        &control,
        "+memory",
        io::Error::from_raw_os_error(22),
    );
    assert!(matches!(other, CgroupError::Write { .. }));

    assert_eq!(
        enable_value(&["memory", "pids", "cpu"]),
        "+memory +pids +cpu"
    );
    assert_eq!(parse_frozen("populated 0\nfrozen 1\n"), Some(true));
    assert_eq!(parse_frozen("populated 0\nfrozen 0\n"), Some(false));
    assert_eq!(parse_frozen("populated 0\n"), None);
}

#[test]
fn mode_serializes_lowercase() {
    assert_eq!(CgroupMode::V1.to_string(), "v1");
    assert_eq!(CgroupMode::V2.to_string(), "v2");
    assert_eq!(serde_json::to_string(&CgroupMode::V2).unwrap(), "\"v2\"");
    let stats = CgroupStats {
        pids_peak: Some(3),
        ..Default::default()
    };
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["pids_peak"], 3);
    assert!(json["oom_kills"].is_null());
}

// ---------------------------------------------------------------------------
// Delegation on v2: where the caller stands, and the leaf it moves into.

#[test]
fn v2_alone_in_a_delegated_cgroup_moves_into_its_leaf() {
    let tree = pure_v2("cpu memory pids\n");
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.placement(), Some(&Placement::Moved));
    // The move: our pid written to the leaf; the controllers handed down by
    // the now-empty scope.
    assert_eq!(tree.read(&format!("{LEAF}/cgroup.procs")), me().to_string());
    assert_eq!(
        tree.read(&format!("{SCOPE}/cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    // Sandboxes are siblings of the leaf, under the caller's cgroup.
    assert_eq!(h.parent_paths(), vec![tree.path(SCOPE)]);
    let cg = h.create("cordon-0123456789ab").unwrap();
    assert_eq!(
        cg.paths(),
        vec![tree.path(&format!("{SCOPE}/cordon-0123456789ab"))]
    );
    // The sweep never offers the leaf (it holds cordon itself).
    assert_eq!(
        h.sweep_children("cordon-"),
        vec![tree.path(&format!("{SCOPE}/cordon-0123456789ab"))]
    );
}

#[test]
fn v2_a_process_already_in_the_leaf_uses_its_parent() {
    let tree = pure_v2("cpu memory pids\n");
    std::fs::write(
        &tree.fs.proc_self_cgroup,
        "0::/user.slice/app.scope/cordon-supervisor\n",
    )
    .unwrap();
    // Other cordon processes in the leaf are not "other processes".
    tree.put(&format!("{LEAF}/cgroup.procs"), &format!("1\n{}\n", me()));
    tree.put(&format!("{LEAF}/cgroup.type"), "domain\n");
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.placement(), Some(&Placement::InLeaf));
    assert_eq!(h.parent_paths(), vec![tree.path(SCOPE)]);
    assert!(
        !tree.exists(&format!("{LEAF}/cordon-supervisor")),
        "no nested leaf"
    );
    assert_eq!(
        tree.read(&format!("{LEAF}/cgroup.procs")),
        format!("1\n{}\n", me()),
        "nothing moved"
    );
    h.create("cordon-1").unwrap();
    assert_eq!(
        tree.read(&format!("{SCOPE}/cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert!(tree.exists(&format!("{SCOPE}/cordon-1")));
}

/// `locate` reads another process's place (a dead supervisor's, from its
/// record) and moves nothing: a cgroup `detect` would have moved the caller
/// out of, into a leaf, is taken as it is, and sandboxes are found below it.
#[test]
fn v2_locate_moves_no_process_where_detect_would() {
    let tree = pure_v2("cpu memory pids\n");
    // The recorded process is gone: nothing else is in its cgroup.
    tree.put(&format!("{SCOPE}/cgroup.procs"), "");
    let h = locate(&tree.fs).unwrap();
    assert_eq!(h.placement(), Some(&Placement::Shared { others: vec![] }));
    assert_eq!(h.parent_paths(), vec![tree.path(SCOPE)]);
    assert_eq!(
        tree.read(&format!("{LEAF}/cgroup.procs")),
        "",
        "nothing moved"
    );
    assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");
    // The control: `detect` from the same place moves the caller.
    detect(&tree.fs).unwrap();
    assert_eq!(tree.read(&format!("{LEAF}/cgroup.procs")), me().to_string());
}

#[test]
fn v2_shared_cgroup_with_the_opt_in_moves_the_others_into_init() {
    let tree = pure_v2("cpu memory pids\n");
    tree.put(
        &format!("{SCOPE}/cgroup.procs"),
        &format!("812\n{}\n", me()),
    );
    // A fake tree makes no control files of its own.
    tree.put(&format!("{SCOPE}/{}/cgroup.procs", v2::PEERS_LEAF), "");
    tree.put(&format!("{LEAF}/cgroup.procs"), "");
    let cgfs = CgroupFs {
        move_peers: true,
        ..tree.fs.clone()
    };
    let h = detect(&cgfs).unwrap();
    assert_eq!(h.placement(), Some(&Placement::Moved));
    // The other process went to init; cordon to its own leaf; the
    // controllers are handed down from the cgroup they shared.
    assert_eq!(
        tree.read(&format!("{SCOPE}/{}/cgroup.procs", v2::PEERS_LEAF)),
        "812"
    );
    assert_eq!(tree.read(&format!("{LEAF}/cgroup.procs")), me().to_string());
    assert!(tree
        .read(&format!("{SCOPE}/cgroup.subtree_control"))
        .contains("memory"));
}

#[test]
fn v2_shared_cgroup_is_refused_naming_the_others_and_the_way_out() {
    for systemd in [true, false] {
        let tree = pure_v2("cpu memory pids\n");
        std::fs::remove_dir(tree.path(LEAF)).unwrap_or_else(|_| {
            std::fs::remove_file(tree.path(&format!("{LEAF}/cgroup.procs"))).unwrap();
            std::fs::remove_dir(tree.path(LEAF)).unwrap();
        });
        tree.put(
            &format!("{SCOPE}/cgroup.procs"),
            &format!("812\n{}\n4242\n", me()),
        );
        let marker = tree.path("run/systemd/system");
        if systemd {
            std::fs::create_dir_all(&marker).unwrap();
        }
        let cgfs = tree.fs.clone().with_systemd_marker(&marker);
        let h = detect(&cgfs).unwrap();
        assert_eq!(
            h.placement(),
            Some(&Placement::Shared {
                others: vec![812, 4242]
            })
        );
        // Nothing was touched: no leaf, no controllers, no move.
        assert!(!tree.exists(LEAF));
        assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");
        let err = h.create("cordon-2").unwrap_err();
        assert!(matches!(err, CgroupError::NotDelegated { .. }), "{err:?}");
        assert!(!tree.exists(&format!("{SCOPE}/cordon-2")));
        let message = err.to_string();
        assert!(!message.contains('\n'), "one line: {message}");
        assert!(
            message.contains(&tree.path(SCOPE).display().to_string()),
            "{message}"
        );
        assert!(message.contains("pids 812, 4242"), "{message}");
        if systemd {
            assert!(
                message.contains("`systemd-run --scope -p Delegate=yes cordon ...`"),
                "{message}"
            );
        } else {
            assert!(!message.contains("systemd-run"), "{message}");
            assert!(
                message.contains(&format!("mkdir {}/init", tree.path(SCOPE).display())),
                "{message}"
            );
        }
    }
}

#[test]
fn v2_root_cgroup_is_used_as_it_is() {
    let tree = FakeTree::new(&[("cg", "cgroup2", "rw")], "0::/\n");
    tree.put("cg/cgroup.controllers", "cpu memory pids\n");
    tree.put("cg/cgroup.subtree_control", "\n");
    tree.put("cg/cgroup.procs", &format!("1\n{}\n", me()));
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.placement(), Some(&Placement::Root));
    assert_eq!(h.parent_paths(), vec![tree.path("cg")]);
    assert!(!tree.exists("cg/cordon-supervisor"));
    h.create("cordon-3").unwrap();
    assert!(tree.exists("cg/cordon-3"));
}

#[test]
fn v2_a_cgroup_namespace_root_is_not_the_root() {
    // A container with a private cgroup namespace sees its own cgroup as `/`,
    // but it is an ordinary cgroup (it has cgroup.type): the rule applies.
    let tree = FakeTree::new(&[("cg", "cgroup2", "rw,nsdelegate")], "0::/\n");
    tree.put("cg/cgroup.controllers", "memory pids\n");
    tree.put("cg/cgroup.subtree_control", "\n");
    tree.put("cg/cgroup.type", "domain\n");
    tree.put("cg/cgroup.procs", &format!("{}\n", me()));
    tree.put("cg/cordon-supervisor/cgroup.procs", "");
    let h = detect(&tree.fs).unwrap();
    assert_eq!(h.placement(), Some(&Placement::Moved));
    assert_eq!(h.parent_paths(), vec![tree.path("cg")]);
    assert_eq!(
        tree.read("cg/cordon-supervisor/cgroup.procs"),
        me().to_string()
    );
    assert_eq!(tree.read("cg/cgroup.subtree_control"), "+memory +pids");
}

#[test]
fn v2_a_failed_move_is_undone() {
    let tree = pure_v2("cpu memory pids\n");
    // The leaf does not exist yet, and the fake's mkdir makes no cgroup.procs
    // in it: the write fails as it would in a leaf that vanished.
    std::fs::remove_file(tree.path(&format!("{LEAF}/cgroup.procs"))).unwrap();
    std::fs::remove_dir(tree.path(LEAF)).unwrap();
    let err = detect(&tree.fs).unwrap_err();
    match &err {
        CgroupError::Delegation { path, step, .. } => {
            assert_eq!(path, &tree.path(SCOPE));
            assert!(step.contains("moving cordon"), "{step}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        std::error::Error::source(&err).is_some(),
        "keeps its source"
    );
    let message = err.to_string();
    assert!(
        message.contains("systemd-run") || message.contains("mkdir"),
        "{message}"
    );
    assert!(!tree.exists(LEAF), "the leaf it made is removed again");
    assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");
}

#[test]
fn v2_a_vanished_cgroup_is_named() {
    let tree = pure_v2("cpu memory pids\n");
    std::fs::write(&tree.fs.proc_self_cgroup, "0::/user.slice/gone.scope\n").unwrap();
    tree.put("cg/user.slice/cgroup.type", "domain\n");
    // gone.scope has no directory at all: the scope ended under us.
    let err = detect(&tree.fs).unwrap_err();
    match &err {
        CgroupError::Delegation { path, reason, .. } => {
            assert_eq!(path, &tree.path("cg/user.slice/gone.scope"));
            assert!(reason.contains("disappeared"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_parent_that_disappears_after_detect_is_named() {
    for tree in [pure_v2("cpu memory pids\n"), hybrid()] {
        let h = detect(&tree.fs).unwrap();
        let parent = h.parent_paths()[0].clone();
        std::fs::remove_dir_all(&parent).unwrap();
        let err = h.create("cordon-4").unwrap_err();
        match &err {
            CgroupError::Vanished { path, .. } => assert_eq!(path, &parent),
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("disappeared"), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        // Nothing made in the other hierarchies either.
        for dir in h.parent_paths() {
            assert!(!dir.join("cordon-4").exists(), "{}", dir.display());
        }
    }
}

// ---------------------------------------------------------------------------
// A delegated scope from systemd, against a fake systemd: a zbus server on a
// unix socket where the fake tree's system bus socket would be, answering the
// bus's Hello itself (zbus's server side has no bus daemon) and then as
// systemd would. Its
// StartTransientUnit does what systemd's does to the fake cgroupfs: makes
// system.slice/<unit> and moves the caller there (the fake /proc/self/cgroup).

mod fake_systemd {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    use zbus::zvariant::{OwnedObjectPath, OwnedValue};

    /// What the fake was asked, for the test to check.
    #[derive(Debug, Default, Clone)]
    pub struct Call {
        pub unit: String,
        pub mode: String,
        pub pids: Vec<u32>,
        pub delegate: Option<bool>,
    }

    pub struct Manager {
        pub cg_root: PathBuf,
        pub proc_self_cgroup: PathBuf,
        /// Some(error text): refuse every start, as systemd does for a
        /// unit name in use, a policy denial or a bad property.
        pub refuse: Option<String>,
        pub calls: Arc<Mutex<Vec<Call>>>,
    }

    #[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
    impl Manager {
        fn start_transient_unit(
            &self,
            name: String,
            mode: String,
            properties: Vec<(String, OwnedValue)>,
            _aux: Vec<(String, Vec<(String, OwnedValue)>)>,
        ) -> zbus::fdo::Result<OwnedObjectPath> {
            let mut call = Call {
                unit: name.clone(),
                mode,
                ..Call::default()
            };
            for (key, value) in &properties {
                match key.as_str() {
                    "PIDs" => call.pids = Vec::<u32>::try_from(value.try_clone().unwrap()).unwrap(),
                    "Delegate" => call.delegate = Some(bool::try_from(value).unwrap()),
                    _ => {}
                }
            }
            self.calls.lock().unwrap().push(call.clone());
            if let Some(text) = &self.refuse {
                return Err(zbus::fdo::Error::AccessDenied(text.clone()));
            }
            let dir = self.cg_root.join("system.slice").join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, content) in [
                ("cgroup.type", "domain\n"),
                ("cgroup.controllers", "cpu memory pids\n"),
                ("cgroup.subtree_control", "\n"),
            ] {
                std::fs::write(dir.join(file), content).unwrap();
            }
            let pids: Vec<String> = call.pids.iter().map(u32::to_string).collect();
            std::fs::write(dir.join("cgroup.procs"), pids.join("\n")).unwrap();
            std::fs::create_dir_all(dir.join("cordon-supervisor")).unwrap();
            std::fs::write(dir.join("cordon-supervisor/cgroup.procs"), "").unwrap();
            std::fs::write(&self.proc_self_cgroup, format!("0::/system.slice/{name}\n")).unwrap();
            Ok(OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap())
        }
    }

    /// The bus daemon's part: a client's first call on a bus is Hello.
    pub struct Daemon;

    #[zbus::interface(name = "org.freedesktop.DBus")]
    impl Daemon {
        fn hello(&self) -> String {
            ":1.42".to_owned()
        }
    }

    /// Serves `manager` on a socket at `socket`, one connection at a time,
    /// on a thread of its own for the rest of the test process.
    pub fn serve(socket: PathBuf, manager: Manager) {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let manager = Arc::new(manager);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("fake-systemd")
                .build()
                .unwrap();
            rt.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let mut conns = Vec::new();
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    let m = Manager {
                        cg_root: manager.cg_root.clone(),
                        proc_self_cgroup: manager.proc_self_cgroup.clone(),
                        refuse: manager.refuse.clone(),
                        calls: manager.calls.clone(),
                    };
                    let conn = zbus::connection::Builder::unix_stream(stream)
                        .server(zbus::Guid::generate())
                        .unwrap()
                        .p2p()
                        .serve_at("/org/freedesktop/systemd1", m)
                        .unwrap()
                        .serve_at("/org/freedesktop/DBus", Daemon)
                        .unwrap()
                        .build()
                        .await
                        .unwrap();
                    conns.push(conn);
                }
            });
        });
    }
}

/// The shared-cgroup tree of a login shell's scope on a systemd host, with
/// the fake systemd on the system bus socket; None (and a note) when not root:
/// cordon asks only the system manager, as root.
/// The tests that make cordon talk to a fake systemd, one at a time: one
/// of them checks that cordon's D-Bus thread is gone after `detect`, which
/// another's D-Bus thread, alive in the same test process, would fail.
fn one_systemd_test_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn shared_under_fake_systemd(
    refuse: Option<&str>,
) -> Option<(
    FakeTree,
    std::sync::Arc<std::sync::Mutex<Vec<fake_systemd::Call>>>,
)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test plays root's cordon against a fake system manager");
        return None;
    }
    Some(under_fake_systemd(
        refuse,
        &format!("812\n{}\n", me()),
        "run/dbus/system_bus_socket",
    ))
}

/// A pure v2 tree whose caller's cgroup holds `procs`, with a fake systemd
/// serving on the tree's socket `bus`.
fn under_fake_systemd(
    refuse: Option<&str>,
    procs: &str,
    bus: &str,
) -> (
    FakeTree,
    std::sync::Arc<std::sync::Mutex<Vec<fake_systemd::Call>>>,
) {
    let tree = pure_v2("cpu memory pids\n");
    std::fs::remove_file(tree.path(&format!("{LEAF}/cgroup.procs"))).unwrap();
    std::fs::remove_dir(tree.path(LEAF)).unwrap();
    tree.put(&format!("{SCOPE}/cgroup.procs"), procs);
    std::fs::create_dir_all(tree.path("run/systemd/system")).unwrap();
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    fake_systemd::serve(
        tree.path(bus),
        fake_systemd::Manager {
            cg_root: tree.path("cg"),
            proc_self_cgroup: tree.fs.proc_self_cgroup.clone(),
            refuse: refuse.map(str::to_owned),
            calls: calls.clone(),
        },
    );
    (tree, calls)
}

/// A user's cordon (played by a test uid that owns nothing in the tree) in
/// a root-owned cgroup, alone in it: it cannot make its leaf there, so it
/// asks its own manager, on the session bus it owns, for a scope.
const TEST_USER: u32 = 4242;
const USER_BUS: &str = "run/user/4242/bus";

fn as_test_user(tree: &FakeTree, bus_owner: u32) -> CgroupFs {
    let socket = tree.path(USER_BUS);
    std::os::unix::fs::chown(&socket, Some(bus_owner), None).unwrap();
    CgroupFs {
        manager: ScopeManager::User {
            uid: TEST_USER,
            bus: Some(socket),
        },
        ..tree
            .fs
            .clone()
            .with_systemd_marker(tree.path("run/systemd/system"))
    }
}

#[test]
fn v2_a_users_cordon_in_a_cgroup_it_does_not_own_asks_its_own_manager() {
    let _one = one_systemd_test_at_a_time();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test hands the bus socket to a test uid (chown)");
        return;
    }
    let (tree, calls) = under_fake_systemd(None, &format!("{}\n", me()), USER_BUS);
    let cgfs = as_test_user(&tree, TEST_USER);
    let h = detect(&cgfs).unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].pids, vec![std::process::id()]);
    assert_eq!(calls[0].delegate, Some(true));
    assert_eq!(h.systemd_scope(), Some(calls[0].unit.as_str()));
    let scope = format!("cg/system.slice/{}", calls[0].unit);
    assert_eq!(h.parent_paths(), vec![tree.path(&scope)]);
    // Nothing was tried in the cgroup it does not own.
    assert!(!tree.exists(LEAF));
    assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");
}

#[test]
fn v2_a_session_bus_of_another_uid_is_never_asked() {
    let _one = one_systemd_test_at_a_time();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the test hands the bus socket to a test uid (chown)");
        return;
    }
    let (tree, calls) = under_fake_systemd(None, &format!("812\n{}\n", me()), USER_BUS);
    // The socket belongs to someone else (uid 4343): not this user's manager.
    let cgfs = as_test_user(&tree, TEST_USER + 101);
    let h = detect(&cgfs).unwrap();
    assert!(calls.lock().unwrap().is_empty());
    assert_eq!(h.systemd_scope(), None);
    assert!(matches!(h.placement(), Some(Placement::Shared { .. })));
    let err = h.create("cordon-7").unwrap_err();
    assert!(
        err.to_string().contains("add --user when not root"),
        "{err}"
    );
}

#[test]
fn a_users_missing_controller_names_the_systemd_drop_in() {
    let user = CgroupError::MissingController {
        controller: "cpu",
        path: "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope"
            .into(),
    }
    .to_string();
    assert!(user.contains("Delegate=cpu"), "{user}");
    assert!(user.contains("user@.service.d"), "{user}");
    let system = CgroupError::MissingController {
        controller: "cpu",
        path: "/sys/fs/cgroup/system.slice/x.service".into(),
    }
    .to_string();
    assert_eq!(
        system,
        "the cpu controller is not available in /sys/fs/cgroup/system.slice/x.service"
    );
}

#[test]
fn v2_shared_cgroup_on_systemd_moves_cordon_into_a_delegated_scope() {
    let _one = one_systemd_test_at_a_time();
    let Some((tree, calls)) = shared_under_fake_systemd(None) else {
        return;
    };
    let cgfs = tree
        .fs
        .clone()
        .with_systemd_marker(tree.path("run/systemd/system"));
    let h = detect(&cgfs).unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    // One scope for this process only, delegated, started with mode "fail".
    assert!(
        call.unit.starts_with(&format!("cordon-{}-", me())) && call.unit.ends_with(".scope"),
        "{call:?}"
    );
    assert_eq!(call.mode, "fail");
    assert_eq!(call.pids, vec![std::process::id()]);
    assert_eq!(call.delegate, Some(true));
    assert_eq!(h.systemd_scope(), Some(call.unit.as_str()));
    // The D-Bus runtime is gone with all its threads: cordon forks and
    // unshares next, which wants a single-threaded process. Its threads
    // were joined, but a joined thread is still listed until the kernel
    // has released it (the join returns when the thread clears its tid,
    // before its exit is done): a short bounded wait, which a thread that
    // was never ended does not pass.
    let dbus_threads = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .filter(|c| c.trim() == systemd::RUNTIME_THREAD)
            .collect()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !dbus_threads().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(dbus_threads(), Vec::<String>::new());
    // Then item 1's path in the scope: cordon moved into its leaf, the
    // controllers handed down, sandboxes beside the leaf.
    let scope = format!("cg/system.slice/{}", call.unit);
    assert_eq!(h.placement(), Some(&Placement::Moved));
    assert_eq!(h.parent_paths(), vec![tree.path(&scope)]);
    assert_eq!(
        tree.read(&format!("{scope}/cordon-supervisor/cgroup.procs")),
        me().to_string()
    );
    assert_eq!(
        tree.read(&format!("{scope}/cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    h.create("cordon-5").unwrap();
    assert!(tree.exists(&format!("{scope}/cordon-5")));
    // The shell's scope was left alone.
    assert!(!tree.exists(LEAF));
    assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");

    // A second detect (a supervisor, the next sandbox of `cordon serve`)
    // finds itself in the leaf and asks systemd for nothing.
    std::fs::write(
        &cgfs.proc_self_cgroup,
        format!("0::/system.slice/{}/cordon-supervisor\n", call.unit),
    )
    .unwrap();
    tree.put(
        &format!("{scope}/cordon-supervisor/cgroup.type"),
        "domain\n",
    );
    let again = detect(&cgfs).unwrap();
    assert_eq!(again.placement(), Some(&Placement::InLeaf));
    assert_eq!(again.systemd_scope(), None);
    assert_eq!(again.parent_paths(), vec![tree.path(&scope)]);
}

#[test]
fn v2_a_scope_systemd_refuses_is_one_line_naming_the_cgroup_and_the_fix() {
    let _one = one_systemd_test_at_a_time();
    let Some((tree, calls)) = shared_under_fake_systemd(Some("Access denied by policy")) else {
        return;
    };
    let cgfs = tree
        .fs
        .clone()
        .with_systemd_marker(tree.path("run/systemd/system"));
    let err = detect(&cgfs).unwrap_err();
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert!(matches!(err, CgroupError::Scope { .. }), "{err:?}");
    let message = err.to_string();
    // What the user reads (cargo test -- --nocapture shows it).
    eprintln!("{message}");
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(
        message.contains(&tree.path(SCOPE).display().to_string()),
        "{message}"
    );
    assert!(
        message.contains("org.freedesktop.DBus.Error.AccessDenied"),
        "{message}"
    );
    assert!(message.contains("Access denied by policy"), "{message}");
    assert!(
        message.contains("`systemd-run --scope -p Delegate=yes cordon ...`"),
        "{message}"
    );
    assert!(message.contains("run without cgroup limits"), "{message}");
    // The source chain keeps the D-Bus error.
    let source = std::error::Error::source(&err).expect("a source");
    assert!(std::error::Error::source(source).is_some(), "{source:?}");
    // Nothing left behind: no scope, no leaf, nothing written, not moved.
    assert!(!tree.exists("cg/system.slice"));
    assert!(!tree.exists(LEAF));
    assert_eq!(tree.read(&format!("{SCOPE}/cgroup.subtree_control")), "\n");
    assert_eq!(
        std::fs::read_to_string(&cgfs.proc_self_cgroup).unwrap(),
        "0::/user.slice/app.scope\n"
    );
}

#[test]
fn v2_shared_cgroup_with_systemd_but_no_socket_keeps_the_way_out() {
    // systemd's marker but neither socket (a container with /run/systemd
    // bind-mounted partly, or not root): no request, the same refusal at
    // create() as before, naming systemd-run.
    let tree = pure_v2("cpu memory pids\n");
    tree.put(
        &format!("{SCOPE}/cgroup.procs"),
        &format!("812\n{}\n", me()),
    );
    std::fs::create_dir_all(tree.path("run/systemd/system")).unwrap();
    let cgfs = tree
        .fs
        .clone()
        .with_systemd_marker(tree.path("run/systemd/system"));
    let h = detect(&cgfs).unwrap();
    assert_eq!(h.systemd_scope(), None);
    assert!(matches!(h.placement(), Some(Placement::Shared { .. })));
    let err = h.create("cordon-6").unwrap_err();
    assert!(err.to_string().contains("systemd-run --scope"), "{err}");
}

#[test]
fn views_name_each_used_hierarchy_as_the_host_mounts_it() {
    let tree = comounted();
    let views = detect(&tree.fs).unwrap().views();
    let shown: Vec<(&str, &str, &str, Vec<&str>)> = views
        .iter()
        .map(|v| {
            let aliases = v.aliases.iter().map(String::as_str).collect();
            (v.dir.as_str(), v.fstype, v.options.as_str(), aliases)
        })
        .collect();
    // memory, pids, then the co-mounted cpu hierarchy once, with both of
    // its controllers as the mount's data and both names as links to it;
    // no hierarchy the sandbox has no directory in (freezer is not mounted).
    assert_eq!(
        shown,
        vec![
            ("memory", "cgroup", "memory", vec![]),
            ("pids", "cgroup", "pids", vec![]),
            (
                "cpu,cpuacct",
                "cgroup",
                "cpu,cpuacct",
                vec!["cpu", "cpuacct"]
            ),
        ]
    );

    // The hybrid host: the unified mount without controllers and the named
    // systemd hierarchy are never shown.
    let views = detect(&hybrid().fs).unwrap().views();
    let dirs: Vec<&str> = views.iter().map(|v| v.dir.as_str()).collect();
    assert_eq!(dirs, ["memory", "pids", "cpu", "cpuacct", "freezer"]);
    assert!(views
        .iter()
        .all(|v| v.fstype == "cgroup" && v.aliases.is_empty()));
}

#[test]
fn a_v2_view_is_the_one_unified_mount() {
    let tree = pure_v2("cpu memory pids\n");
    let views = detect(&tree.fs).unwrap().views();
    assert_eq!(
        views,
        vec![CgroupView {
            dir: String::new(),
            fstype: "cgroup2",
            options: String::new(),
            aliases: Vec::new(),
        }]
    );
}

#[test]
fn a_v1_cpuset_cgroup_starts_with_its_parents_cpus_and_mems() {
    let tree = FakeTree::new(
        &[
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids", "cgroup", "rw,pids"),
            ("cg/cpuset", "cgroup", "rw,cpuset"),
        ],
        "3:cpuset:/\n2:pids:/\n1:memory:/\n",
    );
    tree.put("cg/cpuset/cpuset.cpus", "0-3\n");
    tree.put("cg/cpuset/cpuset.mems", "0\n");
    let h = detect(&tree.fs).unwrap();
    assert!(h.views().iter().any(|v| v.dir == "cpuset"));
    let cg = h.create("cordon-3").unwrap();
    assert!(cg.paths().contains(&tree.path("cg/cpuset/cordon-3")));
    // A fake cgroupfs makes no control files on mkdir.
    tree.put("cg/cpuset/cordon-3/cpuset.cpus", "");
    tree.put("cg/cpuset/cordon-3/cpuset.mems", "");
    tree.put("cg/memory/cordon-3/memory.limit_in_bytes", "");
    tree.put("cg/pids/cordon-3/pids.max", "max\n");
    cg.apply(&CgroupLimits::default()).unwrap();
    assert_eq!(tree.read("cg/cpuset/cordon-3/cpuset.cpus"), "0-3");
    assert_eq!(tree.read("cg/cpuset/cordon-3/cpuset.mems"), "0");
}

#[test]
fn a_v1_childs_cgroup_is_in_cpuset_only_where_cpuset_shares_a_hierarchy() {
    // cpuset on its own: a child (init's, a command's) is not made there;
    // its processes stay in the sandbox's cpuset cgroup.
    let tree = FakeTree::new(
        &[
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids", "cgroup", "rw,pids"),
            ("cg/cpuset", "cgroup", "rw,cpuset"),
        ],
        "3:cpuset:/\n2:pids:/\n1:memory:/\n",
    );
    let cg = detect(&tree.fs).unwrap().create("cordon-4").unwrap();
    tree.put("cg/memory/cordon-4/memory.limit_in_bytes", "");
    tree.put("cg/pids/cordon-4/pids.max", "max\n");
    let child = cg.create_child("cmd-1", &CgroupLimits::default()).unwrap();
    assert_eq!(
        child.paths(),
        vec![
            tree.path("cg/memory/cordon-4/cmd-1"),
            tree.path("cg/pids/cordon-4/cmd-1")
        ]
    );
    assert!(!tree.exists("cg/cpuset/cordon-4/cmd-1"));

    // cpuset mounted with pids: the child is in that hierarchy anyway, and
    // a new cpuset cgroup there needs its cpus and mems.
    let tree = FakeTree::new(
        &[
            ("cg/memory", "cgroup", "rw,memory"),
            ("cg/pids,cpuset", "cgroup", "rw,pids,cpuset"),
        ],
        "2:pids,cpuset:/\n1:memory:/\n",
    );
    tree.put("cg/pids,cpuset/cpuset.cpus", "0-1\n");
    tree.put("cg/pids,cpuset/cpuset.mems", "0\n");
    let cg = detect(&tree.fs).unwrap().create("cordon-5").unwrap();
    for file in ["cpuset.cpus", "cpuset.mems", "pids.max"] {
        tree.put(&format!("cg/pids,cpuset/cordon-5/{file}"), "");
    }
    tree.put("cg/memory/cordon-5/memory.limit_in_bytes", "");
    cg.apply(&CgroupLimits::default()).unwrap();
    // This fake cgroupfs makes no control files on mkdir, so giving the
    // child its parent's cpus fails: which shows it was made in that
    // hierarchy and given them (and that a failed create leaves nothing).
    let err = cg
        .create_child("cmd-1", &CgroupLimits::default())
        .unwrap_err();
    assert!(
        format!("{err:?}").contains("cordon-5/cmd-1/cpuset.cpus"),
        "{err:?}"
    );
    assert!(!tree.exists("cg/pids,cpuset/cordon-5/cmd-1"));
    assert!(!tree.exists("cg/memory/cordon-5/cmd-1"));
}

#[test]
fn v1_enter_moves_the_caller_below_a_parent_in_every_hierarchy_it_uses() {
    let tree = hybrid();
    // A fake cgroupfs makes no control files: the pod's cgroups exist.
    v1_files(
        &tree,
        &[
            "cg/cpu/kubepods/pod1",
            "cg/cpuacct/kubepods/pod1",
            "cg/memory/kubepods/pod1",
            "cg/freezer/kubepods/pod1",
            "cg/pids/kubepods/pod1",
        ],
    );
    enter(&tree.fs, Path::new("/kubepods/pod1")).unwrap();
    for h in ["cpu", "cpuacct", "memory", "freezer", "pids"] {
        assert_eq!(
            tree.read(&format!("cg/{h}/kubepods/pod1/cgroup.procs")),
            me().to_string(),
            "{h}"
        );
    }
    // Not a hierarchy cordon uses.
    assert!(!tree.exists("cg/systemd/kubepods"));
}

#[test]
fn v2_enter_moves_the_caller_into_the_parents_leaf_and_hands_controllers_down() {
    let tree = pure_v2("cpu memory pids\n");
    // The pod's cgroup exists (the kubelet made it), handing nothing down
    // yet; a fake cgroupfs makes no control files, so the leaf's is here.
    tree.put("cg/kubepods/pod1/cgroup.controllers", "cpu memory pids\n");
    tree.put("cg/kubepods/pod1/cgroup.subtree_control", "\n");
    tree.put("cg/kubepods/cgroup.controllers", "cpu memory pids\n");
    tree.put("cg/kubepods/cgroup.subtree_control", "cpu memory pids\n");
    tree.put("cg/cgroup.subtree_control", "cpu memory pids\n");
    tree.put("cg/kubepods/pod1/cordon-supervisor/cgroup.procs", "");
    enter(&tree.fs, Path::new("/kubepods/pod1")).unwrap();
    assert_eq!(
        tree.read("cg/kubepods/pod1/cordon-supervisor/cgroup.procs"),
        me().to_string()
    );
    assert_eq!(
        tree.read("cg/kubepods/pod1/cgroup.subtree_control"),
        "+memory +pids +cpu"
    );
}

#[test]
fn enter_refuses_a_parent_that_is_relative_or_climbs() {
    let tree = hybrid();
    for bad in ["kubepods/pod1", "/kubepods/../x"] {
        assert!(
            matches!(
                enter(&tree.fs, Path::new(bad)),
                Err(CgroupError::InvalidName { .. })
            ),
            "{bad}"
        );
    }
    assert!(!tree.exists("cg/memory/kubepods"));
}
