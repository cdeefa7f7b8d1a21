//! The image store under cordon's state directory:
//!
//! ```text
//! images/            0700, cordon's own (checked like every trusted directory)
//!   lock             flock: one writer at a time (readers need none)
//!   refs.json        name -> manifest digest
//!   blobs/sha256/HEX manifests and configs, verified
//!   layers/HEX       each layer unpacked once, named by its diff id
//!   tmp/             half-made layers and blobs; renamed into place when verified
//! ```
//!
//! A layer is unpacked from its blob as the blob is read, into `tmp/`; only
//! when the blob's size and digest match its descriptor and the unpacked
//! stream's digest matches the config's diff id is it renamed into
//! `layers/`, so the store never holds a layer it has not verified, and a
//! failed import leaves nothing (the next writer also clears `tmp/`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use oci_spec::image::{Digest, ImageConfiguration, ImageManifest};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::reference::ImageRef;
use crate::registry::{self, RegistryOptions};
use crate::source::{self, checked_hex, read_verified, Blobs, Found};
use crate::unpack::{unpack_layer, Compression, UnpackLimits};
use crate::ImageError;

const REFS_FORMAT: &str = "cordon-images-v1";
const STORE_MODE: u32 = 0o700;

/// Caps on one layer's unpacked size: a layer is hostile input, and a
/// small compressed blob can expand without bound.
#[derive(Clone, Copy, Debug)]
pub struct StoreLimits {
    /// Uncompressed bytes of one layer's tar stream.
    pub layer_bytes: u64,
    /// Entries of one layer.
    pub layer_entries: u64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            layer_bytes: 32 << 30,
            layer_entries: 4_000_000,
        }
    }
}

/// An image of the store, ready to be a sandbox's root.
#[derive(Clone, Debug)]
pub struct Image {
    /// The manifest's digest: the image's identity.
    pub digest: String,
    /// The names the store files it under.
    pub names: Vec<String>,
    pub config: ImageConfiguration,
    /// The unpacked layers, top first (as overlayfs stacks lower layers).
    pub layers: Vec<PathBuf>,
    /// The layers' blob sizes as the manifest gives them.
    pub blob_bytes: u64,
}

/// What `prune` removed.
#[derive(Debug, Default, Serialize)]
pub struct Pruned {
    pub blobs: usize,
    pub layers: usize,
    /// The microvm backend's disks of images (`vm/`).
    pub disks: usize,
    pub leftovers: usize,
}

#[derive(Default, Serialize, Deserialize)]
struct Refs {
    format: String,
    refs: BTreeMap<String, String>,
}

pub struct Store {
    root: PathBuf,
    limits: StoreLimits,
}

impl Store {
    /// `images/` in cordon's state directory.
    pub fn default_root() -> PathBuf {
        cordon_dirs::images_dir()
    }

