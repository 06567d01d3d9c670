//! The YAML files of envoyproxy/ratelimit's format read into an [`RlsConfig`]: one domain per
//! file, every field checked, each error naming the file, the line and the field.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::time::Duration;

use paceline_core::policy::FixedWindow;
use paceline_core::Policy;
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::config::ConfigError;

/// The deepest nesting of `descriptors` a file may hold (a deeper file is refused).
pub const MAX_DEPTH: usize = 64;

/// The largest file read, in bytes (a larger one is refused before it is parsed).
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// The most YAML nodes one file may hold once its aliases are expanded.
pub const MAX_NODES: usize = 1_000_000;

/// YAML collections nest two levels per descriptor (its list and its map), and a rate limit
/// adds up to three more (`rate_limit`, `replaces` and one replace).
const MAX_YAML_DEPTH: usize = 2 * MAX_DEPTH + 6;

/// An invalid rate limit configuration: the file, where in it, the field, what is allowed.
///
/// ```
/// use paceline_server::rls::RlsConfig;
/// let err = RlsConfig::from_yaml("limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, requests_per_unit: 1}\n").unwrap_err();
/// assert_eq!(err.line, Some(4));
/// assert_eq!(err.field, "descriptors[0].rate_limit.unit");
/// assert!(err.to_string().starts_with("limits.yaml:4:"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlsConfigError {
    /// The file (or folder) at fault.
    pub file: String,
    /// The line (from 1), where there is one.
    pub line: Option<usize>,
    /// The column (from 1), where there is one.
    pub column: Option<usize>,
    /// The field, e.g. `descriptors[0].rate_limit.unit`; `yaml` for a syntax error, `file`
    /// for one that cannot be read, `domain` for a domain named twice.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl RlsConfigError {
    fn at(file: &str, mark: Mark, field: &str, message: String) -> RlsConfigError {
        RlsConfigError {
            file: file.to_string(),
            line: Some(mark.line),
            column: Some(mark.column),
            field: field.to_string(),
            message,
        }
    }

    fn whole(file: &str, field: &str, message: String) -> RlsConfigError {
        RlsConfigError {
            file: file.to_string(),
            line: None,
            column: None,
            field: field.to_string(),
            message,
        }
    }

    /// `FILE:LINE:COLUMN` (as much of it as is known), the way [`ConfigError`] names a source.
    pub fn location(&self) -> String {
        match (self.line, self.column) {
            (Some(l), Some(c)) => format!("{}:{l}:{c}", self.file),
            (Some(l), None) => format!("{}:{l}", self.file),
            _ => self.file.clone(),
        }
    }
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}`: {}", self.location(), self.field, self.message)
    }
}

impl std::error::Error for RlsConfigError {}

impl From<RlsConfigError> for ConfigError {
    /// The service's config error, with `FILE:LINE:COLUMN` as its source.
    fn from(e: RlsConfigError) -> ConfigError {
        ConfigError {
            source: e.location(),
            field: e.field,
            message: e.message,
        }
    }
}

/// A rate limit's time unit, as envoyproxy/ratelimit's files name it (any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// `second`.
    Second,
    /// `minute`.
    Minute,
    /// `hour`.
    Hour,
    /// `day`.
    Day,
}

impl Unit {
    /// Reads `second`, `minute`, `hour` or `day`, in any case (`SECOND`, `Minute`).
    pub fn parse(text: &str) -> Option<Unit> {
        match text.to_ascii_lowercase().as_str() {
            "second" => Some(Unit::Second),
            "minute" => Some(Unit::Minute),
            "hour" => Some(Unit::Hour),
            "day" => Some(Unit::Day),
            _ => None,
        }
    }

    /// The unit's length in seconds (a window aligned to it spans this long).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
        }
    }

    /// The unit's name in lower case.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
        }
    }
}

/// `requests_per_unit` per `unit`: a limit as the RLS protocol states it (a rule's, or a
/// request's override).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitLimit {
    /// `requests_per_unit` (0 refuses every request).
    pub requests_per_unit: u32,
    /// `unit`.
    pub unit: Unit,
}

impl UnitLimit {
    /// The `fixed_window` policy deciding this limit: `requests_per_unit` per window of one
    /// `unit`, windows aligned to the unit; `None` for 0 (which refuses everything).
    ///
    /// ```
    /// use paceline_server::rls::{Unit, UnitLimit};
    /// let p = UnitLimit { requests_per_unit: 5, unit: Unit::Day }.policy().unwrap();
    /// assert_eq!(p.to_string(), "fixed_window:limit=5,window=1d");
    /// ```
    pub fn policy(&self) -> Option<Policy> {
        let window = Duration::from_secs(self.unit.seconds());
        FixedWindow::new(u64::from(self.requests_per_unit), window)
            .ok()
            .map(Policy::from)
    }
}

