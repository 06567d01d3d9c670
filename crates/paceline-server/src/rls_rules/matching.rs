//! What applies to each descriptor of a request: a pure function of the configuration and
//! the request (no clock, no store, no I/O).

use paceline_core::Policy;

use super::config::{Descriptor, Level, RlsConfig, RuleLimit, UnitLimit, Via};

/// One descriptor of a request, as the RLS protocol carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDescriptor<'r> {
    /// The entries, `(key, value)`, in order.
    pub entries: Vec<(&'r str, &'r str)>,
    /// The descriptor's own limit (`limit` in the protocol): it applies instead of the
    /// configured rules, matched or not, as long as the domain is configured.
    pub limit: Option<UnitLimit>,
    /// The descriptor's own `hits_addend` (0 checks without counting); `None`: the
    /// request's.
    pub hits_addend: Option<u64>,
}

/// What was matched, for the decision, the answer and the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched {
    /// The key to count under: the domain and the request's own keys and values, each part
    /// length-prefixed (`LEN:TEXT`), so two different descriptors never share a key. Every
    /// value is counted apart, a wildcard rule's too, unless the wildcard has
    /// `share_threshold` (then the wildcard stands for every value it matched).
    pub counting_key: String,
    /// The metrics name of what matched: the rule's path in the tree (`domain.key_value.key2`,
    /// with the request's value at a level with `value_to_metric`), or with `detailed_metric`
    /// (and for a request's own limit) the request's keys and values in that form.
    pub rule_id: String,
    /// Whether `rule_id` holds values the request chose (`detailed_metric`, a
    /// `value_to_metric` level the request's value named, or a request's own limit), so
    /// that the ids are not bounded by the rules: the metrics cap how many of them get
    /// series of their own.
    pub rule_id_from_request: bool,
    /// The rule's `name` (none for a request's own limit).
    pub name: Option<String>,
    /// `shadow_mode`: decide and count, but answer OK (never for a request's own limit).
    pub shadow_mode: bool,
    /// `detailed_metric`.
    pub detailed_metric: bool,
    /// `drain` (paceline's extension): the rule's hits are charged, counted past the limit
    /// and never refused.
    pub drain: bool,
    /// `requests_per_unit` and `unit` as configured (or as the request set them), for the
    /// answer's `current_limit`; none for `unlimited` and for a `policy` rule.
    pub current_limit: Option<UnitLimit>,
    /// The cost to charge: the descriptor's `hits_addend` if it has one (0 included), else
    /// the request's, at least 1.
    pub hits: u64,
    /// Whether the request's own `limit` applied instead of a rule.
    pub overridden: bool,
}

/// What applies to one request descriptor.
#[derive(Clone, Debug, PartialEq)]
pub enum Applies {
    /// No rule (unknown domain, nothing matched at the descriptor's depth, or the limit was
    /// replaced by another of the request's): OK, nothing counted.
    None,
    /// `unlimited: true`: OK, nothing counted; the answer's remaining is `u32::MAX`.
    Unlimited(Matched),
    /// `requests_per_unit: 0`: every request is over the limit (unless in shadow mode).
    RefuseAll(Matched),
    /// A limit to decide with `policy` under `matched.counting_key`.
    Limit {
        /// What matched.
        matched: Matched,
        /// The policy to decide with.
        policy: Policy,
    },
}

impl Applies {
    /// What matched, unless nothing applies.
    pub fn matched(&self) -> Option<&Matched> {
        match self {
            Applies::None => None,
            Applies::Unlimited(m) | Applies::RefuseAll(m) => Some(m),
            Applies::Limit { matched, .. } => Some(matched),
        }
    }
}

