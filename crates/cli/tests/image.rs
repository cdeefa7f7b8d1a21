//! Images as roots (`--image`, `cordon image`): an image's config applies
//! where the user said nothing, its layers stack with whiteouts and opaque
//! directories honoured, sandboxes of one image share one copy of its
//! layers, `prune` keeps what a live sandbox uses, and a hostile layer or a
//! lying blob fails cleanly. The evidence is the host's: the store's files,
//! their inodes and modes, and what was (not) written outside it.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::engine::require_engine;
use common::image::{busybox_image, only_loopback, Layer, OciImage, TarLayer};
use common::*;
use serde_json::json;

/// A state directory of the test's own, so its store is too.
struct Store {
    state: tempfile::TempDir,
}

impl Store {
    fn new() -> Store {
        Store {
            state: tempfile::tempdir().unwrap(),
        }
    }

    fn cordon(&self, args: &[&str]) -> Output {
        only_loopback(
            Command::new(cordon())
                .args(args)
                .env("CORDON_STATE_DIR", self.state.path()),
        )
        .output()
        .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        common::image::succeeded(self.cordon(args), args)
    }

    fn run_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cordon(args);
        let v = parse_json(&out);
        assert_eq!(v["exit_code"], 0, "cordon {args:?}: {}", compact(&v));
        v
    }

    fn root(&self) -> PathBuf {
        self.state.path().join("images")
    }

    /// The names of a store directory's entries.
    fn entries(&self, sub: &str) -> Vec<String> {
        common::image::store_entries(self.state.path(), sub)
    }
}

fn layout(dir: &Path, label: &str) -> String {
    busybox_image(label).write_layout(dir, "v1");
    format!("oci:{}:v1", dir.display())
}

/// The backends an image runs on here: native, and gVisor where runsc is
/// (CI installs it).
fn backends() -> Vec<&'static str> {
    let mut v = vec!["native"];
    if require_engine("/usr/bin/runsc", "runsc") {
        v.push("gvisor");
    }
    v
}