/// What a rule's `rate_limit` sets.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleLimit {
    /// `unit` and `requests_per_unit`: a `fixed_window` policy (`None` for 0 requests, which
    /// refuses every request).
    Unit {
        /// As configured, for the answer's `current_limit`.
        limit: UnitLimit,
        /// The policy deciding it, built once.
        policy: Option<Policy>,
    },
    /// `unlimited: true`: every request is OK and nothing is counted.
    Unlimited,
    /// `policy: "SPEC"` (paceline's extension): any paceline policy.
    Policy(Policy),
}

/// A descriptor's `rate_limit` block.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    /// The limit.
    pub limit: RuleLimit,
    /// `name`: what other rules' `replaces` name.
    pub name: Option<String>,
    /// `replaces[].name`: the limits this one drops when both match one request.
    pub replaces: Vec<String>,
    /// `drain` (paceline's extension): the rule's hits are charged after the answer, past
    /// the limit if need be.
    pub drain: bool,
}

/// One descriptor rule of the tree.
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// `key`.
    pub key: String,
    /// `value`: `None` matches any value (each value counted apart); a value ending in `*`
    /// matches every value starting with what comes before the `*`.
    pub value: Option<String>,
    /// `rate_limit`, if this rule sets one.
    pub rate_limit: Option<RateLimit>,
    /// `shadow_mode`: decide and count as usual, but always answer OK.
    pub shadow_mode: bool,
    /// `detailed_metric`: name the metrics after the request's values, not the rule's.
    pub detailed_metric: bool,
    /// `value_to_metric`: name this level of the metrics after the request's value where the
    /// rule has none or a wildcard.
    pub value_to_metric: bool,
    /// `share_threshold` (wildcard values only): every value the wildcard matches counts
    /// under one key, the wildcard's.
    pub share_threshold: bool,
    /// The rule's path in the tree, as metrics name it: `domain.key_value.key2`.
    pub id: String,
    /// The line the rule starts at.
    pub line: usize,
    /// The nested rules.
    pub descriptors: Level,
}

/// One level of rules: the list as written, and an index to find a request entry's rule.
#[derive(Clone, Debug, Default)]
pub struct Level {
    /// The rules in the order written.
    pub rules: Vec<Descriptor>,
    /// Per key: exact values, wildcards in the order written, and the rule with no value.
    index: HashMap<String, KeyRules>,
}

#[derive(Clone, Debug, Default)]
struct KeyRules {
    exact: HashMap<String, usize>,
    wildcards: Vec<(String, usize)>,
    any: Option<usize>,
}

impl Level {
    /// The rule for one request entry: an exact `key`+`value` rule, else the first wildcard
    /// (in the order written) whose prefix the value starts with, else the rule with the key
    /// and no value.
    pub fn find(&self, key: &str, value: &str) -> Option<&Descriptor> {
        self.find_how(key, value).map(|(rule, _)| rule)
    }

