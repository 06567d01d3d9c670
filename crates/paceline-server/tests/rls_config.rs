//! envoyproxy/ratelimit's YAML format: the examples of its configuration docs with the
//! requests they describe, each matching rule, and each way a file is refused.

use paceline_server::config::ConfigError;
use paceline_server::rls::{
    counting_key, match_request, Applies, Matched, RequestDescriptor, RlsConfig, RlsConfigError,
    Unit, UnitLimit, MAX_DEPTH,
};

fn config(yaml: &str) -> RlsConfig {
    RlsConfig::from_yaml("test.yaml", yaml).unwrap()
}

fn refused(yaml: &str) -> RlsConfigError {
    RlsConfig::from_yaml("test.yaml", yaml).unwrap_err()
}

fn desc<'r>(entries: &[(&'r str, &'r str)]) -> RequestDescriptor<'r> {
    RequestDescriptor {
        entries: entries.to_vec(),
        ..Default::default()
    }
}

fn one(config: &RlsConfig, domain: &str, entries: &[(&str, &str)]) -> Applies {
    match_request(config, domain, 1, &[desc(entries)]).remove(0)
}

/// The limit's policy spec and what matched; panics unless a limit applies.
fn limit(applies: &Applies) -> (String, &Matched) {
    match applies {
        Applies::Limit { matched, policy } => (policy.to_string(), matched),
        other => panic!("expected a limit, got {other:?}"),
    }
}

#[test]
fn example_1_two_values_of_one_key() {
    let c = config(
        "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
",
    );
    for value in ["users", "default"] {
        let applies = one(&c, "mongo_cps", &[("database", value)]);
        let (policy, m) = limit(&applies);
        assert_eq!(policy, "fixed_window:limit=500,window=1s");
        assert_eq!(m.rule_id, format!("mongo_cps.database_{value}"));
        assert_eq!(
            m.current_limit,
            Some(UnitLimit {
                requests_per_unit: 500,
                unit: Unit::Second
            })
        );
    }
    assert_eq!(
        one(&c, "mongo_cps", &[("database", "other")]),
        Applies::None
    );
}

const MESSAGING: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[test]
fn example_2_nested_rules_and_several_descriptors_in_one_request() {
    let c = config(MESSAGING);
    let applies = match_request(
        &c,
        "messaging",
        1,
        &[
            desc(&[("message_type", "marketing"), ("to_number", "2061111111")]),
            desc(&[("to_number", "2061111111")]),
        ],
    );
    let (policy, m) = limit(&applies[0]);
    assert_eq!(policy, "fixed_window:limit=5,window=1d");
    assert_eq!(m.rule_id, "messaging.message_type_marketing.to_number");
    let (policy, m2) = limit(&applies[1]);
    assert_eq!(policy, "fixed_window:limit=100,window=1d");
    assert_eq!(m2.rule_id, "messaging.to_number");
    assert_ne!(m.counting_key, m2.counting_key);
    // Each number is counted apart, under the same rule.
    let other = one(
        &c,
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2062222222")],
    );
    let (_, m3) = limit(&other);
    assert_eq!(m3.rule_id, m.rule_id);
    assert_ne!(m3.counting_key, m.counting_key);
    // The placeholder level has no limit of its own, and another type matches nothing.
    assert_eq!(
        one(&c, "messaging", &[("message_type", "marketing")]),
        Applies::None
    );
    assert_eq!(
        one(
            &c,
            "messaging",
            &[
                ("message_type", "transactional"),
                ("to_number", "2061111111")
            ]
        ),
        Applies::None
    );
}

#[test]
fn example_3_key_and_value_before_key_alone() {
    let c = config(
        "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    );
    let applies = one(&c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]);
    assert_eq!(limit(&applies).0, "fixed_window:limit=10,window=1s");
    match one(&c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]) {
        Applies::RefuseAll(m) => {
            assert_eq!(m.rule_id, "edge_proxy_per_ip.remote_address_50.0.0.5");
            assert_eq!(m.current_limit.map(|l| l.requests_per_unit), Some(0));
        }
        other => panic!("expected refuse-all, got {other:?}"),
    }
}

