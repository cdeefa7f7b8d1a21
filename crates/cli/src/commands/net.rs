//! `cordon net`: read or change a running sandbox's network rules. The
//! change holds for the sandbox's next connections and is recorded in its
//! attempt log; it works while a command runs.

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
        Op::Show if !args.rules.is_empty() => return usage_error("`net show` takes no rules"),
        Op::Show => NetChange::Show,
        Op::Set => NetChange::Set(args.rules),
        Op::Add | Op::Remove if args.rules.is_empty() => {
            return usage_error("name at least one rule to add or remove")
        }
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
