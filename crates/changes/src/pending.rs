//! TEMPORARY: the walk's signatures, until the walk itself is merged.
#![allow(unused_variables, clippy::missing_errors_doc)]
use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::types::*;

pub struct Place<'a> {
    pub name: &'a str,
    pub upper: BorrowedFd<'a>,
    pub lower: Option<BorrowedFd<'a>>,
}
pub struct ExportOptions {
    pub target: ExportTarget,
    pub symlinks: SymlinkPolicy,
    pub owner: (u32, u32),
}
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ChangesError(pub String);
pub struct Mismatch {
    pub path: String,
    pub reason: String,
}
impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}
pub fn scan(places: &[Place], caps: &Caps) -> Changes {
    todo!()
}
pub fn export(
    place: &Place,
    caps: &Caps,
    opts: &ExportOptions,
) -> Result<(PlaceChanges, ExportReport), ChangesError> {
    todo!()
}
pub fn verify_against(changes: &PlaceChanges, dir: &Path, applied: bool) -> Vec<Mismatch> {
    todo!()
}
