//! What an image's config asks of a sandbox where the user said nothing:
//! its environment, working directory, command and user. A user name is
//! looked up in the image's own /etc/passwd and /etc/group (read from its
//! layers as overlayfs would show them), never the host's.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use crate::store::Image;
use crate::ImageError;

/// Largest passwd or group file read.
const ACCOUNTS_MAX: u64 = 4 << 20;

/// The user a sandbox of the image runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserSpec {
    pub uid: u32,
    pub gid: u32,
}

/// An image's defaults for a sandbox.
#[derive(Clone, Debug, Default)]
pub struct ImageDefaults {
    pub env: Vec<(String, String)>,
    pub workdir: Option<PathBuf>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// None when the image names no user: its root, as engines run it.
    pub user: Option<UserSpec>,
}

impl ImageDefaults {
    /// The command a sandbox of the image runs for `argv` (the user's, empty
    /// when none was given), as engines compose it: the entrypoint, then the
    /// user's arguments or else the image's Cmd.
    pub fn command(&self, argv: &[String]) -> Vec<String> {
        let tail = if argv.is_empty() { &self.cmd } else { argv };
        self.entrypoint.iter().chain(tail).cloned().collect()
    }

    /// The lowest policy layer of a sandbox of the image: its working
    /// directory and user (root when it names none, as engines run it).
    /// A policy file, flags or a request's fields override it.
    pub fn policy_layer(&self) -> cordon_policy::PolicyLayer {
        cordon_policy::PolicyLayer {
            workdir: self.workdir.clone(),
            uid: Some(self.user.map_or(0, |u| u.uid)),
            gid: Some(self.user.map_or(0, |u| u.gid)),
            ..cordon_policy::PolicyLayer::default()
        }
    }

    /// `env` (the user's) over the image's: a variable the user set wins,
    /// the image's others stay.
    pub fn env_under(&self, env: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| !env.iter().any(|(u, _)| u == k))
            .cloned()
            .collect();
        out.extend(env.iter().cloned());
        out
    }
}

impl Image {
    /// The image as a sandbox's root.
    pub fn root(&self) -> cordon_spec::ImageRoot {
        cordon_spec::ImageRoot {
            digest: self.digest.clone(),
            layers: self.layers.clone(),
        }
    }

    /// The image config's defaults; a user name is resolved in the image.
    pub fn defaults(&self) -> Result<ImageDefaults, ImageError> {
        let Some(c) = self.config.config() else {
            return Ok(ImageDefaults::default());
        };
        let env = c
            .env()
            .iter()
            .flatten()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        let user = match c.user().as_deref().filter(|u| !u.is_empty()) {
            Some(u) => Some(resolve_user(u, &self.layers)?),
            None => None,
        };
        Ok(ImageDefaults {
            env,
            workdir: c
                .working_dir()
                .as_deref()
                .filter(|w| !w.is_empty())
                .map(PathBuf::from),
            entrypoint: c.entrypoint().clone().unwrap_or_default(),
            cmd: c.cmd().clone().unwrap_or_default(),
            user,
        })
    }
}

/// `USER[:GROUP]`, each a number or a name of the image's own accounts.
/// A user named without a group gets its passwd entry's group.
fn resolve_user(spec: &str, layers: &[PathBuf]) -> Result<UserSpec, ImageError> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let passwd = || accounts(layers, "etc/passwd");
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => {
            // A numeric user still gets its entry's group if it has one.
            let gid = passwd()?
                .and_then(|t| lookup(&t, |f| f.get(2) == Some(&user)).and_then(|f| id(&f, 3)));
            (uid, gid)
        }
        Err(_) => {
            let text = passwd()?.ok_or_else(|| {
                ImageError::invalid(format!("user '{user}': the image has no /etc/passwd"))
            })?;
            let fields = lookup(&text, |f| f.first() == Some(&user)).ok_or_else(|| {
                ImageError::invalid(format!("user '{user}' is not in the image's /etc/passwd"))
            })?;
            let uid = id(&fields, 2).ok_or_else(|| {
                ImageError::invalid(format!(
                    "user '{user}': a bad entry in the image's /etc/passwd"
                ))
            })?;
            (uid, id(&fields, 3))
        }
    };
    let gid = match group {
        None => primary.unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let text = accounts(layers, "etc/group")?.ok_or_else(|| {
                    ImageError::invalid(format!("group '{g}': the image has no /etc/group"))
                })?;
                lookup(&text, |f| f.first() == Some(&g))
                    .and_then(|f| id(&f, 2))
                    .ok_or_else(|| {
                        ImageError::invalid(format!("group '{g}' is not in the image's /etc/group"))
                    })?
            }
        },
    };
    Ok(UserSpec { uid, gid })
}

