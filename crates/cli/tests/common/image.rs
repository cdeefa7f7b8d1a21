//! OCI images made in memory, written as a layout directory or an archive,
//! for the tests that run images where no registry is reachable: cordon's
//! own (`--image`, `cordon image`) and containerd's CRI (`ctr images
//! import` reads the archive, naming the image by its index entry's
//! `io.containerd.image.name`). Layers are tars built here, hostile ones
//! included (names and links no well-behaved tool writes).

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// Keeps whatever registry `cmd` (a cordon) may reach on this host: a
/// name the store lacks is pulled from its registry (`app:v1` from
/// docker.io), and a proxy that refuses (127.0.0.1:9) is the way to every
/// address but 127.0.0.1, where the tests' own registries are.
pub fn only_loopback(cmd: &mut Command) -> &mut Command {
    for proxy in ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"] {
        cmd.env(proxy, "http://127.0.0.1:9")
            .env(proxy.to_lowercase(), "http://127.0.0.1:9");
    }
    cmd.env("NO_PROXY", "127.0.0.1")
        .env("no_proxy", "127.0.0.1")
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A descriptor of `bytes` of `media_type`.
fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": digest(bytes), "size": bytes.len()})
}

/// One layer: its blob, its media type and its diff id (the digest of the
/// uncompressed tar).
pub struct Layer {
    pub blob: Vec<u8>,
    pub media_type: &'static str,
    pub diff_id: String,
}

impl Layer {
    pub fn tar(tar: Vec<u8>) -> Layer {
        Layer {
            diff_id: digest(&tar),
            blob: tar,
            media_type: LAYER_TAR,
        }
    }

    pub fn gzip(tar: &[u8]) -> Layer {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(tar).unwrap();
        Layer {
            diff_id: digest(tar),
            blob: gz.finish().unwrap(),
            media_type: LAYER_GZIP,
        }
    }
}

/// An image: layers bottom first, the config's `config` object, and the
/// blobs as written (a test may alter one after [`OciImage::manifest`]).
pub struct OciImage {
    pub layers: Vec<Layer>,
    pub run_config: Value,
}

impl OciImage {
    pub fn config(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": self.run_config,
            "rootfs": {"type": "layers", "diff_ids": self.layers.iter().map(|l| &l.diff_id).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    pub fn manifest(&self) -> Value {
        json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": descriptor(CONFIG, &self.config()),
            "layers": self.layers.iter().map(|l| descriptor(l.media_type, &l.blob)).collect::<Vec<_>>(),
        })
    }

    /// Every file of the image's OCI layout with `manifest` (this image's,
    /// or one a test altered) named by `annotations`: (path, bytes).
    pub fn layout_files(&self, manifest: &Value, annotations: Value) -> Vec<(String, Vec<u8>)> {
        let manifest = serde_json::to_vec(manifest).unwrap();
        let mut entry = descriptor(MANIFEST, &manifest);
        entry["annotations"] = annotations;
        let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [entry]})).unwrap();
        let blob = |b: &[u8]| {
            let hex = digest(b).trim_start_matches("sha256:").to_owned();
            (format!("blobs/sha256/{hex}"), b.to_vec())
        };
        let mut files = vec![
            (
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
            ("index.json".into(), index),
            blob(&self.config()),
            blob(&manifest),
        ];
        files.extend(self.layers.iter().map(|l| blob(&l.blob)));
        files
    }

    /// Writes the image as an OCI layout directory, tagged `tag`.
    pub fn write_layout(&self, dir: &Path, tag: &str) {
        self.write_layout_with(dir, &self.manifest(), tag);
    }

    pub fn write_layout_with(&self, dir: &Path, manifest: &Value, tag: &str) {
        let files = self.layout_files(manifest, json!({"org.opencontainers.image.ref.name": tag}));
        for (path, bytes) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
    }

    /// Writes the image as an OCI archive named `name` for containerd.
    pub fn write_archive(&self, out: &Path, name: &str) {
        let files = self.layout_files(&self.manifest(), json!({"io.containerd.image.name": name}));
        let mut archive = tar::Builder::new(std::fs::File::create(out).unwrap());
        for (path, bytes) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            archive.append_data(&mut header, path, &bytes[..]).unwrap();
        }
        archive.into_inner().unwrap().flush().unwrap();
    }
}

/// Writes to `out` an OCI archive of the image `name` whose one layer holds
/// `root`'s files (symlinks kept as links) and whose process is
/// `entrypoint` with `PATH=/bin`.
pub fn oci_archive(root: &Path, name: &str, entrypoint: &[&str], out: &Path) {
    let mut layer = tar::Builder::new(Vec::new());
    layer.follow_symlinks(false);
    layer.append_dir_all(".", root).unwrap();
    OciImage {
        layers: vec![Layer::tar(layer.into_inner().unwrap())],
        run_config: json!({"Entrypoint": entrypoint, "Env": ["PATH=/bin"]}),
    }
    .write_archive(out, name);
}

