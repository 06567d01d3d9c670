//! The layout rules of the workspace, checked: each crate depends only on the crates below
//! it (docs/architecture.md), and the service's modules import one way (no circle among
//! its files).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace's folder")
}

/// The paceline crates named in the `[dependencies]` table of `manifest` (not the
/// dev-dependencies: tests may use anything).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps {
            if let Some(name) = line.split(['=', ' ', '.']).next() {
                if name.starts_with("paceline") {
                    out.insert(name.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn each_crate_depends_only_on_the_crates_it_may() {
    // What each crate may depend on (docs/architecture.md, "The crates").
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("paceline-core", &[][..]),
        ("paceline-store", &["paceline-core"][..]),
        ("paceline-queue", &["paceline-core", "paceline-store"][..]),
        ("paceline-client", &["paceline-core", "paceline-store"][..]),
        ("paceline-tower", &["paceline-core", "paceline-store"][..]),
        (
            "paceline-server",
            &[
                "paceline-core",
                "paceline-store",
                "paceline-queue",
                "paceline-client",
                "paceline-tower",
            ][..],
        ),
        (
            "paceline-cli",
            &[
                "paceline-core",
                "paceline-store",
                "paceline-queue",
                "paceline-client",
                "paceline-tower",
                "paceline-server",
            ][..],
        ),
        (
            "paceline",
            &[
                "paceline-core",
                "paceline-store",
                "paceline-queue",
                "paceline-client",
                "paceline-tower",
            ][..],
        ),
        // The test kit, a dev-dependency only: the mock API speaks the client's dialects.
        (
            "paceline-testkit",
            &["paceline-core", "paceline-store", "paceline-client"][..],
        ),
    ]);
    let crates = workspace().join("crates");
    let mut seen = 0;
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let dir = entry.expect("an entry of crates/").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a crate folder's name")
            .to_string();
        let Some(may) = allowed.get(name.as_str()) else {
            panic!("crate {name} is not in the layering table: add it here and to docs/architecture.md");
        };
        seen += 1;
        for dependency in dependencies(&manifest) {
            assert!(
                may.contains(&dependency.as_str()),
                "{name} depends on {dependency}, which it may not (docs/architecture.md)"
            );
        }
    }
    assert_eq!(seen, allowed.len(), "every crate of the table was found");
}

/// The top-level module a source file of a crate's `src/` belongs to (`a.rs` and
/// `a/b.rs` both to `a`); `None` for the crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    (name != "lib" && name != "main").then(|| name.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text` names through `crate::`.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
            rest = after;
        }
        // `use crate::{a, b::c}`
        if let Some(at) = line.find("crate::{") {
            let list = &line[at + "crate::{".len()..];
            for part in list.split([',', '}']) {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// The first circle found in `graph`, as the modules along it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(found) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(found);
        }
    }
    None
}

#[test]
fn the_service_s_modules_import_one_way() {
    let src = workspace().join("crates/paceline-server/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let mut text = std::fs::read_to_string(file).expect("a source file");
        if file.parent() == Some(src.as_path()) {
            // In a file directly under src/, `super::` is the crate root.
            text = text.replace("super::", "crate::");
        }
        let names = imports(&text);
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(names.into_iter().filter(|n| *n != module));
    }
    // Only edges to modules of the crate count (`crate::Thing` re-exported by lib.rs is
    // not a module).
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for edges in graph.values_mut() {
        edges.retain(|n| modules.contains(n));
    }
    assert!(
        modules.len() > 5,
        "the service's modules were found: {modules:?}"
    );
    if let Some(found) = circle(&graph) {
        panic!(
            "the service's modules import in a circle: {}",
            found.join(" -> ")
        );
    }
}

#[test]
fn the_circle_finder_finds_circles() {
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let line = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::new()),
    ]);
    assert_eq!(circle(&line), None);
    assert_eq!(
        imports("use crate::{state::AppState, error::ApiError};\nlet x = crate::units::ms(1);"),
        BTreeSet::from(["state".into(), "error".into(), "units".into()])
    );
}