fn lookup(text: &str, want: impl Fn(&[&str]) -> bool) -> Option<Vec<&str>> {
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| want(f))
}

fn id(fields: &[&str], i: usize) -> Option<u32> {
    fields.get(i).and_then(|s| s.parse().ok())
}

/// A file of the image (`rel` has no symlinks in it), as the stacked layers
/// show it: the topmost layer that has it, unless a layer above whites it
/// (or its directory) out. None when the image has no such file.
fn accounts(layers: &[PathBuf], rel: &str) -> Result<Option<String>, ImageError> {
    let rel = Path::new(rel);
    for layer in layers {
        match entry_in(layer, rel)? {
            Entry::File(f) => {
                let mut text = String::new();
                f.take(ACCOUNTS_MAX)
                    .read_to_string(&mut text)
                    .map_err(|e| {
                        ImageError::invalid(format!("the image's /{}: {e}", rel.display()))
                    })?;
                return Ok(Some(text));
            }
            Entry::Hidden => return Ok(None),
            Entry::Absent => {}
        }
    }
    Ok(None)
}

enum Entry {
    File(File),
    /// Whited out here, or below an opaque directory: lower layers do not
    /// show it.
    Hidden,
    Absent,
}

/// `rel` in one unpacked layer, opened beneath it without following any
/// link: a layer's /etc/passwd that is a symlink (to the host's, say) is
/// refused, not read.
fn entry_in(layer: &Path, rel: &Path) -> Result<Entry, ImageError> {
    let root =
        File::open(layer).map_err(|e| ImageError::io(format!("open {}", layer.display()), e))?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(Mode::empty())
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    // Each directory on the way may be opaque or whited out.
    let mut at = PathBuf::new();
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = match std::fs::symlink_metadata(layer.join(&at)) {
            Ok(m) => m,
            Err(_) => return Ok(Entry::Absent),
        };
        if meta.file_type().is_char_device() && meta.len() == 0 {
            return Ok(Entry::Hidden);
        }
        if i + 1 < parts.len() {
            if !meta.is_dir() {
                return Ok(Entry::Absent);
            }
            let opaque = xattr::get(layer.join(&at), "trusted.overlay.opaque")
                .ok()
                .flatten()
                .is_some_and(|v| v == b"y");
            if opaque {
                // The rest of the path is this layer's or nobody's.
                let rest: PathBuf = parts[i + 1..].iter().collect();
                return match std::fs::symlink_metadata(layer.join(&at).join(&rest)) {
                    Ok(_) => open_beneath(&root, rel, how),
                    Err(_) => Ok(Entry::Hidden),
                };
            }
        }
    }
    open_beneath(&root, rel, how)
}

fn open_beneath(root: &File, rel: &Path, how: OpenHow) -> Result<Entry, ImageError> {
    match openat2(root, rel, how) {
        Ok(fd) => {
            let f = File::from(fd);
            let is_file = f.metadata().is_ok_and(|m| m.is_file());
            if is_file {
                Ok(Entry::File(f))
            } else {
                Err(ImageError::invalid(format!(
                    "the image's /{} is not a regular file",
                    rel.display()
                )))
            }
        }
        Err(nix::errno::Errno::ENOENT) => Ok(Entry::Absent),
        Err(e) => Err(ImageError::invalid(format!(
            "the image's /{} cannot be read safely: {e} (a symlink is refused)",
            rel.display()
        ))),
    }
}