#[test]
fn example_4_a_rule_applies_only_at_the_request_depth() {
    let request = [("key", "value"), ("subkey", "subvalue")];
    let shallow = config(
        "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
    );
    assert_eq!(one(&shallow, "example4", &request), Applies::None);
    assert_eq!(
        limit(&one(&shallow, "example4", &[("key", "value")])).0,
        "fixed_window:limit=300,window=1s"
    );
    let nested = config(
        "
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
    );
    let applies = one(&nested, "example4", &request);
    assert_eq!(limit(&applies).0, "fixed_window:limit=300,window=1s");
    assert_eq!(one(&nested, "example4", &[("key", "value")]), Applies::None);
}

#[test]
fn example_5_unlimited() {
    let c = config(
        "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
    );
    match one(&c, "internal", &[("ldap", "anything")]) {
        Applies::Unlimited(m) => {
            assert_eq!(m.rule_id, "internal.ldap");
            assert_eq!(m.current_limit, None);
        }
        other => panic!("expected unlimited, got {other:?}"),
    }
    let applies = one(&c, "internal", &[("azure", "x")]);
    assert_eq!(limit(&applies).0, "fixed_window:limit=100,window=1m");
}

#[test]
fn example_6_shadow_mode() {
    let c = config(
        "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
",
    );
    let a = one(
        &c,
        "example6",
        &[("service", "auth-service"), ("user", "user-a")],
    );
    let (policy, m) = limit(&a);
    assert_eq!(policy, "fixed_window:limit=10,window=1s");
    assert!(m.shadow_mode);
    let b = one(
        &c,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
    );
    let (policy, m) = limit(&b);
    assert_eq!(policy, "fixed_window:limit=20,window=1s");
    assert!(!m.shadow_mode);
    assert_eq!(m.rule_id, "example6.service.user_user-b");
    assert_eq!(
        one(
            &c,
            "example6",
            &[("service", "auth-service"), ("user", "user-c")]
        ),
        Applies::None
    );
}

const EXAMPLE_7: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

#[test]
fn example_7_replaces() {
    let c = config(EXAMPLE_7);
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    let alone = one(&c, "example7", &first);
    let (policy, m) = limit(&alone);
    assert_eq!(policy, "fixed_window:limit=5,window=1s");
    assert_eq!(m.name.as_deref(), Some("specific_limit"));
    assert_eq!(
        limit(&one(&c, "example7", &second)).0,
        "fixed_window:limit=10,window=1s"
    );
    // Both in one request: the named limit is dropped, the replacing one applies.
    let both = match_request(&c, "example7", 1, &[desc(&first), desc(&second)]);
    assert_eq!(both[0], Applies::None);
    assert_eq!(limit(&both[1]).0, "fixed_window:limit=10,window=1s");
}

#[test]
fn replaces_by_an_unlimited_rule_and_of_a_refusing_rule() {
    let c = config(
        "
domain: d
descriptors:
  - key: a
    rate_limit: {name: strict, unit: second, requests_per_unit: 0}
  - key: b
    rate_limit:
      unlimited: true
      replaces: [{name: strict}]
",
    );
    assert!(matches!(one(&c, "d", &[("a", "1")]), Applies::RefuseAll(_)));
    let both = match_request(&c, "d", 1, &[desc(&[("a", "1")]), desc(&[("b", "1")])]);
    assert_eq!(both[0], Applies::None);
    assert!(matches!(both[1], Applies::Unlimited(_)));
}

