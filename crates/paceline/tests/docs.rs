//! The README and the guides keep their Rust snippets honest.
//!
//! Every ```` ```rust ```` block of them is a doc test of this crate (see `guides` in
//! src/lib.rs), compiled and run. A block that needs a Redis, the network or a port of its
//! own is marked `no_run` there, and is instead an example of this crate, word for word:
//! its first line names the file (`// crates/paceline/examples/NAME.rs`), which
//! tests/examples.rs runs against private servers. This test holds each such block equal to
//! its file, and every fence to a language, so that no block is silently left out.

use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README and the guides, as src/lib.rs includes them as doc tests (docs/architecture.md
/// holds no Rust).
fn documents() -> Vec<PathBuf> {
    paceline_testkit::docs::DOCUMENTS
        .iter()
        .map(|path| root().join(path))
        .collect()
}

/// A fenced block: its info string (what follows the opening fence), its text, and the
/// line its fence opens on.
struct Block {
    info: String,
    text: String,
    line: usize,
}

/// The fenced blocks of a Markdown text (fences may be indented, as in a list).
fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String, Block)> = None;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let block = Block {
                        info: info.trim().to_string(),
                        text: String::new(),
                        line: n + 1,
                    };
                    open = Some((indent.to_string(), info.to_string(), block));
                }
            }
            Some((fence_indent, info, mut block)) => {
                if trimmed == "```" && indent == fence_indent {
                    blocks.push(block);
                } else {
                    block
                        .text
                        .push_str(line.strip_prefix(fence_indent.as_str()).unwrap_or(line));
                    block.text.push('\n');
                    open = Some((fence_indent, info, block));
                }
            }
        }
    }
    assert!(open.is_none(), "a fenced block is never closed");
    blocks
}

#[test]
fn every_no_run_snippet_is_an_example_word_for_word() {
    let mut examples = 0;
    for document in documents() {
        let markdown = std::fs::read_to_string(&document).expect("a readable document");
        for block in blocks(&markdown) {
            if block.info != "rust no_run" {
                continue;
            }
            let where_ = format!("{}:{}", document.display(), block.line);
            let first = block.text.lines().next().unwrap_or_default();
            let Some(path) = first
                .strip_prefix("// ")
                .filter(|p| p.starts_with("crates/paceline/examples/") && p.ends_with(".rs"))
            else {
                panic!(
                    "{where_}: a `rust no_run` block begins with the example it is, as \
                     `// crates/paceline/examples/NAME.rs`; it begins with `{first}`"
                );
            };
            let file = std::fs::read_to_string(root().join(path))
                .unwrap_or_else(|e| panic!("{where_}: {path}: {e}"));
            assert_eq!(
                block.text, file,
                "{where_}: the block differs from {path}; copy one onto the other"
            );
            examples += 1;
        }
    }
    assert!(
        examples >= 6,
        "only {examples} examples found in the documents"
    );
}

#[test]
fn every_fence_names_a_language_and_rust_blocks_run() {
    // A bare fence would be compiled as Rust; `sh` would hide bash-only syntax.
    let languages = [
        "rust",
        "rust no_run",
        "bash",
        "console",
        "toml",
        "json",
        "text",
    ];
    for document in documents() {
        let markdown = std::fs::read_to_string(&document).expect("a readable document");
        let found = blocks(&markdown);
        assert!(!found.is_empty(), "{}: no blocks", document.display());
        for block in found {
            assert!(
                languages.contains(&block.info.as_str()),
                "{}:{}: fence `{}`; use one of {languages:?} (rust blocks run, or are \
                 examples with `no_run`; shell is bash)",
                document.display(),
                block.line,
                block.info
            );
        }
    }
}

#[test]
fn the_readme_stays_short_and_keeps_its_two_setup_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("the README");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "the README has {lines} lines; move detail into docs/"
    );
    let setup = blocks(&readme)
        .into_iter()
        .find(|b| b.info == "bash")
        .expect("a bash block in the README");
    assert!(setup
        .text
        .lines()
        .any(|l| l.starts_with("cargo run --release -p paceline-cli -- serve --store memory")));
    // .ci/run runs this very command.
    assert!(setup.text.lines().any(|l| l == "scripts/test"));
}