    /// [`Level::find`], and how the rule matched.
    pub(super) fn find_how(&self, key: &str, value: &str) -> Option<(&Descriptor, Via)> {
        let rules = self.index.get(key)?;
        let (i, via) = rules
            .exact
            .get(value)
            .map(|i| (*i, Via::Exact))
            .or_else(|| {
                rules
                    .wildcards
                    .iter()
                    .find(|(prefix, _)| value.starts_with(prefix.as_str()))
                    .map(|(_, i)| (*i, Via::Wildcard))
            })
            .or(rules.any.map(|i| (i, Via::AnyValue)))?;
        Some((self.rules.get(i)?, via))
    }

    /// Whether the level holds no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// How a request entry found its rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    /// The rule's value is the entry's.
    Exact,
    /// The rule's value is a wildcard the entry's value starts with.
    Wildcard,
    /// The rule has the key and no value.
    AnyValue,
}

/// One domain: its file and its rules.
#[derive(Clone, Debug)]
pub struct Domain {
    /// `domain`.
    pub name: String,
    /// The file it was read from.
    pub file: String,
    /// The top-level `descriptors`.
    pub descriptors: Level,
}

/// Every domain of a set of envoyproxy/ratelimit YAML files.
///
/// ```
/// use paceline_server::rls::RlsConfig;
/// let config = RlsConfig::from_yaml("mongo.yaml", "
/// domain: mongo_cps
/// descriptors:
///   - key: database
///     value: users
///     rate_limit: {unit: second, requests_per_unit: 500}
/// ")?;
/// assert_eq!(config.domain("mongo_cps").unwrap().descriptors.rules[0].id, "mongo_cps.database_users");
/// # Ok::<(), paceline_server::rls::RlsConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct RlsConfig {
    domains: BTreeMap<String, Domain>,
}

impl RlsConfig {
    /// Reads `path`: one YAML file, or a folder whose `.yaml` and `.yml` files are read in
    /// the order of their names (other files and sub-folders are left alone).
    pub fn load(path: &Path) -> Result<RlsConfig, RlsConfigError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path)
            .map_err(|e| RlsConfigError::whole(&shown, "file", format!("cannot read it: {e}")))?;
        if !meta.is_dir() {
            let text = read_text(path)?;
            return RlsConfig::from_files([(shown, text)]);
        }
        let entries = std::fs::read_dir(path).map_err(|e| {
            RlsConfigError::whole(&shown, "file", format!("cannot list the folder: {e}"))
        })?;
        let mut paths = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| {
                RlsConfigError::whole(&shown, "file", format!("cannot list the folder: {e}"))
            })?;
            let p = entry.path();
            let yaml = matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
            if yaml && p.is_file() {
                paths.push(p);
            }
        }
        if paths.is_empty() {
            return Err(RlsConfigError::whole(
                &shown,
                "file",
                "the folder holds no .yaml or .yml file; put one domain's rules in each".into(),
            ));
        }
        paths.sort();
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let text = read_text(&p)?;
            files.push((p.display().to_string(), text));
        }
        RlsConfig::from_files(files)
    }

    /// Reads one file's text; `file` names it in errors.
    pub fn from_yaml(file: &str, text: &str) -> Result<RlsConfig, RlsConfigError> {
        RlsConfig::from_files([(file.to_string(), text.to_string())])
    }

    /// Reads several files' text, `(name, text)` each, one domain per file; a domain in two
    /// files is refused, naming both.
    pub fn from_files<I>(files: I) -> Result<RlsConfig, RlsConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
        for (file, text) in files {
            let domain = parse_file(&file, &text)?;
            if let Some(first) = domains.get(&domain.name) {
                return Err(RlsConfigError::whole(
                    &file,
                    "domain",
                    format!(
                        "domain `{}` is already configured by {}; each domain must be in one file only",
                        domain.name, first.file
                    ),
                ));
            }
            domains.insert(domain.name.clone(), domain);
        }
        Ok(RlsConfig { domains })
    }

    /// A domain's rules.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The domains, by name.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }
}