#[test]
fn example_8_detailed_metric() {
    let c = config(
        "
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    for value in ["unspecified_value", "unspecified_value2"] {
        let applies = one(&c, "example8", &[("key1", value)]);
        let (policy, m) = limit(&applies);
        assert_eq!(policy, "fixed_window:limit=10,window=1m");
        assert!(m.detailed_metric);
        assert_eq!(m.rule_id, format!("example8.key1_{value}"));
    }
    let applies = one(&c, "example8", &[("key1", "value1")]);
    let (policy, m) = limit(&applies);
    assert_eq!(policy, "fixed_window:limit=20,window=1m");
    assert_eq!(m.rule_id, "example8.key1_value1");
}

#[test]
fn detailed_metric_names_every_entry_of_a_nested_request() {
    let c = config(
        "
domain: d
descriptors:
  - key: method
    descriptors:
      - key: path
        value: /api
        descriptors:
          - key: host
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 10}
",
    );
    let applies = one(
        &c,
        "d",
        &[("method", "GET"), ("path", "/api"), ("host", "h1")],
    );
    assert_eq!(limit(&applies).1.rule_id, "d.method_GET.path_/api.host_h1");
    let plain = one(&config(MESSAGING), "messaging", &[("to_number", "1")]);
    assert_eq!(limit(&plain).1.rule_id, "messaging.to_number");
}

#[test]
fn example_9_wildcard_counts_each_value_apart() {
    let c = config(
        "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    let one_ = one(&c, "example9", &[("key1", "value_1")]);
    let two = one(&c, "example9", &[("key1", "value_2")]);
    let (policy, m1) = limit(&one_);
    assert_eq!(policy, "fixed_window:limit=20,window=1m");
    assert_eq!(m1.rule_id, "example9.key1_value*");
    let (_, m2) = limit(&two);
    assert_ne!(m1.counting_key, m2.counting_key);
    assert_eq!(
        m1.counting_key,
        counting_key("example9", &[("key1", "value_1")])
    );
    assert_eq!(one(&c, "example9", &[("key1", "other")]), Applies::None);
    assert_eq!(one(&c, "example9", &[("key2", "value_1")]), Applies::None);
}

#[test]
fn exact_then_first_written_wildcard_then_key_alone() {
    let c = config(
        "
domain: d
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/users*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/users/me
    rate_limit: {unit: second, requests_per_unit: 4}
",
    );
    let spec = |v| limit(&one(&c, "d", &[("path", v)])).0;
    assert_eq!(spec("/api/users/me"), "fixed_window:limit=4,window=1s");
    // Both wildcards match: the first written wins, as envoyproxy/ratelimit does.
    assert_eq!(spec("/api/users/you"), "fixed_window:limit=2,window=1s");
    assert_eq!(spec("/api/x"), "fixed_window:limit=2,window=1s");
    assert_eq!(spec("/other"), "fixed_window:limit=1,window=1s");
}

#[test]
fn wildcards_at_a_nested_level_and_a_lone_star() {
    let c = config(
        "
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: '*'
        rate_limit: {unit: hour, requests_per_unit: 7}
",
    );
    let applies = one(&c, "d", &[("tenant", "t1"), ("path", "/anything")]);
    assert_eq!(limit(&applies).0, "fixed_window:limit=7,window=1h");
    let empty = one(&c, "d", &[("tenant", "t1"), ("path", "")]);
    assert_eq!(limit(&empty).0, "fixed_window:limit=7,window=1h");
}

#[test]
fn a_walk_stops_where_nothing_matches() {
    let c = config(
        "
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 9}
",
    );
    assert_eq!(
        limit(&one(&c, "d", &[("a", "1"), ("b", "2"), ("c", "3")])).0,
        "fixed_window:limit=9,window=1s"
    );
    assert_eq!(
        one(&c, "d", &[("a", "1"), ("x", "2"), ("c", "3")]),
        Applies::None
    );
    assert_eq!(one(&c, "d", &[("a", "1"), ("b", "2")]), Applies::None);
    assert_eq!(
        one(&c, "d", &[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]),
        Applies::None
    );
    assert_eq!(one(&c, "d", &[]), Applies::None);
}

