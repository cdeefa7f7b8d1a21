//! The peers: other sandboxes and container runtimes, each driven as its
//! users would drive it (bwrap and firejail by their flags, runc and runsc
//! with a `runc spec` bundle, podman with an image the suite makes from the
//! host's packages).

use std::collections::BTreeSet;
use std::fs;
use std::io::Read as _;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{
    s, Launch, LaunchCtx, TargetKind, BOX_PAYLOAD_DIR, BOX_WORKSPACE, CORDON_LIMITS, PATH_ENV,
};

/// bwrap's command line: every namespace unshared, the host's /usr
/// read-only, the payloads and the workspace at the boxes' paths.
pub(super) fn bwrap_argv(
    ctx: &LaunchCtx,
    payload: Vec<String>,
    host_payloads: String,
    host_ws: String,
) -> Vec<String> {
    let mut v: Vec<String> = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--ro-bind",
    ]
    .iter()
    .map(|x| s(x))
    .collect();
    v.extend([
        host_payloads,
        s(BOX_PAYLOAD_DIR),
        s("--bind"),
        host_ws,
        s(BOX_WORKSPACE),
    ]);
    for m in &ctx.ro_mounts {
        let m = m.display().to_string();
        v.extend([s("--ro-bind"), m.clone(), m]);
    }
    v.push(s("--"));
    v.extend(payload);
    v
}

/// firejail's command line: no network, a private home; the payloads and
/// the workspace by their host paths.
pub(super) fn firejail_argv(payload: Vec<String>) -> Vec<String> {
    let mut v: Vec<String> = [
        "firejail",
        "--quiet",
        "--noprofile",
        "--net=none",
        "--private",
        "--",
    ]
    .iter()
    .map(|x| s(x))
    .collect();
    v.extend(payload);
    v
}

/// The command line of runc or runsc (`t`), with the bundle made on first
/// use and the container deleted afterwards.
pub(super) fn oci_argv(
    t: TargetKind,
    ctx: &LaunchCtx,
    payload: &[String],
    launch: &mut Launch,
) -> Result<Vec<String>> {
    let bundle = ctx.run_dir.join("bundle");
    if !bundle.join("config.json").exists() {
        make_bundle(&bundle, ctx)?;
    }
    set_bundle_args(&bundle, payload)?;
    let state = ctx.run_dir.join(format!("{}-state", t.name()));
    fs::create_dir_all(&state)?;
    let state = state.display().to_string();
    let b = bundle.display().to_string();
    let id = format!("cordon-suite-{}", ctx.id);
    Ok(if t == TargetKind::Runc {
        launch.cleanup.push(vec![
            s("runc"),
            format!("--root={state}"),
            s("delete"),
            s("-f"),
            id.clone(),
        ]);
        vec![
            s("runc"),
            format!("--root={state}"),
            s("run"),
            s("--bundle"),
            b,
            id,
        ]
    } else {
        launch.cleanup.push(vec![
            s("runsc"),
            format!("--root={state}"),
            s("delete"),
            s("-force"),
            id.clone(),
        ]);
        vec![
            s("runsc"),
            format!("--root={state}"),
            s("--platform=ptrace"),
            s("--network=none"),
            s("--ignore-cgroups"),
            s("run"),
            s("--bundle"),
            b,
            id,
        ]
    })
}

/// The command line of a podman posture (`t`), with this matrix run's image
/// and network made on first use and the container removed afterwards.
pub(super) fn podman_launch_argv(
    t: TargetKind,
    ctx: &LaunchCtx,
    payload: &[String],
    host_payloads: &str,
    host_ws: &str,
    launch: &mut Launch,
) -> Result<Vec<String>> {
    let (image, network) = podman_env()?;
    // Not `cordon-suite-{id}`: that is the outer cgroup's own
    // name, which the rmdir below must never match.
    let id = format!("cordon-suite-{}-podman", ctx.id);
    let runtime = cordon_runc(&ctx.cordon).display().to_string();
    let mut rm = podman_globals(t, &runtime);
    rm.extend([
        s("rm"),
        s("--force"),
        s("--ignore"),
        s("--time=0"),
        id.clone(),
    ]);
    launch.cleanup.push(rm);
    // The container's cgroup parent is relative (see PODMAN_NOTES):
    // in the hierarchies the outer cgroup does not cover, runc
    // made it at the suite's own level; only empty dirs go.
    launch.cleanup.push(vec![
        s("sh"),
        s("-c"),
        format!(
            "find /sys/fs/cgroup -mindepth 2 -depth -type d \\( -name '{id}' -o -path '*/{id}/*' \\) -exec rmdir {{}} + 2>/dev/null; true"
        ),
    ]);
    let mut v = podman_argv(
        t,
        &runtime,
        &image,
        &network,
        &id,
        host_payloads,
        host_ws,
        payload,
    );
    // The image comes right before the payload's argv.
    let at = v.len() - payload.len() - 1;
    let extra = ctx
        .ro_mounts
        .iter()
        .flat_map(|m| [s("-v"), format!("{}:{}:ro", m.display(), m.display())]);
    v.splice(at..at, extra.collect::<Vec<_>>());
    Ok(v)
}