fn read_text(path: &Path) -> Result<String, RlsConfigError> {
    let shown = path.display().to_string();
    let cannot =
        |e: std::io::Error| RlsConfigError::whole(&shown, "file", format!("cannot read it: {e}"));
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(RlsConfigError::whole(
            &shown,
            "file",
            format!(
                "it is {} bytes; a rate limit file may hold at most {MAX_FILE_BYTES} bytes",
                meta.len()
            ),
        ));
    }
    std::fs::read_to_string(path).map_err(cannot)
}

/// A place in a file: line and column from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    line: usize,
    column: usize,
}

impl From<Marker> for Mark {
    fn from(m: Marker) -> Mark {
        Mark {
            line: m.line(),
            column: m.col() + 1,
        }
    }
}

/// A YAML node with where it starts.
#[derive(Clone, Debug)]
struct Node {
    at: Mark,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// A scalar; `null` is a plain empty, `~` or `null` scalar.
    Scalar {
        text: String,
        null: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    fn size(&self) -> usize {
        match &self.kind {
            Kind::Scalar { .. } => 1,
            Kind::Seq(items) => 1 + items.iter().map(Node::size).sum::<usize>(),
            Kind::Map(entries) => {
                1 + entries
                    .iter()
                    .map(|(k, v)| k.size() + v.size())
                    .sum::<usize>()
            }
        }
    }

    fn kind_name(&self) -> &'static str {
        match &self.kind {
            Kind::Scalar { null: true, .. } => "nothing",
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a map",
        }
    }
}

enum Frame {
    Seq(Mark, usize, Vec<Node>),
    Map(Mark, usize, Vec<(Node, Node)>, Option<Node>),
}

/// Reads the YAML text into a tree of nodes, without recursion, refusing more than one
/// document, collections nested deeper than [`MAX_YAML_DEPTH`] and more than [`MAX_NODES`]
/// nodes.
fn read_yaml(file: &str, text: &str) -> Result<Option<Node>, RlsConfigError> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    let mut nodes = 0usize;
    let syntax = |mark: Mark, message: String| RlsConfigError::at(file, mark, "yaml", message);
    loop {
        let (event, marker) = parser.next_token().map_err(|e| {
            syntax(
                Mark::from(*e.marker()),
                format!("not valid YAML: {}", e.info()),
            )
        })?;
        let at = Mark::from(marker);
        let done: Option<(Node, usize)> = match event {
            Event::StreamEnd => break,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(syntax(
                        at,
                        "a second YAML document; a file holds one domain, in one document".into(),
                    ));
                }
                None
            }
            Event::Scalar(text, style, anchor, _) => {
                let null = style == TScalarStyle::Plain
                    && matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL");
                Some((
                    Node {
                        at,
                        kind: Kind::Scalar { text, null },
                    },
                    anchor,
                ))
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if stack.len() >= MAX_YAML_DEPTH {
                    return Err(syntax(
                        at,
                        format!(
                            "nested deeper than {MAX_YAML_DEPTH} levels; descriptors may nest at most {MAX_DEPTH} deep"
                        ),
                    ));
                }
                stack.push(if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq(at, anchor, Vec::new())
                } else {
                    Frame::Map(at, anchor, Vec::new(), None)
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq(at, anchor, items)) => Some((
                    Node {
                        at,
                        kind: Kind::Seq(items),
                    },
                    anchor,
                )),
                Some(Frame::Map(at, anchor, entries, _)) => Some((
                    Node {
                        at,
                        kind: Kind::Map(entries),
                    },
                    anchor,
                )),
                None => {
                    return Err(syntax(
                        at,
                        "a collection closed that was never opened".into(),
                    ))
                }
            },
            Event::Alias(id) => match anchors.get(&id) {
                Some(node) => {
                    nodes += node.size();
                    Some((Node { at, ..node.clone() }, 0))
                }
                None => return Err(syntax(at, "an alias to no anchor".into())),
            },
            _ => None,
        };
        let Some((node, anchor)) = done else {
            continue;
        };
        nodes += 1;
        if nodes > MAX_NODES {
            return Err(syntax(
                at,
                format!("more than {MAX_NODES} YAML nodes (aliases expanded); split the file"),
            ));
        }
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => root = Some(node),
            Some(Frame::Seq(_, _, items)) => items.push(node),
            Some(Frame::Map(_, _, entries, pending)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => entries.push((key, node)),
            },
        }
    }
    Ok(root)
}