#[test]
fn unknown_domain_and_unmatched_descriptor_apply_nothing() {
    let c = config(MESSAGING);
    assert_eq!(one(&c, "nope", &[("to_number", "1")]), Applies::None);
    assert_eq!(one(&c, "messaging", &[("from_number", "1")]), Applies::None);
    // A request's own limit needs a configured domain too.
    let own = RequestDescriptor {
        entries: vec![("to_number", "1")],
        limit: Some(UnitLimit {
            requests_per_unit: 3,
            unit: Unit::Minute,
        }),
        hits_addend: None,
    };
    assert_eq!(
        match_request(&c, "nope", 1, std::slice::from_ref(&own)),
        vec![Applies::None]
    );
}

#[test]
fn a_request_limit_applies_instead_of_the_rules_matched_or_not() {
    let c = config(
        "
domain: d
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {name: n, unit: second, requests_per_unit: 100}
",
    );
    let own = |key, rpu| RequestDescriptor {
        entries: vec![(key, "u1"), ("path", "")],
        limit: Some(UnitLimit {
            requests_per_unit: rpu,
            unit: Unit::Minute,
        }),
        hits_addend: None,
    };
    let applies = match_request(
        &c,
        "d",
        1,
        &[own("user", 3), own("nothing", 3), own("user", 0)],
    );
    let (policy, m) = limit(&applies[0]);
    assert_eq!(policy, "fixed_window:limit=3,window=1m");
    assert!(m.overridden);
    assert!(!m.shadow_mode);
    assert_eq!(m.name, None);
    assert_eq!(m.rule_id, "d.user_u1.path");
    assert_eq!(
        m.counting_key,
        counting_key("d", &[("user", "u1"), ("path", "")])
    );
    assert_eq!(limit(&applies[1]).0, "fixed_window:limit=3,window=1m");
    assert!(matches!(&applies[2], Applies::RefuseAll(m) if m.overridden));
}

#[test]
fn hits_come_from_the_descriptor_else_the_request_at_least_one() {
    let c = config(MESSAGING);
    let hits = |request: u64, own: Option<u64>| {
        let d = RequestDescriptor {
            entries: vec![("to_number", "1")],
            limit: None,
            hits_addend: own,
        };
        match_request(&c, "messaging", request, &[d])[0]
            .matched()
            .unwrap()
            .hits
    };
    assert_eq!(hits(0, None), 1);
    assert_eq!(hits(3, None), 3);
    assert_eq!(hits(3, Some(0)), 0);
    assert_eq!(hits(3, Some(7)), 7);
}

#[test]
fn policy_and_drain_extensions() {
    let c = config(
        "
domain: d
descriptors:
  - key: api
    rate_limit:
      policy: 'gcra:rate=10/s,burst=10'
      drain: true
      name: api
  - key: report
    rate_limit:
      policy: sliding_window:limit=100,window=1m
",
    );
    let applies = one(&c, "d", &[("api", "x")]);
    let (policy, m) = limit(&applies);
    assert_eq!(policy, "gcra:rate=10/s,burst=10");
    assert!(m.drain);
    assert_eq!(m.current_limit, None);
    let applies = one(&c, "d", &[("report", "x")]);
    let (policy, m) = limit(&applies);
    assert_eq!(policy, "sliding_window:limit=100,window=1m");
    assert!(!m.drain);
}

#[test]
fn units_in_any_case() {
    let c = config(
        "
domain: d
descriptors:
  - key: a
    rate_limit: {unit: SECOND, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: Hour, requests_per_unit: 1}
",
    );
    assert_eq!(
        limit(&one(&c, "d", &[("a", "")])).0,
        "fixed_window:limit=1,window=1s"
    );
    assert_eq!(
        limit(&one(&c, "d", &[("b", "")])).0,
        "fixed_window:limit=1,window=1h"
    );
}

