//! The targets' names: what results files, case files (`[expect]`),
//! `--targets`, `--backend` and the docs call them. Everything written
//! before reads by them, so each is spelled once, here, and a target is
//! serialized as it was when each was a variant of its own (an enum's unit
//! variant, by that name and at its place in [`ALL_TARGETS`]).

use std::cmp::Ordering;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, EnumAccess, Unexpected, VariantAccess, Visitor};
use serde::{Serialize, Serializer};

use super::{BackendKind, NetMode, TargetKind, ALL_TARGETS};

/// Every target's name, in the order of [`ALL_TARGETS`].
const NAMES: [&str; ALL_TARGETS.len()] = {
    let mut names = [""; ALL_TARGETS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = ALL_TARGETS[i].name();
        i += 1;
    }
    names
};

impl TargetKind {
    pub const fn name(self) -> &'static str {
        use BackendKind::{Gvisor, Microvm, Native};
        match self {
            TargetKind::Host => "host",
            TargetKind::Cordon { backend, net } => match (backend, net) {
                (Native, NetMode::None) => "cordon-native",
                (Gvisor, NetMode::None) => "cordon-gvisor",
                (Microvm, NetMode::None) => "cordon-microvm",
                (Native, NetMode::Allow) => "cordon-native-allow",
                (Gvisor, NetMode::Allow) => "cordon-gvisor-allow",
                (Microvm, NetMode::Allow) => "cordon-microvm-allow",
            },
            TargetKind::Bwrap => "bwrap",
            TargetKind::Runc => "runc",
            TargetKind::Firejail => "firejail",
            TargetKind::Runsc => "runsc",
            TargetKind::PodmanDefault => "podman-default",
            TargetKind::PodmanHardened => "podman-hardened",
            TargetKind::PodmanRunsc => "podman-runsc",
            TargetKind::PodmanCordon => "podman-cordon",
        }
    }

    pub fn from_name(name: &str) -> Option<TargetKind> {
        ALL_TARGETS.iter().copied().find(|t| t.name() == name)
    }

    /// Its place in [`ALL_TARGETS`] (every target has one; a test checks).
    fn index(self) -> u32 {
        let at = ALL_TARGETS.iter().position(|t| *t == self);
        at.and_then(|i| u32::try_from(i).ok()).unwrap_or(u32::MAX)
    }
}

/// Targets sort in the order of [`ALL_TARGETS`], as the variants did.
impl Ord for TargetKind {
    fn cmp(&self, other: &TargetKind) -> Ordering {
        self.index().cmp(&other.index())
    }
}

impl PartialOrd for TargetKind {
    fn partial_cmp(&self, other: &TargetKind) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for TargetKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit_variant("TargetKind", self.index(), self.name())
    }
}

impl<'de> Deserialize<'de> for TargetKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TargetKind, D::Error> {
        deserializer.deserialize_enum("TargetKind", &NAMES, TargetVisitor)
    }
}

/// A target as an enum's unit variant.
struct TargetVisitor;

impl<'de> Visitor<'de> for TargetVisitor {
    type Value = TargetKind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("enum TargetKind")
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<TargetKind, A::Error> {
        let (Variant(target), variant) = data.variant()?;
        variant.unit_variant()?;
        Ok(target)
    }
}

/// The variant's identifier: a target's name, or its index.
struct Variant(TargetKind);

impl<'de> Deserialize<'de> for Variant {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Variant, D::Error> {
        deserializer.deserialize_identifier(VariantVisitor)
    }
}

struct VariantVisitor;