/// The fields a map holds, each checked against what is allowed there.
struct Fields<'n> {
    entries: Vec<(&'n str, &'n Node)>,
}

impl<'n> Fields<'n> {
    fn new(
        file: &str,
        node: &'n Node,
        path: &str,
        what: &str,
        allowed: &[&str],
    ) -> Result<Fields<'n>, RlsConfigError> {
        let Kind::Map(entries) = &node.kind else {
            return Err(RlsConfigError::at(
                file,
                node.at,
                path,
                format!("must be {what} (a map), not {}", node.kind_name()),
            ));
        };
        let mut out: Vec<(&str, &Node)> = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            let name = match &k.kind {
                Kind::Scalar { text, null: false } => text.as_str(),
                _ => {
                    return Err(RlsConfigError::at(
                        file,
                        k.at,
                        path,
                        format!(
                            "a field's name must be text, not {}; use {}",
                            k.kind_name(),
                            allowed.join(", ")
                        ),
                    ))
                }
            };
            let field = join(path, name);
            if !allowed.contains(&name) {
                return Err(RlsConfigError::at(
                    file,
                    k.at,
                    &field,
                    format!(
                        "unknown field `{name}`; {what} takes {}",
                        allowed.join(", ")
                    ),
                ));
            }
            if out.iter().any(|(n, _)| *n == name) {
                return Err(RlsConfigError::at(
                    file,
                    k.at,
                    &field,
                    format!("`{name}` is set twice; set it once"),
                ));
            }
            out.push((name, v));
        }
        Ok(Fields { entries: out })
    }

    /// A field's node, unless absent or null.
    fn get(&self, name: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(n, v)| *n == name && !matches!(v.kind, Kind::Scalar { null: true, .. }))
            .map(|(_, v)| *v)
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn text<'n>(file: &str, node: &'n Node, field: &str) -> Result<&'n str, RlsConfigError> {
    match &node.kind {
        Kind::Scalar { text, .. } => Ok(text),
        _ => Err(RlsConfigError::at(
            file,
            node.at,
            field,
            format!("must be text, not {}", node.kind_name()),
        )),
    }
}

fn flag(file: &str, node: Option<&Node>, field: &str) -> Result<bool, RlsConfigError> {
    let Some(node) = node else {
        return Ok(false);
    };
    let value = match &node.kind {
        Kind::Scalar { text, .. } => match text.as_str() {
            "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
            "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
            _ => None,
        },
        _ => None,
    };
    value.ok_or_else(|| {
        RlsConfigError::at(file, node.at, field, "must be true or false".to_string())
    })
}

fn seq<'n>(
    file: &str,
    node: Option<&'n Node>,
    field: &str,
    what: &str,
) -> Result<&'n [Node], RlsConfigError> {
    match node.map(|n| (n, &n.kind)) {
        None => Ok(&[]),
        Some((_, Kind::Seq(items))) => Ok(items),
        Some((n, _)) => Err(RlsConfigError::at(
            file,
            n.at,
            field,
            format!("must be a list of {what}, not {}", n.kind_name()),
        )),
    }
}

const ROOT_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
];
const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "policy",
    "drain",
];
const REPLACES_FIELDS: &[&str] = &["name"];

