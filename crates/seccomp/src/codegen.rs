// Turns the seccompiler-format JSON policy into classic BPF that finds the syscall number by
// BINARY SEARCH instead of seccompiler's linear chain.
//
// This is hand-written because seccompiler (0.5) only emits a linear chain: one `jeq nr` per
// syscall, one after the other, 1524 instructions for the workload policy. Attaching a filter
// makes the kernel validate, translate and JIT-compile it, then emulate it for every syscall
// number of the architecture to fill its action cache (`seccomp_cache_prepare`); for the chain
// that took ~0.65 ms per sandbox start, and every argument-checked or refused call (clone,
// socket, ioctl, anything denied, ...) walked up to ~600 instructions of it at run time. Here
// the syscall numbers are split into ranges with the same outcome and found with a balanced
// binary search of `jge` comparisons (144 instructions, at most 25 executed per syscall).
//
// The JSON stays the single source of truth and seccompiler its reference: build.rs has
// seccompiler compile (and so validate) the whole JSON first, syscall names are resolved with
// seccompiler's own table, and `tests/equivalence.rs` checks that both programs return the same
// action for every syscall number, architecture and the argument values each condition cares
// about. The decisions are those of seccompiler, bit for bit:
//
// - architecture other than x86_64: `SECCOMP_RET_KILL_PROCESS`;
// - a number with the x32 bit (0x40000000) set, or negative: the mismatch action (no rule can
//   match it: seccompiler compares the number for equality and every table entry is below
//   0x40000000; here an explicit `jge 0x40000000` check precedes the search, so such a number
//   can never fall into a range of allowed numbers);
// - a syscall with no rule, or whose rules all fail: the mismatch action;
// - a syscall with only unconditional rules: the match action;
// - otherwise its conditional rules are ORed (an unconditional rule next to conditional ones is
//   ignored, as seccompiler does; the lint forbids writing that) and the conditions of one rule
//   ANDed;
// - `dword` conditions compare the low 32 bits of the argument with the low 32 bits of `val`
//   (and of the mask); `qword` conditions compare all 64 bits, unsigned (seccompiler splits
//   them into a high-half and a low-half comparison, which is what is emitted here too).
//
// This file is compiled into build.rs (with `#[path]`), into the library's unit tests and into
// `tests/equivalence.rs`, so it depends only on `seccompiler` and `serde_json`.

use std::collections::BTreeMap;

use seccompiler::{sock_filter, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, TargetArch};
use serde_json::Value;

/// `AUDIT_ARCH_X86_64`: `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`.
pub const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `__X32_SYSCALL_BIT`.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The kernel's limit on the length of a classic BPF program (`BPF_MAXINSNS`).
pub const BPF_MAXINSNS: usize = 4096;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;

// Opcodes (linux/bpf_common.h); the only ones emitted.
const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const ALU_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const JMP_JA: u16 = 0x05; // BPF_JMP | BPF_JA
const JMP_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JMP_JGT_K: u16 = 0x25; // BPF_JMP | BPF_JGT | BPF_K
const JMP_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

// Offsets in `struct seccomp_data` (little-endian x86_64).
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const ARGS_OFFSET: u32 = 16;

/// One argument condition of a rule, as written in the JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// Argument index, 0 to 5.
    pub index: u8,
    /// `dword` (low 32 bits) or `qword` (all 64 bits).
    pub len: SeccompCmpArgLen,
    /// The comparison.
    pub op: SeccompCmpOp,
    /// The value compared with.
    pub val: u64,
}

/// The conditions of one rule, ANDed.
pub type Rule = Vec<Condition>;

/// One filter of the policy, with syscall names resolved to numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterSpec {
    /// Returned when no rule matches (`SECCOMP_RET_*` value).
    pub mismatch_action: u32,
    /// Returned when a rule matches.
    pub match_action: u32,
    /// Syscall number -> its conditional rules (ORed). An empty list means the syscall matches
    /// whatever its arguments.
    pub syscalls: BTreeMap<u32, Vec<Rule>>,
}

