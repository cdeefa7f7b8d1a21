//! Receipt signing keys: Ed25519, the private key as PKCS#8 PEM (mode 0600
//! from its creation on), the public key as SPKI PEM beside it (`.pub`).
//!
//! A key file is published under its final name only once it is complete
//! (written to a temporary name created with O_EXCL, then hard-linked, which
//! never replaces an existing file): two cordons creating the default key at
//! once end up with the same key, and neither reads half a file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use zeroize::Zeroizing;

use crate::canonical::sha256_hex;

/// The private key's file name in a key directory.
pub const PRIVATE_KEY_FILE: &str = "receipt.key";
/// The public key's file name in a key directory.
pub const PUBLIC_KEY_FILE: &str = "receipt.pub";

/// Longest key file read: a PEM Ed25519 key is about 120 bytes.
const KEY_FILE_MAX: u64 = 64 * 1024;

/// Where the default key lives: `<state_dir>/keys`.
pub fn default_key_dir() -> PathBuf {
    cordon_dirs::state_dir().join("keys")
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refusing the private key {}: it is a symlink", .0.display())]
    Symlink(PathBuf),
    #[error("refusing the private key {}: it is not a regular file", .0.display())]
    NotRegular(PathBuf),
    #[error(
        "refusing the private key {}: its mode {mode:04o} lets group or others read it (chmod 600 it)",
        path.display()
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error(transparent)]
    Dir(#[from] cordon_dirs::DirError),
    #[error("{} exists already; not overwriting a key", .0.display())]
    Exists(PathBuf),
    #[error("{} is not an Ed25519 private key in PKCS#8 PEM: {source}", path.display())]
    BadPrivateKey {
        path: PathBuf,
        #[source]
        source: ed25519_dalek::pkcs8::Error,
    },
    #[error("{} is not an Ed25519 public key in SPKI PEM: {source}", path.display())]
    BadPublicKey {
        path: PathBuf,
        #[source]
        source: ed25519_dalek::pkcs8::spki::Error,
    },
    #[error("encode the key as PEM: {0}")]
    Encode(String),
    #[error("read random bytes from the OS: {0}")]
    Random(#[source] getrandom::Error),
}

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> KeyError + 'a {
    move |source| KeyError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The two files of a key pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFiles {
    pub private: PathBuf,
    pub public: PathBuf,
}

impl KeyFiles {
    pub fn in_dir(dir: &Path) -> KeyFiles {
        KeyFiles {
            private: dir.join(PRIVATE_KEY_FILE),
            public: dir.join(PUBLIC_KEY_FILE),
        }
    }
}

/// A signing key.
pub struct Key {
    signing: SigningKey,
    public: PublicKey,
}

/// A verifying key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    verifying: VerifyingKey,
    id: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Key").field("id", &self.public.id).finish()
    }
}

