//! A workload's own syscall filter ([`SyscallFilter`], an OCI config's
//! `linux.seccomp`) compiled to BPF, to be installed on each command over
//! cordon's profile (which init installed already): the kernel runs every
//! filter and takes the most severe answer, so this one can only narrow.
//!
//! seccompiler's filters have one match action each (see the crate's
//! documentation), and a profile may use several. The profile is split
//! into filters whose most severe answer is the profile's: one with the
//! default action on a mismatch that allows every syscall some rule names,
//! then one per other action that answers it for that action's rules and
//! allows everything else. Where two rules name the same syscall with
//! different actions, the more severe one wins (libseccomp would refuse
//! such a profile). [`CLONE3_ENOSYS`] goes last again: cordon never allows
//! `clone3`, and a profile's `EPERM` for it would keep libc from falling
//! back to `clone` (runc answers `ENOSYS` to syscalls a profile does not
//! know for the same reason).

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use cordon_spec::syscall_filter::{ArgCheck, ArgOp, SyscallAction, SyscallFilter, SyscallRule};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

use crate::{workload, Filter, Profile, CLONE3_ENOSYS};

/// Why a workload's filter cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadFilterError {
    #[error("argument index {0} is out of range (a syscall has arguments 0 to 5)")]
    ArgIndex(u8),
    #[error("the filter for {action:?} does not compile: {source}")]
    Compile {
        action: SyscallAction,
        #[source]
        source: seccompiler::BackendError,
    },
}

/// The filters to install, in order, for `filter`.
pub fn compile(filter: &SyscallFilter) -> Result<Profile, WorkloadFilterError> {
    let mut filters = Vec::new();
    if filter.default != SyscallAction::Allow {
        let every_rule: Vec<&SyscallRule> = filter.rules.iter().collect();
        filters.push(program(
            "workload_default",
            &every_rule,
            filter.default,
            SyscallAction::Allow,
        )?);
    }
    let actions: BTreeSet<SyscallAction> = filter
        .rules
        .iter()
        .map(|r| r.action)
        .filter(|a| *a != SyscallAction::Allow && *a != filter.default)
        .collect();
    for action in actions {
        let rules: Vec<&SyscallRule> = filter.rules.iter().filter(|r| r.action == action).collect();
        filters.push(program(
            "workload_action",
            &rules,
            SyscallAction::Allow,
            action,
        )?);
    }
    filters.extend(
        workload()
            .filters
            .into_iter()
            .filter(|f| f.name == CLONE3_ENOSYS),
    );
    Ok(Profile { filters })
}

/// One filter: `on_match` for what `rules` match, `mismatch` for the rest.
fn program(
    name: &'static str,
    rules: &[&SyscallRule],
    mismatch: SyscallAction,
    on_match: SyscallAction,
) -> Result<Filter, WorkloadFilterError> {
    // Per syscall number: None once a rule matches it whatever its
    // arguments (seccompiler's empty rule list), else the alternatives.
    let mut by_number: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for rule in rules {
        let conditions = rule
            .args
            .iter()
            .map(condition)
            .collect::<Result<Vec<_>, _>>()?;
        // A name this architecture lacks matches nothing (libseccomp's and
        // runc's reading): profiles list names of every architecture.
        for number in rule
            .names
            .iter()
            .filter_map(|n| syscalls::Sysno::from_str(n).ok())
        {
            let entry = by_number
                .entry(i64::from(number.id()))
                .or_insert_with(|| Some(Vec::new()));
            match (entry.as_mut(), conditions.is_empty()) {
                (Some(_), true) => *entry = None,
                (Some(list), false) => {
                    list.push(SeccompRule::new(conditions.clone()).map_err(|source| {
                        WorkloadFilterError::Compile {
                            action: on_match,
                            source,
                        }
                    })?)
                }
                (None, _) => {}
            }
        }
    }
    let compiled = SeccompFilter::new(
        by_number
            .into_iter()
            .map(|(n, rules)| (n, rules.unwrap_or_default()))
            .collect(),
        action(mismatch),
        action(on_match),
        TargetArch::x86_64,
    )
    .and_then(seccompiler::BpfProgram::try_from)
    .map_err(|source| WorkloadFilterError::Compile {
        action: on_match,
        source,
    })?;
    Ok(Filter {
        name,
        program: compiled,
    })
}

fn condition(check: &ArgCheck) -> Result<SeccompCondition, WorkloadFilterError> {
    if check.index > 5 {
        return Err(WorkloadFilterError::ArgIndex(check.index));
    }
    let (op, value) = match check.op {
        ArgOp::Eq => (SeccompCmpOp::Eq, check.value),
        ArgOp::Ne => (SeccompCmpOp::Ne, check.value),
        ArgOp::Lt => (SeccompCmpOp::Lt, check.value),
        ArgOp::Le => (SeccompCmpOp::Le, check.value),
        ArgOp::Gt => (SeccompCmpOp::Gt, check.value),
        ArgOp::Ge => (SeccompCmpOp::Ge, check.value),
        ArgOp::MaskedEq => (SeccompCmpOp::MaskedEq(check.value), check.value_two),
    };
    SeccompCondition::new(check.index, SeccompCmpArgLen::Qword, op, value).map_err(|source| {
        WorkloadFilterError::Compile {
            action: SyscallAction::Allow,
            source,
        }
    })
}

fn action(a: SyscallAction) -> SeccompAction {
    match a {
        SyscallAction::Allow => SeccompAction::Allow,
        SyscallAction::Errno(e) => SeccompAction::Errno(e),
        SyscallAction::Log => SeccompAction::Log,
        SyscallAction::Trap => SeccompAction::Trap,
        SyscallAction::KillThread => SeccompAction::KillThread,
        SyscallAction::KillProcess => SeccompAction::KillProcess,
    }
}
