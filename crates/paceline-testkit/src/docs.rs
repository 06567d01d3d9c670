//! The documents users read: the README and the guides, by their paths from the
//! workspace's root. The tests that run their code blocks and replay their transcripts all
//! read this one list, so a new guide is checked everywhere once it is added here.

/// The README and the guides under `docs/` that hold code (`docs/architecture.md` holds
/// none), as paths from the workspace's root.
///
/// ```
/// assert!(paceline_testkit::docs::DOCUMENTS.contains(&"README.md"));
/// ```
pub const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/library.md",
    "docs/policies.md",
    "docs/service.md",
    "docs/queue.md",
    "docs/client.md",
    "docs/tower.md",
    "docs/simulate.md",
    "docs/rls.md",
];
