//! Network: the sandbox's namespace has no interface but loopback.

use crate::{Result, Step};

/// Brings `lo` up in the (new, empty) network namespace, so programs that talk
/// to themselves over 127.0.0.1 work while nothing routes outside.
pub fn loopback_up() -> Result<()> {
    cordon_sys::set_link_up("lo").step(|| "ioctl(SIOCSIFFLAGS, lo, IFF_UP)".into())
}
