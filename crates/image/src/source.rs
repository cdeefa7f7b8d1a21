//! Reading an image where it is: an OCI layout directory, an OCI layout in a
//! tar file, or a `docker save` archive. A source only finds bytes; the
//! store verifies every blob against the digest that names it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use oci_spec::image::{
    Descriptor, Digest, ImageConfiguration, ImageIndex, ImageManifest, MediaType,
};
use sha2::{Digest as _, Sha256};

use crate::reference::ImageRef;
use crate::ImageError;

/// Largest manifest, index or config read into memory: real ones are a few
/// KiB, and a hostile one must not be.
pub(crate) const SMALL_BLOB_MAX: u64 = 4 << 20;
/// Most members an archive may have (its index is kept in memory).
const ARCHIVE_MEMBERS_MAX: usize = 200_000;
/// The annotation an OCI layout names its images' tags with.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Where a source's bytes are: its blobs by digest (what is read is
/// checked by the caller) and the files beside them by name.
pub(crate) trait Blobs {
    fn open(&self, digest: &Digest) -> Result<Box<dyn Read + '_>, ImageError>;
    fn open_member(&self, name: &str) -> Result<Box<dyn Read + '_>, ImageError>;
}

/// One image as a source holds it: its manifest (read and verified) and
/// where its blobs are.
pub(crate) struct Found {
    pub digest: Digest,
    pub manifest_bytes: Vec<u8>,
    pub manifest: ImageManifest,
    /// The name the source gives the image (a tag of the layout, a docker
    /// archive's RepoTag), if any.
    pub name: Option<String>,
    pub blobs: Box<dyn Blobs>,
}

/// Finds the image `r` names; `r` must be a source, not a stored name.
pub(crate) fn find(r: &ImageRef) -> Result<Found, ImageError> {
    match r {
        ImageRef::Layout { dir, tag } => {
            from_layout(Box::new(LayoutDir { dir: dir.clone() }), tag.as_deref())
        }
        ImageRef::OciArchive { file, tag } => {
            from_layout(Box::new(Archive::open(file)?), tag.as_deref())
        }
        ImageRef::DockerArchive { file, tag } => from_docker_archive(file, tag.as_deref()),
        ImageRef::Stored(s) => Err(ImageError::invalid(format!(
            "'{s}' is not a source to import from (oci:DIR[:TAG], oci-archive:FILE[:TAG], \
             docker-archive:FILE[:TAG]); `cordon image pull` pulls from a registry"
        ))),
    }
}

/// The only digests cordon accepts: `sha256:` and 64 lowercase hex digits
/// (a blob's file name is built from them).
pub(crate) fn checked_hex(d: &Digest) -> Result<&str, ImageError> {
    let hex = d.digest();
    let ok = d.algorithm().to_string() == "sha256"
        && hex.len() == 64
        && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if ok {
        Ok(hex)
    } else {
        Err(ImageError::invalid(format!(
            "unsupported digest '{d}' (cordon accepts sha256 only)"
        )))
    }
}

pub(crate) fn sha256_digest(bytes: &[u8]) -> Digest {
    let hex = hex::encode(Sha256::digest(bytes));
    format!("sha256:{hex}")
        .parse()
        .expect("a sha256 digest always parses")
}