/// What applies to each of a request's descriptors, in order: each matched on its own, then
/// a limit whose `name` another matched limit `replaces` is dropped (an `unlimited` rule's
/// `replaces` count too). `hits_addend` is the request's (0 counts as 1).
///
/// ```
/// use paceline_server::rls::{match_request, Applies, RequestDescriptor, RlsConfig};
/// let config = RlsConfig::from_yaml("ip.yaml", "
/// domain: edge_proxy_per_ip
/// descriptors:
///   - key: remote_address
///     rate_limit: {unit: second, requests_per_unit: 10}
///   - key: remote_address
///     value: 50.0.0.5
///     rate_limit: {unit: second, requests_per_unit: 0}
/// ")?;
/// let ip = |v| RequestDescriptor { entries: vec![("remote_address", v)], ..Default::default() };
/// let applies = match_request(&config, "edge_proxy_per_ip", 0, &[ip("50.0.0.1"), ip("50.0.0.5")]);
/// let Applies::Limit { matched, policy } = &applies[0] else { panic!() };
/// assert_eq!(policy.to_string(), "fixed_window:limit=10,window=1s");
/// assert_eq!(matched.rule_id, "edge_proxy_per_ip.remote_address");
/// assert!(matches!(applies[1], Applies::RefuseAll(_)));
/// # Ok::<(), paceline_server::rls::RlsConfigError>(())
/// ```
pub fn match_request(
    config: &RlsConfig,
    domain: &str,
    hits_addend: u64,
    descriptors: &[RequestDescriptor<'_>],
) -> Vec<Applies> {
    let matched: Vec<(Applies, Option<&[String]>)> = descriptors
        .iter()
        .map(|d| match_one(config, domain, hits_addend, d))
        .collect();
    let replaced: Vec<&str> = matched
        .iter()
        .filter_map(|(_, r)| *r)
        .flatten()
        .map(String::as_str)
        .collect();
    matched
        .into_iter()
        .map(|(applies, _)| match &applies {
            Applies::RefuseAll(m) | Applies::Limit { matched: m, .. }
                if m.name.as_deref().is_some_and(|n| replaced.contains(&n)) =>
            {
                Applies::None
            }
            _ => applies,
        })
        .collect()
}

/// What applies to one descriptor on its own (before `replaces`), with the names its rule
/// replaces.
fn match_one<'c>(
    config: &'c RlsConfig,
    domain: &str,
    hits_addend: u64,
    request: &RequestDescriptor<'_>,
) -> (Applies, Option<&'c [String]>) {
    let Some(tree) = config.domain(domain) else {
        return (Applies::None, None);
    };
    let hits = request.hits_addend.unwrap_or(hits_addend.max(1));
    if let Some(limit) = request.limit {
        let matched = Matched {
            counting_key: counting_key(domain, &request.entries),
            rule_id: detailed_id(domain, &request.entries, false),
            rule_id_from_request: true,
            name: None,
            shadow_mode: false,
            detailed_metric: false,
            drain: false,
            current_limit: Some(limit),
            hits,
            overridden: true,
        };
        let applies = match limit.policy() {
            Some(policy) => Applies::Limit { matched, policy },
            None => Applies::RefuseAll(matched),
        };
        return (applies, None);
    }
    let Some(walk) = walk(&tree.descriptors, request) else {
        return (Applies::None, None);
    };
    let Some((rule, _)) = walk.last() else {
        return (Applies::None, None);
    };
    let Some(rate_limit) = &rule.rate_limit else {
        return (Applies::None, None);
    };
    // `share_threshold`: the values a wildcard matched count, and are named, as the wildcard.
    let entries: Vec<(&str, &str)> = request
        .entries
        .iter()
        .zip(&walk)
        .map(|((key, value), (step, via))| match (via, &step.value) {
            (Via::Wildcard, Some(pattern)) if step.share_threshold => (*key, pattern.as_str()),
            _ => (*key, *value),
        })
        .collect();
    let shared = walk
        .iter()
        .any(|(step, via)| *via == Via::Wildcard && step.share_threshold);
    let (rule_id, rule_id_from_request) = if rule.detailed_metric {
        (detailed_id(domain, &entries, !shared), true)
    } else {
        metric_id(domain, request, &walk)
    };
    let mut matched = Matched {
        counting_key: counting_key(domain, &entries),
        rule_id,
        rule_id_from_request,
        name: rate_limit.name.clone(),
        shadow_mode: rule.shadow_mode,
        detailed_metric: rule.detailed_metric,
        drain: rate_limit.drain,
        current_limit: None,
        hits,
        overridden: false,
    };
    let applies = match &rate_limit.limit {
        RuleLimit::Unlimited => Applies::Unlimited(matched),
        RuleLimit::Policy(policy) => Applies::Limit {
            matched,
            policy: policy.clone(),
        },
        RuleLimit::Unit { limit, policy } => {
            matched.current_limit = Some(*limit);
            match policy {
                Some(policy) => Applies::Limit {
                    matched,
                    policy: policy.clone(),
                },
                None => Applies::RefuseAll(matched),
            }
        }
    };
    (applies, Some(rate_limit.replaces.as_slice()))
}

/// Walks the tree entry by entry: the rule each entry found and how, if every entry found
/// one (a rule applies only at the request descriptor's own depth).
fn walk<'c>(
    level: &'c Level,
    request: &RequestDescriptor<'_>,
) -> Option<Vec<(&'c Descriptor, Via)>> {
    let mut level = level;
    let mut steps = Vec::with_capacity(request.entries.len());
    for (key, value) in &request.entries {
        if !steps.is_empty() && level.is_empty() {
            return None;
        }
        let (rule, via) = level.find_how(key, value)?;
        steps.push((rule, via));
        level = &rule.descriptors;
    }
    Some(steps)
}

