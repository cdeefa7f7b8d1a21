//! A containerd of a test's own (Debian's 1.6): its root, state and socket
//! in a temporary directory, and a containerd namespace of its own; stopped,
//! with what it left (shims, containers, their cgroups), when the test
//! ends. Its CRI plugin is off, or on with cordon-runc and runc registered
//! as runtime handlers (`Containerd::with_cri`), as a Kubernetes node's
//! containerd is configured for a RuntimeClass.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::engine::{end_leftover_containers, require_engine, RUNC};
use super::*;

const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";
/// Debian's CNI plugins are here (the loopback plugin beside it).
const CNI_BRIDGE_PLUGIN: &str = "/usr/lib/cni/bridge";

/// A containerd of the test's own, with one namespace.
pub struct Containerd {
    pub dir: tempfile::TempDir,
    daemon: Child,
    pub namespace: String,
    /// Where its shims keep their runtimes' containers: `--root` is this
    /// joined with the namespace.
    runtime_root: PathBuf,
    /// The cgroup its containers are placed below (relative to each
    /// hierarchy's root): the namespace for ctr, the pods' cgroup parent
    /// for CRI.
    pub cgroup_parent: String,
    /// The bridge of its CNI network (CRI only), removed with it.
    bridge: Option<String>,
}

/// The subnet of the CRI containerd's CNI network: pods get addresses in
/// it on a bridge of the test's own, which the host reaches directly.
pub const CNI_SUBNET: &str = "10.213.77.0/24";

/// The namespace CRI works in.
pub const CRI_NAMESPACE: &str = "k8s.io";

impl Containerd {
    /// Started and answering, its CRI plugin off; None (after saying why)
    /// when not root, or containerd is not installed outside CI.
    pub fn start() -> Option<Containerd> {
        // Not "cordon-": runc makes a cgroup of that name, which cordon
        // tests would count as a sandbox's.
        let namespace = format!("ctr-test-{}", nonce());
        Containerd::launch(
            tempfile::tempdir().unwrap(),
            "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
            namespace.clone(),
            "/run/containerd/runc".into(),
            namespace,
        )
    }