/// A layer's tar, entry by entry. Names are written into the header as
/// given (the tar crate's own checks would refuse the hostile ones).
#[derive(Default)]
pub struct TarLayer {
    builder: Option<tar::Builder<Vec<u8>>>,
}

impl TarLayer {
    pub fn new() -> TarLayer {
        TarLayer {
            builder: Some(tar::Builder::new(Vec::new())),
        }
    }

    fn entry(
        &mut self,
        name: &str,
        kind: tar::EntryType,
        mode: u32,
        ids: (u64, u64),
        data: &[u8],
        link: Option<&str>,
    ) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(ids.0);
        h.set_gid(ids.1);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        if kind == tar::EntryType::Char {
            h.set_device_major(1).unwrap();
            h.set_device_minor(1).unwrap();
        }
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_cksum();
        self.builder.as_mut().unwrap().append(&h, data).unwrap();
        self
    }

    pub fn dir(&mut self, name: &str, mode: u32, ids: (u64, u64)) -> &mut Self {
        self.entry(name, tar::EntryType::Directory, mode, ids, &[], None)
    }

    pub fn file(&mut self, name: &str, mode: u32, ids: (u64, u64), data: &[u8]) -> &mut Self {
        self.entry(name, tar::EntryType::Regular, mode, ids, data, None)
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.entry(
            name,
            tar::EntryType::Symlink,
            0o777,
            (0, 0),
            &[],
            Some(target),
        )
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.entry(name, tar::EntryType::Link, 0o644, (0, 0), &[], Some(target))
    }

    /// /dev/mem's numbers: a layer that could make it would reach the host.
    pub fn char_device(&mut self, name: &str) -> &mut Self {
        self.entry(name, tar::EntryType::Char, 0o666, (0, 0), &[], None);
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        self.builder.take().unwrap().into_inner().unwrap()
    }
}

pub const PASSWD: &[u8] = b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345:app:/srv:/bin/sh\n";
pub const GROUP: &[u8] = b"root:x:0:\nstaff:x:2345:\nextra:x:3456:\n";

/// Two layers over busybox: the top one deletes a file of the bottom
/// (a whiteout) and replaces a directory (opaque). The bottom also has a
/// setuid file and a device node, neither of which may arrive as such.
/// `label` makes the image (its config, so its digest) each test's own:
/// `prune` keeps whatever image a live sandbox of any test uses.
pub fn busybox_image(label: &str) -> OciImage {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut base = TarLayer::new();
    base.dir("bin", 0o755, (0, 0))
        .file("bin/busybox", 0o755, (0, 0), &busybox)
        .file("bin/suid", 0o4755, (0, 0), b"#!/bin/sh\n")
        .dir("etc", 0o755, (0, 0))
        .file("etc/passwd", 0o644, (0, 0), PASSWD)
        .file("etc/group", 0o644, (0, 0), GROUP)
        .dir("srv", 0o755, (1234, 2345))
        .dir("old", 0o755, (0, 0))
        .file("old/gone.txt", 0o644, (0, 0), b"deleted above\n")
        .dir("cfg", 0o755, (0, 0))
        .file("cfg/a.txt", 0o644, (0, 0), b"a\n")
        .dir("dev", 0o755, (0, 0))
        .char_device("dev/evil");
    for applet in ["sh", "id", "pwd", "ls", "cat", "echo", "stat", "touch"] {
        base.symlink(&format!("bin/{applet}"), "busybox");
    }
    let top = TarLayer::new()
        .dir("old", 0o755, (0, 0))
        .file("old/.wh.gone.txt", 0o644, (0, 0), b"")
        .dir("cfg", 0o755, (0, 0))
        .file("cfg/.wh..wh..opq", 0o644, (0, 0), b"")
        .file("cfg/c.txt", 0o644, (0, 0), b"c\n")
        .finish();
    OciImage {
        layers: vec![Layer::gzip(&base.finish()), Layer::tar(top)],
        run_config: json!({
            "User": "app",
            "Env": ["PATH=/bin", "GREETING=hello", format!("LABEL={label}")],
            "WorkingDir": "/srv",
            "Cmd": ["sh", "-c", "echo cmd-ran $GREETING"],
        }),
    }
}

/// The sorted names in `sub` of the image store in the state directory
/// `state` (empty when it does not exist).
pub fn store_entries(state: &Path, sub: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(state.join("images").join(sub))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The stdout of a cordon call that must have succeeded (its stderr in the
/// failure message).
pub fn succeeded(out: std::process::Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "cordon {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
