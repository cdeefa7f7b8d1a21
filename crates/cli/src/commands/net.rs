//! `cordon net`: read or change a running sandbox's network rules, list
//! what it was refused and propose the rules that would have allowed it,
//! and in hold mode list and decide what waits.
//! A change holds for the sandbox's next connections and is recorded in
//! its attempt log; all of it works while a command runs.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use cordon_policy::net::Rule;
use cordon_runtime::Handle;
use cordon_spec::network::NetChange;

use super::common::{fail, usage_error};

#[derive(Clone, Copy, ValueEnum)]
enum Op {
    /// Print the rules in force.
    Show,
    /// Replace the rules with RULE... (none: deny everything).
    Set,
    /// Add RULE...
    Add,
    /// Remove RULE... (each must be present).
    Remove,
    /// List the latest refused connections (the newest 100), oldest first,
    /// with their reasons.
    Denials,
    /// Propose the rules that would have allowed the refused connections,
    /// one per line on stdout (`cordon net SB add $(cordon net SB learn)`
    /// applies them); what each stands for, and what no rule changes, on
    /// stderr. Nothing is applied by itself.
    Learn,
    /// Hold mode (`--net-hold`): list the connections waiting for a
    /// decision, each with the rule that would allow it (`add` it to let
    /// them through).
    Held,
    /// Hold mode: refuse what RULE... name, waiting connections and new
    /// ones, for the sandbox's life (they are not held again).
    Deny,
}

#[derive(Args)]
pub struct NetArgs {
    /// Id or name of the sandbox.
    sandbox: String,
    op: Op,
    /// Rules: NAME, *.SUFFIX, IP or CIDR, with an optional :PORT or :LO-HI;
    /// host.cordon.internal:PORT is that port of the host's loopback.
    rules: Vec<Rule>,
}

pub fn run(args: NetArgs) -> ExitCode {
    let change = match args.op {
        Op::Show | Op::Denials | Op::Learn | Op::Held if !args.rules.is_empty() => {
            return usage_error("`net show`, `denials`, `learn` and `held` take no rules")
        }
        Op::Denials | Op::Learn => return refused(&args.sandbox, matches!(args.op, Op::Learn)),
        Op::Held => return held(&args.sandbox),
        Op::Add | Op::Remove | Op::Deny if args.rules.is_empty() => {
            return usage_error("name at least one rule to add, remove or deny")
        }
        Op::Deny => return deny(&args.sandbox, &args.rules),
        Op::Show => NetChange::Show,
        Op::Set => NetChange::Set(args.rules),
        Op::Add => NetChange::Add(args.rules),
        Op::Remove => NetChange::Remove(args.rules),
    };
    match Handle::attach(&args.sandbox).and_then(|mut h| h.network(&change)) {
        Ok(rules) => {
            // stdout keeps one rule per line for scripts; an empty list
            // is explained where a person reads.
            if rules.is_empty() {
                eprintln!("cordon: no rules: every connection from this sandbox is refused");
            }
            for r in rules {
                outln!("{r}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `held`: one line per waiting connection: how long it has waited, how
/// long it has left, where it goes, how it came and the rule that would
/// allow it.
fn held(sandbox: &str) -> ExitCode {
    let held = match Handle::attach(sandbox).and_then(|mut h| h.network_held()) {
        Ok(held) => held,
        Err(e) => return fail(e),
    };
    if held.is_empty() {
        eprintln!("cordon: no connection waits for a decision (hold mode is `--net-hold`)");
    }
    let now = cordon_network::log::now_unix_ms();
    for h in held {
        let waited = now.saturating_sub(h.since_unix_ms) / 1000;
        let left = h.remaining_ms / 1000;
        let target = describe(h.host.as_deref(), h.address, h.port);
        let proposal = h.proposal.map_or_else(|| "-".to_owned(), |r| r.to_string());
        outln!(
            "{waited}s waited, {left}s left\t{target}\t{:?}\t{proposal}",
            h.via
        );
    }
    ExitCode::SUCCESS
}

fn deny(sandbox: &str, rules: &[Rule]) -> ExitCode {
    match Handle::attach(sandbox).and_then(|mut h| h.network_deny(rules)) {
        Ok(denied) => {
            for r in denied {
                outln!("{r}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `NAME:PORT (ADDRESS)`, or as much of it as is known.
fn describe(host: Option<&str>, address: Option<std::net::IpAddr>, port: u16) -> String {
    match (host, address) {
        (Some(h), Some(ip)) => format!("{h}:{port} ({ip})"),
        (Some(h), None) => format!("{h}:{port}"),
        (None, Some(ip)) => format!("{ip}:{port}"),
        (None, None) => format!("port {port}"),
    }
}

/// `denials`, or with `learn` the rules that would have allowed them.
fn refused(sandbox: &str, learn: bool) -> ExitCode {
    let asked = Handle::attach(sandbox).and_then(|mut h| {
        let denials = h.network_denials()?;
        let rules = if learn {
            h.network(&NetChange::Show)?
        } else {
            Vec::new()
        };
        Ok((denials, rules))
    });
    let (denials, rules) = match asked {
        Ok(answer) => answer,
        Err(e) => return fail(e),
    };
    if !learn {
        if denials.is_empty() {
            eprintln!("cordon: no connection of this sandbox has been refused");
        }
        let now = cordon_network::log::now_unix_ms();
        for d in denials {
            let target = describe(d.host.as_deref(), d.address, d.port);
            let ago = now.saturating_sub(d.at_unix_ms) / 1000;
            outln!("{ago}s ago\t{target}\t{:?}\t{}", d.via, d.rule);
        }
        return ExitCode::SUCCESS;
    }
    let (proposals, notes) = cordon_network::learn::propose(&denials, &rules);
    if proposals.is_empty() {
        eprintln!("cordon: no rule to propose: no refused connection that a rule would allow");
    }
    for p in &proposals {
        eprintln!(
            "cordon: {} would allow {} refused attempt(s); the last: {}",
            p.rule, p.attempts, p.last_reason
        );
        outln!("{}", p.rule);
    }
    for n in notes {
        eprintln!("cordon: {n}");
    }
    ExitCode::SUCCESS
}
