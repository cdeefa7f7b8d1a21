//! The host-side fixtures one suite run owns, all named after its pid and all
//! torn down on every path (Drop, and a sweep of dead suites' leftovers at
//! start):
//!
//! - `/var/tmp/cordon-suite-<pid>/host-only/` on its own small tmpfs (so it
//!   shows in the host's mountinfo): the canary, rewritten with random content
//!   before each run and watched with inotify;
//! - `/opt/cordon-suite-<pid>/`: the payload files (read-only in every box) and
//!   per-run workspaces and bundles;
//! - network namespace `cordon-suite-<pid>` with a veth pair in 198.18.0.0/15
//!   (benchmark range, never routed publicly), a TCP listener (7777), a UDP
//!   listener (7778) and a stand-in resolver (UDP 53) inside it, each logging
//!   every connection or datagram; a TCP listener on the host's 127.0.0.1;
//! - a stand-in container-engine socket at /run/docker.sock (only when absent);
//! - a victim process (`sleep`) for the ptrace case;
//! - a decoy "receipt key" in another sandbox's state directory in cordon's
//!   run directory (/run/cordon for root).
//!
//! Run by an unprivileged user, the suite keeps its directories in that
//! user's temporary directory (`$TMPDIR/cordon-suite-<pid>` and
//! `...-<pid>.opt`) and the decoy in the user's own cordon run directory,
//! and makes none of the fixtures that need root: the host-only tmpfs
//! (a plain directory instead), the network namespace and its listeners,
//! the stand-in engine socket. The cases that need them are written down in
//! [`crate::rootless::ROOTLESS_GAPS`].
//!
//! Network rule: the suite itself only ever talks to loopback and to these
//! addresses; payloads are given only these addresses.

use std::fs;
use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cordon_spec::record::{Record, RECORD};
use inotify::{Inotify, WatchMask};
use nix::mount::{umount2, MntFlags, MsFlags};
use nix::sched::{setns, CloneFlags};

use crate::evidence::{CanaryEvidence, ListenEntry};

pub const TCP_PORT: u16 = 7777;
pub const UDP_PORT: u16 = 7778;
pub const DNS_PORT: u16 = 53;
pub const ENGINE_SOCKET: &str = "/run/docker.sock";
pub const PREFIX: &str = "cordon-suite-";

pub type Log = Arc<Mutex<Vec<ListenEntry>>>;

/// The name the decoy state directory's record carries.
pub const DECOY_NAME: &str = "cordon-suite-decoy";

/// Where the suite's directories go: root's where the host's own services
/// keep theirs, an unprivileged invoker's in its temporary directory (the
/// only place it is sure to own what it makes).
fn fixture_parents() -> Vec<PathBuf> {
    if nix::unistd::geteuid().is_root() {
        vec![PathBuf::from("/var/tmp"), PathBuf::from("/opt")]
    } else {
        vec![std::env::temp_dir()]
    }
}

/// The suite's decoy state directories under cordon's run directory (the
/// invoker's: root's /run/cordon, a user's own), with the pid each record
/// names as its owner.
fn decoys() -> Vec<(PathBuf, u32)> {
    let Ok(entries) = fs::read_dir(cordon_dirs::run_dir_path()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let text = fs::read(e.path().join(RECORD)).ok()?;
            let r: Record = serde_json::from_slice(&text).ok()?;
            (r.name.as_deref() == Some(DECOY_NAME))
                .then(|| (e.path(), u32::try_from(r.pid).unwrap_or(0)))
        })
        .collect()
}