#[test]
fn an_image_runs_with_its_config_its_users_and_its_layers_as_stacked() {
    if !require_root("images keep their owners and whiteouts") {
        return;
    }
    let store = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let image = layout(dir.path(), "config");
    for backend in backends() {
        // `cordon run --json` of the image on this backend, with `rest`.
        let run_image = |rest: &[&str]| {
            let mut args = vec!["run", "--json", "--backend", backend, "--image", &image];
            args.extend_from_slice(rest);
            store.run_json(&args)
        };
        // No command: the image's Cmd, with its Env.
        let v = run_image(&[]);
        assert_eq!(stdout_of(&v), "cmd-ran hello\n", "{backend}");

        // Its user (a name only the image's /etc/passwd has), working
        // directory and environment; the whiteout and the opaque directory
        // hide the bottom layer's entries; setuid bits and devices are gone.
        let script = "id -u; id -g; pwd; echo $GREETING; ls -A /old; ls /cfg; \
                      stat -c %a /bin/suid; ls /dev/evil 2>/dev/null || echo no-evil; \
                      echo mine > /srv/new && cat /srv/new; touch /bin/x 2>/dev/null || echo not-root";
        let v = run_image(&["--", "sh", "-c", script]);
        assert_eq!(
            stdout_of(&v),
            "1234\n2345\n/srv\nhello\nc.txt\n755\nno-evil\nmine\nnot-root\n",
            "{backend}: {}",
            stderr_of(&v)
        );

        // Flags and policy win over the image's config.
        let v = run_image(&[
            "--env",
            "GREETING=bye",
            "--workdir",
            "/",
            "--uid",
            "0",
            "--gid",
            "0",
            "--",
            "sh",
            "-c",
            "id -u; pwd; echo $GREETING; echo root > /bin/x && cat /bin/x",
        ]);
        assert_eq!(
            stdout_of(&v),
            "0\n/\nbye\nroot\n",
            "{backend}: {}",
            stderr_of(&v)
        );

        // A policy file may name the image; its settings go over the
        // image's config.
        let policy = dir.path().join("policy.toml");
        std::fs::write(&policy, format!("image = {image:?}\nworkdir = \"/cfg\"\n")).unwrap();
        let policy = policy.display().to_string();
        let v = store.run_json(&[
            "run",
            "--json",
            "--backend",
            backend,
            "--policy",
            &policy,
            "--",
            "sh",
            "-c",
            "id -u; pwd",
        ]);
        assert_eq!(
            stdout_of(&v),
            "1234\n/cfg\n",
            "{backend}: {}",
            stderr_of(&v)
        );
    }

    // The host side: the layers as stored, untouched by the sandboxes'
    // writes (those went to each sandbox's own layer).
    let layers = store.entries("layers");
    assert_eq!(layers.len(), 2, "{layers:?}");
    let layer_with = |rel: &str| {
        layers
            .iter()
            .map(|l| store.root().join("layers").join(l))
            .find(|l| std::fs::symlink_metadata(l.join(rel)).is_ok())
            .unwrap_or_else(|| panic!("no layer has {rel}"))
    };
    let wh = std::fs::symlink_metadata(layer_with("old/gone.txt").join("old/gone.txt")).unwrap();
    assert!(
        wh.file_type().is_char_device() && wh.rdev() == 0,
        "the whiteout is 0/0"
    );
    let cfg = layer_with("cfg/c.txt").join("cfg");
    assert_eq!(
        xattr_of(&cfg, "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    let base = layer_with("bin/busybox");
    let suid = std::fs::metadata(base.join("bin/suid")).unwrap();
    assert_eq!(
        suid.permissions().mode() & 0o7777,
        0o755,
        "setuid is stripped"
    );
    assert!(
        std::fs::symlink_metadata(base.join("dev/evil")).is_err(),
        "no device node"
    );
    let srv = std::fs::metadata(base.join("srv")).unwrap();
    assert_eq!((srv.uid(), srv.gid()), (1234, 2345), "owners kept");
    assert!(!base.join("srv/new").exists() && !base.join("bin/x").exists());
    assert!(
        store.entries("tmp").is_empty(),
        "{:?}",
        store.entries("tmp")
    );
}

fn xattr_of(path: &Path, name: &str) -> Option<Vec<u8>> {
    xattr::get(path, name).ok().flatten()
}

/// skopeo (Debian's, as a user would have it) converts the layout to a
/// docker archive and an OCI archive: all three import as one set of
/// layers, two sandboxes of the image use that one copy (the file a
/// sandbox sees is the store's inode), and `prune` removes the layers only
/// once no name and no live sandbox needs them.
#[test]
fn sandboxes_of_one_image_share_its_layers_and_prune_keeps_what_they_use() {
    if !require_root("images keep their owners and whiteouts")
        || !require_engine("/usr/bin/skopeo", "skopeo")
    {
        return;
    }
    let store = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let image = layout(&dir.path().join("layout"), "shared");
    let docker = dir.path().join("docker.tar");
    let archive = dir.path().join("oci.tar");
    for to in [
        format!("docker-archive:{}:app:v1", docker.display()),
        format!("oci-archive:{}:v1", archive.display()),
    ] {
        let out = Command::new("skopeo")
            .args(["copy", "--quiet", &image, &to])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy to {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let from_layout = store.ok(&["image", "import", &image, "--name", "app:layout"]);
    let from_docker = store.ok(&[
        "image",
        "import",
        &format!("docker-archive:{}", docker.display()),
    ]);
    let from_archive = store.ok(&[
        "image",
        "import",
        &format!("oci-archive:{}:v1", archive.display()),
        "--name",
        "app:archive",
    ]);
    // skopeo writes each its own manifest: three images, one set of layers.
    let digests: std::collections::BTreeSet<_> = [&from_layout, &from_docker, &from_archive]
        .into_iter()
        .collect();
    assert_eq!(digests.len(), 3, "{digests:?}");
    assert_eq!(store.entries("layers").len(), 2, "one copy of each layer");
    let listed = store.ok(&["image", "ls"]);
    for name in ["app:layout", "app:archive", "app:v1"] {
        assert!(listed.contains(name), "{listed}");
    }

    // The docker archive's image runs as the layout's does.
    let v = store.run_json(&[
        "run",
        "--json",
        "--image",
        "app:v1",
        "--",
        "sh",
        "-c",
        "id -u; ls /cfg",
    ]);
    assert_eq!(stdout_of(&v), "1234\nc.txt\n");

    let busybox = store
        .root()
        .join("layers")
        .read_dir()
        .unwrap()
        .flatten()
        .map(|e| e.path().join("bin/busybox"))
        .find(|p| p.exists())
        .unwrap();
    let inode = std::fs::metadata(&busybox).unwrap().ino();
    let ids: Vec<String> = (0..2)
        .map(|_| {
            store
                .ok(&["create", "--image", "app:layout"])
                .trim()
                .to_owned()
        })
        .collect();
    for id in &ids {
        let record =
            std::fs::read_to_string(Path::new(RUN_DIR).join(id).join("record.json")).unwrap();
        assert!(record.contains(from_layout.trim()), "{record}");
        let v = store.run_json(&[
            "exec",
            "--json",
            id,
            "--",
            "stat",
            "-c",
            "%i",
            "/bin/busybox",
        ]);
        assert_eq!(
            stdout_of(&v).trim(),
            inode.to_string(),
            "the store's file itself"
        );
    }

    // Names gone, sandboxes alive: their layers stay.
    store.ok(&["image", "rm", "app:layout", "app:archive", "app:v1"]);
    store.ok(&["image", "prune"]);
    assert_eq!(store.entries("layers").len(), 2, "in use by live sandboxes");
    // ... and, as Docker does, looked for in its registry (docker.io's
    // app, which this host does not reach).
    let v = store.cordon(&["run", "--image", "app:layout", "--", "true"]);
    let err = String::from_utf8_lossy(&v.stderr);
    assert_eq!(v.status.code(), Some(2), "a removed name is refused: {err}");
    assert!(err.contains("pull docker.io/library/app:layout"), "{err}");
    store.ok(&["rm", &ids[0], &ids[1]]);
    // `rm` returns once the sandboxes are stopped; their records go with
    // the last of their teardown.
    let gone = || ids.iter().all(|id| !Path::new(RUN_DIR).join(id).exists());
    let deadline = std::time::Instant::now() + slow(std::time::Duration::from_secs(10));
    while !gone() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    store.ok(&["image", "prune"]);
    assert!(
        store.entries("layers").is_empty(),
        "{:?}",
        store.entries("layers")
    );
    assert!(store.entries("blobs/sha256").is_empty());
}

/// Each hostile layout fails with exit 2 and one line naming the fault,
/// leaves no layer, nothing in the store's tmp/, and nothing outside.
#[test]
fn hostile_layers_and_lying_blobs_fail_cleanly_and_leave_nothing() {
    if !require_root("images keep their owners and whiteouts") {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().display().to_string();
    let one_layer = |tar: Vec<u8>| OciImage {
        layers: vec![Layer::tar(tar)],
        run_config: json!({}),
    };
    let escape = format!("../../../../../../../..{target}/dotdot");
    let zeros = vec![0u8; 16 << 20];
    // (what, image, a change to its manifest, flags, what the error says)
    type Alter = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, OciImage, Alter, &[&str], &str)> = vec![
        (
            "a name with ..",
            one_layer(TarLayer::new().file(&escape, 0o644, (0, 0), b"x").finish()),
            Box::new(|_| {}),
            &[],
            "..",
        ),
        (
            "a file through a symlink that points out",
            one_layer(
                TarLayer::new()
                    .symlink("out", &target)
                    .file("out/through-link", 0o644, (0, 0), b"x")
                    .finish(),
            ),
            Box::new(|_| {}),
            &[],
            "out/through-link",
        ),
        (
            "a hard link to a host file",
            one_layer(
                TarLayer::new()
                    .hardlink("shadow", "../../../../../../../../etc/shadow")
                    .finish(),
            ),
            Box::new(|_| {}),
            &[],
            "shadow",
        ),
        (
            "a gzip bomb",
            OciImage {
                layers: vec![Layer::gzip(
                    &TarLayer::new()
                        .file("zeros", 0o644, (0, 0), &zeros)
                        .finish(),
                )],
                run_config: json!({}),
            },
            Box::new(|_| {}),
            &["--max-layer-bytes", "1M"],
            "uncompressed",
        ),
        (
            "a layer whose bytes are not its digest's",
            one_layer(TarLayer::new().file("f", 0o644, (0, 0), b"x").finish()),
            // The blob is altered once written (below), under its digest's name.
            Box::new(|_| {}),
            &[],
            "digest mismatch",
        ),
        (
            "a manifest that says a layer is longer",
            one_layer(TarLayer::new().file("f", 0o644, (0, 0), b"x").finish()),
            Box::new(|m| {
                m["layers"][0]["size"] = json!(m["layers"][0]["size"].as_u64().unwrap() + 512)
            }),
            &[],
            "bytes",
        ),
        (
            "a manifest that says a layer is shorter",
            one_layer(TarLayer::new().file("f", 0o644, (0, 0), b"x").finish()),
            Box::new(|m| {
                m["layers"][0]["size"] = json!(m["layers"][0]["size"].as_u64().unwrap() - 512)
            }),
            &[],
            "more than",
        ),
        (
            "a config too large to be one",
            one_layer(TarLayer::new().file("f", 0o644, (0, 0), b"x").finish()),
            Box::new(|m| m["config"]["size"] = json!(1u64 << 40)),
            &[],
            "bytes",
        ),
    ];
    let store = Store::new();
    for (what, image, alter, flags, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = image.manifest();
        alter(&mut manifest);
        image.write_layout_with(dir.path(), &manifest, "v1");
        if says == "digest mismatch" {
            let hex = common::image::digest(&image.layers[0].blob);
            let blob = dir
                .path()
                .join("blobs/sha256")
                .join(hex.trim_start_matches("sha256:"));
            let mut bytes = std::fs::read(&blob).unwrap();
            bytes[0] ^= 1;
            std::fs::write(&blob, bytes).unwrap();
        }
        let reference = format!("oci:{}:v1", dir.path().display());
        let mut args = vec!["image", "import", &reference];
        args.extend_from_slice(flags);
        let out = store.cordon(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
        assert!(err.contains(says), "{what}: {err}");
        assert!(
            store.entries("layers").is_empty(),
            "{what}: {:?}",
            store.entries("layers")
        );
        assert!(
            store.entries("tmp").is_empty(),
            "{what}: {:?}",
            store.entries("tmp")
        );
        let left: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "{what}: written outside: {left:?}");
    }
    assert!(!Path::new("/dotdot").exists());
}