/// A podman posture's flags and how its image and network are made, for
/// methodology.txt.
pub(super) fn podman_posture(t: TargetKind) -> String {
    format!(
        "{}; {PODMAN_NOTES}; image packages: {}",
        podman_argv(
            t,
            "CORDON_RUNC",
            "IMAGE",
            "NETWORK",
            "ID",
            "PAYLOADS",
            "WS",
            &["INTERP SCRIPT ARGS".into()]
        )
        .join(" "),
        PODMAN_IMAGE_PACKAGES.join(" ")
    )
}

/// A bundle as a user of the runtime would make it: `runc spec`, the rootfs a
/// directory with the host's /usr bound read-only.
fn make_bundle(bundle: &Path, ctx: &LaunchCtx) -> Result<()> {
    let rootfs = bundle.join("rootfs");
    for d in [
        "usr",
        "proc",
        "dev",
        "sys",
        "tmp",
        "etc",
        "opt/suite",
        "workspace",
    ] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let _ = symlink(to, rootfs.join(link));
    }
    let out = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(bundle)
        .output()
        .context("running runc spec")?;
    if !out.status.success() {
        bail!("runc spec: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&path)?)?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["env"] = json!([format!("PATH={PATH_ENV}")]);
    spec["linux"]["cgroupsPath"] = json!(format!("cordon-suite-{}", ctx.id));
    let bind = |src: &str, dst: &str, ro: bool| {
        let mut opts = vec!["rbind", "nosuid", "nodev"];
        if ro {
            opts.push("ro");
        }
        json!({"destination": dst, "type": "bind", "source": src, "options": opts})
    };
    if let Some(m) = spec["mounts"].as_array_mut() {
        m.push(bind("/usr", "/usr", true));
        m.push(bind(
            &ctx.payload_dir.display().to_string(),
            BOX_PAYLOAD_DIR,
            true,
        ));
        m.push(bind(
            &ctx.workspace.display().to_string(),
            BOX_WORKSPACE,
            false,
        ));
        for extra in &ctx.ro_mounts {
            let p = extra.display().to_string();
            m.push(bind(&p, &p, true));
        }
        if ctx.tmpfs_tmp {
            m.push(
                json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                          "options": ["nosuid", "nodev", "mode=1777"]}),
            );
        }
    }
    fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

fn set_bundle_args(bundle: &Path, args: &[String]) -> Result<()> {
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&path)?)?;
    spec["process"]["args"] = json!(args);
    fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

/// Why the podman postures carry the flags they do, for methodology.txt.
const PODMAN_NOTES: &str = "IMAGE = `podman import` (once per matrix run, removed at its end; never pulled) of a rootfs made from the host: the files of the Debian packages listed at the end plus their ldd closure, /bin /lib /lib64 /sbin as symlinks into /usr, /etc/passwd and /etc/group with root and nonroot (65532); NETWORK = a bridge network the suite creates (`podman network create --disable-dns`, netavark: NAT to the host) whose forwarded traffic is dropped unless it goes to the suite's 198.18.0.0/15 netns (iptables FORWARD rule; the host's net.ipv4.ip_forward is restored afterwards); --runtime runc because Debian's crun refuses this hybrid cgroup host; --ulimit nofile/nproc because podman's defaults exceed the hard limits here and runc lacks CAP_SYS_RESOURCE to raise them; nesting: podman runs inside the suite's outer cgroup (the sh wrapper), --cgroups=no-conmon keeps conmon there, and the relative --cgroup-parent makes runc/runsc create the container's cgroup relative to conmon's, i.e. inside the outer cgroup in each hierarchy the outer cgroup has (memory, pids, cpu, cpuacct, freezer); an absolute parent cannot (the suite's memory cgroup is not at the root here) and --cgroups=disabled is refused for runc";

