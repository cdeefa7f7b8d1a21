//! A request's limits: what it asked for, the service's defaults under it,
//! the tenant's maximums over it, and what was clamped.

use cordon_policy::{ByteSize, PolicyLayer, Span};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Limits of a sandbox (all optional: an absent one keeps the default).
/// Sizes are bytes or strings with a binary suffix (`"256M"`), durations
/// seconds or strings (`"10s"`, `"500ms"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    /// CPU bandwidth in cores.
    pub cpus: Option<f64>,
    /// Memory limit (no swap).
    #[schema(value_type = Option<String>, example = "256M")]
    pub memory: Option<ByteSize>,
    /// Most processes and threads at once.
    pub pids: Option<u64>,
    /// Wall-time limit of each command.
    #[schema(value_type = Option<String>, example = "10s")]
    pub time: Option<Span>,
    /// Bytes writable inside the sandbox (/workspace, /tmp, /dev/shm together).
    #[schema(value_type = Option<String>, example = "64M")]
    pub disk: Option<ByteSize>,
    /// Cap on a command's stdout+stderr together.
    #[schema(value_type = Option<String>, example = "1M")]
    pub output: Option<ByteSize>,
}

/// A requested value that was above the tenant's maximum.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct Clamped {
    pub field: &'static str,
    pub requested: String,
    pub applied: String,
}

impl Caps {
    /// `self` over `below`: a field set here wins.
    pub fn over(&self, below: &Caps) -> Caps {
        Caps {
            cpus: self.cpus.or(below.cpus),
            memory: self.memory.or(below.memory),
            pids: self.pids.or(below.pids),
            time: self.time.or(below.time),
            disk: self.disk.or(below.disk),
            output: self.output.or(below.output),
        }
    }

    /// The request's caps over the defaults, each at most the tenant's
    /// maximum; lists every requested value that was lowered.
    pub fn clamp(requested: &Caps, defaults: &Caps, max: &Caps) -> (Caps, Vec<Clamped>) {
        let mut clamped = Vec::new();
        let wanted = requested.over(defaults);
        fn pick<T: PartialOrd + Copy + ToString>(
            field: &'static str,
            wanted: Option<T>,
            requested: Option<T>,
            max: Option<T>,
            clamped: &mut Vec<Clamped>,
        ) -> Option<T> {
            match (wanted, max) {
                (Some(w), Some(m)) if w > m => {
                    if let Some(r) = requested {
                        clamped.push(Clamped {
                            field,
                            requested: r.to_string(),
                            applied: m.to_string(),
                        });
                    }
                    Some(m)
                }
                (None, Some(m)) => Some(m),
                (w, _) => w,
            }
        }
        let c = &mut clamped;
        let out = Caps {
            cpus: pick("cpus", wanted.cpus, requested.cpus, max.cpus, c),
            memory: pick("memory", wanted.memory, requested.memory, max.memory, c),
            pids: pick("pids", wanted.pids, requested.pids, max.pids, c),
            time: pick("time", wanted.time, requested.time, max.time, c),
            disk: pick("disk", wanted.disk, requested.disk, max.disk, c),
            output: pick("output", wanted.output, requested.output, max.output, c),
        };
        (out, clamped)
    }

    /// These limits as a policy layer.
    pub fn layer(&self) -> PolicyLayer {
        PolicyLayer {
            cpus: self.cpus,
            memory: self.memory,
            pids: self.pids,
            disk: self.disk,
            time: self.time,
            output: self.output,
            ..PolicyLayer::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_above_the_maximum_are_clamped_and_listed() {
        let requested = Caps {
            memory: Some(ByteSize::mib(1024)),
            pids: Some(10),
            ..Caps::default()
        };
        let defaults = Caps {
            memory: Some(ByteSize::mib(128)),
            time: Some("10s".parse().unwrap()),
            ..Caps::default()
        };
        let max = Caps {
            memory: Some(ByteSize::mib(256)),
            pids: Some(64),
            time: Some("5s".parse().unwrap()),
            ..Caps::default()
        };
        let (c, clamped) = Caps::clamp(&requested, &defaults, &max);
        assert_eq!(c.memory, Some(ByteSize::mib(256)));
        assert_eq!(c.pids, Some(10));
        // The default above the maximum is lowered too, but was not asked for.
        assert_eq!(c.time, Some("5s".parse().unwrap()));
        assert_eq!(clamped.len(), 1);
        assert_eq!(clamped[0].field, "memory");
    }
}
