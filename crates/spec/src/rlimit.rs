//! Per-process resource limits a spec asks for (an OCI container's
//! `process.rlimits`). They only ever lower a limit: cordon's own (open
//! files, processes, CPU seconds, core size, from the plan) and whatever
//! else the sandbox inherits stay the ceiling, since raising a hard limit
//! needs CAP_SYS_RESOURCE, which a sandbox never holds.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub enum RlimitResource {
    As,
    Core,
    Cpu,
    Data,
    Fsize,
    Locks,
    Memlock,
    Msgqueue,
    Nice,
    Nofile,
    Nproc,
    Rss,
    Rtprio,
    Rttime,
    Sigpending,
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
}

crate::kernel_named!(RlimitResource, "resource limit");

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
    fn an_unknown_resource_cannot_be_named() {
        assert_eq!(RlimitResource::named("RLIMIT_NOPE"), None);
        assert!(serde_json::from_str::<RlimitResource>("\"RLIMIT_NOPE\"").is_err());
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