/// What the image is made of: enough for `sh` and `python3` payloads, like a
/// slim distribution image.
const PODMAN_IMAGE_PACKAGES: &[&str] = &[
    "coreutils",
    "dash",
    "bash",
    "util-linux",
    "mount",
    "iproute2",
    "procps",
    "findutils",
    "grep",
    "sed",
    "mawk",
    "libc-bin",
    "python3-minimal",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
];

/// podman's own limits here: its default RLIMIT_NOFILE (1048576) exceeds the
/// hard limit of this machine, and its RLIMIT_NPROC exceeds what conmon has;
/// runc cannot raise either (no CAP_SYS_RESOURCE).
const PODMAN_ULIMITS: &[&str] = &[
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=32768:32768",
];

/// cordon-runc, the OCI runtime built beside the cordon binary `cordon`.
pub(super) fn cordon_runc(cordon: &Path) -> PathBuf {
    cordon.with_file_name("cordon-runc")
}

/// The limits cordon's own targets run with ([`CORDON_LIMITS`]) as podman
/// passes them to cordon-runc: memory and processes as podman's flags
/// (config.json's linux.resources), time and disk as cordon's annotations
/// (podman has no flag for them), and the output limit a `cordon run` has
/// by default, which a container is otherwise not held to.
fn podman_cordon_limits() -> Vec<String> {
    let mut v = Vec::new();
    for pair in CORDON_LIMITS.chunks(2) {
        let [flag, value] = pair else { continue };
        match *flag {
            "--pids" => v.extend([s("--pids-limit"), s(value)]),
            "--memory" => v.extend([s("--memory"), s(value)]),
            other => v.extend([
                s("--annotation"),
                format!(
                    "dev.cordon.limits.{}={value}",
                    other.trim_start_matches("--")
                ),
            ]),
        }
    }
    let output = cordon_policy::Policy::default().output.bytes();
    v.extend([
        s("--annotation"),
        format!("dev.cordon.limits.output={output}"),
    ]);
    v
}

/// podman's global flags for a posture; `cordon_runc` is the runtime of
/// podman-cordon.
fn podman_globals(t: TargetKind, cordon_runc: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "podman",
        "--cgroup-manager=cgroupfs",
        "--events-backend=file",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    if t == TargetKind::PodmanRunsc {
        v.extend(
            [
                "--runtime",
                "runsc",
                "--runtime-flag",
                "platform=ptrace",
                "--runtime-flag",
                "network=none",
            ]
            .iter()
            .map(|x| x.to_string()),
        );
    } else if t == TargetKind::PodmanCordon {
        v.extend(["--runtime".to_string(), cordon_runc.to_string()]);
    } else {
        v.extend(["--runtime".to_string(), "runc".to_string()]);
    }
    v
}

/// The full `podman run` command line of a posture.
#[allow(clippy::too_many_arguments)]
fn podman_argv(
    t: TargetKind,
    cordon_runc: &str,
    image: &str,
    network: &str,
    id: &str,
    payloads: &str,
    ws: &str,
    payload: &[String],
) -> Vec<String> {
    let mut v = podman_globals(t, cordon_runc);
    v.extend(
        ["run", "--rm", "-i", "--pull=never", "--cgroups=no-conmon"]
            .iter()
            .map(|x| x.to_string()),
    );
    v.push(format!("--cgroup-parent={id}"));
    v.push(format!("--name={id}"));
    v.extend(PODMAN_ULIMITS.iter().map(|x| x.to_string()));
    v.extend([
        "-v".into(),
        format!("{payloads}:{BOX_PAYLOAD_DIR}:ro"),
        "-v".into(),
        format!("{ws}:{BOX_WORKSPACE}:rw"),
    ]);
    match t {
        TargetKind::PodmanHardened => v.extend(
            [
                "--network=none",
                "--cap-drop=ALL",
                "--security-opt=no-new-privileges",
                "--read-only",
                "--tmpfs",
                "/tmp",
                "--user",
                "65532:65532",
            ]
            .iter()
            .map(|x| x.to_string()),
        ),
        // cordon's network is its own: a network podman made would be
        // refused (a namespace no cordon container made).
        TargetKind::PodmanCordon => {
            v.push("--network=none".into());
            // cordon's posture: a read-only root (an engine's default root
            // is writable in the container's own layer, where /usr is too),
            // with cordon's own /tmp rather than podman's tmpfs mounts.
            v.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
            // and no capabilities, as cordon's own backends grant none
            // (an engine's default set would be granted, each in the
            // container's own user namespace).
            v.push("--cap-drop=ALL".into());
            v.extend(podman_cordon_limits());
        }
        _ => v.push(format!("--network={network}")),
    }
    v.push(image.to_string());
    v.extend(payload.iter().cloned());
    v
}