fn parse_file(file: &str, source: &str) -> Result<Domain, RlsConfigError> {
    let root = read_yaml(file, source)?;
    let Some(root) = root.filter(|r| !matches!(r.kind, Kind::Scalar { null: true, .. })) else {
        return Err(RlsConfigError::whole(
            file,
            "domain",
            "the file is empty; it must set `domain` and `descriptors`".into(),
        ));
    };
    let fields = Fields::new(file, &root, "", "the file", ROOT_FIELDS)?;
    let name = match fields.get("domain") {
        Some(n) => text(file, n, "domain")?,
        None => "",
    };
    if name.is_empty() {
        return Err(RlsConfigError::at(
            file,
            root.at,
            "domain",
            "is required: a non-empty name, e.g. `domain: edge_proxy`".into(),
        ));
    }
    let descriptors = level(file, fields.get("descriptors"), "descriptors", name, 1)?;
    Ok(Domain {
        name: name.to_string(),
        file: file.to_string(),
        descriptors,
    })
}

fn level(
    file: &str,
    node: Option<&Node>,
    path: &str,
    parent_id: &str,
    depth: usize,
) -> Result<Level, RlsConfigError> {
    let items = seq(file, node, path, "descriptors")?;
    if depth > MAX_DEPTH && !items.is_empty() {
        return Err(RlsConfigError::at(
            file,
            items[0].at,
            path,
            format!("descriptors nest deeper than {MAX_DEPTH} levels; nest at most {MAX_DEPTH}"),
        ));
    }
    let mut out = Level::default();
    for (i, item) in items.iter().enumerate() {
        let here = format!("{path}[{i}]");
        let rule = descriptor(file, item, &here, parent_id, depth)?;
        let slot = out.index.entry(rule.key.clone()).or_default();
        let taken = match rule.value.as_deref() {
            None => slot.any,
            Some(v) => slot.exact.get(v).copied().or_else(|| {
                slot.wildcards
                    .iter()
                    .find(|(p, _)| v.strip_suffix('*') == Some(p.as_str()))
                    .map(|(_, j)| *j)
            }),
        };
        if let Some(j) = taken {
            let first = out.rules.get(j).map_or(0, |r| r.line);
            return Err(RlsConfigError::at(
                file,
                item.at,
                &here,
                format!(
                    "the key `{}`{} is already a rule at this level (line {first}); each key and value may appear once per level",
                    rule.key,
                    rule.value
                        .as_deref()
                        .map_or(String::new(), |v| format!(" with value `{v}`"))
                ),
            ));
        }
        let n = out.rules.len();
        match rule.value.as_deref() {
            None => slot.any = Some(n),
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => slot.wildcards.push((prefix.to_string(), n)),
                None => {
                    slot.exact.insert(v.to_string(), n);
                }
            },
        }
        out.rules.push(rule);
    }
    Ok(out)
}

fn descriptor(
    file: &str,
    node: &Node,
    path: &str,
    parent_id: &str,
    depth: usize,
) -> Result<Descriptor, RlsConfigError> {
    let fields = Fields::new(file, node, path, "a descriptor", DESCRIPTOR_FIELDS)?;
    let key_field = join(path, "key");
    let key = match fields.get("key") {
        Some(n) => text(file, n, &key_field)?,
        None => "",
    };
    if key.is_empty() {
        return Err(RlsConfigError::at(
            file,
            node.at,
            &key_field,
            "is required: every descriptor needs a non-empty `key`".into(),
        ));
    }
    let value = match fields.get("value") {
        Some(n) => Some(text(file, n, &join(path, "value"))?).filter(|v| !v.is_empty()),
        None => None,
    };
    let id = match value {
        Some(v) => format!("{parent_id}.{key}_{v}"),
        None => format!("{parent_id}.{key}"),
    };
    let rate_limit = match fields.get("rate_limit") {
        Some(n) => Some(rate_limit(file, n, &join(path, "rate_limit"))?),
        None => None,
    };
    let share_path = join(path, "share_threshold");
    let share_threshold = flag(file, fields.get("share_threshold"), &share_path)?;
    if share_threshold && !value.is_some_and(|v| v.ends_with('*')) {
        let at = fields.get("share_threshold").map_or(node.at, |n| n.at);
        return Err(RlsConfigError::at(
            file,
            at,
            &share_path,
            format!(
                "is only for a wildcard value (ending in `*`), and `{key}` has {}",
                value.map_or("no value".to_string(), |v| format!("the value `{v}`"))
            ),
        ));
    }
    let descriptors = level(
        file,
        fields.get("descriptors"),
        &join(path, "descriptors"),
        &id,
        depth + 1,
    )?;
    Ok(Descriptor {
        key: key.to_string(),
        value: value.map(str::to_string),
        rate_limit,
        shadow_mode: flag(file, fields.get("shadow_mode"), &join(path, "shadow_mode"))?,
        detailed_metric: flag(
            file,
            fields.get("detailed_metric"),
            &join(path, "detailed_metric"),
        )?,
        value_to_metric: flag(
            file,
            fields.get("value_to_metric"),
            &join(path, "value_to_metric"),
        )?,
        share_threshold,
        id,
        line: node.at.line,
        descriptors,
    })
}