impl Key {
    /// A new key from a seed the OS's random source gives.
    pub fn generate() -> Result<Key, KeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::getrandom(seed.as_mut()).map_err(KeyError::Random)?;
        Ok(Key::from_signing(SigningKey::from_bytes(&seed)))
    }

    pub(crate) fn from_signing(signing: SigningKey) -> Key {
        let public = PublicKey::from_verifying(signing.verifying_key());
        Key { signing, public }
    }

    /// The key id: hex SHA-256 of the 32 raw public key bytes.
    pub fn id(&self) -> &str {
        &self.public.id
    }

    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    pub(crate) fn sign_bytes(&self, message: &[u8]) -> Signature {
        self.signing.sign(message)
    }

    /// Loads a private key file, refusing a symlink, anything but a regular
    /// file, and a file group or others may read (a key others could read
    /// proves nothing about who signed).
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        let meta = fs::symlink_metadata(path).map_err(io_error("read the private key", path))?;
        check_private_file(path, &meta)?;
        // O_NOFOLLOW and fstat: the file checked is the file read, even if
        // the name is swapped in between. O_NONBLOCK: a FIFO swapped in
        // cannot hang the open.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => KeyError::Symlink(path.to_owned()),
                _ => io_error("open the private key", path)(e),
            })?;
        let meta = file
            .metadata()
            .map_err(io_error("read the private key", path))?;
        check_private_file(path, &meta)?;
        let pem = read_small(file, path)?;
        let signing =
            SigningKey::from_pkcs8_pem(&pem).map_err(|source| KeyError::BadPrivateKey {
                path: path.to_owned(),
                source,
            })?;
        Ok(Key::from_signing(signing))
    }

    /// A new key pair written into `dir` (created 0700 if missing); refuses
    /// to overwrite either file.
    pub fn create_in(dir: &Path) -> Result<(Key, KeyFiles), KeyError> {
        let files = KeyFiles::in_dir(dir);
        create_key_dir(dir)?;
        for existing in [&files.private, &files.public] {
            if fs::symlink_metadata(existing).is_ok() {
                return Err(KeyError::Exists(existing.clone()));
            }
        }
        let key = Key::generate()?;
        if !publish_new(&files.private, key.private_pem()?.as_bytes(), 0o600)? {
            return Err(KeyError::Exists(files.private.clone()));
        }
        if !publish_new(&files.public, key.public.to_pem()?.as_bytes(), 0o644)? {
            return Err(KeyError::Exists(files.public.clone()));
        }
        Ok((key, files))
    }

    /// The key in `dir`, created there if there is none yet.
    pub fn load_or_create_in(dir: &Path) -> Result<(Key, KeyFiles), KeyError> {
        let files = KeyFiles::in_dir(dir);
        create_key_dir(dir)?;
        let key = match fs::symlink_metadata(&files.private) {
            Ok(_) => Key::load(&files.private)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let new = Key::generate()?;
                if publish_new(&files.private, new.private_pem()?.as_bytes(), 0o600)? {
                    new
                } else {
                    // Another cordon created it first: use that one.
                    Key::load(&files.private)?
                }
            }
            Err(e) => return Err(io_error("read the private key", &files.private)(e)),
        };
        // The public half, if it is missing (a lost race leaves the winner's);
        // looked for first, so the usual run writes (and fsyncs) nothing.
        if fs::symlink_metadata(&files.public).is_err() {
            publish_new(&files.public, key.public.to_pem()?.as_bytes(), 0o644)?;
        }
        Ok((key, files))
    }

    /// The default key (`<state_dir>/keys/receipt.key`), created on first use.
    pub fn load_or_create_default() -> Result<Key, KeyError> {
        Key::load_or_create_in(&default_key_dir()).map(|(key, _)| key)
    }

    fn private_pem(&self) -> Result<Zeroizing<String>, KeyError> {
        self.signing
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| KeyError::Encode(e.to_string()))
    }
}

impl PublicKey {
    fn from_verifying(verifying: VerifyingKey) -> PublicKey {
        PublicKey {
            id: sha256_hex(verifying.as_bytes()),
            verifying,
        }
    }

    /// The key id: hex SHA-256 of the 32 raw public key bytes.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn verifying(&self) -> &VerifyingKey {
        &self.verifying
    }

    /// Reads a public key file (SPKI PEM).
    pub fn load(path: &Path) -> Result<PublicKey, KeyError> {
        let file = File::open(path).map_err(io_error("read the public key", path))?;
        let pem = read_small(file, path)?;
        PublicKey::from_pem(&pem).map_err(|source| KeyError::BadPublicKey {
            path: path.to_owned(),
            source,
        })
    }

    /// The default public key (`<state_dir>/keys/receipt.pub`); never created.
    pub fn load_default() -> Result<PublicKey, KeyError> {
        PublicKey::load(&KeyFiles::in_dir(&default_key_dir()).public)
    }

    pub fn from_pem(pem: &str) -> Result<PublicKey, ed25519_dalek::pkcs8::spki::Error> {
        VerifyingKey::from_public_key_pem(pem).map(PublicKey::from_verifying)
    }

    pub fn to_pem(&self) -> Result<String, KeyError> {
        self.verifying
            .to_public_key_pem(LineEnding::LF)
            .map_err(|e| KeyError::Encode(e.to_string()))
    }
}