/// The metrics name of a walk without `detailed_metric`: the rule's path in the tree, where
/// `value_to_metric` puts the request's value in place of a wildcard or of no value, and
/// `share_threshold` keeps the wildcard; and whether a value of the request's own is in it
/// (one `value_to_metric` put there, not one the rule names exactly).
fn metric_id(
    domain: &str,
    request: &RequestDescriptor<'_>,
    walk: &[(&Descriptor, Via)],
) -> (String, bool) {
    let mut out = domain.to_string();
    let mut from_request = false;
    for ((key, value), (step, via)) in request.entries.iter().zip(walk) {
        out.push('.');
        out.push_str(key);
        let shown = match via {
            Via::Wildcard if step.share_threshold || !step.value_to_metric => step.value.as_deref(),
            Via::AnyValue if !step.value_to_metric => None,
            Via::Exact => Some(*value).filter(|v| !v.is_empty()),
            _ => {
                from_request = true;
                Some(*value).filter(|v| !v.is_empty())
            }
        };
        if let Some(v) = shown {
            out.push('_');
            out.push_str(v);
        }
    }
    (out, from_request)
}

/// `LEN:domain` then `LEN:key` `LEN:value` for each entry (lengths in bytes): compact,
/// deterministic, and never the same for two different descriptors.
///
/// ```
/// use paceline_server::rls::counting_key;
/// assert_eq!(counting_key("d", &[("a_b", "c")]), "1:d3:a_b1:c");
/// assert_ne!(counting_key("d", &[("a_b", "c")]), counting_key("d", &[("a", "b_c")]));
/// ```
pub fn counting_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(
        domain.len()
            + 4
            + entries
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>(),
    );
    let mut part = |s: &str| {
        out.push_str(itoa::Buffer::new().format(s.len()));
        out.push(':');
        out.push_str(s);
    };
    part(domain);
    for (k, v) in entries {
        part(k);
        part(v);
    }
    out
}

/// `domain.key_value.key2_value2` from the request's entries. For a request's own limit an
/// empty value leaves `_value` out; with `detailed_metric` every entry keeps `_`, as
/// envoyproxy/ratelimit names them.
fn detailed_id(domain: &str, entries: &[(&str, &str)], keep_empty: bool) -> String {
    let mut out = domain.to_string();
    for (k, v) in entries {
        out.push('.');
        out.push_str(k);
        if keep_empty || !v.is_empty() {
            out.push('_');
            out.push_str(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_keys_are_length_prefixed() {
        assert_eq!(counting_key("dom", &[("k", "v1")]), "3:dom1:k2:v1");
        assert_eq!(counting_key("", &[("", "")]), "0:0:0:");
        assert_ne!(counting_key("", &[("", "")]), counting_key("", &[]));
    }

    #[test]
    fn rule_ids_say_whether_they_hold_a_request_s_values() {
        let config = RlsConfig::from_yaml(
            "ids.yaml",
            "
domain: d
descriptors:
  - key: exact
    value: v
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: any
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: named
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
",
        )
        .expect("rules");
        let id = |key: &str, value: &str, limit: Option<UnitLimit>| {
            let d = RequestDescriptor {
                entries: vec![(key, value)],
                limit,
                hits_addend: None,
            };
            let applies = match_request(&config, "d", 1, &[d]);
            let m = applies[0].matched().expect("a match");
            (m.rule_id.clone(), m.rule_id_from_request)
        };
        assert_eq!(id("exact", "v", None), ("d.exact_v".into(), false));
        assert_eq!(id("any", "x", None), ("d.any".into(), false));
        assert_eq!(id("named", "x", None), ("d.named_x".into(), true));
        assert_eq!(id("detailed", "x", None), ("d.detailed_x".into(), true));
        let own = UnitLimit {
            requests_per_unit: 5,
            unit: super::super::config::Unit::Minute,
        };
        assert_eq!(id("any", "x", Some(own)), ("d.any_x".into(), true));
    }

    #[test]
    fn detailed_ids_keep_or_drop_empty_values() {
        let entries = [("a", "1"), ("b", "")];
        assert_eq!(detailed_id("d", &entries, true), "d.a_1.b_");
        assert_eq!(detailed_id("d", &entries, false), "d.a_1.b");
    }
}