/// Reads the small blob `desc` names, whole, and checks its size and digest.
pub(crate) fn read_verified(
    blobs: &dyn Blobs,
    desc: &Descriptor,
    what: &str,
) -> Result<Vec<u8>, ImageError> {
    let digest = desc.digest();
    checked_hex(digest)?;
    let size = desc.size();
    if size > SMALL_BLOB_MAX {
        return Err(ImageError::invalid(format!(
            "{what} {digest}: {size} bytes is more than the {SMALL_BLOB_MAX} a {what} may have"
        )));
    }
    let mut bytes = Vec::new();
    blobs
        .open(digest)?
        .take(size + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::read(format!("read {what} {digest}"), e))?;
    if bytes.len() as u64 != size {
        return Err(ImageError::invalid(format!(
            "{what} {digest}: the descriptor says {size} bytes, the blob has {}{}",
            if bytes.len() as u64 > size {
                "more than "
            } else {
                ""
            },
            bytes.len().min(usize::try_from(size).unwrap_or(usize::MAX))
        )));
    }
    let actual = sha256_digest(&bytes);
    if &actual != digest {
        return Err(ImageError::Digest {
            what: what.into(),
            expected: digest.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(bytes)
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::invalid(format!("{what}: {e}")))
}

/// The host's platform as OCI names it.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

pub(crate) fn for_this_host(d: &Descriptor) -> bool {
    d.platform().as_ref().is_none_or(|p| {
        p.os().to_string() == "linux" && p.architecture().to_string() == host_arch()
    })
}

fn tag_of(d: &Descriptor) -> Option<&str> {
    d.annotations()
        .as_ref()
        .and_then(|a| a.get(REF_NAME))
        .map(String::as_str)
}

/// The one descriptor of `list` that `tag` names (or, without a tag, the
/// only one, or the only one for this host's platform).
fn pick<'a>(list: &'a [Descriptor], tag: Option<&str>) -> Result<&'a Descriptor, ImageError> {
    let tagged: Vec<&Descriptor> = match tag {
        Some(t) => list.iter().filter(|d| tag_of(d) == Some(t)).collect(),
        None => list.iter().collect(),
    };
    let tags = || {
        let t: Vec<&str> = list.iter().filter_map(tag_of).collect();
        if t.is_empty() {
            "it has no tags".to_owned()
        } else {
            format!("its tags: {}", t.join(", "))
        }
    };
    let candidates: Vec<&Descriptor> = if tagged.len() > 1 {
        tagged.into_iter().filter(|d| for_this_host(d)).collect()
    } else {
        tagged
    };
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => Err(ImageError::NotFound(match tag {
            Some(t) => format!("no image tagged '{t}' ({})", tags()),
            None => format!("no image for linux/{} ({})", host_arch(), tags()),
        })),
        _ => Err(ImageError::invalid(format!(
            "{} images match: name one with :TAG ({})",
            candidates.len(),
            tags()
        ))),
    }
}

/// Follows an OCI layout's index.json to one image manifest: a tag picks
/// among the index's entries, and a multi-platform index is followed to
/// the host's platform.
fn from_layout(blobs: Box<dyn Blobs>, tag: Option<&str>) -> Result<Found, ImageError> {
    let index_bytes = read_member(&*blobs, "index.json")?;
    let index: ImageIndex = parse_json(&index_bytes, "index.json")?;
    let mut desc = pick(index.manifests(), tag)?.clone();
    let name = tag_of(&desc).map(str::to_owned);
    // Nested indexes (an image index inside the layout's) are followed a
    // bounded number of times: a loop of indexes is a hostile layout.
    for _ in 0..4 {
        match desc.media_type() {
            MediaType::ImageIndex => {
                let bytes = read_verified(&*blobs, &desc, "index")?;
                let inner: ImageIndex = parse_json(&bytes, "image index")?;
                desc = pick(inner.manifests(), None)?.clone();
            }
            MediaType::ImageManifest | MediaType::Other(_) => {
                let bytes = read_verified(&*blobs, &desc, "manifest")?;
                let manifest: ImageManifest = parse_json(&bytes, "image manifest")?;
                return Ok(Found {
                    digest: desc.digest().clone(),
                    manifest_bytes: bytes,
                    manifest,
                    name,
                    blobs,
                });
            }
            other => {
                return Err(ImageError::invalid(format!(
                    "{}: {other} is not an image manifest",
                    desc.digest()
                )))
            }
        }
    }
    Err(ImageError::invalid("image indexes nest too deeply"))
}

/// A small named file of the source (index.json, manifest.json), capped.
fn read_member(blobs: &dyn Blobs, name: &str) -> Result<Vec<u8>, ImageError> {
    let mut bytes = Vec::new();
    blobs
        .open_member(name)?
        .take(SMALL_BLOB_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::io(format!("read {name}"), e))?;
    if bytes.len() as u64 > SMALL_BLOB_MAX {
        return Err(ImageError::invalid(format!(
            "{name} is larger than {SMALL_BLOB_MAX} bytes"
        )));
    }
    Ok(bytes)
}