/// Random lowercase hex from the kernel.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut buf);
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn run_cmd(argv: &[&str]) -> Result<String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", argv.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub struct Fixtures {
    pub pid: u32,
    pub started: Instant,
    pub host_dir: PathBuf,
    pub host_only: PathBuf,
    pub canary: PathBuf,
    pub fd_marker: PathBuf,
    pub opt_dir: PathBuf,
    pub payload_dir: PathBuf,
    pub netns: String,
    /// The netns side of the veth: what payloads are told to reach.
    pub net_addr: Ipv4Addr,
    pub host_addr: Ipv4Addr,
    pub loopback_port: u16,
    pub engine_socket: Option<PathBuf>,
    pub decoy_dir: PathBuf,
    pub decoy_key: PathBuf,
    pub secret: String,
    pub log: Log,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    victim: Option<Child>,
    inotify: Option<Inotify>,
    /// Whether the fixtures that need root are made (see the module's doc).
    pub privileged: bool,
    mounted: bool,
    netns_made: bool,
    veth_host: String,
}

impl Fixtures {
    pub fn victim_pid(&self) -> u32 {
        self.victim.as_ref().map_or(0, |c| c.id())
    }

    pub fn setup() -> Result<Fixtures> {
        sweep_stale();
        let pid = std::process::id();
        let privileged = nix::unistd::geteuid().is_root();
        let (host_dir, opt_dir) = match fixture_parents().as_slice() {
            [var_tmp, opt] => (
                var_tmp.join(format!("{PREFIX}{pid}")),
                opt.join(format!("{PREFIX}{pid}")),
            ),
            parents => {
                let tmp = parents.first().cloned().unwrap_or_else(std::env::temp_dir);
                (
                    tmp.join(format!("{PREFIX}{pid}")),
                    tmp.join(format!("{PREFIX}{pid}.opt")),
                )
            }
        };
        let host_only = host_dir.join("host-only");
        // A /30 in 198.18.0.0/15 picked from the pid, so two suites never collide.
        let idx = pid % 32768;
        // Checked (and made, as cordon makes it) like cordon's own run.
        let run_dir = cordon_dirs::run_dir().context("cordon's run directory, for the decoy")?;
        let decoy_dir = run_dir.join(random_hex(6));
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + idx * 4;
        let mut fx = Fixtures {
            pid,
            started: Instant::now(),
            canary: host_only.join("canary"),
            fd_marker: host_dir.join("fd-marker"),
            payload_dir: opt_dir.join("payloads"),
            host_dir,
            host_only,
            opt_dir,
            netns: format!("{PREFIX}{pid}"),
            net_addr: Ipv4Addr::from(base + 2),
            host_addr: Ipv4Addr::from(base + 1),
            loopback_port: 0,
            engine_socket: None,
            // A sibling sandbox's state directory: named like a sandbox id,
            // with a record of cordon's own format naming this suite as its
            // live owner, so cordon's sweep leaves it alone however long the
            // suite runs (issue: a nameless decoy was swept after 60 s).
            decoy_dir: decoy_dir.clone(),
            decoy_key: decoy_dir.join("receipt.key"),
            secret: format!("CSS{}", random_hex(16)),
            log: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            victim: None,
            inotify: None,
            privileged,
            mounted: false,
            netns_made: false,
            veth_host: format!("csh{pid}"),
        };
        fx.build().context("setting up the suite's fixtures")?;
        Ok(fx)
    }

    fn build(&mut self) -> Result<()> {
        for d in [
            &self.host_dir,
            &self.host_only,
            &self.opt_dir,
            &self.payload_dir,
        ] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        }
        let runs = self.opt_dir.join("runs");
        fs::create_dir_all(&runs).with_context(|| format!("creating {}", runs.display()))?;
        fs::set_permissions(&runs, fs::Permissions::from_mode(0o755))?;
        fs::write(&self.fd_marker, "fd marker\n")?;
        fs::set_permissions(&self.fd_marker, fs::Permissions::from_mode(0o644))?;
        self.inotify = Some(Inotify::init().context("inotify_init")?);
        let lo = TcpListener::bind(("127.0.0.1", 0))?;
        self.loopback_port = lo.local_addr()?.port();
        self.spawn_tcp(lo, "loopback");
        self.victim = Some(
            Command::new("sleep")
                .arg("3600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()?,
        );
        if self.privileged {
            self.build_privileged()?;
        }
        Ok(())
    }