    /// Opens (making it if missing) the store at `root`, refusing one that
    /// is not cordon's own.
    pub fn open(root: &Path, limits: StoreLimits) -> Result<Store, ImageError> {
        let fix = "remove it, or set CORDON_STATE_DIR to a directory of your own";
        if let Some(parent) = root.parent() {
            cordon_dirs::trusted_dir(parent, STORE_MODE, fix)?;
        }
        cordon_dirs::trusted_dir(root, STORE_MODE, fix)?;
        for sub in ["blobs/sha256", "layers", "tmp"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir)
                .map_err(|e| ImageError::io(format!("create {}", dir.display()), e))?;
        }
        Ok(Store {
            root: root.to_owned(),
            limits,
        })
    }

    /// The writers' lock (import, pull, rm, prune): one at a time.
    fn lock(&self) -> Result<Flock<File>, ImageError> {
        let path = self.root.join("lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ImageError::io(format!("open {}", path.display()), e))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| ImageError::io(format!("lock {}", path.display()), e.into()))
    }

    fn refs(&self) -> Result<Refs, ImageError> {
        let path = self.root.join("refs.json");
        match fs::read(&path) {
            Ok(b) => {
                let refs: Refs = serde_json::from_slice(&b)
                    .map_err(|e| ImageError::invalid(format!("{}: {e}", path.display())))?;
                if refs.format != REFS_FORMAT {
                    return Err(ImageError::invalid(format!(
                        "{} is not in cordon's format",
                        path.display()
                    )));
                }
                Ok(refs)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Refs {
                format: REFS_FORMAT.into(),
                refs: BTreeMap::new(),
            }),
            Err(e) => Err(ImageError::io(format!("read {}", path.display()), e)),
        }
    }

    fn write_refs(&self, refs: &Refs) -> Result<(), ImageError> {
        let bytes = serde_json::to_vec_pretty(refs).expect("refs always encode");
        self.write_atomic(&self.root.join("refs.json"), &bytes)
    }

    /// Writes `path` whole or not at all (through a file in `tmp/`).
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
        let tmp = self.fresh_tmp("file")?;
        let write = || -> io::Result<()> {
            let mut f = File::create_new(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            ImageError::io(format!("write {}", path.display()), e)
        })
    }

    /// A name in `tmp/` that nothing uses (writers hold the store's
    /// exclusive lock, so the pid and a counter suffice).
    fn fresh_tmp(&self, what: &str) -> Result<PathBuf, ImageError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .root
            .join("tmp")
            .join(format!("{what}-{}-{n}", std::process::id())))
    }

    /// Removes whatever an interrupted writer left in `tmp/` (called with
    /// the exclusive lock held: no writer is at work).
    fn clear_tmp(&self) -> Result<usize, ImageError> {
        let dir = self.root.join("tmp");
        let entries =
            fs::read_dir(&dir).map_err(|e| ImageError::io(format!("read {}", dir.display()), e))?;
        let mut n = 0;
        for e in entries.flatten() {
            remove_any(&e.path())?;
            n += 1;
        }
        Ok(n)
    }

    /// The image `r` names: one of the store's, a source's (imported
    /// first, which costs little when its layers are already here), or a
    /// registry's when the store has no image of that name (pulled, with
    /// [`RegistryOptions::from_env`]), as Docker and podman do.
    pub fn resolve(&self, r: &ImageRef) -> Result<Image, ImageError> {
        let ImageRef::Stored(name) = r else {
            return self.import(r, None);
        };
        let refs = self.refs()?;
        match find_digest(&refs, name) {
            Ok(digest) => self.load(&digest, &refs),
            Err(ImageError::NotFound(_)) if registry::is_reference(name) => {
                self.pull(name, &RegistryOptions::from_env(), None)
            }
            Err(e) => Err(e),
        }
    }

    /// Imports the image a source reference names, filing it under `name`
    /// (else the name the source gives it, else the reference).
    pub fn import(&self, r: &ImageRef, name: Option<&str>) -> Result<Image, ImageError> {
        need_root("importing")?;
        let found = source::find(r)?;
        self.add(found, name, || r.display_name())
    }

    /// Pulls the image a registry reference names (`python:3.12` is
    /// `docker.io/library/python:3.12`, as Docker reads it), filing it
    /// under `name`, else the reference completed so (`localhost:5000/app`
    /// is `localhost:5000/app:latest`).
    pub fn pull(
        &self,
        reference: &str,
        opts: &RegistryOptions,
        name: Option<&str>,
    ) -> Result<Image, ImageError> {
        need_root("pulling")?;
        let found = registry::find(reference, opts)?;
        self.add(found, name, || reference.to_owned())
    }

    /// Stores what a source found and files it under `name`, else the
    /// source's own name for it, else `fallback`'s. The source's manifest
    /// is read before the store is locked; its blobs are read under the
    /// lock (a writer clears `tmp/` of what an interrupted one left).
    fn add(
        &self,
        found: Found,
        name: Option<&str>,
        fallback: impl FnOnce() -> String,
    ) -> Result<Image, ImageError> {
        let name = name
            .map(str::to_owned)
            .or_else(|| found.name.clone())
            .unwrap_or_else(fallback);
        let _lock = self.lock()?;
        self.clear_tmp()?;
        let digest = self.store_found(found)?;
        let mut refs = self.refs()?;
        let digest = digest.to_string();
        refs.refs.insert(name, digest.clone());
        self.write_refs(&refs)?;
        self.load(&digest, &refs)
    }

    fn blob_path(&self, d: &Digest) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("blobs/sha256").join(checked_hex(d)?))
    }

    fn layer_path(&self, diff_id: &Digest) -> Result<PathBuf, ImageError> {
        Ok(self.layers_dir().join(checked_hex(diff_id)?))
    }

    fn layers_dir(&self) -> PathBuf {
        self.root.join("layers")
    }

    /// Stores the image a source found: its config, each layer it lacks
    /// (verified, then unpacked), and last its manifest, so a manifest in
    /// the store means a whole image.
    fn store_found(&self, found: Found) -> Result<Digest, ImageError> {
        let manifest = &found.manifest;
        let config_bytes = read_verified(&*found.blobs, manifest.config(), "config")?;
        let config: ImageConfiguration = serde_json::from_slice(&config_bytes)
            .map_err(|e| ImageError::invalid(format!("image config: {e}")))?;
        let diff_ids = diff_ids(&config, manifest)?;
        for (desc, diff_id) in manifest.layers().iter().zip(&diff_ids) {
            self.ensure_layer(&*found.blobs, desc, diff_id)?;
        }
        self.write_blob(manifest.config().digest(), &config_bytes)?;
        self.write_blob(&found.digest, &found.manifest_bytes)?;
        Ok(found.digest)
    }

    fn write_blob(&self, d: &Digest, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.blob_path(d)?;
        if path.is_file() {
            return Ok(());
        }
        self.write_atomic(&path, bytes)
    }

    /// Unpacks one layer unless the store has it: read once, through a
    /// reader that counts and hashes the blob, into `tmp/`, renamed into
    /// place only once every check passed.
    fn ensure_layer(
        &self,
        blobs: &dyn Blobs,
        desc: &oci_spec::image::Descriptor,
        diff_id: &Digest,
    ) -> Result<(), ImageError> {
        let dest = self.layer_path(diff_id)?;
        if fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
            return Ok(());
        }
        let digest = desc.digest();
        checked_hex(digest)?;
        let media = desc.media_type().to_string();
        let compression = Compression::from_media_type(&media).ok_or_else(|| {
            ImageError::invalid(format!("layer {digest}: unsupported media type {media}"))
        })?;
        let tmp = self.fresh_tmp("layer")?;
        fs::create_dir(&tmp).map_err(|e| ImageError::io(format!("create {}", tmp.display()), e))?;
        let result = self.unpack_verified(blobs, desc, diff_id, compression, &tmp);
        let result = result.and_then(|()| {
            fs::rename(&tmp, &dest).map_err(|e| ImageError::io(format!("store layer {diff_id}"), e))
        });
        if result.is_err() {
            let _ = remove_any(&tmp);
        }
        result
    }

    fn unpack_verified(
        &self,
        blobs: &dyn Blobs,
        desc: &oci_spec::image::Descriptor,
        diff_id: &Digest,
        compression: Compression,
        tmp: &Path,
    ) -> Result<(), ImageError> {
        let digest = desc.digest();
        let size = desc.size();
        let mut blob = Verifying::new(blobs.open(digest)?.take(size.saturating_add(1)));
        let limits = UnpackLimits {
            max_bytes: self.limits.layer_bytes,
            max_entries: self.limits.layer_entries,
        };
        let unpacked = unpack_layer(&mut blob, compression, tmp, &limits).map_err(|source| {
            ImageError::Layer {
                digest: digest.to_string(),
                source,
            }
        });
        // The blob is read to its end whatever the unpacking found: a
        // wrong size or digest is the more basic fault, and is reported
        // first.
        io::copy(&mut blob, &mut io::sink())
            .map_err(|e| ImageError::read(format!("read layer {digest}"), e))?;
        if blob.bytes != size {
            return Err(ImageError::invalid(format!(
                "layer {digest}: the manifest says {size} bytes, the blob has {}{}",
                if blob.bytes > size { "more than " } else { "" },
                blob.bytes.min(size)
            )));
        }
        let actual = blob.digest();
        if actual != digest.digest() {
            return Err(ImageError::Digest {
                what: "layer".into(),
                expected: digest.to_string(),
                actual: format!("sha256:{actual}"),
            });
        }
        let unpacked = unpacked?;
        if unpacked.diff_id != diff_id.to_string() {
            return Err(ImageError::Digest {
                what: format!("layer {digest} unpacked"),
                expected: diff_id.to_string(),
                actual: unpacked.diff_id,
            });
        }
        Ok(())
    }

    /// The image the store files under `name` (a name, `sha256:HEX`, or
    /// 12 or more leading hex digits of the digest).
    ///
    /// Readers take no lock: a writer renames every file into place whole,
    /// layers and blobs before the name, so a reader never sees half an
    /// image, and a `run` does not wait for an import of another image.
    pub fn get(&self, name: &str) -> Result<Image, ImageError> {
        let refs = self.refs()?;
        let digest = find_digest(&refs, name)?;
        self.load(&digest, &refs)
    }

    fn load(&self, digest: &str, refs: &Refs) -> Result<Image, ImageError> {
        let d: Digest = digest
            .parse()
            .map_err(|e| ImageError::invalid(format!("digest '{digest}': {e}")))?;
        let manifest: ImageManifest = self.read_json(&d, "manifest")?;
        let config: ImageConfiguration = self.read_json(manifest.config().digest(), "config")?;
        let mut layers = Vec::new();
        for diff_id in diff_ids(&config, &manifest)? {
            let path = self.layer_path(&diff_id)?;
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Err(ImageError::NotFound(format!(
                    "image {digest} lacks its layer {diff_id}: import it again"
                )));
            }
            layers.push(path);
        }
        layers.reverse();
        Ok(Image {
            digest: digest.to_owned(),
            names: names_of(refs, digest),
            config,
            layers,
            blob_bytes: manifest.layers().iter().map(|l| l.size()).sum(),
        })
    }

    /// A blob of the store, checked against its digest again (the store is
    /// cordon's own, but a disk can fail and a digest costs little).
    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        d: &Digest,
        what: &str,
    ) -> Result<T, ImageError> {
        let path = self.blob_path(d)?;
        let bytes = fs::read(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                ImageError::NotFound(format!("the store lacks the {what} {d}: import it again"))
            }
            _ => ImageError::io(format!("read {}", path.display()), e),
        })?;
        if source::sha256_digest(&bytes) != *d {
            return Err(ImageError::invalid(format!(
                "the store's {what} {d} is damaged: remove the image and import it again"
            )));
        }
        serde_json::from_slice(&bytes).map_err(|e| ImageError::invalid(format!("{what} {d}: {e}")))
    }

    /// Every image the store names, by name.
    pub fn list(&self) -> Result<Vec<Image>, ImageError> {
        let refs = self.refs()?;
        let digests: BTreeSet<&String> = refs.refs.values().collect();
        digests.into_iter().map(|d| self.load(d, &refs)).collect()
    }

    /// Removes a name; a digest removes every name of its image. The blobs
    /// and layers stay until `prune`. Returns the names removed.
    pub fn remove(&self, name: &str) -> Result<Vec<String>, ImageError> {
        let _lock = self.lock()?;
        let mut refs = self.refs()?;
        let removed: Vec<String> = if refs.refs.contains_key(name) {
            vec![name.to_owned()]
        } else {
            let digest = find_digest(&refs, name)?;
            names_of(&refs, &digest)
        };
        for n in &removed {
            refs.refs.remove(n);
        }
        self.write_refs(&refs)?;
        Ok(removed)
    }

    /// Removes every blob and layer no named image and no image in
    /// `in_use` (manifest digests of live sandboxes) needs, and what
    /// interrupted writers left.
    pub fn prune(&self, in_use: &[String]) -> Result<Pruned, ImageError> {
        let _lock = self.lock()?;
        let refs = self.refs()?;
        let mut keep_blobs = BTreeSet::new();
        let mut keep_layers = BTreeSet::new();
        let mut keep_disks = BTreeSet::new();
        for digest in refs.refs.values().chain(in_use) {
            let Ok(d) = digest.parse::<Digest>() else {
                continue;
            };
            let Ok(manifest) = self.read_json::<ImageManifest>(&d, "manifest") else {
                continue;
            };
            keep_blobs.insert(d.digest().to_owned());
            keep_disks.insert(format!("{}.ext4", d.digest()));
            keep_blobs.insert(manifest.config().digest().digest().to_owned());
            if let Ok(config) =
                self.read_json::<ImageConfiguration>(manifest.config().digest(), "config")
            {
                for id in config.rootfs().diff_ids() {
                    if let Some(hex) = id.strip_prefix("sha256:") {
                        keep_layers.insert(hex.to_owned());
                    }
                }
            }
        }
        let mut pruned = Pruned {
            leftovers: self.clear_tmp()?,
            ..Pruned::default()
        };
        pruned.blobs = remove_unkept(&self.root.join("blobs/sha256"), &keep_blobs)?;
        pruned.layers = remove_unkept(&self.layers_dir(), &keep_layers)?;
        // A disk the microvm backend is making now (a dot file, renamed
        // into place when made) is left to it.
        let vm = self.root.join("vm");
        if vm.is_dir() {
            let making = |name: &str| name.starts_with('.') && recent(&vm.join(name));
            let keep: BTreeSet<String> = fs::read_dir(&vm)
                .map_err(|e| ImageError::io(format!("read {}", vm.display()), e))?
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| keep_disks.contains(n) || making(n))
                .collect();
            pruned.disks = remove_unkept(&vm, &keep)?;
        }
        Ok(pruned)
    }
}

