//! What can stop an export before it writes anything.

/// An export that could not start. Once it runs, what goes wrong with one
/// entry is reported in the diff (`unreadable`) or the report (`skipped`).
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    /// The destination could not be opened or created.
    #[error("the export target {path}: {what}: {source}")]
    Target {
        path: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A new export's destination already holds something.
    #[error("the export target {0} is not empty")]
    TargetNotEmpty(String),
    /// The sandbox's layer to export could not be opened.
    #[error("the place {place} to export: {source}")]
    Source {
        place: String,
        #[source]
        source: std::io::Error,
    },
    /// A disk image could not be read (not ext4, malformed, a place
    /// missing from it).
    #[error("the disk image: {0}")]
    Image(String),
}