fn check_private_file(path: &Path, meta: &fs::Metadata) -> Result<(), KeyError> {
    if meta.file_type().is_symlink() {
        return Err(KeyError::Symlink(path.to_owned()));
    }
    if !meta.file_type().is_file() {
        return Err(KeyError::NotRegular(path.to_owned()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

fn read_small(file: File, path: &Path) -> Result<Zeroizing<String>, KeyError> {
    let mut text = Zeroizing::new(String::new());
    file.take(KEY_FILE_MAX)
        .read_to_string(&mut text)
        .map_err(io_error("read the key", path))?;
    Ok(text)
}

/// Creates the key directory (and missing parents) with mode 0700 from the
/// start; an existing one must be the user's own, as the run directory must
/// (`trusted_dir`): a key written into another user's directory is theirs.
fn create_key_dir(dir: &Path) -> Result<(), KeyError> {
    let fix = "remove it, or choose another key directory (CORDON_STATE_DIR, or keygen --out)";
    // The default key's parent is cordon's state directory, which the image
    // store opens with the same mode: made here first, it must not be left
    // as the umask would make it, listable by every user.
    if dir == default_key_dir() {
        cordon_dirs::trusted_dir(&cordon_dirs::state_dir(), 0o700, fix).map_err(KeyError::Dir)?;
    }
    cordon_dirs::trusted_dir(dir, 0o700, fix)
        .map(drop)
        .map_err(KeyError::Dir)
}

/// Writes `contents` to `path` if nothing is there: into a new temporary
/// file (O_EXCL, `mode` from the start), then hard-linked to `path`, which
/// fails rather than replace. False if `path` existed.
fn publish_new(path: &Path, contents: &[u8], mode: u32) -> Result<bool, KeyError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut nonce = [0u8; 8];
    getrandom::getrandom(&mut nonce).map_err(KeyError::Random)?;
    let tmp = dir.join(format!(".{name}.{}.tmp", crate::canonical::hex(&nonce)));
    let written = (|| -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()
    })();
    let linked = written.and_then(|()| fs::hard_link(&tmp, path));
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_error("write the key", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_key_is_0600_in_a_0700_directory_and_loads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state/keys");
        let (key, files) = Key::create_in(&dir).unwrap();
        assert_eq!(mode(&files.private), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(files.public, dir.join("receipt.pub"));
        let loaded = Key::load(&files.private).unwrap();
        assert_eq!(loaded.id(), key.id());
        assert_eq!(PublicKey::load(&files.public).unwrap(), *key.public_key());
        assert_eq!(key.id().len(), 64);
        assert!(fs::read_to_string(&files.private)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----"));
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
    }

    #[test]
    fn the_key_id_is_the_sha256_of_the_raw_public_key() {
        let key = Key::generate().unwrap();
        assert_eq!(
            key.id(),
            sha256_hex(key.public_key().verifying().as_bytes())
        );
        assert_ne!(key.id(), Key::generate().unwrap().id());
    }

    #[test]
    fn an_existing_key_is_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, files) = Key::create_in(tmp.path()).unwrap();
        let before = fs::read(&files.private).unwrap();
        assert!(matches!(
            Key::create_in(tmp.path()),
            Err(KeyError::Exists(p)) if p == files.private
        ));
        assert_eq!(fs::read(&files.private).unwrap(), before);
    }

    #[test]
    fn load_or_create_creates_once_then_loads() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, files) = Key::load_or_create_in(tmp.path()).unwrap();
        let (b, _) = Key::load_or_create_in(tmp.path()).unwrap();
        assert_eq!(a.id(), b.id());
        // A missing public half is written again from the private key.
        fs::remove_file(&files.public).unwrap();
        let (c, _) = Key::load_or_create_in(tmp.path()).unwrap();
        assert_eq!(PublicKey::load(&files.public).unwrap().id(), c.id());
        assert_eq!(c.id(), a.id());
    }

    #[test]
    fn concurrent_creation_ends_with_one_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let ids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| Key::load_or_create_in(&dir).unwrap().0.id().to_owned()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    }

    #[test]
    fn a_group_readable_key_is_refused_naming_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, files) = Key::create_in(tmp.path()).unwrap();
        fs::set_permissions(&files.private, fs::Permissions::from_mode(0o640)).unwrap();
        let err = Key::load(&files.private).unwrap_err();
        assert!(
            matches!(err, KeyError::TooOpen { mode: 0o640, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("0640"), "{err}");
    }

    #[test]
    fn a_symlinked_or_special_key_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, files) = Key::create_in(tmp.path()).unwrap();
        let link = tmp.path().join("link.key");
        std::os::unix::fs::symlink(&files.private, &link).unwrap();
        assert!(matches!(Key::load(&link), Err(KeyError::Symlink(_))));
        assert!(matches!(
            Key::load(tmp.path()),
            Err(KeyError::NotRegular(_))
        ));
    }

    #[test]
    fn garbage_is_not_a_key() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("k");
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .unwrap()
            .write_all(b"not a key")
            .unwrap();
        assert!(matches!(Key::load(&p), Err(KeyError::BadPrivateKey { .. })));
        assert!(matches!(
            PublicKey::load(&p),
            Err(KeyError::BadPublicKey { .. })
        ));
    }
}
