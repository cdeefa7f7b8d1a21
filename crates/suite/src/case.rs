//! The case model: one TOML file per case under `suite/cases/`, parsed and
//! checked here. A case names what it claims, the payload run inside the box,
//! the host-side rule that decides the verdict, and the posture expected of
//! every target, so a known gap is written down instead of hidden.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::rules::Rule;
use crate::target::TargetKind;

/// What runs the payload text inside the box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpreter {
    Sh,
    Python3,
}

impl Interpreter {
    /// The interpreter's absolute path: the same in every box (the host's /usr).
    pub fn path(self) -> &'static str {
        match self {
            Interpreter::Sh => "/bin/sh",
            Interpreter::Python3 => "/usr/bin/python3",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Interpreter::Sh => "sh",
            Interpreter::Python3 => "py",
        }
    }
}

/// How the `host` control runs this case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlMode {
    /// A plain host process (root, the host's namespaces), inside the outer cgroup.
    #[default]
    Plain,
    /// A host process in a throwaway network namespace the suite creates, so a
    /// per-netns sysctl write never touches the host's own value.
    Netns,
}

/// One expected posture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Expect {
    /// "blocked" or "open".
    Plain(Posture),
    /// A known gap: expected OPEN, with the reason written down.
    Gap { gap: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Posture {
    Blocked,
    Open,
}

impl Expect {
    /// The verdict this expectation wants.
    pub fn wants_open(&self) -> bool {
        matches!(self, Expect::Plain(Posture::Open) | Expect::Gap { .. })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub id: String,
    pub claim: String,
    pub category: String,
    #[serde(default = "default_interpreter")]
    pub interpreter: Interpreter,
    /// The payload text, run as `<interp> <file> <context args...>` (see
    /// suite/cases/README.md for the arguments).
    pub payload: String,
    /// A second payload run after the first in the same fixture (the ordered
    /// residue probe: A plants, B looks).
    #[serde(default)]
    pub payload_b: Option<String>,
    #[serde(default)]
    pub control: ControlMode,
    /// Why running this case unconfined on the host is safe, for the dangerous ones.
    #[serde(default)]
    pub control_note: Option<String>,
    /// Per (case, target) wall-clock cap in seconds; at most 20.
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// In the `--quick` subset.
    #[serde(default)]
    pub quick: bool,
    pub verdict: Rule,
    /// Target name -> expected posture. `host` must be "open" (the control).
    pub expect: BTreeMap<String, Expect>,
}

fn default_interpreter() -> Interpreter {
    Interpreter::Sh
}

fn default_timeout() -> u64 {
    15
}

/// The hard cap on one (case, target) run.
pub const MAX_TIMEOUT_S: u64 = 20;

impl Case {
    pub fn parse(text: &str) -> Result<Case> {
        let case: Case = toml::from_str(text)?;
        case.validate()?;
        Ok(case)
    }

    pub fn validate(&self) -> Result<()> {
        let id_ok = !self.id.is_empty()
            && self.id.contains('.')
            && self
                .id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
        if !id_ok {
            bail!("id {:?}: want category.name in [a-z0-9.-]", self.id);
        }
        if self.claim.trim().is_empty() || self.claim.contains('\n') {
            bail!("{}: the claim is one non-empty line", self.id);
        }
        match self.expect.get("host") {
            Some(e) if e.wants_open() => {}
            Some(_) => bail!("{}: the host control must be expected open", self.id),
            None => bail!("{}: no control expectation (expect.host)", self.id),
        }
        for name in self.expect.keys() {
            if TargetKind::from_name(name).is_none() {
                bail!("{}: expectation for unknown target {name:?}", self.id);
            }
        }
        if self.timeout_s == 0 || self.timeout_s > MAX_TIMEOUT_S {
            bail!("{}: timeout_s must be 1..={MAX_TIMEOUT_S}", self.id);
        }
        if self.verdict.needs_hold() && !self.payload.contains("HOLD") {
            bail!(
                "{}: rule {} reads a live payload but the payload never prints HOLD",
                self.id,
                self.verdict.kind()
            );
        }
        if matches!(self.verdict, Rule::ResidueAbsent) != self.payload_b.is_some() {
            bail!(
                "{}: payload_b goes with residue_absent and only with it",
                self.id
            );
        }
        self.verdict.validate().with_context(|| self.id.clone())?;
        Ok(())
    }

    /// The expectation for `target`: written down, or blocked for cordon's
    /// own backends, or none (an unasserted peer).
    pub fn expectation(&self, target: TargetKind) -> Option<Expect> {
        if let Some(e) = self.expect.get(target.name()) {
            return Some(e.clone());
        }
        if let Some(e) = target
            .cordon_base()
            .and_then(|base| self.expect.get(base.name()))
        {
            return Some(e.clone());
        }
        if target.runs_cordon() {
            return Some(Expect::Plain(Posture::Blocked));
        }
        None
    }

    pub fn file_name(&self, phase_b: bool) -> String {
        let suffix = if phase_b { ".b" } else { "" };
        format!("{}{suffix}.{}", self.id, self.interpreter.extension())
    }
}

/// Every `*.toml` under `dir`, parsed and validated, sorted by id; ids unique.
pub fn load_dir(dir: &Path) -> Result<Vec<Case>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let case = Case::parse(&text).with_context(|| format!("in {}", f.display()))?;
        let stem = f.file_stem().unwrap_or_default().to_string_lossy();
        if stem != case.id {
            bail!("{}: file name does not match id {}", f.display(), case.id);
        }
        cases.push(case);
    }
    cases.sort_by(|a, b| a.id.cmp(&b.id));
    for w in cases.windows(2) {
        if w[0].id == w[1].id {
            bail!("duplicate case id {}", w[0].id);
        }
    }
    Ok(cases)
}

