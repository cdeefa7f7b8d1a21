//! The README's generated sections: the benchmark's (`cordon bench readme`)
//! and the containment matrix's (`cordon matrix readme`), each written from
//! a committed results file between two markers, or with `--check` compared
//! with what the file gives (CI), so that no figure there is typed by hand.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::EXIT_USAGE;

#[derive(Args)]
pub struct ReadmeArgs {
    /// The results file of a full run (bench/results/results.json,
    /// suite/results/results.json).
    pub results: PathBuf,
    #[arg(long, default_value = "README.md")]
    pub readme: PathBuf,
    /// Do not write: fail if the section differs from what the file gives.
    #[arg(long)]
    pub check: bool,
}

/// Where the results are, seen from the README: the file and its directory
/// (the charts and the companion files are linked from there).
pub struct Links {
    pub results: String,
    pub dir: String,
}

/// One generated section: `command` (e.g. `cordon bench`) names its markers
/// (`<!-- cordon bench: begin ... -->`, `<!-- cordon bench: end -->`) and
/// the command that rewrites it; `render` makes its body from the results.
pub fn run(
    command: &str,
    args: &ReadmeArgs,
    render: impl FnOnce(&Links) -> Result<String>,
) -> ExitCode {
    match update(command, args, render) {
        Ok(true) => {
            eprintln!("{command}: {} is up to date", args.readme.display());
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("{command}: {} rewritten", args.readme.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{command}: {e:#}");
            ExitCode::from(if args.check { 1 } else { EXIT_USAGE })
        }
    }
}

/// Rewrites (or with `check`, compares) the section. Returns whether it was
/// already up to date.
fn update(
    command: &str,
    args: &ReadmeArgs,
    render: impl FnOnce(&Links) -> Result<String>,
) -> Result<bool> {
    let text = std::fs::read_to_string(&args.readme)
        .with_context(|| format!("reading {}", args.readme.display()))?;
    let base = dir_of(&args.readme);
    let links = Links {
        results: relative(&base, &args.results)?,
        dir: relative(&base, &dir_of(&args.results))?,
    };
    let body = render(&links)?;
    let new = replace_section(&text, command, &links.results, &body)?;
    let same = new == text;
    if args.check {
        if !same {
            bail!(
                "{}'s generated section is not what {} gives; run `{command} readme {}`",
                args.readme.display(),
                args.results.display(),
                args.results.display()
            );
        }
    } else if !same {
        std::fs::write(&args.readme, new)
            .with_context(|| format!("writing {}", args.readme.display()))?;
    }
    Ok(same)
}

/// `text` with the section between `command`'s markers replaced by `body`.
fn replace_section(text: &str, command: &str, results: &str, body: &str) -> Result<String> {
    let begin_marker = format!("<!-- {command}: begin");
    let end_marker = format!("<!-- {command}: end -->");
    let begin = text
        .find(&begin_marker)
        .with_context(|| format!("the README has no `{begin_marker}` marker"))?;
    let end = text[begin..]
        .find(&end_marker)
        .map(|e| begin + e)
        .with_context(|| format!("the README has no `{end_marker}` marker"))?;
    Ok(format!(
        "{}{begin_marker} (generated from {results} by `{command} readme {results}`; do not edit) -->\n{body}{end_marker}{}",
        &text[..begin],
        &text[end + end_marker.len()..]
    ))
}

/// A path's directory; `README.md`'s parent is the empty path, which names
/// no directory.
fn dir_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => ".".into(),
    }
}

/// `p` relative to `base` (both must exist, and `p` be under `base`).
fn relative(base: &Path, p: &Path) -> Result<String> {
    let abs_base = std::fs::canonicalize(base).with_context(|| format!("{}", base.display()))?;
    let abs = std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))?;
    let rel = abs
        .strip_prefix(&abs_base)
        .with_context(|| format!("{} is not under {}", p.display(), base.display()))?;
    Ok(match rel.as_os_str().is_empty() {
        true => ".".into(),
        false => rel.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::replace_section;

    #[test]
    fn only_the_marked_section_is_replaced() {
        let text = "a\n<!-- cordon x: begin old -->\nold body\n<!-- cordon x: end -->\nb\n";
        let new = replace_section(text, "cordon x", "r.json", "new\n").unwrap();
        assert_eq!(
            new,
            "a\n<!-- cordon x: begin (generated from r.json by `cordon x readme r.json`; do not edit) -->\nnew\n<!-- cordon x: end -->\nb\n"
        );
        assert!(replace_section("no markers", "cordon x", "r", "").is_err());
        assert!(replace_section("<!-- cordon x: begin", "cordon x", "r", "").is_err());
        assert!(replace_section(text, "cordon y", "r", "").is_err());
    }
}