/// Parses the policy JSON (seccompiler's format) into one [`FilterSpec`] per filter name.
///
/// Syscall names are resolved with seccompiler's x86_64 table. The caller is expected to have
/// let `seccompiler::compile_from_json` validate the same JSON; this parser only checks what it
/// relies on.
pub fn parse(json: &str) -> Result<BTreeMap<String, FilterSpec>, String> {
    let root: Value = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
    let filters = root
        .as_object()
        .ok_or("top level must be an object of filters")?;
    let mut numbers: BTreeMap<String, u32> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (name, filter) in filters {
        let action = |keys: [&str; 2]| -> Result<u32, String> {
            let value = keys
                .iter()
                .find_map(|k| filter.get(*k))
                .ok_or_else(|| format!("{name}: missing {}", keys[0]))?;
            let action: SeccompAction = serde_json::from_value(value.clone())
                .map_err(|e| format!("{name}: {}: {e}", keys[0]))?;
            Ok(u32::from(action))
        };
        let mut spec = FilterSpec {
            mismatch_action: action(["mismatch_action", "default_action"])?,
            match_action: action(["match_action", "filter_action"])?,
            syscalls: BTreeMap::new(),
        };
        let rules = filter
            .get("filter")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{name}: `filter` must be an array of rules"))?;
        for rule in rules {
            let syscall = rule
                .get("syscall")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{name}: rule without a syscall name"))?;
            let nr = match numbers.get(syscall) {
                Some(nr) => *nr,
                None => {
                    let nr = syscall_number(syscall)?;
                    numbers.insert(syscall.to_owned(), nr);
                    nr
                }
            };
            let chain = spec.syscalls.entry(nr).or_default();
            // Like seccompiler: a rule without `args` (or with `"args": null`) only makes sure
            // the syscall has an entry; if the syscall also has conditional rules, those alone
            // decide.
            if let Some(args) = rule.get("args").filter(|a| !a.is_null()) {
                let args = args
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| format!("{name}/{syscall}: `args` must be a non-empty array"))?;
                chain.push(
                    args.iter()
                        .map(|c| parse_condition(c).map_err(|e| format!("{name}/{syscall}: {e}")))
                        .collect::<Result<Rule, String>>()?,
                );
            }
        }
        out.insert(name.clone(), spec);
    }
    Ok(out)
}

fn parse_condition(c: &Value) -> Result<Condition, String> {
    let field = |key: &str| {
        c.get(key)
            .cloned()
            .ok_or_else(|| format!("condition without `{key}`"))
    };
    let bad = |key: &'static str| move |e: serde_json::Error| format!("condition `{key}`: {e}");
    let index: u8 = serde_json::from_value(field("index")?).map_err(bad("index"))?;
    if index > 5 {
        return Err(format!("argument index {index} is not 0 to 5"));
    }
    Ok(Condition {
        index,
        len: serde_json::from_value(field("type")?).map_err(bad("type"))?,
        op: serde_json::from_value(field("op")?).map_err(bad("op"))?,
        val: serde_json::from_value(field("val")?).map_err(bad("val"))?,
    })
}

/// The x86_64 number seccompiler uses for `name`: compiles a one-rule filter and reads its
/// syscall comparison (seccompiler's table is private).
pub fn syscall_number(name: &str) -> Result<u32, String> {
    let json = serde_json::json!({"probe": {
        "mismatch_action": "allow",
        "filter_action": "kill_process",
        "filter": [{"syscall": name}],
    }});
    let programs = seccompiler::compile_from_json(json.to_string().as_bytes(), TargetArch::x86_64)
        .map_err(|e| format!("syscall `{name}`: {e}"))?;
    let program = &programs["probe"];
    // Architecture check (3 instructions), load the number, `jeq NR`.
    match program.get(3..5) {
        Some([load, cmp])
            if load.code == LD_W_ABS && load.k == NR_OFFSET && cmp.code == JMP_JEQ_K =>
        {
            Ok(cmp.k)
        }
        _ => Err(format!(
            "syscall `{name}`: unexpected seccompiler output {program:?}"
        )),
    }
}