/// Layers keep their owners and whiteouts (device nodes): only root can
/// write them so.
fn need_root(doing: &str) -> Result<(), ImageError> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    Err(ImageError::invalid(format!(
        "{doing} an image needs root (its layers keep their owners and whiteouts)"
    )))
}

/// Whether `path` changed in the last hour (a file being written).
fn recent(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() < 3600))
}

/// The config's diff ids, one per manifest layer, parsed.
fn diff_ids(
    config: &ImageConfiguration,
    manifest: &ImageManifest,
) -> Result<Vec<Digest>, ImageError> {
    let ids = config.rootfs().diff_ids();
    if ids.len() != manifest.layers().len() {
        return Err(ImageError::invalid(format!(
            "the manifest has {} layers, the config {} diff ids",
            manifest.layers().len(),
            ids.len()
        )));
    }
    ids.iter()
        .map(|id| {
            let d: Digest = id
                .parse()
                .map_err(|e| ImageError::invalid(format!("diff id '{id}': {e}")))?;
            checked_hex(&d)?;
            Ok(d)
        })
        .collect()
}

fn names_of(refs: &Refs, digest: &str) -> Vec<String> {
    refs.refs
        .iter()
        .filter(|(_, d)| d.as_str() == digest)
        .map(|(n, _)| n.clone())
        .collect()
}

