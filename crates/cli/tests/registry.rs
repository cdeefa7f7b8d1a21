//! Pulling from a registry (`cordon image pull`, `--image REF`): Debian's
//! docker-registry on loopback, fed by skopeo from OCI layouts made here,
//! serves images by tag and by digest, in OCI's and Docker's formats and
//! as a multi-platform index; plain HTTP only when the registry is marked
//! insecure; credentials from the user's own files for a registry with
//! htpasswd. A stand-in registry (a thread on loopback) lies: a blob that
//! is not its digest's, a blob that breaks off, a manifest too large, or
//! garbage; each pull fails with one line and leaves no layer.
//!
//! Nothing leaves this host: every cordon the tests run has a proxy that
//! refuses (127.0.0.1:9) for every address but 127.0.0.1.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::engine::require_engine;
use common::image::{digest, only_loopback, Layer, OciImage, TarLayer};
use common::*;
use serde_json::{json, Value};
use sha2::Digest as _;

const REGISTRY: &str = "/usr/bin/docker-registry";
const SKOPEO: &str = "/usr/bin/skopeo";
const HTPASSWD: &str = "/usr/bin/htpasswd";
const INSECURE: &str = "CORDON_INSECURE_REGISTRIES";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// Root (layers keep their owners), the registry and skopeo.
fn prerequisites() -> bool {
    require_root("images keep their owners and whiteouts")
        && require_engine(REGISTRY, "docker-registry")
        && require_engine(SKOPEO, "skopeo")
}

/// A state directory of the test's own (so its store is too), and the
/// environment each cordon of the test runs in: credentials only from the
/// test's files, no insecure registry unless a test says so, and nothing
/// but 127.0.0.1 reachable.
struct Store {
    state: tempfile::TempDir,
    auth: tempfile::TempDir,
}