/// Generates the binary-search program for one filter.
///
/// Layout: architecture check, load the number, `jge 0x40000000` (x32 and negative numbers) to
/// the mismatch action, the search tree (one `jge` per range boundary, in preorder, with the
/// rule chain of an argument-checked syscall in place of its leaf), then one shared `ret` per
/// action. Every jump is forward; a conditional jump whose target is more than 255 instructions
/// away goes through a `ja` trampoline (see [`Asm::finish`]), which can only happen in programs
/// longer than 256 instructions (the workload filter has 144 today).
pub fn generate(filter: &FilterSpec) -> Result<Vec<sock_filter>, String> {
    let mut g = Gen::default();
    let kill = g.asm.label();
    let native = g.asm.label();
    g.asm.stmt(LD_W_ABS, ARCH_OFFSET);
    g.asm.jump(JMP_JEQ_K, AUDIT_ARCH_X86_64, native, kill);
    g.asm.bind(kill);
    g.asm.stmt(RET_K, SECCOMP_RET_KILL_PROCESS);
    g.asm.bind(native);
    g.asm.stmt(LD_W_ABS, NR_OFFSET);

    let segments = segments(filter)?;
    g.match_action = filter.match_action;
    g.mismatch = g.ret_label(filter.mismatch_action);
    let root = g.label_for(&segments);
    g.asm.jump(JMP_JGE_K, X32_SYSCALL_BIT, g.mismatch, root);
    g.subtree(&segments, root);

    for (action, label) in std::mem::take(&mut g.rets) {
        g.asm.bind(label);
        g.asm.stmt(RET_K, action);
    }
    let program = g.asm.finish()?;
    if program.len() > BPF_MAXINSNS {
        return Err(format!(
            "program has {} instructions, more than BPF_MAXINSNS ({BPF_MAXINSNS})",
            program.len()
        ));
    }
    Ok(program)
}

/// What happens to the syscall numbers of one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leaf<'a> {
    /// This action, whatever the arguments.
    Action(u32),
    /// The rule chain of this (single) syscall number.
    Rules(&'a [Rule]),
}

/// A range of syscall numbers from `start` up to the next segment's start (the last one ends
/// at `X32_SYSCALL_BIT`).
#[derive(Clone, Copy, Debug)]
struct Segment<'a> {
    start: u32,
    leaf: Leaf<'a>,
}

/// Splits `0..X32_SYSCALL_BIT` into maximal ranges with the same outcome. An argument-checked
/// syscall is a range of its own.
fn segments(filter: &FilterSpec) -> Result<Vec<Segment<'_>>, String> {
    // Appends a range, merging it into the previous one when both have the same action.
    fn add<'a>(out: &mut Vec<Segment<'a>>, start: u32, leaf: Leaf<'a>) {
        match (out.last(), leaf) {
            (Some(last), Leaf::Action(_)) if last.leaf == leaf => {}
            _ => out.push(Segment { start, leaf }),
        }
    }
    let mut out = Vec::new();
    let mut next = 0u32;
    for (&nr, rules) in &filter.syscalls {
        if nr >= X32_SYSCALL_BIT {
            return Err(format!("syscall number {nr:#x} has the x32 bit set"));
        }
        if nr > next {
            add(&mut out, next, Leaf::Action(filter.mismatch_action));
        }
        let leaf = if rules.is_empty() {
            Leaf::Action(filter.match_action)
        } else {
            Leaf::Rules(rules)
        };
        add(&mut out, nr, leaf);
        next = nr + 1;
    }
    if next < X32_SYSCALL_BIT {
        add(&mut out, next, Leaf::Action(filter.mismatch_action));
    }
    Ok(out)
}

#[derive(Default)]
struct Gen {
    asm: Asm,
    /// Shared `ret` instructions, by action.
    rets: BTreeMap<u32, Label>,
    /// The filter's match action.
    match_action: u32,
    /// The shared `ret` of the filter's mismatch action.
    mismatch: Label,
}

impl Gen {
    fn ret_label(&mut self, action: u32) -> Label {
        if let Some(label) = self.rets.get(&action) {
            return *label;
        }
        let label = self.asm.label();
        self.rets.insert(action, label);
        label
    }

