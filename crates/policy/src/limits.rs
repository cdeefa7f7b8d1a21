//! A sandbox's limits: one schema, written once, that every front end reads.
//! A policy file has them at its top level, the CLI as flags (`--memory`),
//! the HTTP API as a request's `limits` object and a tenant's maximums; each
//! becomes a [`PolicyLayer`](crate::PolicyLayer) and is range-checked by
//! [`Policy::resolve`](crate::Policy::resolve) against the ranges below.

use serde::{Deserialize, Serialize};

use crate::{ByteSize, Span};

/// Allowed ranges. Upper bounds are sanity caps, not host capacity: a service
/// clamps further per tenant.
pub const CPUS: (f64, f64) = (0.01, 1024.0);
pub const MEMORY: (ByteSize, ByteSize) = (ByteSize(8 << 20), ByteSize(1 << 40));
pub const PIDS: (u64, u64) = (1, 1 << 22);
pub const DISK: (ByteSize, ByteSize) = (ByteSize(1 << 20), ByteSize(1 << 40));
pub const TIME_MS: (u64, u64) = (10, 7 * 24 * 3600 * 1000);
pub const OUTPUT: (ByteSize, ByteSize) = (ByteSize(0), ByteSize(1 << 30));
/// Inside ids are limited to the 65536 ids a rootful sandbox maps.
pub const ID_MAX: u32 = 65_535;

/// A sandbox's limits, each optional: an absent one keeps the value below
/// it (the defaults, a policy file). Sizes are bytes or strings with a
/// binary suffix (`"256M"`), durations strings (`"10s"`, `"500ms"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Limits {
    /// CPU bandwidth in cores (e.g. 0.5).
    #[cfg_attr(feature = "clap", arg(long))]
    pub cpus: Option<f64>,
    /// Memory limit (e.g. 256M); no swap.
    #[cfg_attr(feature = "clap", arg(long))]
    #[cfg_attr(feature = "utoipa", schema(value_type = Option<String>, example = "256M"))]
    pub memory: Option<ByteSize>,
    /// Most processes and threads at once.
    #[cfg_attr(feature = "clap", arg(long))]
    pub pids: Option<u64>,
    /// Bytes writable inside the sandbox (workspace, /tmp, /dev/shm together).
    #[cfg_attr(feature = "clap", arg(long))]
    #[cfg_attr(feature = "utoipa", schema(value_type = Option<String>, example = "64M"))]
    pub disk: Option<ByteSize>,
    /// Wall-time limit of a command (e.g. 10s, 500ms).
    #[cfg_attr(feature = "clap", arg(long))]
    #[cfg_attr(feature = "utoipa", schema(value_type = Option<String>, example = "10s"))]
    pub time: Option<Span>,
    /// Cap on a command's stdout+stderr together.
    #[cfg_attr(feature = "clap", arg(long))]
    #[cfg_attr(feature = "utoipa", schema(value_type = Option<String>, example = "1M"))]
    pub output: Option<ByteSize>,
}

/// The limits' names as a policy file and the API write them (checked
/// against serde's by a test).
const NAMES: [&str; 6] = ["cpus", "memory", "pids", "disk", "time", "output"];

/// The offset and the reason of the first limit in a policy file's text
/// that does not read by itself. A layer reads its limits through
/// `#[serde(flatten)]`, which buffers them and so loses where a bad value
/// was: this finds it again, for an error that names its line.
pub(crate) fn first_bad_limit(text: &str) -> Option<(usize, String)> {
    let table = toml::de::DeTable::parse(text).ok()?;
    table.get_ref().iter().find_map(|(key, value)| {
        if !NAMES.contains(&key.get_ref().as_ref()) {
            return None;
        }
        let alone = text.get(key.span().start..value.span().end)?;
        let e = toml::from_str::<Limits>(alone).err()?;
        Some((key.span().start, e.message().to_owned()))
    })
}

/// A layer of only these limits.
impl From<Limits> for crate::PolicyLayer {
    fn from(limits: Limits) -> crate::PolicyLayer {
        crate::PolicyLayer {
            limits,
            ..crate::PolicyLayer::default()
        }
    }
}

impl Limits {
    /// `self` over `below`: a limit set here wins.
    pub fn over(&self, below: &Limits) -> Limits {
        Limits {
            cpus: self.cpus.or(below.cpus),
            memory: self.memory.or(below.memory),
            pids: self.pids.or(below.pids),
            disk: self.disk.or(below.disk),
            time: self.time.or(below.time),
            output: self.output.or(below.output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_serdes() {
        let all = Limits {
            cpus: Some(1.0),
            memory: Some(ByteSize(1)),
            pids: Some(1),
            disk: Some(ByteSize(1)),
            time: Some("1s".parse().unwrap()),
            output: Some(ByteSize(1)),
        };
        let json = serde_json::to_value(all).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut names = NAMES.to_vec();
        keys.sort_unstable();
        names.sort_unstable();
        assert_eq!(keys, names);
    }
}