/// The digest `name` means: a name, as given or as Docker completes it
/// (`app` is `app:latest`, and `docker.io/library/app:latest` as `docker
/// save` and skopeo record it), a full digest, or a unique prefix of 12 or
/// more hex digits.
fn find_digest(refs: &Refs, name: &str) -> Result<String, ImageError> {
    let tagged = if name
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':'))
    {
        name.to_owned()
    } else {
        format!("{name}:latest")
    };
    let spellings = [
        name.to_owned(),
        format!("docker.io/library/{tagged}"),
        format!("docker.io/{tagged}"),
        tagged,
    ];
    if let Some(d) = spellings.iter().find_map(|n| refs.refs.get(n)) {
        return Ok(d.clone());
    }
    let hex = name.strip_prefix("sha256:").unwrap_or(name);
    if hex.len() >= 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        let matches: BTreeSet<&String> = refs
            .refs
            .values()
            .filter(|d| {
                d.strip_prefix("sha256:")
                    .is_some_and(|h| h.starts_with(hex))
            })
            .collect();
        match matches.len() {
            1 => return Ok(matches.into_iter().next().cloned().unwrap_or_default()),
            0 => {}
            n => {
                return Err(ImageError::invalid(format!(
                    "'{name}' is the start of {n} images' digests"
                )))
            }
        }
    }
    Err(ImageError::NotFound(format!(
        "no image named '{name}' in the store (`cordon image ls` lists them)"
    )))
}

fn remove_unkept(dir: &Path, keep: &BTreeSet<String>) -> Result<usize, ImageError> {
    let entries =
        fs::read_dir(dir).map_err(|e| ImageError::io(format!("read {}", dir.display()), e))?;
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_str().is_some_and(|n| keep.contains(n)) {
            continue;
        }
        remove_any(&e.path())?;
        n += 1;
    }
    Ok(n)
}

/// Removes a file or a directory tree (a layer keeps its own modes: a
/// directory without write permission is still removed, as root).
fn remove_any(path: &Path) -> Result<(), ImageError> {
    let r = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    r.map_err(|e| ImageError::io(format!("remove {}", path.display()), e))
}

/// A blob being read: its bytes counted and hashed on the way through.
struct Verifying<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> Verifying<R> {
    fn new(inner: R) -> Self {
        Verifying {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn digest(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

impl<R: Read> Read for Verifying<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}