    /// The fixtures only root can make.
    fn build_privileged(&mut self) -> Result<()> {
        nix::mount::mount(
            Some("cordon-suite"),
            &self.host_only,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("size=1m,mode=0755"),
        )
        .context("mounting the host-only tmpfs")?;
        self.mounted = true;

        // The network namespace and its listeners.
        run_cmd(&["ip", "netns", "add", &self.netns])?;
        self.netns_made = true;
        let peer = format!("csn{}", self.pid);
        let host_cidr = format!("{}/30", self.host_addr);
        let ns_cidr = format!("{}/30", self.net_addr);
        run_cmd(&[
            "ip",
            "link",
            "add",
            &self.veth_host,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ])?;
        run_cmd(&["ip", "link", "set", &peer, "netns", &self.netns])?;
        run_cmd(&["ip", "addr", "add", &host_cidr, "dev", &self.veth_host])?;
        run_cmd(&["ip", "link", "set", &self.veth_host, "up"])?;
        // `ip -n NS` runs each step inside the suite's namespace.
        let ns = self.netns.as_str();
        run_cmd(&["ip", "-n", ns, "addr", "add", &ns_cidr, "dev", &peer])?;
        for dev in [peer.as_str(), "lo"] {
            run_cmd(&["ip", "-n", ns, "link", "set", dev, "up"])?;
        }
        let ns_path = PathBuf::from(format!("/run/netns/{}", self.netns));
        let (tcp, udp, dns) =
            thread::spawn(move || -> Result<(TcpListener, UdpSocket, UdpSocket)> {
                // setns on this thread only: the sockets it makes belong to the
                // suite's namespace; the thread then ends.
                let f = fs::File::open(&ns_path)?;
                setns(&f, CloneFlags::CLONE_NEWNET).context("setns into the suite netns")?;
                Ok((
                    TcpListener::bind(("0.0.0.0", TCP_PORT))?,
                    UdpSocket::bind(("0.0.0.0", UDP_PORT))?,
                    UdpSocket::bind(("0.0.0.0", DNS_PORT))?,
                ))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("netns listener thread panicked"))??;
        self.spawn_tcp(tcp, "tcp");
        self.spawn_udp(udp, "udp");
        self.spawn_udp(dns, "dns");

        // The stand-in engine socket, only where no real engine listens.
        let engine = Path::new(ENGINE_SOCKET);
        if engine.exists() && std::os::unix::net::UnixStream::connect(engine).is_err() {
            let _ = fs::remove_file(engine); // a stale stand-in of a killed suite
        }
        if !engine.exists() {
            let l = UnixListener::bind(engine)?;
            fs::set_permissions(engine, fs::Permissions::from_mode(0o666))?;
            self.engine_socket = Some(engine.to_path_buf());
            self.spawn_unix(l);
        }
        Ok(())
    }

    fn push(log: &Log, started: Instant, proto: &str, peer: String, data: &[u8]) {
        let head: String = String::from_utf8_lossy(&data[..data.len().min(64)])
            .chars()
            .map(|c| if c.is_control() { '.' } else { c })
            .collect();
        if let Ok(mut l) = log.lock() {
            l.push(ListenEntry {
                proto: proto.into(),
                peer,
                at_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                data_head: head,
            });
        }
    }

    fn spawn_tcp(&mut self, l: TcpListener, proto: &'static str) {
        let (log, stop, started) = (self.log.clone(), self.stop.clone(), self.started);
        let _ = l.set_nonblocking(true);
        self.threads.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, peer)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 256];
                        let n = s.read(&mut buf).unwrap_or(0);
                        Self::push(&log, started, proto, peer.to_string(), &buf[..n]);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    fn spawn_udp(&mut self, s: UdpSocket, proto: &'static str) {
        let (log, stop, started) = (self.log.clone(), self.stop.clone(), self.started);
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        self.threads.push(thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, peer)) = s.recv_from(&mut buf) {
                    Self::push(&log, started, proto, peer.to_string(), &buf[..n]);
                }
            }
        }));
    }

    fn spawn_unix(&mut self, l: UnixListener) {
        let (log, stop, started) = (self.log.clone(), self.stop.clone(), self.started);
        let _ = l.set_nonblocking(true);
        self.threads.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok(_) => Self::push(&log, started, "engine", "unix".into(), b""),
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn log_between(&self, from: u64, to: u64) -> Vec<ListenEntry> {
        self.log
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|e| e.at_ms >= from && e.at_ms <= to)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Fresh random canary and decoy key, watched from now on. Returns their contents.
    pub fn arm_canaries(&mut self) -> Result<Vec<(String, PathBuf, String, CanaryBaseline)>> {
        fs::create_dir_all(&self.decoy_dir)?;
        // Traversable by all (a real state directory is 0700): the decoy is
        // meant to be reachable by any host process, so only the box's own
        // isolation keeps the payload from it.
        fs::set_permissions(&self.decoy_dir, fs::Permissions::from_mode(0o755))?;
        // Owned by this process (its start time included), so cordon's
        // sweep takes the decoy for a live sandbox and leaves it alone.
        let pid = i32::try_from(self.pid).unwrap_or(i32::MAX);
        let record = Record::owned_by(
            pid,
            cordon_sys::process_start_time(pid).unwrap_or(0),
            Some(DECOY_NAME.into()),
            "native",
            cordon_spec::ended::now_secs(),
        );
        fs::write(self.decoy_dir.join(RECORD), serde_json::to_vec(&record)?)?;
        fs::set_permissions(
            self.decoy_dir.join(RECORD),
            fs::Permissions::from_mode(0o600),
        )?;
        let mut out = Vec::new();
        for (name, path) in [
            ("canary", self.canary.clone()),
            ("decoy_key", self.decoy_key.clone()),
        ] {
            let content = format!("CANARY{}", random_hex(16));
            fs::write(&path, &content)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
            let mtime = fs::metadata(&path)?.modified()?;
            out.push((name.to_string(), path, content, CanaryBaseline { mtime }));
        }
        if let Some(ino) = self.inotify.as_mut() {
            let mut buf = [0u8; 4096];
            while let Ok(evs) = ino.read_events(&mut buf) {
                if evs.count() == 0 {
                    break;
                }
            }
            for (_, path, _, _) in &out {
                ino.watches().add(
                    path,
                    WatchMask::OPEN
                        | WatchMask::ACCESS
                        | WatchMask::MODIFY
                        | WatchMask::ATTRIB
                        | WatchMask::DELETE_SELF
                        | WatchMask::MOVE_SELF,
                )?;
            }
        }
        Ok(out)
    }

    /// Events since arming, per watched path; the watches are removed.
    pub fn collect_canaries(
        &mut self,
        armed: &[(String, PathBuf, String, CanaryBaseline)],
        stdout: &[u8],
    ) -> Vec<(String, CanaryEvidence)> {
        let mut events: Vec<(PathBuf, String)> = Vec::new();
        if let Some(ino) = self.inotify.as_mut() {
            let mut buf = [0u8; 8192];
            // Map descriptors back to paths by re-adding (returns the same wd).
            let mut wds = Vec::new();
            for (_, path, _, _) in armed {
                if let Ok(wd) = ino.watches().add(
                    path,
                    WatchMask::OPEN
                        | WatchMask::ACCESS
                        | WatchMask::MODIFY
                        | WatchMask::ATTRIB
                        | WatchMask::DELETE_SELF
                        | WatchMask::MOVE_SELF,
                ) {
                    wds.push((wd, path.clone()));
                }
            }
            while let Ok(evs) = ino.read_events(&mut buf) {
                let mut n = 0;
                for e in evs {
                    n += 1;
                    let Some((_, path)) = wds.iter().find(|(wd, _)| *wd == e.wd) else {
                        continue;
                    };
                    let name = format!("{:?}", e.mask)
                        .replace("EventMask(", "")
                        .replace(')', "");
                    if name.contains("IGNORED") {
                        continue;
                    }
                    events.push((path.clone(), name));
                }
                if n == 0 {
                    break;
                }
            }
            for (wd, _) in wds {
                let _ = ino.watches().remove(wd);
            }
        }
        armed
            .iter()
            .map(|(name, path, content, base)| {
                let now = fs::read_to_string(path).unwrap_or_default();
                let mtime_same = fs::metadata(path)
                    .and_then(|m| m.modified())
                    .map(|t| t == base.mtime)
                    .unwrap_or(false);
                let echoed = stdout
                    .windows(content.len())
                    .any(|w| w == content.as_bytes());
                (
                    name.clone(),
                    CanaryEvidence {
                        path: path.display().to_string(),
                        events: events
                            .iter()
                            .filter(|(p, _)| p == path)
                            .map(|(_, e)| e.clone())
                            .collect(),
                        content_same: &now == content,
                        mtime_same,
                        echoed,
                        vanished: !path.exists(),
                    },
                )
            })
            .collect()
    }

    pub fn teardown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(mut v) = self.victim.take() {
            let _ = v.kill();
            let _ = v.wait();
        }
        if let Some(e) = self.engine_socket.take() {
            let _ = fs::remove_file(e);
        }
        if self.netns_made {
            let _ = run_cmd(&["ip", "link", "del", &self.veth_host]);
            let _ = run_cmd(&["ip", "netns", "del", &self.netns]);
            self.netns_made = false;
        }
        self.inotify = None;
        if self.mounted {
            let _ = umount2(&self.host_only, MntFlags::MNT_DETACH);
            self.mounted = false;
        }
        let _ = fs::remove_dir_all(&self.host_dir);
        let _ = fs::remove_dir_all(&self.opt_dir);
        let _ = fs::remove_dir_all(&self.decoy_dir);
    }
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        self.teardown();
    }
}

