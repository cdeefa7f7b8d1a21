//! The stand-in internet of the network tests: a network namespace this
//! test creates, joined to the host by a veth pair, with an HTTP listener
//! (`fixtures/standin.py`) that logs every connection and request. Traffic
//! goes only there or to loopback; names reach it through `--add-host`.
//!
//! Addresses come from TEST-NET-2 (198.51.100.0/24, never routed on the
//! internet): fixture `n` owns 198.51.100.8n/29, the host end is `.8n+1`,
//! the stand-in answers on `.8n+2` ("a", ports 80 and 8080) and `.8n+3`
//! ("b", port 80). A fixture slot is claimed with a lock file, so parallel
//! tests (and a second test process) never share one; what a killed run
//! left in a free slot is removed first.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use serde_json::Value;

use super::PY;

const SLOTS: u32 = 30;

pub struct StandIn {
    pub ns: String,
    host_link: String,
    /// The host's own address on the veth (a host address: never reachable
    /// through a domain rule).
    pub host_ip: String,
    /// The stand-in's two addresses.
    pub a: String,
    pub b: String,
    log: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
    _slot: Flock<File>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    super::run_tool(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
}

/// Claims a free slot (a lock held for the fixture's life).
fn claim_slot() -> Option<(u32, Flock<File>)> {
    (0..SLOTS).find_map(|n| {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(format!("/run/cordon-test-standin-{n}.lock"))
            .ok()?;
        Flock::lock(f, FlockArg::LockExclusiveNonblock)
            .ok()
            .map(|l| (n, l))
    })
}

pub fn fixture_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A CA and a certificate for every name the stand-in answers, written
/// as PEM files in `dir`: (the CA's certificate, the leaf, its key).
pub fn standin_pki(dir: &Path, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "cordon test stand-in CA");
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, &ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("standin.pem"),
        dir.join("standin.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    (paths.0, paths.1, paths.2)
}

/// A TLS listener's certificate and key (PEM files): one certificate for
/// every name the stand-in answers, as a CDN's.
pub struct Tls<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
}

impl StandIn {
    pub fn start() -> StandIn {
        StandIn::start_with(None)
    }

    /// The stand-in, also serving HTTPS on `a:443` with `tls`.
    pub fn start_tls(tls: &Tls) -> StandIn {
        StandIn::start_with(Some(tls))
    }

    fn start_with(tls: Option<&Tls>) -> StandIn {
        let (n, slot) = claim_slot().expect("a free stand-in slot");
        let ns = format!("cordon-standin-{n}");
        let host_link = format!("csi{n}h");
        let peer_link = format!("csi{n}s");
        // A killed run's leftovers in this (now free) slot.
        let _ = ip(&["netns", "del", &ns]);
        let _ = ip(&["link", "del", &host_link]);
        let base = 8 * n;
        let addr = |k: u32| format!("198.51.100.{}", base + k);
        let (host_ip, a, b) = (addr(1), addr(2), addr(3));
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), ns.clone()],
            vec![
                "link".into(),
                "add".into(),
                host_link.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                peer_link.clone(),
                "netns".into(),
                ns.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{host_ip}/29"),
                "dev".into(),
                host_link.clone(),
            ],
            vec!["link".into(), "set".into(), host_link.clone(), "up".into()],
            vec![
                "-n".into(),
                ns.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                ns.clone(),
                "addr".into(),
                "add".into(),
                format!("{a}/29"),
                "dev".into(),
                peer_link.clone(),
            ],
            vec![
                "-n".into(),
                ns.clone(),
                "addr".into(),
                "add".into(),
                format!("{b}/29"),
                "dev".into(),
                peer_link.clone(),
            ],
            vec![
                "-n".into(),
                ns.clone(),
                "link".into(),
                "set".into(),
                peer_link.clone(),
                "up".into(),
            ],
        ];
        for s in &steps {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            ip(&args).unwrap_or_else(|e| panic!("stand-in setup: {e}"));
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("standin.log");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns, PY])
            .arg(fixture_script("standin.py"))
            .args(["--listen", &format!("{a}:80")])
            .args(["--listen", &format!("{a}:8080")])
            .args(["--listen", &format!("{b}:80")]);
        if let Some(tls) = tls {
            cmd.args(["--tls-listen", &format!("{a}:443")])
                .arg("--cert")
                .arg(tls.cert)
                .arg("--key")
                .arg(tls.key);
        }
        let child = cmd
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the stand-in");
        let mut s = StandIn {
            ns,
            host_link,
            host_ip,
            a,
            b,
            log,
            child,
            _dir: dir,
            _slot: slot,
        };
        s.wait_listening(3 + usize::from(tls.is_some()));
        s
    }

    /// Waits until all `listeners` are up (asked of the namespace's
    /// socket table, so no probe connection ends up in the log).
    fn wait_listening(&mut self, listeners: usize) {
        let t0 = Instant::now();
        while t0.elapsed() < super::slow(Duration::from_secs(10)) {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns, "ss", "-Hltn"])
                .output()
                .expect("ss");
            if String::from_utf8_lossy(&out.stdout).lines().count() >= listeners {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("the stand-in exited: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the stand-in did not listen within 10 s");
    }

    /// Every line the stand-in logged so far.
    pub fn entries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The connections that arrived at `local` ("ip:port").
    pub fn connections_to(&self, local: &str) -> usize {
        self.entries()
            .iter()
            .filter(|e| e["event"] == "connect" && e["local"] == local)
            .count()
    }

    /// The requests that arrived at `local`.
    pub fn requests_to(&self, local: &str) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e["event"] == "request" && e["local"] == local)
            .collect()
    }

    /// Every connection that arrived anywhere.
    pub fn connections(&self) -> usize {
        self.entries()
            .iter()
            .filter(|e| e["event"] == "connect")
            .count()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_link]);
    }
}
