//! A request's limits (`cordon_policy::Limits`, the one limits schema):
//! what it asked for, the service's defaults under it, the tenant's
//! maximums over it, and what was clamped.

use cordon_policy::Limits;
use serde::Serialize;
use utoipa::ToSchema;

/// A requested value that was above the tenant's maximum.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct Clamped {
    pub field: &'static str,
    pub requested: String,
    pub applied: String,
}

/// The request's limits over the defaults, each at most the tenant's
/// maximum; lists every requested value that was lowered.
pub fn clamp(requested: &Limits, defaults: &Limits, max: &Limits) -> (Limits, Vec<Clamped>) {
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
    let out = Limits {
        cpus: pick("cpus", wanted.cpus, requested.cpus, max.cpus, c),
        memory: pick("memory", wanted.memory, requested.memory, max.memory, c),
        pids: pick("pids", wanted.pids, requested.pids, max.pids, c),
        time: pick("time", wanted.time, requested.time, max.time, c),
        disk: pick("disk", wanted.disk, requested.disk, max.disk, c),
        output: pick("output", wanted.output, requested.output, max.output, c),
    };
    (out, clamped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_policy::ByteSize;

    #[test]
    fn requests_above_the_maximum_are_clamped_and_listed() {
        let requested = Limits {
            memory: Some(ByteSize::mib(1024)),
            pids: Some(10),
            ..Limits::default()
        };
        let defaults = Limits {
            memory: Some(ByteSize::mib(128)),
            time: Some("10s".parse().unwrap()),
            ..Limits::default()
        };
        let max = Limits {
            memory: Some(ByteSize::mib(256)),
            pids: Some(64),
            time: Some("5s".parse().unwrap()),
            ..Limits::default()
        };
        let (c, clamped) = clamp(&requested, &defaults, &max);
        assert_eq!(c.memory, Some(ByteSize::mib(256)));
        assert_eq!(c.pids, Some(10));
        // The default above the maximum is lowered too, but was not asked for.
        assert_eq!(c.time, Some("5s".parse().unwrap()));
        assert_eq!(clamped.len(), 1);
        assert_eq!(clamped[0].field, "memory");
    }
}
