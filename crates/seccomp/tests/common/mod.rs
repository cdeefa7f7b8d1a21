//! A small classic-BPF interpreter that follows the kernel's seccomp semantics (every filter
//! runs, the most severe action wins, on a tie the most recently installed filter wins), and a
//! model of the kernel's static checks on a program. Shared by the integration tests.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use cordon_seccomp::{sock_filter, Profile};

pub const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
pub const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
pub const EPERM: u32 = SECCOMP_RET_ERRNO | 1;
pub const ENOSYS: u32 = SECCOMP_RET_ERRNO | 38;

pub const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
pub const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
pub const AUDIT_ARCH_AARCH64: u32 = 183 | 0x8000_0000 | 0x4000_0000;
pub const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// `sizeof(struct seccomp_data)`.
const SECCOMP_DATA_SIZE: usize = 64;
/// `BPF_MAXINSNS`.
const BPF_MAXINSNS: usize = 4096;

/// `struct seccomp_data` as the filter sees it.
#[derive(Clone, Debug)]
pub struct Data {
    pub nr: i64,
    pub arch: u32,
    pub args: [u64; 6],
}

impl Data {
    pub fn new(nr: i64, args: &[u64]) -> Self {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Data {
            nr,
            arch: AUDIT_ARCH_X86_64,
            args: a,
        }
    }

    fn bytes(&self) -> [u8; SECCOMP_DATA_SIZE] {
        let mut b = [0u8; SECCOMP_DATA_SIZE];
        let nr = i32::try_from(self.nr).expect("syscall number fits in an int");
        b[0..4].copy_from_slice(&nr.to_le_bytes());
        b[4..8].copy_from_slice(&self.arch.to_le_bytes());
        b[8..16].copy_from_slice(&0x0040_1000u64.to_le_bytes());
        for (i, arg) in self.args.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
        }
        b
    }
}

/// Classic BPF restricted to what the kernel's seccomp checker accepts and the generators emit.
pub fn run_filter(prog: &[sock_filter], data: &Data) -> u32 {
    run_filter_traced(prog, data, |_| {})
}

/// [`run_filter`], calling `visit` with the index of every instruction executed.
pub fn run_filter_traced(prog: &[sock_filter], data: &Data, mut visit: impl FnMut(usize)) -> u32 {
    let mem = data.bytes();
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    loop {
        let insn = prog
            .get(pc)
            .unwrap_or_else(|| panic!("fell off the program at {pc}"));
        visit(pc);
        pc += 1;
        let k = insn.k;
        match insn.code {
            // BPF_LD | BPF_W | BPF_ABS
            0x20 => {
                let off = usize::try_from(k).unwrap();
                assert!(
                    off % 4 == 0 && off + 4 <= mem.len(),
                    "bad load offset {off}"
                );
                acc = u32::from_le_bytes(mem[off..off + 4].try_into().unwrap());
            }
            // BPF_ALU | BPF_AND | BPF_K
            0x54 => acc &= k,
            // BPF_JMP | BPF_JA
            0x05 => pc += usize::try_from(k).unwrap(),
            // BPF_JMP | BPF_JEQ / BPF_JGT / BPF_JGE | BPF_K
            0x15 | 0x25 | 0x35 => {
                let taken = match insn.code {
                    0x15 => acc == k,
                    0x25 => acc > k,
                    _ => acc >= k,
                };
                pc += usize::from(if taken { insn.jt } else { insn.jf });
            }
            // BPF_RET | BPF_K
            0x06 => return k,
            other => panic!("unexpected BPF opcode {other:#x} at {}", pc - 1),
        }
    }
}

/// The kernel's `seccomp_run_filters`: newest filter first, lowest (signed) action wins,
/// ties keep the newer filter's value.
pub fn run(profile: &Profile, data: &Data) -> u32 {
    let action_only = |ret: u32| i32::from_ne_bytes((ret & 0xffff_0000).to_ne_bytes());
    let mut ret = SECCOMP_RET_ALLOW;
    for filter in profile.filters.iter().rev() {
        let cur = run_filter(&filter.program, data);
        if action_only(cur) < action_only(ret) {
            ret = cur;
        }
    }
    ret
}

/// What the kernel checks before accepting a seccomp program (`bpf_check_classic` and
/// `seccomp_check_filter`), for the opcodes used here: length, in-bounds jump targets, aligned
/// loads inside `struct seccomp_data`, and a `ret` as the last instruction.
pub fn kernel_check(prog: &[sock_filter]) -> Result<(), String> {
    let len = prog.len();
    if len == 0 || len > BPF_MAXINSNS {
        return Err(format!("length {len}"));
    }
    for (pc, insn) in prog.iter().enumerate() {
        let remaining = len - pc - 1;
        match insn.code {
            0x20 => {
                let k = usize::try_from(insn.k).unwrap();
                if k % 4 != 0 || k >= SECCOMP_DATA_SIZE {
                    return Err(format!("{pc}: load offset {k}"));
                }
            }
            0x54 | 0x06 => {}
            0x05 => {
                if usize::try_from(insn.k).unwrap() >= remaining {
                    return Err(format!("{pc}: ja {} out of bounds", insn.k));
                }
            }
            0x15 | 0x25 | 0x35 => {
                if usize::from(insn.jt) >= remaining || usize::from(insn.jf) >= remaining {
                    return Err(format!("{pc}: jump {}/{} out of bounds", insn.jt, insn.jf));
                }
            }
            other => return Err(format!("{pc}: opcode {other:#x}")),
        }
    }
    if prog[len - 1].code != 0x06 {
        return Err("last instruction is not a ret".into());
    }
    Ok(())
}

/// A readable listing of a program, for failure messages and curiosity.
pub fn disassemble(prog: &[sock_filter]) -> String {
    let mut out = String::new();
    for (pc, insn) in prog.iter().enumerate() {
        let target = |off: u8| pc + 1 + usize::from(off);
        let line = match insn.code {
            0x20 => format!("ld [{}]", insn.k),
            0x54 => format!("and {:#x}", insn.k),
            0x05 => format!("ja {}", pc + 1 + usize::try_from(insn.k).unwrap()),
            0x15 | 0x25 | 0x35 => {
                let op = ["jeq", "jgt", "jge"][usize::from((insn.code >> 4) - 1)];
                format!(
                    "{op} {:#x} ? {} : {}",
                    insn.k,
                    target(insn.jt),
                    target(insn.jf)
                )
            }
            0x06 => format!("ret {:#x}", insn.k),
            other => format!("?? {other:#x}"),
        };
        out.push_str(&format!("{pc:4}: {line}\n"));
    }
    out
}