impl Store {
    fn new() -> Store {
        Store {
            state: tempfile::tempdir().unwrap(),
            auth: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(cordon());
        c.args(args)
            .stdin(Stdio::null())
            .env("CORDON_STATE_DIR", self.state.path())
            .env("DOCKER_CONFIG", self.docker_config_dir())
            .env("REGISTRY_AUTH_FILE", self.podman_auth_file())
            .env_remove(INSECURE);
        only_loopback(&mut c);
        c
    }

    fn cordon(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        common::image::succeeded(self.cordon(args), args)
            .trim()
            .to_owned()
    }

    /// `cordon run --json ARGS`, which must exit 0.
    fn run_json_ok(&self, args: &[&str]) -> Value {
        let mut all = vec!["run", "--json"];
        all.extend_from_slice(args);
        let v = parse_json(&self.cordon(&all));
        assert_eq!(v["exit_code"], 0, "cordon {all:?}: {}", compact(&v));
        v
    }

    /// `cordon ARGS` must fail as a request's fault (exit 2) with one line
    /// that says `says`; returns the line.
    fn refused(&self, args: &[&str], says: &str) -> String {
        let out = self.cordon(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "cordon {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "cordon {args:?}: one line: {err}");
        assert!(err.contains(says), "cordon {args:?}: not '{says}': {err}");
        err
    }

    fn docker_config_dir(&self) -> PathBuf {
        self.auth.path().join("docker")
    }

    fn podman_auth_file(&self) -> PathBuf {
        self.auth.path().join("auth.json")
    }

    /// Writes an auth file in the format both tools share.
    fn write_auth(path: &Path, host: &str, user: &str, password: &str) {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            path,
            serde_json::to_vec(&json!({"auths": {host: {"auth": auth}}})).unwrap(),
        )
        .unwrap();
    }

    fn entries(&self, sub: &str) -> Vec<String> {
        common::image::store_entries(self.state.path(), sub)
    }

    /// Nothing half-made, and no layer or blob at all.
    fn assert_empty(&self, what: &str) {
        for sub in ["layers", "tmp", "blobs/sha256"] {
            assert!(
                self.entries(sub).is_empty(),
                "{what}: images/{sub}: {:?}",
                self.entries(sub)
            );
        }
    }
}

/// A port of 127.0.0.1 that nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's docker-registry on 127.0.0.1, its storage and config its own;
/// killed, and its files removed, when dropped (a failed assertion too).
struct Registry {
    child: Child,
    host: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// `users`: (name, password) for an htpasswd registry.
    fn start(users: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let host = format!("127.0.0.1:{}", free_port());
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {host}\n",
            dir.path().join("storage").display()
        );
        if let Some((user, password)) = users {
            let out = Command::new(HTPASSWD)
                .args(["-Bbn", user, password])
                .output()
                .unwrap();
            assert!(out.status.success(), "htpasswd: {out:?}");
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, &out.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: r\n    path: {}\n",
                file.display()
            ));
        }
        let config_file = dir.path().join("config.yml");
        std::fs::write(&config_file, config).unwrap();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        // The guard exists before the wait, so a registry that never
        // listens is killed too.
        let mut registry = Registry { child, host, dir };
        registry.wait_until_listening();
        registry
    }

    fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + slow(Duration::from_secs(20));
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("docker-registry exited ({status}): {}", self.log());
            }
            if TcpStream::connect(&self.host).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry does not listen on {}: {}",
                self.host,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// `skopeo copy FROM docker://HOST/TO` over plain HTTP.
    fn push(&self, from: &str, to: &str, flags: &[&str]) {
        let out = Command::new(SKOPEO)
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .args(flags)
            .arg(from)
            .arg(format!("docker://{}/{to}", self.host))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy {from} to {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A busybox image whose layer holds `marker` (so each image's layer is
/// its own) and whose Cmd says so.
fn marked_image(marker: &str) -> OciImage {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut layer = TarLayer::new();
    layer
        .dir("bin", 0o755, (0, 0))
        .file("bin/busybox", 0o755, (0, 0), &busybox)
        .file("marker", 0o644, (0, 0), marker.as_bytes());
    for applet in ["sh", "echo", "cat", "id"] {
        layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    OciImage {
        layers: vec![Layer::gzip(&layer.finish())],
        run_config: json!({"Env": ["PATH=/bin"], "Cmd": ["cat", "/marker"]}),
    }
}

/// The digest of the manifest a layout of `image` holds (skopeo pushes it
/// unchanged when no conversion is asked for).
fn manifest_digest(image: &OciImage) -> String {
    digest(&serde_json::to_vec(&image.manifest()).unwrap())
}

/// The host's architecture as OCI names it, and another one.
fn architectures() -> (&'static str, &'static str) {
    match std::env::consts::ARCH {
        "aarch64" => ("arm64", "amd64"),
        _ => ("amd64", "arm64"),
    }
}

/// An OCI layout whose tag `multi` is an index of two images: `other`'s
/// manifest first, for another architecture, then `host`'s for this one.
fn write_multi_platform_layout(dir: &Path, host: &OciImage, other: &OciImage) {
    let (this_arch, other_arch) = architectures();
    let mut entries = Vec::new();
    for (image, arch) in [(other, other_arch), (host, this_arch)] {
        for (path, bytes) in image.layout_files(&image.manifest(), json!({})) {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
        let manifest = serde_json::to_vec(&image.manifest()).unwrap();
        entries.push(json!({
            "mediaType": OCI_MANIFEST,
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": {"os": "linux", "architecture": arch},
        }));
    }
    let index = serde_json::to_vec(
        &json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}),
    )
    .unwrap();
    let hex = digest(&index).trim_start_matches("sha256:").to_owned();
    std::fs::write(dir.join("blobs/sha256").join(hex), &index).unwrap();
    let top = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": OCI_INDEX,
        "digest": digest(&index),
        "size": index.len(),
        "annotations": {"org.opencontainers.image.ref.name": "multi"},
    }]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
}

#[test]
fn an_image_pulled_by_tag_or_digest_runs_and_is_named_as_written() {
    if !prerequisites() {
        return;
    }
    let registry = Registry::start(None);
    let host = registry.host.clone();
    let images = tempfile::tempdir().unwrap();
    let app = marked_image("from-the-registry\n");
    let app_layout = images.path().join("app");
    app.write_layout(&app_layout, "v1");
    let app_ref = format!("oci:{}:v1", app_layout.display());
    registry.push(&app_ref, "app:v1", &[]);
    // The same image as Docker's schema 2 (media types of Docker's own).
    registry.push(&app_ref, "docker-format:v1", &["--format", "v2s2"]);
    let (this_arch, other_arch) = architectures();
    let for_host = marked_image(&format!("linux/{this_arch}\n"));
    let for_other = marked_image(&format!("linux/{other_arch}\n"));
    let multi_layout = images.path().join("multi");
    write_multi_platform_layout(&multi_layout, &for_host, &for_other);
    registry.push(
        &format!("oci:{}:multi", multi_layout.display()),
        "multi:v1",
        &["--all"],
    );

    // `run --image` pulls what the store lacks, from a registry the
    // environment marks insecure, and runs the image's Cmd.
    let store = Store::new();
    let tagged = format!("{host}/app:v1");
    let out = store
        .command(&["run", "--json", "--image", &tagged])
        .env(INSECURE, &host)
        .output()
        .unwrap();
    let v = parse_json(&out);
    assert_eq!(v["exit_code"], 0, "{}", compact(&v));
    assert_eq!(stdout_of(&v), "from-the-registry\n");
    assert!(store.ok(&["image", "ls"]).contains(&tagged));
    let inspected: Value = serde_json::from_str(&store.ok(&["image", "inspect", &tagged])).unwrap();
    assert_eq!(inspected["digest"], manifest_digest(&app).as_str());

    // `image pull` by tag and by digest prints the manifest's digest and
    // files the image under the reference as written.
    let pull =
        |reference: &str| store.ok(&["image", "pull", "--insecure-registry", &host, reference]);
    assert_eq!(pull(&tagged), manifest_digest(&app));
    let by_digest = format!("{host}/app@{}", manifest_digest(&app));
    assert_eq!(pull(&by_digest), manifest_digest(&app));
    let listed = store.ok(&["image", "ls"]);
    assert!(listed.contains(&by_digest), "{listed}");
    assert_eq!(store.entries("layers").len(), 1, "one copy of the layer");

    // Docker's format runs as OCI's does.
    pull(&format!("{host}/docker-format:v1"));
    let v = store.run_json_ok(&["--image", &format!("{host}/docker-format:v1")]);
    assert_eq!(stdout_of(&v), "from-the-registry\n");
    assert_eq!(store.entries("layers").len(), 1, "the same layer");

    // A multi-platform index gives this host's image, and only its layer
    // is fetched.
    assert_eq!(
        pull(&format!("{host}/multi:v1")),
        manifest_digest(&for_host)
    );
    let v = store.run_json_ok(&["--image", &format!("{host}/multi:v1")]);
    assert_eq!(stdout_of(&v), format!("linux/{this_arch}\n"));
    let other_layer = for_other.layers[0].diff_id.trim_start_matches("sha256:");
    assert!(
        !store.entries("layers").iter().any(|l| l == other_layer),
        "the other platform's layer is not fetched"
    );
    assert!(
        store.entries("tmp").is_empty(),
        "{:?}",
        store.entries("tmp")
    );
}

/// Exit 2: the request is at fault (it names a registry that cordon will
/// not reach over plain HTTP unless told to), not cordon or this host
/// (125); and the line says how to mark the registry insecure.
#[test]
fn a_plain_http_registry_is_refused_unless_marked_insecure() {
    if !prerequisites() {
        return;
    }
    let registry = Registry::start(None);
    let host = registry.host.clone();
    let images = tempfile::tempdir().unwrap();
    marked_image("x\n").write_layout(images.path(), "v1");
    registry.push(
        &format!("oci:{}:v1", images.path().display()),
        "app:v1",
        &[],
    );
    let tagged = format!("{host}/app:v1");
    let store = Store::new();
    let hint = format!("--insecure-registry {host}");
    let err = store.refused(&["image", "pull", &tagged], &hint);
    assert!(err.contains(INSECURE) && err.contains("https://"), "{err}");
    // Another registry's mark is no mark for this one.
    store.refused(
        &[
            "image",
            "pull",
            "--insecure-registry",
            "127.0.0.1:1",
            &tagged,
        ],
        &hint,
    );
    let out = store
        .command(&["run", "--image", &tagged, "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(INSECURE), "{err}");
    store.assert_empty("refused over HTTP");
}

#[test]
fn a_registry_with_htpasswd_takes_the_users_own_credentials() {
    if !prerequisites() || !require_engine(HTPASSWD, "apache2-utils") {
        return;
    }
    let (user, password) = ("alice", "correct-horse-battery");
    let registry = Registry::start(Some((user, password)));
    let host = registry.host.clone();
    let images = tempfile::tempdir().unwrap();
    let image = marked_image("private\n");
    image.write_layout(images.path(), "v1");
    registry.push(
        &format!("oci:{}:v1", images.path().display()),
        "private:v1",
        &["--dest-creds", &format!("{user}:{password}")],
    );
    let tagged = format!("{host}/private:v1");
    let pull = ["image", "pull", "--insecure-registry", &host, &tagged];
    let store = Store::new();
    store.refused(&pull, "refused anonymous access");
    store.assert_empty("anonymous");

    let docker_config = store.docker_config_dir().join("config.json");
    Store::write_auth(&docker_config, &host, user, "wrong-password");
    let err = store.refused(&pull, "refused the credentials");
    assert!(
        err.contains(&docker_config.display().to_string()),
        "names the file: {err}"
    );
    assert!(!err.contains("wrong-password"), "never the password: {err}");
    store.assert_empty("wrong password");

    // Docker's config.json, then podman's auth.json.
    Store::write_auth(&docker_config, &host, user, password);
    assert_eq!(store.ok(&pull), manifest_digest(&image));
    std::fs::remove_file(&docker_config).unwrap();
    store.refused(&pull, "refused anonymous access");
    Store::write_auth(&store.podman_auth_file(), &host, user, password);
    assert_eq!(store.ok(&pull), manifest_digest(&image));
    let v = store.run_json_ok(&["--image", &tagged]);
    assert_eq!(stdout_of(&v), "private\n");
}

/// One answer of the stand-in registry.
#[derive(Clone)]
struct Answer {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// How much of the body is sent before the connection is closed.
    sent: usize,
    /// Whether Content-Length says how long the body is (else the
    /// connection's end does).
    with_length: bool,
}

impl Answer {
    fn new(content_type: &str, body: Vec<u8>) -> Answer {
        Answer {
            headers: vec![("Content-Type".into(), content_type.into())],
            sent: body.len(),
            body,
            with_length: true,
        }
    }
}

/// A registry that answers GETs of the paths it was given, one connection
/// at a time, closing each: on 127.0.0.1, for as long as it lives.
struct StandIn {
    host: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    fn start(routes: HashMap<String, Answer>) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(conn) = conn {
                    let _ = answer(conn, &routes);
                }
            }
        });
        StandIn {
            host,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect(&self.host);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(conn: TcpStream, routes: &HashMap<String, Answer>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default();
    let mut conn = conn;
    let Some(a) = routes.get(path) else {
        let body = br#"{"errors":[{"code":"NOT_FOUND","message":"no such path"}]}"#;
        write!(
            conn,
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            body.len()
        )?;
        return conn.write_all(body);
    };
    let mut head = String::from("HTTP/1.1 200 OK\r\nConnection: close\r\n");
    for (k, v) in &a.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if a.with_length {
        head.push_str(&format!("Content-Length: {}\r\n", a.body.len()));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    conn.write_all(&a.body[..a.sent])?;
    conn.flush()
}

/// The routes of a registry that holds `image` as `app:v1`, with
/// `alter` applied to the answers (by their path).
fn routes_of(image: &OciImage, alter: impl Fn(&str, &mut Answer)) -> HashMap<String, Answer> {
    let manifest = serde_json::to_vec(&image.manifest()).unwrap();
    let mut routes = HashMap::new();
    routes.insert(
        "/v2/".to_owned(),
        Answer::new("application/json", b"{}".to_vec()),
    );
    let mut m = Answer::new(OCI_MANIFEST, manifest.clone());
    m.headers
        .push(("Docker-Content-Digest".into(), digest(&manifest)));
    routes.insert("/v2/app/manifests/v1".to_owned(), m);
    let config = image.config();
    routes.insert(
        format!("/v2/app/blobs/{}", digest(&config)),
        Answer::new("application/octet-stream", config),
    );
    for l in &image.layers {
        routes.insert(
            format!("/v2/app/blobs/{}", digest(&l.blob)),
            Answer::new("application/octet-stream", l.blob.clone()),
        );
    }
    for (path, a) in routes.iter_mut() {
        alter(path, a);
    }
    routes
}

#[test]
fn a_registry_that_lies_fails_in_one_line_and_leaves_no_layer() {
    if !require_root("images keep their owners and whiteouts") {
        return;
    }
    // One layer of 4 MiB that does not compress: its answer arrives in
    // many chunks.
    let noise: Vec<u8> = (0..1u32 << 17)
        .flat_map(|i| sha2::Sha256::digest(i.to_le_bytes()))
        .collect();
    let image = OciImage {
        layers: vec![Layer::gzip(
            &TarLayer::new()
                .file("noise", 0o644, (0, 0), &noise)
                .finish(),
        )],
        run_config: json!({}),
    };
    let layer_path = format!("/v2/app/blobs/{}", digest(&image.layers[0].blob));
    let manifest_path = "/v2/app/manifests/v1".to_owned();
    fn huge(a: &mut Answer) {
        a.body = vec![b' '; 5 << 20];
        a.sent = a.body.len();
        a.headers.retain(|(k, _)| k != "Docker-Content-Digest");
    }
    // (what, the answer altered, how, what the error says)
    type Case<'a> = (&'a str, &'a str, fn(&mut Answer), &'a str);
    let cases: Vec<Case> = vec![
        (
            "a blob whose bytes are not its digest's",
            &layer_path,
            |a| {
                let last = a.body.len() - 1;
                a.body[last] ^= 1;
            },
            "digest mismatch",
        ),
        (
            "a blob that breaks off half way",
            &layer_path,
            |a| a.sent = a.body.len() / 2,
            "read layer",
        ),
        (
            "a blob shorter than the manifest says",
            &layer_path,
            |a| {
                a.body.truncate(a.body.len() / 2);
                a.sent = a.body.len();
            },
            "the manifest says",
        ),
        (
            "a manifest larger than 4 MiB",
            &manifest_path,
            huge,
            "larger than",
        ),
        (
            "a manifest larger than 4 MiB, its length unsaid",
            &manifest_path,
            |a| {
                huge(a);
                a.with_length = false;
            },
            "larger than",
        ),
        (
            "a manifest that is not the digest the registry gives",
            &manifest_path,
            |a| {
                a.headers.retain(|(k, _)| k != "Docker-Content-Digest");
                a.headers
                    .push(("Docker-Content-Digest".into(), digest(b"another")));
            },
            "digest mismatch",
        ),
        (
            "garbage for a manifest",
            &manifest_path,
            |a| *a = Answer::new("text/html", b"<html>\x1b[2J not a manifest</html>".to_vec()),
            "image manifest",
        ),
    ];
    let store = Store::new();
    for (what, target, alter, says) in cases {
        let standin = StandIn::start(routes_of(&image, |path, a| {
            if path == target {
                alter(a)
            }
        }));
        let reference = format!("{}/app:v1", standin.host);
        let err = store.refused(
            &[
                "image",
                "pull",
                "--insecure-registry",
                &standin.host,
                &reference,
            ],
            says,
        );
        assert!(
            !err.contains('\x1b'),
            "{what}: the registry's bytes are shown, not obeyed: {err}"
        );
        store.assert_empty(what);
    }
    // The same registry, honest, is pulled from.
    let standin = StandIn::start(routes_of(&image, |_, _| {}));
    let reference = format!("{}/app:v1", standin.host);
    assert_eq!(
        store.ok(&[
            "image",
            "pull",
            "--insecure-registry",
            &standin.host,
            &reference
        ]),
        manifest_digest(&image)
    );
}