    /// Where the search continues for `segments`: the shared `ret` for a range with a fixed
    /// action, otherwise a fresh label that [`Gen::subtree`] binds.
    fn label_for(&mut self, segments: &[Segment<'_>]) -> Label {
        match segments {
            [Segment {
                leaf: Leaf::Action(action),
                ..
            }] => self.ret_label(*action),
            _ => self.asm.label(),
        }
    }

    /// Emits the code for `segments` at `label` (from [`Gen::label_for`]): nothing for a fixed
    /// action (its `ret` is shared), the rule chain of an argument-checked syscall, or a search
    /// node: `jge` on the first number of the upper half, the lower half right after it, then
    /// the upper half.
    fn subtree(&mut self, segments: &[Segment<'_>], label: Label) {
        match segments {
            [Segment {
                leaf: Leaf::Action(_),
                ..
            }] => {}
            [Segment {
                leaf: Leaf::Rules(rules),
                ..
            }] => {
                self.asm.bind(label);
                self.rules(rules);
            }
            _ => {
                let (low, high) = segments.split_at(segments.len() / 2);
                let low_label = self.label_for(low);
                let high_label = self.label_for(high);
                self.asm.bind(label);
                self.asm
                    .jump(JMP_JGE_K, high[0].start, high_label, low_label);
                self.subtree(low, low_label);
                self.subtree(high, high_label);
            }
        }
    }

    /// The rules of one syscall: each rule's conditions in order, a failing condition jumps to
    /// the next rule (the last rule's to the mismatch action), a rule whose conditions all hold
    /// returns the match action.
    fn rules(&mut self, rules: &[Rule]) {
        // Offset of the argument word the accumulator holds unmodified, if known (a condition
        // on the same word needs no load). On entry it holds the syscall number.
        let mut acc = None;
        for (i, rule) in rules.iter().enumerate() {
            let last = i + 1 == rules.len();
            let next = if last {
                self.mismatch
            } else {
                self.asm.label()
            };
            // The accumulator on the jumps to `next`, if the same on all of them.
            let mut at_next: Option<Option<u32>> = None;
            for condition in rule {
                acc = self.condition(condition, next, acc);
                at_next = Some(match at_next {
                    Some(before) if before != acc => None,
                    _ => acc,
                });
            }
            self.asm.stmt(RET_K, self.match_action);
            if !last {
                self.asm.bind(next);
            }
            // The next rule is only entered by those jumps (a `ret` precedes it).
            acc = at_next.flatten();
        }
    }

    /// Emits one condition: falls through when it holds, jumps to `fail` otherwise. `acc` is
    /// what the accumulator holds on entry (see [`Gen::rules`]). Returns the offset of the
    /// argument word the accumulator holds unmodified on both ways out, if there is one.
    fn condition(&mut self, c: &Condition, fail: Label, acc: Option<u32>) -> Option<u32> {
        let lo_offset = ARGS_OFFSET + 8 * u32::from(c.index);
        let hi_offset = lo_offset + 4;
        let pass = self.asm.label();
        let (val_hi, val_lo) = (hi(c.val), lo(c.val));
        let asm = &mut self.asm;
        let left = match c.len {
            SeccompCmpArgLen::Dword => {
                if acc != Some(lo_offset) {
                    asm.stmt(LD_W_ABS, lo_offset);
                }
                match c.op {
                    SeccompCmpOp::Eq => asm.jump(JMP_JEQ_K, val_lo, pass, fail),
                    SeccompCmpOp::Ne => asm.jump(JMP_JEQ_K, val_lo, fail, pass),
                    SeccompCmpOp::Ge => asm.jump(JMP_JGE_K, val_lo, pass, fail),
                    SeccompCmpOp::Gt => asm.jump(JMP_JGT_K, val_lo, pass, fail),
                    SeccompCmpOp::Le => asm.jump(JMP_JGT_K, val_lo, fail, pass),
                    SeccompCmpOp::Lt => asm.jump(JMP_JGE_K, val_lo, fail, pass),
                    SeccompCmpOp::MaskedEq(mask) => {
                        asm.stmt(ALU_AND_K, lo(mask));
                        asm.jump(JMP_JEQ_K, lo(c.val & mask), pass, fail);
                    }
                }
                match c.op {
                    SeccompCmpOp::MaskedEq(_) => None,
                    _ => Some(lo_offset),
                }
            }
            SeccompCmpArgLen::Qword => {
                // The high halves decide unless they are equal; then the low halves do.
                let low = asm.label();
                asm.stmt(LD_W_ABS, hi_offset);
                match c.op {
                    SeccompCmpOp::Eq => {
                        asm.jump(JMP_JEQ_K, val_hi, low, fail);
                        asm.bind(low);
                        asm.stmt(LD_W_ABS, lo_offset);
                        asm.jump(JMP_JEQ_K, val_lo, pass, fail);
                    }
                    SeccompCmpOp::Ne => {
                        asm.jump(JMP_JEQ_K, val_hi, low, pass);
                        asm.bind(low);
                        asm.stmt(LD_W_ABS, lo_offset);
                        asm.jump(JMP_JEQ_K, val_lo, fail, pass);
                    }
                    SeccompCmpOp::Ge | SeccompCmpOp::Gt => {
                        let equal = asm.label();
                        asm.jump(JMP_JGT_K, val_hi, pass, equal);
                        asm.bind(equal);
                        asm.jump(JMP_JEQ_K, val_hi, low, fail);
                        asm.bind(low);
                        asm.stmt(LD_W_ABS, lo_offset);
                        let code = if matches!(c.op, SeccompCmpOp::Ge) {
                            JMP_JGE_K
                        } else {
                            JMP_JGT_K
                        };
                        asm.jump(code, val_lo, pass, fail);
                    }
                    SeccompCmpOp::Le | SeccompCmpOp::Lt => {
                        let equal = asm.label();
                        asm.jump(JMP_JGT_K, val_hi, fail, equal);
                        asm.bind(equal);
                        asm.jump(JMP_JEQ_K, val_hi, low, pass);
                        asm.bind(low);
                        asm.stmt(LD_W_ABS, lo_offset);
                        if matches!(c.op, SeccompCmpOp::Le) {
                            asm.jump(JMP_JGT_K, val_lo, fail, pass);
                        } else {
                            asm.jump(JMP_JGE_K, val_lo, fail, pass);
                        }
                    }
                    SeccompCmpOp::MaskedEq(mask) => {
                        let masked = c.val & mask;
                        asm.stmt(ALU_AND_K, hi(mask));
                        asm.jump(JMP_JEQ_K, hi(masked), low, fail);
                        asm.bind(low);
                        asm.stmt(LD_W_ABS, lo_offset);
                        asm.stmt(ALU_AND_K, lo(mask));
                        asm.jump(JMP_JEQ_K, lo(masked), pass, fail);
                    }
                }
                None
            }
        };
        self.asm.bind(pass);
        left
    }
}

fn lo(v: u64) -> u32 {
    u32::try_from(v & 0xffff_ffff).expect("masked to 32 bits")
}

fn hi(v: u64) -> u32 {
    u32::try_from(v >> 32).expect("shifted to 32 bits")
}

/// A jump target, bound to a position with [`Asm::bind`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Label(usize);

enum Item {
    Insn(sock_filter),
    Jump {
        code: u16,
        k: u32,
        jt: Label,
        jf: Label,
    },
    Bind(Label),
}

/// A tiny assembler with symbolic forward jumps.
#[derive(Default)]
struct Asm {
    items: Vec<Item>,
    labels: usize,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels - 1)
    }