#[test]
fn counting_keys_never_collide() {
    let a = counting_key("d", &[("a_b", "c")]);
    let b = counting_key("d", &[("a", "b_c")]);
    assert_ne!(a, b);
    assert_ne!(
        counting_key("d.a", &[("b", "c")]),
        counting_key("d", &[("a", "b"), ("c", "")])
    );
    assert_ne!(
        counting_key("d", &[("a", "1:b")]),
        counting_key("d", &[("a", ""), ("b", "")])
    );
    assert_eq!(a, counting_key("d", &[("a_b", "c")]));
    // Key and value are matched apart, too.
    let c = config(
        "
domain: d
descriptors:
  - key: a_b
    value: c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b_c
    rate_limit: {unit: second, requests_per_unit: 2}
",
    );
    assert_eq!(
        limit(&one(&c, "d", &[("a_b", "c")])).0,
        "fixed_window:limit=1,window=1s"
    );
    assert_eq!(
        limit(&one(&c, "d", &[("a", "b_c")])).0,
        "fixed_window:limit=2,window=1s"
    );
}

/// Asserts a refusal's line, field and a part of its message.
fn assert_refused(yaml: &str, line: usize, field: &str, says: &str) {
    let e = refused(yaml);
    assert_eq!(e.file, "test.yaml", "{e}");
    assert_eq!(e.line, Some(line), "{e}");
    assert_eq!(e.field, field, "{e}");
    assert!(e.message.contains(says), "{e}");
    assert!(
        e.to_string().starts_with(&format!("test.yaml:{line}:")),
        "{e}"
    );
}

#[test]
fn every_field_error_names_the_file_line_and_field() {
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    limit: 3\n",
        4,
        "descriptors[0].limit",
        "unknown field `limit`; a descriptor takes key, value, rate_limit",
    );
    assert_refused(
        "domain: d\nunit: second\n",
        2,
        "unit",
        "the file takes domain, descriptors",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: week\n      requests_per_unit: 1\n",
        5,
        "descriptors[0].rate_limit.unit",
        "`week` is not a unit; use second, minute, hour or day",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 1\n",
        5,
        "descriptors[0].rate_limit.unit",
        "is required",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
        6,
        "descriptors[0].rate_limit.unit",
        "cannot be set with `unlimited: true`",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      requests_per_unit: 5\n",
        6,
        "descriptors[0].rate_limit.requests_per_unit",
        "cannot be set with `unlimited: true`",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: ''\n",
        8,
        "descriptors[0].rate_limit.replaces[0].name",
        "is required",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      name: me\n      replaces:\n        - name: me\n",
        8,
        "descriptors[0].rate_limit.replaces[0].name",
        "cannot replace itself",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - value: v\n",
        3,
        "descriptors[0].key",
        "non-empty `key`",
    );
    assert_refused("descriptors:\n  - key: a\n", 1, "domain", "is required");
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
        4,
        "descriptors[0].rate_limit.requests_per_unit",
        "not a whole number from 0 to 4294967295",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
        4,
        "descriptors[0].rate_limit.requests_per_unit",
        "not a whole number",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
        4,
        "descriptors[0].shadow_mode",
        "must be true or false",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  key: a\n",
        3,
        "descriptors",
        "must be a list of descriptors, not a map",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n  - key: a\n    key: b\n",
        5,
        "descriptors[1].key",
        "set twice",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      policy: 'gcra:rate=10/s'\n      unit: second\n",
        5,
        "descriptors[0].rate_limit.policy",
        "cannot be set with `unit`",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      policy: 'bogus:x=1'\n",
        5,
        "descriptors[0].rate_limit.policy",
        "`bogus:x=1` is not a policy",
    );
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    value: [1]\n",
        4,
        "descriptors[0].value",
        "must be text, not a list",
    );
}