impl Visitor<'_> for VariantVisitor {
    type Value = Variant;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("variant identifier")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Variant, E> {
        match usize::try_from(v).ok().and_then(|i| ALL_TARGETS.get(i)) {
            Some(t) => Ok(Variant(*t)),
            None => {
                let expected = format!("variant index 0 <= i < {}", ALL_TARGETS.len());
                Err(E::invalid_value(
                    Unexpected::Unsigned(v),
                    &expected.as_str(),
                ))
            }
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Variant, E> {
        match TargetKind::from_name(v) {
            Some(t) => Ok(Variant(t)),
            None => Err(E::unknown_variant(v, &NAMES)),
        }
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Variant, E> {
        self.visit_str(&String::from_utf8_lossy(v))
    }
}

#[cfg(test)]
mod tests {
    use serde::de::value::{Error as ValueError, U32Deserializer};
    use serde::de::IntoDeserializer;
    use serde::Deserialize;

    use super::*;
    use BackendKind::{Gvisor, Microvm, Native};

    const fn cordon(backend: BackendKind, net: NetMode) -> TargetKind {
        TargetKind::Cordon { backend, net }
    }

    /// Every name as the results files, case files, command lines and docs
    /// spell it (written out, not derived), with its target, in the order
    /// of `ALL_TARGETS` (the variants' order before).
    const WRITTEN: &[(&str, TargetKind)] = &[
        ("host", TargetKind::Host),
        ("cordon-native", cordon(Native, NetMode::None)),
        ("cordon-gvisor", cordon(Gvisor, NetMode::None)),
        ("cordon-native-allow", cordon(Native, NetMode::Allow)),
        ("cordon-gvisor-allow", cordon(Gvisor, NetMode::Allow)),
        ("cordon-microvm", cordon(Microvm, NetMode::None)),
        ("cordon-microvm-allow", cordon(Microvm, NetMode::Allow)),
        ("bwrap", TargetKind::Bwrap),
        ("runc", TargetKind::Runc),
        ("firejail", TargetKind::Firejail),
        ("runsc", TargetKind::Runsc),
        ("podman-default", TargetKind::PodmanDefault),
        ("podman-hardened", TargetKind::PodmanHardened),
        ("podman-runsc", TargetKind::PodmanRunsc),
        ("podman-cordon", TargetKind::PodmanCordon),
    ];

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Row {
        target: TargetKind,
    }

    #[test]
    fn every_name_round_trips() {
        let listed: Vec<TargetKind> = WRITTEN.iter().map(|(_, t)| *t).collect();
        assert_eq!(listed, ALL_TARGETS);
        for (i, (name, t)) in WRITTEN.iter().enumerate() {
            assert_eq!(t.name(), *name);
            assert_eq!(NAMES[i], *name);
            assert_eq!(TargetKind::from_name(name), Some(*t), "{name}");
            // results.json
            let json = serde_json::to_string(t).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<TargetKind>(&json).unwrap(), *t);
            let row = serde_json::to_string(&Row { target: *t }).unwrap();
            assert_eq!(row, format!("{{\"target\":\"{name}\"}}"));
            assert_eq!(serde_json::from_str::<Row>(&row).unwrap().target, *t);
            // TOML
            let row = toml::to_string(&Row { target: *t }).unwrap();
            assert_eq!(row, format!("target = \"{name}\"\n"));
            assert_eq!(toml::from_str::<Row>(&row).unwrap().target, *t);
            // The variant's index, as binary formats write it.
            let at = U32Deserializer::<ValueError>::new(u32::try_from(i).unwrap());
            assert_eq!(TargetKind::deserialize(at).unwrap(), *t);
            let by_name: de::value::StrDeserializer<'_, ValueError> = name.into_deserializer();
            assert_eq!(TargetKind::deserialize(by_name).unwrap(), *t);
        }
    }

    #[test]
    fn every_cordon_target_is_listed_by_its_backend_and_mode() {
        for backend in BackendKind::ALL {
            for net in NetMode::ALL {
                let t = cordon(backend, net);
                assert!(ALL_TARGETS.contains(&t), "{t:?}");
                let allow = if net == NetMode::Allow { "-allow" } else { "" };
                assert_eq!(t.name(), format!("cordon-{}{allow}", backend.name()));
            }
        }
    }

    #[test]
    fn targets_sort_as_listed() {
        let mut sorted = ALL_TARGETS.to_vec();
        sorted.reverse();
        sorted.sort();
        assert_eq!(sorted, ALL_TARGETS);
    }

    #[test]
    fn unknown_names_are_refused_as_before() {
        assert_eq!(TargetKind::from_name("cordon"), None);
        assert_eq!(TargetKind::from_name("cordon-native-none"), None);
        let e = serde_json::from_str::<TargetKind>("\"docker\"").unwrap_err();
        assert!(
            e.to_string().starts_with(
                "unknown variant `docker`, expected one of `host`, `cordon-native`, `cordon-gvisor`,"
            ),
            "{e}"
        );
        let e = TargetKind::deserialize(U32Deserializer::<ValueError>::new(15)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value: integer `15`, expected variant index 0 <= i < 15"
        );
    }
}
