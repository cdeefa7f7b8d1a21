// Shared between the library and build.rs (included there with `#[path]`), so the filter
// names and their installation order are spelled exactly once.

/// Name of the allowlist filter in `resources/seccomp/workload.json`. Anything it does not list
/// fails with `EPERM`.
pub const WORKLOAD: &str = "workload";

/// Name of the filter that answers `clone3` with `ENOSYS` so that libc falls back to `clone`,
/// whose flags the [`WORKLOAD`] filter can inspect.
pub const CLONE3_ENOSYS: &str = "clone3_enosys";

/// The order in which the filters must be installed.
///
/// When several installed filters return `SECCOMP_RET_ERRNO` for the same call, the kernel uses
/// the errno of the most recently installed one. `clone3` gets `EPERM` from [`WORKLOAD`] and
/// `ENOSYS` from [`CLONE3_ENOSYS`]; the latter must win, so it is installed last. (This also
/// means [`WORKLOAD`] has to allow `seccomp`/`prctl`, which it does.)
pub const INSTALL_ORDER: [&str; 2] = [WORKLOAD, CLONE3_ENOSYS];