#[test]
fn a_key_and_value_twice_at_one_level_names_both_lines() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n";
    let e = refused(yaml);
    assert_eq!((e.line, e.field.as_str()), (Some(5), "descriptors[1]"));
    assert!(e.message.contains("(line 3)"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: k\n  - key: k\n");
    assert_eq!(e.line, Some(4));
    let e =
        refused("domain: d\ndescriptors:\n  - key: k\n    value: a*\n  - key: k\n    value: a*\n");
    assert_eq!(e.line, Some(5));
    // The same key and value at different levels or under different parents is fine.
    config("domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k\n  - key: j\n    descriptors:\n      - key: k\n");
}

#[test]
fn garbage_yaml_names_the_line() {
    let e = refused("domain: d\ndescriptors:\n  - key: [a\n  - key: b\n");
    assert_eq!(e.field, "yaml");
    assert!(e.line.is_some_and(|l| l >= 3), "{e}");
    assert!(e.message.starts_with("not valid YAML"), "{e}");
    let e = refused("domain: d\n  bad indent: 1\n");
    assert_eq!((e.field.as_str(), e.line), ("yaml", Some(2)));
    let e = refused("just text");
    assert!(e.message.contains("must be the file (a map)"), "{e}");
    let e = refused("domain: a\n---\ndomain: b\n");
    assert_eq!((e.field.as_str(), e.line), ("yaml", Some(2)));
    let e = refused("");
    assert_eq!((e.field.as_str(), e.line), ("domain", None));
}

fn nested(depth: usize) -> String {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for level in 0..depth {
        let pad = "    ".repeat(level);
        yaml.push_str(&format!("{pad}  - key: k{level}\n"));
        if level + 1 < depth {
            yaml.push_str(&format!("{pad}    descriptors:\n"));
        } else {
            yaml.push_str(&format!(
                "{pad}    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        }
    }
    yaml
}

#[test]
fn nesting_deeper_than_the_limit_is_refused_cleanly() {
    let c = config(&nested(MAX_DEPTH));
    let names: Vec<String> = (0..MAX_DEPTH).map(|i| format!("k{i}")).collect();
    let entries: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    assert_eq!(
        limit(&one(&c, "d", &entries)).0,
        "fixed_window:limit=1,window=1s"
    );
    let e = refused(&nested(MAX_DEPTH + 1));
    assert!(e.message.contains("nest"), "{e}");
    assert!(e.line.is_some());
    // Far deeper, in flow style: refused at the limit, no stack overflow.
    let deep = format!(
        "domain: d\ndescriptors: {}{}",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let e = refused(&deep);
    assert_eq!((e.field.as_str(), e.line), ("yaml", Some(2)));
    assert!(e.message.starts_with("not valid YAML"), "{e}");
    // Deep in block style: refused by the reader's own limit, naming the line.
    let e = refused(&nested(200));
    assert_eq!(e.field, "yaml");
    assert!(e.line.is_some_and(|l| l > 100), "{e}");
    assert!(e.message.contains("nested deeper than"), "{e}");
}

#[test]
fn aliases_expand_within_the_node_budget() {
    let c = config(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &lim {unit: second, requests_per_unit: 4}\n  - key: b\n    rate_limit: *lim\n",
    );
    assert_eq!(
        limit(&one(&c, "d", &[("b", "")])).0,
        "fixed_window:limit=4,window=1s"
    );
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let prev = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    let e = refused(&bomb);
    assert!(e.message.contains("YAML nodes"), "{e}");
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("paceline-rls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_folder_of_files_each_a_domain() {
    let dir = temp_dir("folder");
    std::fs::write(dir.join("b.yml"), MESSAGING).unwrap();
    std::fs::write(dir.join("a.yaml"), EXAMPLE_7).unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml: [").unwrap();
    std::fs::create_dir(dir.join("sub.yaml")).unwrap();
    let c = RlsConfig::load(&dir).unwrap();
    let names: Vec<&str> = c.domains().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["example7", "messaging"]);
    assert!(c.domain("messaging").unwrap().file.ends_with("b.yml"));
    assert!(matches!(
        one(&c, "messaging", &[("to_number", "1")]),
        Applies::Limit { .. }
    ));
    // One file on its own.
    let single = RlsConfig::load(&dir.join("a.yaml")).unwrap();
    assert!(single.domain("example7").is_some());
    assert!(single.domain("messaging").is_none());
    // The same domain in two files is refused, naming both.
    std::fs::write(dir.join("c.yaml"), MESSAGING).unwrap();
    let e = RlsConfig::load(&dir).unwrap_err();
    assert!(e.file.ends_with("c.yaml"), "{e}");
    assert_eq!(e.field, "domain");
    assert!(e.message.contains("b.yml"), "{e}");
    // An error inside a file names that file and line.
    std::fs::write(
        dir.join("c.yaml"),
        "domain: other\ndescriptors:\n  - key: a\n    oops: 1\n",
    )
    .unwrap();
    let e = RlsConfig::load(&dir).unwrap_err();
    assert!(e.file.ends_with("c.yaml") && e.line == Some(4), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_empty_and_huge_paths_are_refused() {
    let dir = temp_dir("paths");
    let e = RlsConfig::load(&dir).unwrap_err();
    assert!(e.message.contains("no .yaml or .yml file"), "{e}");
    let e = RlsConfig::load(&dir.join("absent.yaml")).unwrap_err();
    assert_eq!(e.field, "file");
    let huge = dir.join("huge.yaml");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(paceline_server::rls::MAX_FILE_BYTES + 1).unwrap();
    let e = RlsConfig::load(&huge).unwrap_err();
    assert!(e.message.contains("at most"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_error_converts_to_the_services_config_error() {
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: year}\n");
    let c: ConfigError = e.clone().into();
    assert_eq!(c.source, format!("test.yaml:4:{}", e.column.unwrap()));
    assert_eq!(c.field, "descriptors[0].rate_limit.unit");
}

#[test]
fn share_threshold_counts_every_value_of_a_wildcard_as_one() {
    let c = config(
        "
domain: d
descriptors:
  - key: path
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: models/*
    rate_limit: {unit: hour, requests_per_unit: 100}
",
    );
    let a = one(&c, "d", &[("path", "files/a.pdf")]);
    let b = one(&c, "d", &[("path", "files/b.csv")]);
    assert_eq!(limit(&a).1.counting_key, limit(&b).1.counting_key);
    assert_eq!(
        limit(&a).1.counting_key,
        counting_key("d", &[("path", "files/*")])
    );
    assert_eq!(limit(&a).1.rule_id, "d.path_files/*");
    let x = one(&c, "d", &[("path", "models/x")]);
    let y = one(&c, "d", &[("path", "models/y")]);
    assert_ne!(limit(&x).1.counting_key, limit(&y).1.counting_key);
    assert_refused(
        "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
        5,
        "descriptors[0].share_threshold",
        "only for a wildcard value",
    );
}

#[test]
fn value_to_metric_names_a_level_after_the_request() {
    let c = config(
        "
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        descriptors:
          - key: user
            value: u*
            value_to_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
",
    );
    let applies = one(
        &c,
        "d",
        &[("route", "/a"), ("method", "GET"), ("user", "u1")],
    );
    let (_, m) = limit(&applies);
    assert_eq!(m.rule_id, "d.route_/a.method.user_u1");
    assert_eq!(
        c.domain("d").unwrap().descriptors.rules[0]
            .descriptors
            .rules[0]
            .descriptors
            .rules[0]
            .id,
        "d.route.method.user_u*"
    );
}

#[test]
fn the_config_is_shared_across_threads_and_errors_give_columns() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<RlsConfig>();
    shared::<Applies>();
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n");
    assert_eq!((e.line, e.column), (Some(4), Some(24)));
    assert_eq!(
        e.to_string(),
        "test.yaml:4:24: `descriptors[0].rate_limit.unit`: `fortnight` is not a unit; use second, minute, hour or day"
    );
}