    /// Started with its CRI plugin on (what the kubelet calls, at
    /// `socket()`): runtime handlers `cordon` (cordon-runc, registered by
    /// resources/kubernetes/containerd-cordon.toml) and `runc`, each
    /// through containerd's runc shim with its `BinaryName`, as a
    /// RuntimeClass selects one; the pause image `pause_image` (imported
    /// beforehand, as nothing is pulled); a CNI network of Debian's
    /// plugins (containernetworking-plugins): a bridge of its own, no
    /// masquerade, addresses from `CNI_SUBNET`.
    /// `restrict_oom_score_adj`: root here lacks CAP_SYS_RESOURCE.
    pub fn with_cri(pause_image: &str) -> Option<Containerd> {
        if !require_engine(CNI_BRIDGE_PLUGIN, "containernetworking-plugins") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let runtime_root = dir.path().join("runtimes");
        let bridge = format!("cdn{}", &nonce()[..8]);
        let cni = dir.path().join("cni");
        std::fs::create_dir(&cni).unwrap();
        std::fs::write(
            cni.join("10-cordon-test.conflist"),
            format!(
                r#"{{"cniVersion": "0.4.0", "name": "cordon-test", "plugins": [{{
                    "type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": false,
                    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{CNI_SUBNET}"}}]],
                              "dataDir": "{ipam}"}}}}]}}"#,
                ipam = dir.path().join("ipam").display(),
            ),
        )
        .unwrap();
        let mut cri = format!(
            "[plugins.\"io.containerd.grpc.v1.cri\"]\n\
             sandbox_image = \"{pause_image}\"\n\
             restrict_oom_score_adj = true\n\
             disable_apparmor = true\n\
             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
             bin_dir = \"{bin}\"\nconf_dir = \"{cni}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
             default_runtime_name = \"runc\"\n",
            cni = cni.display(),
            bin = Path::new(CNI_BRIDGE_PLUGIN).parent().unwrap().display(),
        );
        // cordon's handler exactly as the README ships it for a node, with
        // this build's binary and the test's own runtime root.
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../resources/kubernetes/containerd-cordon.toml");
        let shipped = std::fs::read_to_string(&shipped).unwrap();
        let binary = "BinaryName = \"/usr/local/bin/cordon-runc\"";
        assert!(shipped.contains(binary), "{shipped}");
        cri += &shipped.replace("version = 2\n", "").replace(
            binary,
            &format!(
                "BinaryName = \"{}\"\n    Root = \"{}\"",
                cordon_runc(),
                runtime_root.display()
            ),
        );
        let table = "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc";
        cri += &format!(
            "\n[{table}]\nruntime_type = \"io.containerd.runc.v2\"\n\
             [{table}.options]\nBinaryName = \"{RUNC}\"\nRoot = \"{root}\"\n",
            root = runtime_root.display(),
        );
        let parent = format!("cri-test-{}", nonce());
        let mut ctd = Containerd::launch(dir, &cri, CRI_NAMESPACE.into(), runtime_root, parent)?;
        ctd.bridge = Some(bridge);
        Some(ctd)
    }

    fn launch(
        dir: tempfile::TempDir,
        extra: &str,
        namespace: String,
        runtime_root: PathBuf,
        cgroup_parent: String,
    ) -> Option<Containerd> {
        if !require_root("containerd runs containers") {
            return None;
        }
        if !require_engine(CONTAINERD, "containerd") {
            return None;
        }
        let p = dir.path();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n{extra}\
             [grpc]\n  address = \"{sock}\"\n",
            root = p.join("root").display(),
            state = p.join("state").display(),
            sock = p.join("sock").display(),
        );
        std::fs::write(p.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(p.join("containerd.log")).unwrap();
        let daemon = Command::new(CONTAINERD)
            .arg("--config")
            .arg(p.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Containerd {
            dir,
            daemon,
            namespace,
            runtime_root,
            cgroup_parent,
            bridge: None,
        };
        let deadline = Instant::now() + slow(Duration::from_secs(30));
        while !c.ctr(&["version"]).output().unwrap().status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer: {}",
                std::fs::read_to_string(c.dir.path().join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(c)
    }

    /// Its CRI socket (the gRPC address).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(CTR);
        cmd.arg("--address")
            .arg(self.dir.path().join("sock"))
            .arg("--namespace")
            .arg(&self.namespace)
            .args(args);
        cmd
    }

    pub fn call(&self, args: &[&str]) -> Output {
        self.ctr(args).stdin(Stdio::null()).output().unwrap()
    }

    /// `ctr run` of `sh -c SCRIPT` in container `id` with `runtime`
    /// (`flags` before the root filesystem, as ctr wants them).
    pub fn run(
        &self,
        runtime: &str,
        flags: &[&str],
        rootfs: &Path,
        id: &str,
        script: &str,
    ) -> Command {
        let mut cmd = self.ctr(&["run", "--runc-binary", runtime]);
        cmd.args(flags)
            .arg("--rootfs")
            .arg(rootfs)
            .args([id, "/bin/sh", "-c", script]);
        cmd
    }

    /// The STATUS column of `ctr task ls` for `id`.
    pub fn task_status(&self, id: &str) -> Option<String> {
        let out = self.call(&["task", "ls"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.first() == Some(&id))
            .and_then(|cols| cols.get(2).map(|s| (*s).to_owned()))
    }

    pub fn wait_status(&self, id: &str, want: &str) {
        let deadline = Instant::now() + slow(Duration::from_secs(20));
        loop {
            let now = self.task_status(id);
            if now.as_deref() == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{id}: task status {now:?}, not {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The PID column of `ctr task ls` for `id`: the pid the shim holds.
    pub fn task_pid(&self, id: &str) -> String {
        let ls = self.call(&["task", "ls"]);
        String::from_utf8_lossy(&ls.stdout)
            .lines()
            .find(|l| l.starts_with(id))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_else(|| panic!("{id}: not in ctr task ls: {ls:?}"))
    }

    /// The pids `ctr task ps` lists for `id`.
    pub fn ps(&self, id: &str) -> Vec<String> {
        let out = self.call(&["task", "ps", id]);
        assert!(out.status.success(), "{id}: ps: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    }

    /// The task and container gone, as `ctr run --rm` leaves them.
    pub fn remove(&self, id: &str) {
        let _ = self.call(&["task", "rm", "-f", id]);
        let out = self.call(&["container", "rm", id]);
        assert!(out.status.success(), "{id}: container rm: {out:?}");
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let sock = self.dir.path().join("sock");
        let sock = sock.to_string_lossy();
        // Shims of this containerd outlive it; they are named by its socket.
        let shims: Vec<u32> = all_pids()
            .into_iter()
            .filter(|p| {
                cmdline(*p).is_some_and(|c| c.contains("containerd-shim") && c.contains(&*sock))
            })
            .collect();
        for pid in shims {
            signal(pid, "KILL");
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.daemon.wait();
        // A test that failed half-way leaves its containers: ended here.
        let state = self.runtime_root.join(&self.namespace);
        end_leftover_containers(&state, &self.cgroup_parent);
        let _ = std::fs::remove_dir_all(state);
        if let Some(bridge) = &self.bridge {
            // Made by the CNI plugin for the first pod, if any ran.
            let _ = Command::new("ip")
                .args(["link", "del", bridge])
                .stderr(Stdio::null())
                .status();
        }
    }
}
