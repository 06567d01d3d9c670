//! The golden traffic scripts of `tests/golden/`, and `paceline simulate` run on them.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Every golden script (`NAME.jsonl`, not the expected `NAME.out.jsonl`), sorted.
pub fn scripts() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("tests/golden exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".jsonl") && !name.ends_with(".out.jsonl")
        })
        .collect();
    found.sort();
    found
}

/// A script's command-line arguments, from its first line `# args: ...`.
pub fn args_of(script: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(script).expect("readable script");
    let first = text.lines().next().unwrap_or_default();
    let args = first
        .strip_prefix("# args:")
        .unwrap_or_else(|| panic!("{}: first line must be `# args: ...`", script.display()));
    args.split_whitespace().map(str::to_string).collect()
}

/// `paceline simulate ARGS --input INPUT`.
pub fn simulate(args: &[String], input: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("simulate")
        .args(args)
        .arg("--input")
        .arg(input)
        .output()
        .expect("the paceline binary runs")
}
