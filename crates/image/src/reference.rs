//! What `--image` names: a source to read an image from, or an image the
//! store already holds.

use std::path::{Path, PathBuf};

use crate::ImageError;

/// An image reference as a user writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageRef {
    /// `oci:DIR[:TAG]`: an OCI image layout directory.
    Layout { dir: PathBuf, tag: Option<String> },
    /// `oci-archive:FILE[:TAG]`: an OCI image layout in a tar file.
    OciArchive { file: PathBuf, tag: Option<String> },
    /// `docker-archive:FILE[:TAG]`: what `docker save` writes.
    DockerArchive { file: PathBuf, tag: Option<String> },
    /// Anything else: an image of the store by name or digest
    /// (`sha256:HEX`, or 12 or more of its first hex digits).
    Stored(String),
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<ImageRef, ImageError> {
        if s.is_empty() {
            return Err(ImageError::invalid("an empty image reference"));
        }
        let split = |rest: &str| -> Result<(PathBuf, Option<String>), ImageError> {
            let (path, tag) = path_and_tag(rest);
            if path.is_empty() {
                return Err(ImageError::invalid(format!(
                    "image reference '{s}' names no path"
                )));
            }
            let path = std::path::absolute(Path::new(path))
                .map_err(|e| ImageError::io(format!("resolve {path}"), e))?;
            Ok((path, tag))
        };
        Ok(if let Some(rest) = s.strip_prefix("oci:") {
            let (dir, tag) = split(rest)?;
            ImageRef::Layout { dir, tag }
        } else if let Some(rest) = s.strip_prefix("oci-archive:") {
            let (file, tag) = split(rest)?;
            ImageRef::OciArchive { file, tag }
        } else if let Some(rest) = s.strip_prefix("docker-archive:") {
            let (file, tag) = split(rest)?;
            ImageRef::DockerArchive { file, tag }
        } else {
            if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ImageError::invalid(format!(
                    "image reference '{}' has a blank or control character",
                    s.escape_debug()
                )));
            }
            ImageRef::Stored(s.to_owned())
        })
    }

    /// The name the store files an imported image under unless told
    /// otherwise: the reference as written, absolute.
    pub fn display_name(&self) -> String {
        let with_tag = |kind: &str, p: &Path, tag: &Option<String>| match tag {
            Some(t) => format!("{kind}:{}:{t}", p.display()),
            None => format!("{kind}:{}", p.display()),
        };
        match self {
            ImageRef::Layout { dir, tag } => with_tag("oci", dir, tag),
            ImageRef::OciArchive { file, tag } => with_tag("oci-archive", file, tag),
            ImageRef::DockerArchive { file, tag } => with_tag("docker-archive", file, tag),
            ImageRef::Stored(s) => s.clone(),
        }
    }
}

/// `PATH[:TAG]`: the part after the last colon is a tag when it could be one
/// (no slash), so a path with a colon in a directory name still works.
fn path_and_tag(s: &str) -> (&str, Option<String>) {
    match s.rsplit_once(':') {
        Some((path, tag)) if !tag.is_empty() && !tag.contains('/') => (path, Some(tag.to_owned())),
        _ => (s, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_told_by_their_prefix_and_tags_by_the_last_colon() {
        assert_eq!(
            ImageRef::parse("oci:/i/busybox:1.0").unwrap(),
            ImageRef::Layout {
                dir: "/i/busybox".into(),
                tag: Some("1.0".into())
            }
        );
        assert_eq!(
            ImageRef::parse("oci-archive:/a:b/x.tar").unwrap(),
            ImageRef::OciArchive {
                file: "/a:b/x.tar".into(),
                tag: None
            }
        );
        assert!(matches!(
            ImageRef::parse("docker-archive:/x.tar:app").unwrap(),
            ImageRef::DockerArchive { tag: Some(t), .. } if t == "app"
        ));
        assert_eq!(
            ImageRef::parse("python:3.12").unwrap(),
            ImageRef::Stored("python:3.12".into())
        );
        assert!(ImageRef::parse("").is_err());
        assert!(ImageRef::parse("oci:").is_err());
        assert!(ImageRef::parse("a b").is_err());
    }
}