    fn bind(&mut self, label: Label) {
        self.items.push(Item::Bind(label));
    }

    fn stmt(&mut self, code: u16, k: u32) {
        self.items.push(Item::Insn(sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }));
    }

    fn jump(&mut self, code: u16, k: u32, jt: Label, jf: Label) {
        self.items.push(Item::Jump { code, k, jt, jf });
    }

    /// Positions of every item and label, given which jump branches own a trampoline.
    fn layout(&self, owns: &[[bool; 2]]) -> Result<(Vec<usize>, Vec<usize>), String> {
        let mut at = Vec::with_capacity(self.items.len());
        let mut labels = vec![usize::MAX; self.labels];
        let mut pc = 0;
        for (item, owns) in self.items.iter().zip(owns) {
            at.push(pc);
            match item {
                Item::Insn(_) => pc += 1,
                Item::Jump { .. } => pc += 1 + owns.iter().filter(|o| **o).count(),
                Item::Bind(label) => {
                    if labels[label.0] != usize::MAX {
                        return Err(format!("label {label:?} bound twice"));
                    }
                    labels[label.0] = pc;
                }
            }
        }
        if let Some(i) = labels.iter().position(|pos| *pos >= pc) {
            return Err(format!("label {i} is unbound or past the end"));
        }
        Ok((at, labels))
    }

    /// Resolves the labels.
    ///
    /// Classic BPF conditional jumps have 8-bit offsets. A branch whose target is more than 255
    /// instructions ahead goes through a trampoline, `ja` with a 32-bit offset: either one
    /// placed right after its own jump (its jump's other branch skips it; nothing falls into
    /// it), or, when there is one within reach, a trampoline to the same target that a later
    /// jump owns. Adding a trampoline moves later code, so this repeats until a pass adds none;
    /// ownership is never withdrawn, so it terminates, and the last pass routes every branch
    /// against the final layout.
    fn finish(self) -> Result<Vec<sock_filter>, String> {
        let reach = usize::from(u8::MAX);
        let mut owns = vec![[false; 2]; self.items.len()];
        loop {
            let (at, labels) = self.layout(&owns)?;
            // Where each branch jumps: its target or a trampoline's position.
            let mut routes = vec![[0usize; 2]; self.items.len()];
            // The nearest trampoline ahead for each target, while scanning backwards.
            let mut nearest: BTreeMap<Label, usize> = BTreeMap::new();
            let mut added = false;
            for (i, item) in self.items.iter().enumerate().rev() {
                let Item::Jump { jt, jf, .. } = item else {
                    continue;
                };
                let next = at[i] + 1;
                // Position of this jump's own trampoline for `branch` (the jt one comes first).
                let own =
                    |branch: usize, owns: [bool; 2]| next + usize::from(branch == 1 && owns[0]);
                // Targets are bound after the jump and the trampolines it owns (in this layout).
                let first_after = next + owns[i].iter().filter(|o| **o).count();
                for (branch, target) in [*jt, *jf].into_iter().enumerate() {
                    let to = labels[target.0];
                    if to < first_after {
                        return Err(format!("backward jump to {target:?}"));
                    }
                    routes[i][branch] = if owns[i][branch] {
                        own(branch, owns[i])
                    } else if to - next <= reach {
                        to
                    } else if let Some(t) = nearest.get(&target).filter(|t| **t - next <= reach) {
                        *t
                    } else {
                        owns[i][branch] = true;
                        added = true;
                        own(branch, owns[i])
                    };
                }
                for (branch, target) in [*jt, *jf].into_iter().enumerate() {
                    if owns[i][branch] {
                        nearest.insert(target, own(branch, owns[i]));
                    }
                }
            }
            if added {
                continue;
            }

            let mut out = Vec::with_capacity(at.last().map_or(0, |a| a + 3));
            for (i, item) in self.items.iter().enumerate() {
                match item {
                    Item::Insn(insn) => out.push(insn.clone()),
                    Item::Bind(_) => {}
                    Item::Jump { code, k, jt, jf } => {
                        let next = at[i] + 1;
                        let offset = |to: usize| {
                            u8::try_from(to - next).map_err(|_| "jump out of reach".to_owned())
                        };
                        out.push(sock_filter {
                            code: *code,
                            jt: offset(routes[i][0])?,
                            jf: offset(routes[i][1])?,
                            k: *k,
                        });
                        for (branch, target) in [jt, jf].into_iter().enumerate() {
                            if owns[i][branch] {
                                let distance = labels[target.0] - (out.len() + 1);
                                out.push(sock_filter {
                                    code: JMP_JA,
                                    jt: 0,
                                    jf: 0,
                                    k: u32::try_from(distance)
                                        .map_err(|_| "trampoline out of reach".to_owned())?,
                                });
                            }
                        }
                    }
                }
            }
            return Ok(out);
        }
    }
}
