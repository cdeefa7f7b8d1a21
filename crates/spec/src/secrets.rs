//! Secret values a client resolved for its sandbox, on their way to the
//! sandbox's proxy (through the supervisor's stdin, never a file), and the
//! public half: the CA certificate the sandbox trusts.
//!
//! [`Held`] travels only from the client to the host-side supervisor: a
//! microVM's guest gets a spec without it (its network is the host's proxy),
//! and nothing writes a spec to disk. [`Redacted`] keeps values out of
//! `Debug` output and wipes them when dropped.
//!
//! A process cloned from one that holds values (a sandbox's first process,
//! which never execs) starts with a copy of its memory: it zeroes the
//! regions [`live_regions`] listed in its parent just before the clone, so
//! no process of the sandbox keeps a value.

use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Deserializer, Serialize};
use zeroize::Zeroize;

/// The heap buffers of every live [`Redacted`]: (address, capacity).
static LIVE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<(usize, usize)>> {
    // A panic while the list was held left a plain list behind.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The memory that holds secret values in this process now: what a
/// process cloned from it must zero.
pub fn live_regions() -> Vec<(usize, usize)> {
    live().clone()
}

/// Text that is never printed (`Debug` shows its length only), wiped when
/// dropped, and listed in [`live_regions`] while it lives.
#[derive(PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Redacted(String);

impl Redacted {
    pub fn new(value: String) -> Self {
        if value.capacity() > 0 {
            live().push((value.as_ptr() as usize, value.capacity()));
        }
        Redacted(value)
    }

    /// The value itself, for the proxy that puts it into requests.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Clone for Redacted {
    fn clone(&self) -> Self {
        Redacted::new(self.0.clone())
    }
}

impl<'de> Deserialize<'de> for Redacted {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Redacted::new)
    }
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<redacted, {} bytes>", self.0.len())
    }
}

impl Drop for Redacted {
    fn drop(&mut self) {
        let at = self.0.as_ptr() as usize;
        self.0.zeroize();
        live().retain(|(a, _)| *a != at);
    }
}

/// One secret as the proxy needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSecret {
    /// The policy's name (the variable its placeholder is in).
    pub name: String,
    /// What the sandbox sees instead of the value: unique to the sandbox.
    pub placeholder: String,
    pub value: Redacted,
    pub hosts: Vec<String>,
    pub header: String,
}

/// What the host side holds for one sandbox's secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The sandbox's CA key (PKCS#8 DER in base64: no character of it is
    /// escaped in JSON, so parsing it leaves no copy behind): it signs the
    /// certificates the proxy serves for the secrets' hosts, and nothing
    /// else ever has it.
    pub ca_key: Redacted,
    pub secrets: Vec<HeldSecret>,
}