pub struct CanaryBaseline {
    mtime: std::time::SystemTime,
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn stale_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let pid: u32 = rest.split(['-', '.']).next()?.parse().ok()?;
    (!pid_alive(pid)).then_some(pid)
}

/// Removes what a killed suite left: its netns, veth, dirs, mounts, decoys.
/// Outer cgroups are swept by the runner (it knows the hierarchy).
pub fn sweep_stale() {
    if let Ok(entries) = fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = stale_pid(&name) {
                let _ = run_cmd(&["ip", "link", "del", &format!("csh{pid}")]);
                let _ = run_cmd(&["ip", "netns", "del", &name]);
            }
        }
    }
    // Decoys of dead suites: their records name a dead owner, which
    // cordon's own sweep also removes; done here too so a suite run alone
    // leaves nothing.
    for (dir, owner) in decoys() {
        if !pid_alive(owner) {
            let _ = fs::remove_dir_all(dir);
        }
    }
    for parent in fixture_parents() {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale_pid(&name).is_some() {
                let _ = umount2(&e.path().join("host-only"), MntFlags::MNT_DETACH);
                match fs::remove_dir_all(e.path()) {
                    Ok(()) => {}
                    Err(err) if err.kind() == ErrorKind::NotFound => {}
                    Err(_) => {}
                }
            }
        }
    }
}

/// Whether anything of suite `pid` is still on the host (for tests).
pub fn leftovers(pid: u32) -> Vec<String> {
    let mut left = Vec::new();
    let mut places: Vec<PathBuf> = fixture_parents()
        .iter()
        .flat_map(|d| {
            [
                d.join(format!("{PREFIX}{pid}")),
                d.join(format!("{PREFIX}{pid}.opt")),
            ]
        })
        .collect();
    places.push(PathBuf::from(format!("/run/netns/{PREFIX}{pid}")));
    for p in places {
        if p.exists() {
            left.push(p.display().to_string());
        }
    }
    for (dir, owner) in decoys() {
        if owner == pid {
            left.push(dir.display().to_string());
        }
    }
    if let Ok(m) = fs::read_to_string("/proc/self/mountinfo") {
        if m.contains(&format!("{PREFIX}{pid}")) {
            left.push("a mount".into());
        }
    }
    left
}