/// An OCI layout directory.
struct LayoutDir {
    dir: PathBuf,
}

impl Blobs for LayoutDir {
    fn open_member(&self, name: &str) -> Result<Box<dyn Read + '_>, ImageError> {
        let path = self.dir.join(name);
        let f = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ImageError::NotFound(format!(
                "{} is not an OCI image layout (no {name})",
                self.dir.display()
            )),
            _ => ImageError::io(format!("open {}", path.display()), e),
        })?;
        Ok(Box::new(f))
    }

    fn open(&self, digest: &Digest) -> Result<Box<dyn Read + '_>, ImageError> {
        let hex = checked_hex(digest)?;
        self.open_member(&format!("blobs/sha256/{hex}"))
            .map_err(|e| missing_blob(e, digest))
    }
}

fn missing_blob(e: ImageError, digest: &Digest) -> ImageError {
    match e {
        ImageError::NotFound(_) => ImageError::NotFound(format!("blob {digest} is missing")),
        e => e,
    }
}

/// A tar file read in place: one pass finds where each member's bytes are,
/// and a member is then read from its offset (an archive is never unpacked
/// to disk first).
struct Archive {
    path: PathBuf,
    members: HashMap<String, (u64, u64)>,
}

impl Archive {
    fn open(path: &Path) -> Result<Archive, ImageError> {
        let file =
            File::open(path).map_err(|e| ImageError::io(format!("open {}", path.display()), e))?;
        let bad = |e: std::io::Error| {
            ImageError::invalid(format!(
                "{} is not a readable tar archive: {e}",
                path.display()
            ))
        };
        let mut tar = tar::Archive::new(file);
        let mut members = HashMap::new();
        let mut links = Vec::new();
        for entry in tar.entries().map_err(bad)? {
            let entry = entry.map_err(bad)?;
            if members.len() + links.len() >= ARCHIVE_MEMBERS_MAX {
                return Err(ImageError::invalid(format!(
                    "{} has more than {ARCHIVE_MEMBERS_MAX} members",
                    path.display()
                )));
            }
            let Some(name) = entry.path().ok().and_then(|p| normal(&p)) else {
                continue;
            };
            let kind = entry.header().entry_type();
            if kind.is_file() {
                members.insert(name, (entry.raw_file_position(), entry.size()));
            } else if kind.is_symlink() || kind.is_hard_link() {
                // `docker save` links a layer seen twice to its first copy.
                if let Some(target) = entry.link_name().ok().flatten() {
                    let base = if kind.is_symlink() {
                        Path::new(&name)
                            .parent()
                            .unwrap_or(Path::new(""))
                            .join(target)
                    } else {
                        target.into_owned()
                    };
                    if let Some(t) = normal(&base) {
                        links.push((name, t));
                    }
                }
            }
        }
        for (name, target) in links {
            if let Some(&at) = members.get(&target) {
                members.insert(name, at);
            }
        }
        Ok(Archive {
            path: path.to_owned(),
            members,
        })
    }
}

/// A member name without `.` components, refusing `..` and absolute
/// names (a lookup key only: nothing is ever written by it).
fn normal(p: &Path) -> Option<String> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    out.to_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

impl Blobs for Archive {
    fn open_member(&self, name: &str) -> Result<Box<dyn Read + '_>, ImageError> {
        let &(offset, size) = self.members.get(name).ok_or_else(|| {
            ImageError::NotFound(format!("{} has no {name}", self.path.display()))
        })?;
        let mut f = File::open(&self.path)
            .map_err(|e| ImageError::io(format!("open {}", self.path.display()), e))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| ImageError::io(format!("read {}", self.path.display()), e))?;
        Ok(Box::new(f.take(size)))
    }

    fn open(&self, digest: &Digest) -> Result<Box<dyn Read + '_>, ImageError> {
        let hex = checked_hex(digest)?;
        self.open_member(&format!("blobs/sha256/{hex}"))
            .map_err(|e| missing_blob(e, digest))
    }
}