fn rate_limit(file: &str, node: &Node, path: &str) -> Result<RateLimit, RlsConfigError> {
    let fields = Fields::new(file, node, path, "a rate_limit", RATE_LIMIT_FIELDS)?;
    let err = |n: &Node, name: &str, message: String| {
        RlsConfigError::at(file, n.at, &join(path, name), message)
    };
    let unlimited = flag(file, fields.get("unlimited"), &join(path, "unlimited"))?;
    let unit_node = fields.get("unit");
    let rpu_node = fields.get("requests_per_unit");
    let policy_node = fields.get("policy");
    if let Some(p) = policy_node {
        let other = [("unit", unit_node), ("requests_per_unit", rpu_node)]
            .into_iter()
            .find_map(|(name, n)| n.map(|_| name))
            .or(unlimited.then_some("unlimited"));
        if let Some(other) = other {
            return Err(err(
                p,
                "policy",
                format!("cannot be set with `{other}`; use either `policy` or `unit` and `requests_per_unit` (or `unlimited: true`)"),
            ));
        }
    }
    let limit = if unlimited {
        let other = [("unit", unit_node), ("requests_per_unit", rpu_node)]
            .into_iter()
            .find_map(|(name, n)| n.map(|n| (name, n)));
        if let Some((name, n)) = other {
            return Err(err(
                n,
                name,
                "cannot be set with `unlimited: true`; remove it, or remove `unlimited`".into(),
            ));
        }
        RuleLimit::Unlimited
    } else if let Some(p) = policy_node {
        let spec = text(file, p, &join(path, "policy"))?;
        let policy: Policy = spec.parse().map_err(|e: paceline_core::InputError| {
            err(
                p,
                "policy",
                format!("`{spec}` is not a policy: {}", e.message()),
            )
        })?;
        RuleLimit::Policy(policy)
    } else {
        let allowed = "use second, minute, hour or day";
        let unit = match unit_node {
            None => {
                return Err(RlsConfigError::at(
                    file,
                    node.at,
                    &join(path, "unit"),
                    format!("is required; {allowed} (or `unlimited: true`, or `policy`)"),
                ))
            }
            Some(n) => {
                let t = text(file, n, &join(path, "unit"))?;
                Unit::parse(t)
                    .ok_or_else(|| err(n, "unit", format!("`{t}` is not a unit; {allowed}")))?
            }
        };
        // As envoyproxy/ratelimit reads it, an absent `requests_per_unit` is 0.
        let requests_per_unit = match rpu_node {
            None => 0,
            Some(n) => {
                let t = text(file, n, &join(path, "requests_per_unit"))
                    .ok()
                    .filter(|_| matches!(n.kind, Kind::Scalar { .. }));
                let plain = t.map(|t| t.strip_prefix('+').unwrap_or(t));
                plain
                    .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|t| t.parse::<u32>().ok())
                    .ok_or_else(|| {
                        err(
                            n,
                            "requests_per_unit",
                            format!(
                                "`{}` is not a whole number from 0 to {}",
                                t.unwrap_or("?"),
                                u32::MAX
                            ),
                        )
                    })?
            }
        };
        let limit = UnitLimit {
            requests_per_unit,
            unit,
        };
        RuleLimit::Unit {
            limit,
            policy: limit.policy(),
        }
    };
    let name = match fields.get("name") {
        Some(n) => Some(text(file, n, &join(path, "name"))?).filter(|s| !s.is_empty()),
        None => None,
    };
    let replaces_path = join(path, "replaces");
    let mut replaces = Vec::new();
    for (i, item) in seq(file, fields.get("replaces"), &replaces_path, "{name: NAME}")?
        .iter()
        .enumerate()
    {
        let here = format!("{replaces_path}[{i}]");
        let entry = Fields::new(file, item, &here, "a replaces entry", REPLACES_FIELDS)?;
        let replaced = match entry.get("name") {
            Some(n) => text(file, n, &join(&here, "name"))?,
            None => "",
        };
        if replaced.is_empty() {
            return Err(RlsConfigError::at(
                file,
                item.at,
                &join(&here, "name"),
                "is required: the `name` of the rate limit this one replaces".into(),
            ));
        }
        if Some(replaced) == name {
            return Err(RlsConfigError::at(
                file,
                item.at,
                &join(&here, "name"),
                format!(
                    "`{replaced}` is this rate limit's own name; a limit cannot replace itself"
                ),
            ));
        }
        replaces.push(replaced.to_string());
    }
    Ok(RateLimit {
        limit,
        name: name.map(str::to_string),
        replaces,
        drain: flag(file, fields.get("drain"), &join(path, "drain"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(node: &Node) -> &str {
        match &node.kind {
            Kind::Scalar { text, .. } => text,
            other => panic!("not a scalar: {other:?}"),
        }
    }

    #[test]
    fn the_reader_marks_lines_and_columns_from_one() {
        let root = read_yaml("f", "a: 1\nb:\n  - c\n").unwrap().unwrap();
        let Kind::Map(entries) = &root.kind else {
            panic!("a map")
        };
        assert_eq!(scalar(&entries[0].0), "a");
        assert_eq!(entries[0].1.at, Mark { line: 1, column: 4 });
        let Kind::Seq(items) = &entries[1].1.kind else {
            panic!("a list")
        };
        assert_eq!(items[0].at, Mark { line: 3, column: 5 });
    }

    #[test]
    fn plain_nulls_are_null_and_quoted_ones_are_text() {
        let root = read_yaml("f", "a: ~\nb: 'null'\nc:\n").unwrap().unwrap();
        let Kind::Map(entries) = &root.kind else {
            panic!("a map")
        };
        let nulls: Vec<bool> = entries
            .iter()
            .map(|(_, v)| matches!(v.kind, Kind::Scalar { null: true, .. }))
            .collect();
        assert_eq!(nulls, [true, false, true]);
    }

    #[test]
    fn a_level_finds_exact_then_wildcard_then_any() {
        let config = RlsConfig::from_yaml(
            "f",
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n    value: ab*\n  - key: k\n    value: abc\n",
        )
        .unwrap();
        let level = &config.domain("d").unwrap().descriptors;
        let found = |v| level.find("k", v).and_then(|r| r.value.clone());
        assert_eq!(found("abc"), Some("abc".to_string()));
        assert_eq!(found("abd"), Some("ab*".to_string()));
        assert_eq!(found("x"), None);
        assert!(level.find("k", "x").is_some());
        assert!(level.find("j", "abc").is_none());
    }

    #[test]
    fn units_read_in_any_case_and_build_aligned_windows() {
        assert_eq!(Unit::parse("MiNuTe"), Some(Unit::Minute));
        assert_eq!(Unit::parse("week"), None);
        assert_eq!(Unit::Day.seconds(), 86_400);
        let limit = UnitLimit {
            requests_per_unit: 0,
            unit: Unit::Second,
        };
        assert_eq!(limit.policy(), None);
    }
}