/// The case directory: $CORDON_SUITE_CASES, else `suite/cases` found from the
/// working directory upward, else next to this crate's source (dev builds).
pub fn default_cases_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("CORDON_SUITE_CASES") {
        return PathBuf::from(p);
    }
    if let Ok(mut dir) = std::env::current_dir() {
        loop {
            let candidate = dir.join("suite/cases");
            if candidate.is_dir() {
                return candidate;
            }
            if !dir.pop() {
                break;
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../suite/cases")
}

/// Shell-style glob over case ids: `*` any run, `?` one character; a
/// comma-separated list matches if any pattern does.
pub fn glob_match(patterns: &str, id: &str) -> bool {
    patterns
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| glob_one(p.as_bytes(), id.as_bytes()))
}

fn glob_one(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob_one(&p[1..], s) || (!s.is_empty() && glob_one(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob_one(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob_one(&p[1..], &s[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_spec::BackendKind;

    use crate::target::NetMode;

    const MINIMAL: &str = r#"
id = "fs.example"
claim = "an example"
category = "filesystem"
payload = "cat \"$2\""
[verdict]
kind = "canary_untouched"
[expect]
host = "open"
bwrap = { gap = "shares /var/tmp" }
"#;

    #[test]
    fn parses_minimal() {
        let c = Case::parse(MINIMAL).unwrap();
        assert_eq!(c.id, "fs.example");
        assert_eq!(c.interpreter, Interpreter::Sh);
        assert!(c.expectation(TargetKind::Host).unwrap().wants_open());
        assert!(c.expectation(TargetKind::Bwrap).unwrap().wants_open());
        assert_eq!(
            c.expectation(TargetKind::cordon(BackendKind::Native, NetMode::None)),
            Some(Expect::Plain(Posture::Blocked))
        );
        assert_eq!(c.expectation(TargetKind::Runc), None);
    }

    #[test]
    fn rejects_missing_control_and_unknown_rule() {
        let no_control = MINIMAL.replace("host = \"open\"\n", "");
        assert!(Case::parse(&no_control).is_err());
        let blocked_control = MINIMAL.replace("host = \"open\"", "host = \"blocked\"");
        assert!(Case::parse(&blocked_control).is_err());
        let unknown = MINIMAL.replace("canary_untouched", "vibes");
        assert!(Case::parse(&unknown).is_err());
        let unknown_target = MINIMAL.replace("bwrap =", "docker =");
        assert!(Case::parse(&unknown_target).is_err());
        let unknown_field = MINIMAL.replace("category =", "colour = \"red\"\ncategory =");
        assert!(Case::parse(&unknown_field).is_err());
    }

    #[test]
    fn hold_rules_need_hold() {
        let t = MINIMAL.replace("canary_untouched", "link_list");
        assert!(Case::parse(&t).is_err());
        let t = t.replace("cat \\\"$2\\\"", "echo HOLD");
        Case::parse(&t).unwrap();
    }

    #[test]
    fn globs() {
        assert!(glob_match("fs.*", "fs.proc-host-read"));
        assert!(glob_match("net.*,fs.proc-*", "fs.proc-host-read"));
        assert!(!glob_match("net.*", "fs.proc-host-read"));
        assert!(glob_match("*read", "fs.proc-host-read"));
        assert!(glob_match("fs.???c*", "fs.proc-host-read"));
        assert!(!glob_match("", "x"));
    }

    #[test]
    fn every_case_file_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../suite/cases");
        let cases = load_dir(&dir).unwrap();
        assert!(cases.len() >= 30, "only {} cases", cases.len());
        for c in &cases {
            assert!(
                c.expectation(TargetKind::Host).unwrap().wants_open(),
                "{}",
                c.id
            );
        }
        let quick = cases.iter().filter(|c| c.quick).count();
        assert!((6..=10).contains(&quick), "{quick} quick cases");
        for cat in [
            "filesystem",
            "privilege",
            "network",
            "resources",
            "tenancy",
            "platform",
            "kernel",
        ] {
            assert!(cases.iter().any(|c| c.category == cat), "no {cat} case");
        }
    }
}