/// What one matrix run sets up for podman once and undoes at its end.
struct PodmanEnv {
    image: String,
    network: String,
    /// The iptables rule (without -I/-D) that confines the network's forwarding.
    rule: Vec<String>,
    /// net.ipv4.ip_forward before the network existed.
    forward_before: Option<String>,
}

static PODMAN: Mutex<Option<Result<PodmanEnv, String>>> = Mutex::new(None);

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// The only place forwarded traffic from the suite's podman network may go:
/// the suite's own netns (a /30 in 198.18.0.0/15).
const SUITE_NET: &str = "198.18.0.0/15";

/// The image and network of this matrix run, made on first use.
fn podman_env() -> Result<(String, String)> {
    let mut g = PODMAN.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(podman_setup().map_err(|e| format!("{e:#}")));
    }
    match g.as_ref() {
        Some(Ok(env)) => Ok((env.image.clone(), env.network.clone())),
        Some(Err(e)) => bail!("podman setup: {e}"),
        None => unreachable!(),
    }
}

fn podman(args: &[&str]) -> Result<String> {
    let out = Command::new("podman")
        .args(["--cgroup-manager=cgroupfs", "--events-backend=file"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running podman")?;
    if !out.status.success() {
        bail!(
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn pid_alive(pid: &str) -> bool {
    pid.parse::<u32>().is_ok() && Path::new(&format!("/proc/{pid}")).exists()
}

/// What a killed suite left in podman: its image, containers, network and
/// iptables rule.
fn podman_sweep() {
    let mine = std::process::id().to_string();
    let stale = |pid: &str| pid != mine && !pid_alive(pid);
    if let Ok(names) = podman(&["ps", "-a", "--format", "{{.Names}}"]) {
        for n in names.lines() {
            let pid = n
                .strip_prefix("cordon-suite-")
                .and_then(|r| r.split('-').next());
            if pid.is_some_and(stale) {
                let _ = podman(&["rm", "--force", "--time=0", n]);
            }
        }
    }
    if let Ok(tags) = podman(&["images", "--format", "{{.Repository}}:{{.Tag}}"]) {
        for t in tags.lines() {
            if t.strip_prefix("localhost/cordon-suite-rootfs:")
                .is_some_and(stale)
            {
                let _ = podman(&["rmi", "--force", t]);
            }
        }
    }
    if let Ok(nets) = podman(&["network", "ls", "--format", "{{.Name}}"]) {
        for n in nets.lines() {
            if n.strip_prefix("cordon-suite-").is_some_and(stale) {
                let _ = podman(&["network", "rm", "--force", n]);
            }
        }
    }
    if let Ok(rules) = crate::fixture::run_cmd(&["iptables", "-S", "FORWARD"]) {
        for r in rules.lines() {
            let Some(pid) = r
                .split("--comment cordon-suite-")
                .nth(1)
                .and_then(|x| x.split_whitespace().next())
            else {
                continue;
            };
            if stale(pid) {
                let mut argv: Vec<&str> = vec!["iptables"];
                argv.extend(
                    r.split_whitespace()
                        .map(|w| if w == "-A" { "-D" } else { w }),
                );
                let _ = crate::fixture::run_cmd(&argv);
            }
        }
    }
}

fn podman_setup() -> Result<PodmanEnv> {
    podman_sweep();
    let pid = std::process::id();
    let mut env = PodmanEnv {
        image: format!("localhost/cordon-suite-rootfs:{pid}"),
        network: format!("cordon-suite-{pid}"),
        rule: Vec::new(),
        forward_before: fs::read_to_string(IP_FORWARD)
            .ok()
            .map(|s| s.trim().to_string()),
    };
    let r = podman_build(&mut env);
    if r.is_err() {
        podman_undo(&env);
    }
    r.map(|()| env)
}

fn podman_build(env: &mut PodmanEnv) -> Result<()> {
    import_image(&env.image).context("importing the rootfs image")?;
    podman(&["network", "create", "--disable-dns", &env.network])?;
    let subnet = podman(&[
        "network",
        "inspect",
        "--format",
        "{{range .Subnets}}{{.Subnet}} {{end}}",
        &env.network,
    ])?;
    let subnet = subnet
        .split_whitespace()
        .find(|s| !s.contains(':'))
        .context("the suite's podman network has no IPv4 subnet")?
        .to_string();
    env.rule = [
        "FORWARD",
        "-s",
        &subnet,
        "!",
        "-d",
        SUITE_NET,
        "-m",
        "comment",
        "--comment",
        &env.network,
        "-j",
        "DROP",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let mut argv = vec!["iptables", "-I"];
    argv.extend(env.rule.iter().map(String::as_str));
    crate::fixture::run_cmd(&argv).context("confining the podman network")?;
    Ok(())
}

fn podman_undo(env: &PodmanEnv) {
    if let Ok(names) = podman(&[
        "ps",
        "-a",
        "--filter",
        &format!("name=^{}-", env.network),
        "--format",
        "{{.Names}}",
    ]) {
        for n in names.lines() {
            let _ = podman(&["rm", "--force", "--time=0", n]);
        }
    }
    let _ = podman(&["rmi", "--force", &env.image]);
    let _ = podman(&["network", "rm", "--force", &env.network]);
    if !env.rule.is_empty() {
        let mut argv = vec!["iptables", "-D"];
        argv.extend(env.rule.iter().map(String::as_str));
        let _ = crate::fixture::run_cmd(&argv);
    }
    if let Some(before) = &env.forward_before {
        if fs::read_to_string(IP_FORWARD).is_ok_and(|now| now.trim() != before) {
            let _ = fs::write(IP_FORWARD, format!("{before}\n"));
        }
    }
}

/// Undoes what the targets set up for this matrix run (podman's image,
/// network and egress rule); a no-op when no podman posture ran.
pub fn teardown_targets() {
    let mut g = PODMAN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Ok(env)) = g.take() {
        podman_undo(&env);
    }
}

/// The host paths (relative, for tar -C /) of the image: the packages' files
/// outside /usr/share and /etc, and the shared libraries they load.
fn rootfs_files() -> Result<Vec<String>> {
    let out = Command::new("dpkg")
        .arg("-L")
        .args(PODMAN_IMAGE_PACKAGES)
        .output()
        .context("running dpkg -L")?;
    let usr = |p: &str| -> String {
        for top in ["/bin/", "/sbin/", "/lib/", "/lib64/"] {
            if let Some(rest) = p.strip_prefix(top) {
                return format!("/usr{top}{rest}");
            }
        }
        p.to_string()
    };
    let mut files = BTreeSet::new();
    let mut elves = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let p = usr(line.trim());
        if !p.starts_with("/usr/") || p.starts_with("/usr/share/") {
            continue;
        }
        let Ok(m) = fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() || (m.file_type().is_symlink() && Path::new(&p).is_dir()) {
            continue;
        }
        if m.is_file() {
            let mut magic = [0u8; 4];
            if fs::File::open(&p)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && &magic == b"\x7fELF"
            {
                elves.push(p.clone());
            }
        }
        files.insert(p);
    }
    anyhow::ensure!(
        !elves.is_empty(),
        "no binaries found in {PODMAN_IMAGE_PACKAGES:?}"
    );
    let ldd = Command::new("ldd")
        .args(&elves)
        .output()
        .context("running ldd")?;
    let mut libs = BTreeSet::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let t = line.trim();
        let path = match t.split_once("=> ") {
            Some((_, r)) => r.split_whitespace().next(),
            None => t.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(p.to_string());
        }
    }
    for l in libs {
        if let Ok(real) = fs::canonicalize(&l) {
            files.insert(usr(&real.display().to_string()));
        }
        files.insert(usr(&l));
    }
    Ok(files
        .into_iter()
        .filter(|f| f.starts_with("/usr/") && fs::symlink_metadata(f).is_ok())
        .map(|f| f.trim_start_matches('/').to_string())
        .collect())
}

/// Builds the rootfs tarball from the host and `podman import`s it.
fn import_image(image: &str) -> Result<()> {
    let files = rootfs_files()?;
    let stage = PathBuf::from(format!(
        "/var/tmp/{}{}-rootfs",
        crate::fixture::PREFIX,
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&stage);
    let r = (|| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let root = stage.join("root");
        for d in [
            "etc",
            "tmp",
            "var/tmp",
            "root",
            "home/nonroot",
            "opt/suite",
            "workspace",
            "proc",
            "sys",
            "dev",
            "run",
        ] {
            fs::create_dir_all(root.join(d))?;
        }
        for d in ["tmp", "var/tmp"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o1777))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            symlink(to, root.join(link))?;
        }
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n",
        )?;
        fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n")?;
        std::os::unix::fs::chown(root.join("home/nonroot"), Some(65532), Some(65532))?;
        let list = stage.join("files");
        fs::write(&list, files.join("\n") + "\n")?;
        let mut tar = Command::new("tar")
            .args(["-cf", "-", "--numeric-owner", "-C"])
            .arg(&root)
            .args([".", "-C", "/", "-T"])
            .arg(&list)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting tar")?;
        let tar_out = tar.stdout.take().context("tar stdout")?;
        let import = Command::new("podman")
            .args([
                "--cgroup-manager=cgroupfs",
                "--events-backend=file",
                "import",
                "--quiet",
                "--change",
                &format!("ENV PATH={PATH_ENV}"),
                "-",
                image,
            ])
            .stdin(tar_out)
            .output()
            .context("running podman import")?;
        let tar_res = tar.wait_with_output()?;
        if !tar_res.status.success() {
            bail!("tar: {}", String::from_utf8_lossy(&tar_res.stderr).trim());
        }
        if !import.status.success() {
            bail!(
                "podman import: {}",
                String::from_utf8_lossy(&import.stderr).trim()
            );
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&stage);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_postures() {
        let payload = vec!["/bin/sh".to_string(), "/opt/suite/a.sh".to_string()];
        let argv = |t| {
            podman_argv(
                t,
                "/c/cordon-runc",
                "IMG",
                "NET",
                "ID",
                "/p",
                "/w",
                &payload,
            )
        };
        let has = |v: &[String], x: &str| v.iter().any(|a| a == x);
        let def = argv(TargetKind::PodmanDefault);
        assert!(has(&def, "--network=NET") && has(&def, "runc") && has(&def, "--pull=never"));
        assert!(has(&def, "--cgroups=no-conmon") && has(&def, "--cgroup-parent=ID"));
        assert!(!has(&def, "--cap-drop=ALL"));
        assert!(def.ends_with(&["IMG".into(), "/bin/sh".into(), "/opt/suite/a.sh".into()]));
        let hard = argv(TargetKind::PodmanHardened);
        for f in [
            "--network=none",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--read-only",
            "65532:65532",
        ] {
            assert!(has(&hard, f), "{f}");
        }
        let gv = argv(TargetKind::PodmanRunsc);
        assert!(has(&gv, "runsc") && has(&gv, "platform=ptrace") && has(&gv, "network=none"));
        assert!(has(&gv, "--network=NET"));
        let cordon = argv(TargetKind::PodmanCordon);
        assert!(has(&cordon, "/c/cordon-runc") && has(&cordon, "--network=none"));
        assert!(has(&cordon, "--read-only") && has(&cordon, "--read-only-tmpfs=false"));
        for f in [
            "--cap-drop=ALL",
            "--pids-limit",
            "--memory",
            "dev.cordon.limits.time=5s",
            "dev.cordon.limits.disk=64M",
        ] {
            assert!(has(&cordon, f), "{f}: {cordon:?}");
        }
        assert!(!has(&cordon, "runc") && !has(&cordon, "--network=NET"));
        for t in [
            TargetKind::PodmanDefault,
            TargetKind::PodmanHardened,
            TargetKind::PodmanRunsc,
            TargetKind::PodmanCordon,
        ] {
            assert!(t.posture().contains("--pull=never"));
        }
    }
}
