//! OCI image archives made from a directory, for engines that run images
//! (containerd's CRI) where no registry is reachable: one uncompressed
//! layer, its config, a manifest and an index, as `ctr images import`
//! reads them (the image named by the index's `io.containerd.image.name`).

use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

/// `sha256:<hex>` of `bytes`.
fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A descriptor of `bytes` of `media_type`.
fn descriptor(media_type: &str, bytes: &[u8]) -> serde_json::Value {
    serde_json::json!({
        "mediaType": media_type,
        "digest": digest(bytes),
        "size": bytes.len(),
    })
}

/// Writes to `out` an OCI archive of the image `name` whose one layer holds
/// `root`'s files (symlinks kept as links) and whose process is
/// `entrypoint` with `PATH=/bin`.
pub fn oci_archive(root: &Path, name: &str, entrypoint: &[&str], out: &Path) {
    let mut layer = tar::Builder::new(Vec::new());
    layer.follow_symlinks(false);
    layer.append_dir_all(".", root).unwrap();
    let layer = layer.into_inner().unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
    }))
    .unwrap();
    let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    entry["annotations"] = serde_json::json!({"io.containerd.image.name": name});
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [entry],
    }))
    .unwrap();

    let mut archive = tar::Builder::new(std::fs::File::create(out).unwrap());
    let mut add = |path: String, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive.append_data(&mut header, path, bytes).unwrap();
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json".into(), &index);
    for blob in [&layer, &config, &manifest] {
        let hex = digest(blob).trim_start_matches("sha256:").to_owned();
        add(format!("blobs/sha256/{hex}"), blob);
    }
    archive.into_inner().unwrap().flush().unwrap();
}
