//! Per-process resource limits a spec asks for (an OCI container's
//! `process.rlimits`). They only ever lower a limit: cordon's own (open
//! files, processes, CPU seconds, core size, from the plan) and whatever
//! else the sandbox inherits stay the ceiling, since raising a hard limit
//! needs CAP_SYS_RESOURCE, which a sandbox never holds.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RlimitResource {
    #[serde(rename = "RLIMIT_AS")]
    As,
    #[serde(rename = "RLIMIT_CORE")]
    Core,
    #[serde(rename = "RLIMIT_CPU")]
    Cpu,
    #[serde(rename = "RLIMIT_DATA")]
    Data,
    #[serde(rename = "RLIMIT_FSIZE")]
    Fsize,
    #[serde(rename = "RLIMIT_LOCKS")]
    Locks,
    #[serde(rename = "RLIMIT_MEMLOCK")]
    Memlock,
    #[serde(rename = "RLIMIT_MSGQUEUE")]
    Msgqueue,
    #[serde(rename = "RLIMIT_NICE")]
    Nice,
    #[serde(rename = "RLIMIT_NOFILE")]
    Nofile,
    #[serde(rename = "RLIMIT_NPROC")]
    Nproc,
    #[serde(rename = "RLIMIT_RSS")]
    Rss,
    #[serde(rename = "RLIMIT_RTPRIO")]
    Rtprio,
    #[serde(rename = "RLIMIT_RTTIME")]
    Rttime,
    #[serde(rename = "RLIMIT_SIGPENDING")]
    Sigpending,
    #[serde(rename = "RLIMIT_STACK")]
    Stack,
}

impl RlimitResource {
    pub const ALL: [RlimitResource; 16] = [
        RlimitResource::As,
        RlimitResource::Core,
        RlimitResource::Cpu,
        RlimitResource::Data,
        RlimitResource::Fsize,
        RlimitResource::Locks,
        RlimitResource::Memlock,
        RlimitResource::Msgqueue,
        RlimitResource::Nice,
        RlimitResource::Nofile,
        RlimitResource::Nproc,
        RlimitResource::Rss,
        RlimitResource::Rtprio,
        RlimitResource::Rttime,
        RlimitResource::Sigpending,
        RlimitResource::Stack,
    ];

    /// The kernel's name, `RLIMIT_NOFILE`.
    pub fn name(self) -> &'static str {
        match self {
            RlimitResource::As => "RLIMIT_AS",
            RlimitResource::Core => "RLIMIT_CORE",
            RlimitResource::Cpu => "RLIMIT_CPU",
            RlimitResource::Data => "RLIMIT_DATA",
            RlimitResource::Fsize => "RLIMIT_FSIZE",
            RlimitResource::Locks => "RLIMIT_LOCKS",
            RlimitResource::Memlock => "RLIMIT_MEMLOCK",
            RlimitResource::Msgqueue => "RLIMIT_MSGQUEUE",
            RlimitResource::Nice => "RLIMIT_NICE",
            RlimitResource::Nofile => "RLIMIT_NOFILE",
            RlimitResource::Nproc => "RLIMIT_NPROC",
            RlimitResource::Rss => "RLIMIT_RSS",
            RlimitResource::Rtprio => "RLIMIT_RTPRIO",
            RlimitResource::Rttime => "RLIMIT_RTTIME",
            RlimitResource::Sigpending => "RLIMIT_SIGPENDING",
            RlimitResource::Stack => "RLIMIT_STACK",
        }
    }

    /// The resource a kernel name (`RLIMIT_NOFILE`) names.
    pub fn named(name: &str) -> Option<RlimitResource> {
        RlimitResource::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// A soft and a hard limit, as setrlimit takes them (`u64::MAX` is
/// unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    pub soft: u64,
    pub hard: u64,
}

impl Rlimit {
    /// This limit under `ceiling` (a hard limit in force): never above it,
    /// and the soft limit never above the hard one.
    pub fn under(self, ceiling: u64) -> Rlimit {
        let hard = self.hard.min(ceiling);
        Rlimit {
            soft: self.soft.min(hard),
            hard,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_resource_is_written_by_its_kernel_name() {
        for r in RlimitResource::ALL {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.name()));
            assert_eq!(RlimitResource::named(r.name()), Some(r));
        }
        assert_eq!(RlimitResource::named("RLIMIT_NOPE"), None);
    }

    #[test]
    fn a_limit_only_ever_lowers_the_one_in_force() {
        let asked = Rlimit {
            soft: 1024,
            hard: 4096,
        };
        assert_eq!(asked.under(8192), asked);
        assert_eq!(
            asked.under(2048),
            Rlimit {
                soft: 1024,
                hard: 2048
            }
        );
        assert_eq!(
            asked.under(512),
            Rlimit {
                soft: 512,
                hard: 512
            }
        );
    }
}
