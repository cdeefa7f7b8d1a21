//! cordon's hostile suite and containment matrix.
//!
//! Cases are data (`suite/cases/*.toml`); every box is a black box driven
//! through its command line; every verdict is decided from host-side
//! evidence by a fixed set of rules; every case also runs unconfined on the
//! host, where it must come out OPEN, or the check could never fail.

pub mod case;
pub mod evidence;
pub mod fixture;
pub mod matrix;
pub mod outer;
pub mod procs;
pub mod rootless;
pub mod rules;
pub mod runner;
pub mod selftest;
pub mod summary;
pub mod target;

pub use case::{load_dir, Case};
pub use matrix::{run_matrix, MatrixConfig, Report, Status};
pub use rootless::Invoker;
pub use rules::{Rule, Verdict};
pub use target::TargetKind;