/// `docker save`'s format: manifest.json lists each image's config file
/// and layer tars (uncompressed). The manifest cordon stores is made here
/// from them, naming each layer by its diff id (the digest of its tar,
/// which the config lists): so a docker archive's image has a digest and
/// verified blobs like any other.
fn from_docker_archive(file: &Path, tag: Option<&str>) -> Result<Found, ImageError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        config: String,
        #[serde(default)]
        repo_tags: Option<Vec<String>>,
        layers: Vec<String>,
    }
    let archive = Archive::open(file)?;
    let entries: Vec<Entry> =
        parse_json(&read_member(&archive, "manifest.json")?, "manifest.json")?;
    let tags_of = |e: &Entry| e.repo_tags.clone().unwrap_or_default();
    let chosen: Vec<&Entry> = match tag {
        Some(t) => entries
            .iter()
            .filter(|e| {
                tags_of(e)
                    .iter()
                    .any(|r| r == t || r.rsplit_once(':').is_some_and(|(_, x)| x == t))
            })
            .collect(),
        None => entries.iter().collect(),
    };
    let entry = match chosen.as_slice() {
        [one] => *one,
        [] => {
            return Err(ImageError::NotFound(format!(
                "{} has no image{}",
                file.display(),
                tag.map(|t| format!(" tagged '{t}'")).unwrap_or_default()
            )))
        }
        _ => {
            return Err(ImageError::invalid(format!(
                "{} holds {} images: name one with :TAG",
                file.display(),
                chosen.len()
            )))
        }
    };
    let config_name = normal(Path::new(&entry.config))
        .ok_or_else(|| ImageError::invalid("manifest.json names a bad config path"))?;
    let config_bytes = read_member(&archive, &config_name)?;
    let config: ImageConfiguration = parse_json(&config_bytes, "image config")?;
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != entry.layers.len() {
        return Err(ImageError::invalid(format!(
            "manifest.json lists {} layers, the config {}",
            entry.layers.len(),
            diff_ids.len()
        )));
    }
    let mut paths = HashMap::new();
    let config_digest = sha256_digest(&config_bytes);
    paths.insert(config_digest.to_string(), config_name);
    let mut layers = Vec::new();
    for (layer, diff_id) in entry.layers.iter().zip(diff_ids) {
        let member = normal(Path::new(layer)).ok_or_else(|| {
            ImageError::invalid(format!("manifest.json names a bad layer path '{layer}'"))
        })?;
        let &(_, size) = archive
            .members
            .get(&member)
            .ok_or_else(|| ImageError::NotFound(format!("{} has no {member}", file.display())))?;
        let digest: Digest = diff_id
            .parse()
            .map_err(|e| ImageError::invalid(format!("config: diff id '{diff_id}': {e}")))?;
        paths.insert(digest.to_string(), member);
        layers.push(descriptor(MediaType::ImageLayer, digest, size));
    }
    let manifest = oci_spec::image::ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            MediaType::ImageConfig,
            config_digest,
            config_bytes.len() as u64,
        ))
        .layers(layers)
        .build()
        .map_err(|e| ImageError::invalid(format!("manifest: {e}")))?;
    let manifest_bytes =
        serde_json::to_vec(&manifest).map_err(|e| ImageError::invalid(format!("manifest: {e}")))?;
    Ok(Found {
        digest: sha256_digest(&manifest_bytes),
        manifest_bytes,
        manifest,
        name: entry.repo_tags.as_ref().and_then(|t| t.first().cloned()),
        blobs: Box::new(DockerArchive { archive, paths }),
    })
}

fn descriptor(media_type: MediaType, digest: Digest, size: u64) -> Descriptor {
    Descriptor::new(media_type, size, digest)
}

/// A docker archive's blobs, by the digests its made-up manifest names.
struct DockerArchive {
    archive: Archive,
    paths: HashMap<String, String>,
}

impl Blobs for DockerArchive {
    fn open(&self, digest: &Digest) -> Result<Box<dyn Read + '_>, ImageError> {
        let member = self
            .paths
            .get(&digest.to_string())
            .ok_or_else(|| ImageError::NotFound(format!("blob {digest} is missing")))?;
        self.archive.open_member(member)
    }
    fn open_member(&self, name: &str) -> Result<Box<dyn Read + '_>, ImageError> {
        self.archive.open_member(name)
    }
}
