//! Envoy's rate limit service in process: rules from a YAML file, called with Envoy's own
//! gRPC client (and over `POST /json`), on the memory store, on Redis and on a Redis
//! Cluster. The clock is a `ManualClock`: no window turns during a test.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use paceline_server::config::RlsSettings;
use paceline_server::{Server, Settings};
use paceline_store::ManualClock;
use paceline_testkit::{shared_cluster, shared_server, unique_name};
use serde_json::{json, Value};
use std::io::Write;
use tonic::transport::Channel;

/// A running service with its RLS listener.
struct Rls {
    url: String,
    addr: std::net::SocketAddr,
    client: RateLimitServiceClient<Channel>,
    rules: PathBuf,
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Rls {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }

    async fn call(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.client
            .clone()
            .should_rate_limit(request)
            .await
            .expect("an answer")
            .into_inner()
    }

    async fn error(&self, request: RateLimitRequest) -> tonic::Status {
        self.client
            .clone()
            .should_rate_limit(request)
            .await
            .expect_err("an error")
    }
}

/// A folder of its own holding `rules.yaml`.
fn rules_file(yaml: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name("paceline-rls"));
    std::fs::create_dir_all(&dir).expect("a folder");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, yaml).expect("written");
    path
}

async fn start(store: &str, yaml: &str, headers: bool, clock: Arc<ManualClock>) -> Rls {
    start_with(store, rules_file(yaml), headers, clock).await
}

async fn start_with(store: &str, rules: PathBuf, headers: bool, clock: Arc<ManualClock>) -> Rls {
    let settings = Settings {
        store: store.to_string(),
        ..Settings::default()
    };
    start_settings(settings, rules, headers, clock).await
}

/// `settings` with an RLS listener on a free port and the rules of `rules`.
async fn start_settings(
    settings: Settings,
    rules: PathBuf,
    headers: bool,
    clock: Arc<ManualClock>,
) -> Rls {
    paceline_store::install_tls_provider();
    let settings = Settings {
        listen: "127.0.0.1:0".parse().expect("an address"),
        rls: RlsSettings {
            listen: Some("127.0.0.1:0".parse().expect("an address")),
            config: Some(rules.clone()),
            response_headers: headers,
        },
        ..settings
    };
    let server = Server::bind_with_clock(settings, clock)
        .await
        .expect("bind");
    let url = format!("http://{}", server.local_addr());
    let addr = server.rls_addr().expect("an RLS listener");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = server
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connected");
    Rls {
        url,
        addr,
        client,
        rules,
        task,
        stop,
    }
}

/// The clock's start, µs since the Unix epoch: on a whole second, 30 s into a minute and
/// an hour, 20 h 0 min 30 s into a (UTC) day.
const START_MICROS: u64 = 1_800_000_000_000_000 + 43_230_000_000;

fn clock() -> Arc<ManualClock> {
    // No window of a test turns unless the test advances the clock.
    Arc::new(ManualClock::new(START_MICROS))
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

fn one(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    request(domain, vec![descriptor(entries)])
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn readme(domain: &str) -> String {
    format!(
        "
domain: {domain}
descriptors:
  # Nested: a marketing message to one number, 5 a day; any message, 100 a day.
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {{unit: day, requests_per_unit: 5}}
  - key: to_number
    rate_limit: {{unit: day, requests_per_unit: 100}}
  # A wildcard: each path under /foo/ counted apart.
  - key: path
    value: /foo/*
    rate_limit: {{unit: minute, requests_per_unit: 2}}
  # Unlimited and refuse-all.
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {{unlimited: true}}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {{unit: second, requests_per_unit: 0}}
  - key: remote_address
    rate_limit: {{unit: second, requests_per_unit: 3}}
  # Replaces: a premium key's own limit drops the generic one.
  - key: key
    value: premium
    rate_limit: {{unit: minute, requests_per_unit: 4, name: premium, replaces: [{{name: generic}}]}}
  - key: api
    rate_limit: {{unit: minute, requests_per_unit: 1, name: generic}}
  # Shadow mode: counted, never refused.
  - key: shadow
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 1}}
  - key: shadow_zero
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 0}}
  # Two independent limits for all-or-nothing.
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 10}}
  - key: tenant
    rate_limit: {{unit: hour, requests_per_unit: 1}}
  # paceline's own policy.
  - key: gcra
    rate_limit: {{policy: \"gcra:rate=1/s,burst=2\"}}
"
    )
}

/// How a test asks the service: with Envoy's own gRPC client, or with `POST /json`.
#[derive(Clone, Copy, Debug)]
enum Via {
    Grpc,
    Json,
}

/// One descriptor's status, as either transport answers it.
#[derive(Debug, PartialEq)]
struct Status {
    code: i32,
    remaining: u32,
    /// `current_limit`: its requests per unit and its unit.
    limit: Option<(u32, i32)>,
    reset: Option<Duration>,
}

/// An answer, as either transport gives it: the overall code and each descriptor's status.
#[derive(Debug, PartialEq)]
struct Verdict {
    overall: i32,
    statuses: Vec<Status>,
}

impl Verdict {
    fn of_grpc(r: &RateLimitResponse) -> Verdict {
        let statuses = r
            .statuses
            .iter()
            .map(|s| Status {
                code: s.code,
                remaining: s.limit_remaining,
                limit: s
                    .current_limit
                    .as_ref()
                    .map(|l| (l.requests_per_unit, l.unit)),
                reset: s.duration_until_reset.as_ref().map(|d| {
                    Duration::new(
                        u64::try_from(d.seconds).expect("a duration of 0 or more"),
                        u32::try_from(d.nanos).expect("nanoseconds of 0 or more"),
                    )
                }),
            })
            .collect();
        Verdict {
            overall: r.overall_code,
            statuses,
        }
    }

    /// A `RateLimitResponse` in protobuf's JSON mapping, where a field left out is its
    /// default (0, UNKNOWN, none).
    fn of_json(answer: &Value) -> Verdict {
        let code = |v: Option<&Value>| match v {
            None => 0,
            Some(v) => v
                .as_str()
                .and_then(Code::from_str_name)
                .unwrap_or_else(|| panic!("a code by its name: {answer}"))
                as i32,
        };
        let number = |v: Option<&Value>| match v {
            None => 0,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or_else(|| panic!("a 32-bit number: {answer}")),
        };
        let statuses = match answer.get("statuses") {
            None => Vec::new(),
            Some(list) => list
                .as_array()
                .unwrap_or_else(|| panic!("statuses as an array: {answer}"))
                .iter()
                .map(|s| Status {
                    code: code(s.get("code")),
                    remaining: number(s.get("limitRemaining")),
                    limit: s.get("currentLimit").map(|l| {
                        let unit = l.get("unit").map_or(0, |u| {
                            u.as_str()
                                .and_then(Unit::from_str_name)
                                .unwrap_or_else(|| panic!("a unit by its name: {answer}"))
                                as i32
                        });
                        (number(l.get("requestsPerUnit")), unit)
                    }),
                    reset: s.get("durationUntilReset").map(|d| {
                        d.as_str()
                            .and_then(json_duration)
                            .unwrap_or_else(|| panic!("a duration: {answer}"))
                    }),
                })
                .collect(),
        };
        Verdict {
            overall: code(answer.get("overallCode")),
            statuses,
        }
    }
}

/// A protobuf `Duration` in its JSON mapping (`"30s"`, `"0.250s"`).
fn json_duration(text: &str) -> Option<Duration> {
    let seconds = text.strip_suffix('s')?;
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let nanos = format!("{fraction:0<9}").parse().ok()?;
    Some(Duration::new(whole.parse().ok()?, nanos))
}

/// `request` in protobuf's JSON mapping, as `POST /json` reads it.
fn json_request(r: &RateLimitRequest) -> Value {
    let descriptors: Vec<Value> = r
        .descriptors
        .iter()
        .map(|d| {
            let entries: Vec<Value> = d
                .entries
                .iter()
                .map(|e| json!({"key": e.key, "value": e.value}))
                .collect();
            let mut out = json!({ "entries": entries });
            if let Some(hits) = &d.hits_addend {
                out["hitsAddend"] = json!(hits.value);
            }
            if let Some(limit) = &d.limit {
                let unit = RateLimitUnit::try_from(limit.unit)
                    .map_or_else(|_| json!(limit.unit), |u| json!(u.as_str_name()));
                out["limit"] = json!({"requestsPerUnit": limit.requests_per_unit, "unit": unit});
            }
            if d.is_negative_hits {
                out["isNegativeHits"] = json!(true);
            }
            out
        })
        .collect();
    json!({"domain": r.domain, "hitsAddend": r.hits_addend, "descriptors": descriptors})
}

impl Rls {
    /// `request` sent `via` a transport, its answer as a [`Verdict`]; on `/json`, the HTTP
    /// status is checked too: 200, or 429 when over the limit.
    async fn ask(&self, via: Via, request: RateLimitRequest) -> Verdict {
        match via {
            Via::Grpc => Verdict::of_grpc(&self.call(request).await),
            Via::Json => {
                let (status, answer) = post_json(&self.url, json_request(&request)).await;
                let verdict = Verdict::of_json(&answer);
                let expected = if verdict.overall == OVER { 429 } else { 200 };
                assert_eq!(status, expected, "{answer}");
                verdict
            }
        }
    }
}

const SECOND: i32 = Unit::Second as i32;
const MINUTE: i32 = Unit::Minute as i32;
const DAY: i32 = Unit::Day as i32;

/// What is left of the window of `unit` at the clock's start: windows are aligned to
/// their unit, and the clock starts on a whole second.
fn window_left(unit: i32) -> Duration {
    let length = match Unit::try_from(unit) {
        Ok(Unit::Second) => 1,
        Ok(Unit::Minute) => 60,
        Ok(Unit::Hour) => 3_600,
        Ok(Unit::Day) => 86_400,
        other => panic!("no window for {other:?}"),
    };
    Duration::from_secs(length - START_MICROS / 1_000_000 % length)
}

/// The status of a limit of `per` a `unit`, decided in the store.
fn limited(code: i32, remaining: u32, per: u32, unit: i32) -> Status {
    Status {
        code,
        remaining,
        limit: Some((per, unit)),
        reset: Some(window_left(unit)),
    }
}

/// The status of a descriptor no rule limits.
fn no_limit() -> Status {
    Status {
        code: OK,
        remaining: 0,
        limit: None,
        reset: None,
    }
}

/// The status of an `unlimited` rule: OK, MaxUint32 remaining.
fn unlimited() -> Status {
    Status {
        code: OK,
        remaining: u32::MAX,
        limit: None,
        reset: None,
    }
}

/// The status of a rule of `requests_per_unit: 0`.
fn refuse_all(unit: i32) -> Status {
    Status {
        code: OVER,
        remaining: 0,
        limit: Some((0, unit)),
        reset: None,
    }
}

fn verdict(overall: i32, statuses: Vec<Status>) -> Verdict {
    Verdict { overall, statuses }
}

/// `request` counting `hits` (its `hits_addend`).
fn adding(hits: u32, request: RateLimitRequest) -> RateLimitRequest {
    RateLimitRequest {
        hits_addend: hits,
        ..request
    }
}

/// The configuration examples of envoyproxy/ratelimit's README, each a domain's name and
/// its descriptors (example 4 twice: the rule a request of two entries does not match, and
/// the one it does), then a rule of paceline's own.
const README_EXAMPLES: [(&str, &str); 11] = [
    (
        "mongo_cps",
        "
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
    ),
    (
        "messaging",
        "
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
",
    ),
    (
        "edge_proxy_per_ip",
        "
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    ),
    (
        "example4",
        "
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
    ),
    (
        "example4_nested",
        "
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
    ),
    (
        "internal",
        "
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
    ),
    (
        "example6",
        "
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
    ),
    (
        "example7",
        "
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
",
    ),
    (
        "example8",
        "
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
    ),
    (
        "example9",
        "
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    ),
    (
        "paceline",
        "
  - key: gcra
    rate_limit: {policy: \"gcra:rate=1/s,burst=2\"}
",
    ),
];

/// A folder of the README's examples, a file each, every domain's name followed by `tag`.
fn readme_rules(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name("paceline-rls-readme"));
    std::fs::create_dir_all(&dir).expect("a folder");
    for (i, (domain, descriptors)) in README_EXAMPLES.iter().enumerate() {
        let yaml = format!("domain: {domain}{tag}\ndescriptors:{descriptors}");
        std::fs::write(dir.join(format!("{i:02}-{domain}.yaml")), yaml).expect("written");
    }
    dir
}

/// A service serving the README's examples, asked through one transport. `tag` makes its
/// domains its own (`mongo_cps{tag}`), so that runs on one store count apart.
struct Readme {
    rls: Rls,
    via: Via,
    tag: String,
}

impl Readme {
    fn domain(&self, name: &str) -> String {
        format!("{name}{}", self.tag)
    }

    async fn expect(&self, request: RateLimitRequest, expected: Verdict) {
        let got = self.rls.ask(self.via, request.clone()).await;
        assert_eq!(got, expected, "{:?}: {request:?}", self.via);
    }
}

/// Example 1: two values of one key, 500 a second each, counted apart; another value of
/// the key has no rule.
async fn example_1(r: &Readme) {
    let d = r.domain("mongo_cps");
    let database = |value: &str, hits| adding(hits, one(&d, &[("database", value)]));
    for value in ["users", "default"] {
        let left = |left| verdict(OK, vec![limited(OK, left, 500, SECOND)]);
        r.expect(database(value, 1), left(499)).await;
        r.expect(database(value, 499), left(0)).await;
        let over = verdict(OVER, vec![limited(OVER, 0, 500, SECOND)]);
        r.expect(database(value, 1), over).await;
    }
    r.expect(database("other", 1), verdict(OK, vec![no_limit()]))
        .await;
}

/// Example 2: 5 marketing messages a day to a number (a nested rule under a placeholder),
/// 100 messages a day to any number; one request of both descriptors is limited by both,
/// its overall code their logical or. (All or nothing, paceline's difference: the refused
/// request counts on neither.)
async fn example_2(r: &Readme) {
    let d = r.domain("messaging");
    let marketing = |to: &str| descriptor(&[("message_type", "marketing"), ("to_number", to)]);
    let any = |to: &str| descriptor(&[("to_number", to)]);
    let both = |to: &str| request(&d, vec![marketing(to), any(to)]);
    for sent in 0..5 {
        let statuses = vec![
            limited(OK, 4 - sent, 5, DAY),
            limited(OK, 99 - sent, 100, DAY),
        ];
        r.expect(both("2061111111"), verdict(OK, statuses)).await;
    }
    let statuses = vec![limited(OVER, 0, 5, DAY), limited(OK, 95, 100, DAY)];
    r.expect(both("2061111111"), verdict(OVER, statuses)).await;
    let alone = request(&d, vec![any("2061111111")]);
    r.expect(alone, verdict(OK, vec![limited(OK, 94, 100, DAY)]))
        .await;
    // Each number has its own 5 and its own 100.
    let statuses = vec![limited(OK, 4, 5, DAY), limited(OK, 99, 100, DAY)];
    r.expect(both("2062222222"), verdict(OK, statuses)).await;
    // The placeholder has no limit of its own; another type of message matches nothing.
    r.expect(
        one(&d, &[("message_type", "marketing")]),
        verdict(OK, vec![no_limit()]),
    )
    .await;
    r.expect(
        one(
            &d,
            &[
                ("message_type", "transactional"),
                ("to_number", "2061111111"),
            ],
        ),
        verdict(OK, vec![no_limit()]),
    )
    .await;
}

/// Example 3: 10 a second for each address; key and value match before key alone, so
/// 50.0.0.5 is refused from its first request.
async fn example_3(r: &Readme) {
    let d = r.domain("edge_proxy_per_ip");
    let from = |address: &str, hits| adding(hits, one(&d, &[("remote_address", address)]));
    let ten = |code, left| verdict(code, vec![limited(code, left, 10, SECOND)]);
    r.expect(from("50.0.0.1", 10), ten(OK, 0)).await;
    r.expect(from("50.0.0.1", 1), ten(OVER, 0)).await;
    r.expect(from("50.0.0.2", 1), ten(OK, 9)).await;
    for _ in 0..2 {
        r.expect(from("50.0.0.5", 1), verdict(OVER, vec![refuse_all(SECOND)]))
            .await;
    }
}

/// Example 4: a rule applies only at the depth of the request's descriptor: a request of
/// two entries does not match a rule of the first level, and matches the nested one.
async fn example_4(r: &Readme) {
    let shallow = r.domain("example4");
    let nested = r.domain("example4_nested");
    let two = [("key", "value"), ("subkey", "subvalue")];
    let left = |left| verdict(OK, vec![limited(OK, left, 300, SECOND)]);
    let none = || verdict(OK, vec![no_limit()]);
    r.expect(one(&shallow, &two), none()).await;
    r.expect(one(&shallow, &[("key", "value")]), left(299))
        .await;
    r.expect(one(&nested, &two), left(299)).await;
    r.expect(one(&nested, &two), left(298)).await;
    // The nested rule has no value: each subkey's value counts apart.
    r.expect(
        one(&nested, &[("key", "value"), ("subkey", "other")]),
        left(299),
    )
    .await;
    r.expect(one(&nested, &[("key", "value")]), none()).await;
    let three = [("key", "value"), ("subkey", "subvalue"), ("more", "x")];
    r.expect(one(&nested, &three), none()).await;
}

/// Example 5: an unlimited rule answers OK with MaxUint32 remaining, whatever it is sent;
/// beside it, a limit of 100 a minute.
async fn example_5(r: &Readme) {
    let d = r.domain("internal");
    for hits in [1, 1, 1_000_000] {
        r.expect(
            adding(hits, one(&d, &[("ldap", "anything")])),
            verdict(OK, vec![unlimited()]),
        )
        .await;
    }
    r.expect(
        one(&d, &[("azure", "x")]),
        verdict(OK, vec![limited(OK, 99, 100, MINUTE)]),
    )
    .await;
}

/// Example 6: user-a's rule is in shadow mode: always OK, its breaches counted in the
/// metrics; user-b is limited to 20 a second.
async fn example_6(r: &Readme) {
    let d = r.domain("example6");
    let user = |name: &str, hits| {
        adding(
            hits,
            one(&d, &[("service", "auth-service"), ("user", name)]),
        )
    };
    let a = || verdict(OK, vec![limited(OK, 0, 10, SECOND)]);
    r.expect(user("user-a", 10), a()).await;
    for _ in 0..5 {
        r.expect(user("user-a", 1), a()).await;
    }
    let b = |code| verdict(code, vec![limited(code, 0, 20, SECOND)]);
    r.expect(user("user-b", 20), b(OK)).await;
    r.expect(user("user-b", 1), b(OVER)).await;
    r.expect(user("user-c", 1), verdict(OK, vec![no_limit()]))
        .await;
    // [hits, over limit, near limit, within limit, shadow mode]: 10 at once (2 of them
    // past 80 %), then 5 over the limit that shadow mode let through.
    let samples = metrics(&r.rls.url).await;
    let rule = format!("{d}.service.user_user-a");
    assert_eq!(
        rule_counts(&samples, &rule),
        [15, 5, 2, 10, 5],
        "{:?}",
        r.via
    );
}

/// Example 7: with both descriptors, the limit that replaces (10 a second) applies and
/// the named one it replaces (5 a second) neither applies nor counts.
async fn example_7(r: &Readme) {
    let d = r.domain("example7");
    let first = || descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let second = || descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    let five = |code, left| verdict(code, vec![limited(code, left, 5, SECOND)]);
    // 7 at once: more than the 5, within the 10.
    r.expect(
        adding(7, request(&d, vec![first(), second()])),
        verdict(OK, vec![no_limit(), limited(OK, 3, 10, SECOND)]),
    )
    .await;
    r.expect(request(&d, vec![first()]), five(OK, 4)).await;
    r.expect(
        adding(3, request(&d, vec![second()])),
        verdict(OK, vec![limited(OK, 0, 10, SECOND)]),
    )
    .await;
    r.expect(
        request(&d, vec![first(), second()]),
        verdict(OVER, vec![no_limit(), limited(OVER, 0, 10, SECOND)]),
    )
    .await;
    r.expect(adding(4, request(&d, vec![first()])), five(OK, 0))
        .await;
    r.expect(request(&d, vec![first()]), five(OVER, 0)).await;
}

/// Example 8: `detailed_metric` limits as usual (10 a minute for each value without a
/// rule of its own, 20 for value1) and names each value's series after the value.
async fn example_8(r: &Readme) {
    let d = r.domain("example8");
    let key1 = |value: &str, hits| adding(hits, one(&d, &[("key1", value)]));
    let ten = |code, left| verdict(code, vec![limited(code, left, 10, MINUTE)]);
    r.expect(key1("unspecified_value", 10), ten(OK, 0)).await;
    r.expect(key1("unspecified_value", 1), ten(OVER, 0)).await;
    r.expect(key1("unspecified_value2", 1), ten(OK, 9)).await;
    r.expect(
        key1("value1", 1),
        verdict(OK, vec![limited(OK, 19, 20, MINUTE)]),
    )
    .await;
    let samples = metrics(&r.rls.url).await;
    let rule = |name: &str| format!("{d}.{name}");
    // [hits, over limit, near limit, within limit, shadow mode]
    for (name, counts) in [
        ("key1_unspecified_value", [11, 1, 2, 10, 0]),
        ("key1_unspecified_value2", [1, 0, 0, 1, 0]),
        ("key1_value1", [1, 0, 0, 1, 0]),
    ] {
        assert_eq!(rule_counts(&samples, &rule(name)), counts, "{name}");
    }
    let rolled_up = rule("key1");
    assert!(
        !samples
            .iter()
            .any(|s| s.labels.iter().any(|(_, v)| *v == rolled_up)),
        "a series of {rolled_up}"
    );
}

/// Example 9: a trailing `*` matches every value with its prefix, each counted apart.
async fn example_9(r: &Readme) {
    let d = r.domain("example9");
    let key1 = |value: &str, hits| adding(hits, one(&d, &[("key1", value)]));
    let twenty = |code, left| verdict(code, vec![limited(code, left, 20, MINUTE)]);
    r.expect(key1("value_1", 20), twenty(OK, 0)).await;
    r.expect(key1("value_1", 1), twenty(OVER, 0)).await;
    r.expect(key1("value_2", 1), twenty(OK, 19)).await;
    r.expect(key1("other", 1), verdict(OK, vec![no_limit()]))
        .await;
}

/// Beyond the README: a rule with a paceline policy (GCRA, a burst of 2) answers its
/// decision's remaining and no `current_limit`; an unknown domain is OK with no limit.
async fn beyond_the_readme(r: &Readme) {
    let d = r.domain("paceline");
    for (code, left) in [(OK, 1), (OK, 0), (OVER, 0)] {
        let got = r.rls.ask(r.via, one(&d, &[("gcra", "a")])).await;
        assert_eq!(got.overall, code, "{:?}: {got:?}", r.via);
        let [status] = &got.statuses[..] else {
            panic!("one status: {got:?}");
        };
        assert_eq!(
            (status.code, status.remaining, status.limit),
            (code, left, None),
            "{:?}",
            r.via
        );
        assert!(status.reset.is_some(), "{:?}: {got:?}", r.via);
    }
    r.expect(
        one("no-such-domain", &[("user", "u")]),
        verdict(OK, vec![no_limit()]),
    )
    .await;
}

/// Every configuration example of envoyproxy/ratelimit's README, through gRPC and through
/// `POST /json`, each transport on a service (and domains) of its own.
async fn readme_examples(store: &str) {
    for via in [Via::Grpc, Via::Json] {
        let tag = unique_name("");
        let rls = start_with(store, readme_rules(&tag), false, clock()).await;
        let r = Readme { rls, via, tag };
        example_1(&r).await;
        example_2(&r).await;
        example_3(&r).await;
        example_4(&r).await;
        example_5(&r).await;
        example_6(&r).await;
        example_7(&r).await;
        example_8(&r).await;
        example_9(&r).await;
        beyond_the_readme(&r).await;
        r.rls.stop().await;
    }
}

#[tokio::test]
async fn readme_examples_on_memory() {
    readme_examples("memory").await;
}

#[tokio::test]
async fn readme_examples_on_redis() {
    readme_examples(&shared_server().url()).await;
}

#[tokio::test]
async fn readme_examples_on_a_redis_cluster() {
    readme_examples(&shared_cluster().url()).await;
}

/// Two descriptors, one over its limit: refused, and the other's counter did not move.
async fn all_or_nothing(store: &str) {
    let domain = unique_name("all");
    let rls = start(store, &readme(&domain), false, clock()).await;
    let both = || {
        request(
            &domain,
            vec![
                descriptor(&[("user", "u1")]),
                descriptor(&[("tenant", "t1")]),
            ],
        )
    };
    let r = rls.call(both()).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
        (9, 0)
    );
    // The tenant is spent: the whole request is refused, the user's status OK.
    let r = rls.call(both()).await;
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    // ... and the user's counter is where it was: 9 left, 8 after this one.
    let r = rls.call(one(&domain, &[("user", "u1")])).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        ((OK, vec![OK]), 8)
    );
    // A refuse-all rule refuses the request and counts on nothing either.
    let r = rls
        .call(request(
            &domain,
            vec![
                descriptor(&[("user", "u1")]),
                descriptor(&[("remote_address", "50.0.0.5")]),
            ],
        ))
        .await;
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    let r = rls.call(one(&domain, &[("user", "u1")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 7);
    rls.stop().await;
}

#[tokio::test]
async fn all_or_nothing_on_memory() {
    all_or_nothing("memory").await;
}

#[tokio::test]
async fn all_or_nothing_on_redis() {
    all_or_nothing(&shared_server().url()).await;
}

#[tokio::test]
async fn all_or_nothing_on_a_redis_cluster() {
    all_or_nothing(&shared_cluster().url()).await;
}

#[tokio::test]
async fn hits_addend_and_a_request_s_own_limit() {
    let domain = unique_name("hits");
    let rls = start("memory", &readme(&domain), false, clock()).await;
    // The request's hits_addend counts 4 of 10.
    let mut r4 = one(&domain, &[("user", "h")]);
    r4.hits_addend = 4;
    let r = rls.call(r4).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    // A descriptor's own hits_addend wins over the request's; 0 checks without counting.
    let mut d = descriptor(&[("user", "h")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let mut check = request(&domain, vec![d]);
    check.hits_addend = 3;
    let r = rls.call(check.clone()).await;
    assert_eq!(codes(&r), (OK, vec![OK]));
    assert_eq!(r.statuses[0].limit_remaining, 6);
    let mut d = descriptor(&[("user", "h")]);
    d.hits_addend = Some(UInt64Value { value: 6 });
    let r = rls.call(request(&domain, vec![d])).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        ((OK, vec![OK]), 0)
    );
    // Spent: the check says so, and more than the limit ever admits is over it.
    let r = rls.call(check).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    let mut d = descriptor(&[("user", "other")]);
    d.hits_addend = Some(UInt64Value { value: 11 });
    let r = rls.call(request(&domain, vec![d])).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    let r = rls.call(one(&domain, &[("user", "other")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 9, "nothing was counted");

    // A descriptor's own limit, even where no rule matches: 2 a minute.
    let own = || {
        let mut d = descriptor(&[("nothing", "configured")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 2,
        });
        request(&domain, vec![d])
    };
    for left in [1, 0] {
        let r = rls.call(own()).await;
        assert_eq!(
            (codes(&r), r.statuses[0].limit_remaining),
            ((OK, vec![OK]), left)
        );
        let limit = r.statuses[0].current_limit.as_ref().expect("the limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (2, 2));
    }
    assert_eq!(codes(&rls.call(own()).await), (OVER, vec![OVER]));
    rls.stop().await;
}

#[tokio::test]
async fn shadow_mode_is_always_ok_and_still_counts() {
    let domain = unique_name("shadow");
    let rls = start("memory", &readme(&domain), false, clock()).await;
    for _ in 0..3 {
        let r = rls.call(one(&domain, &[("shadow", "s")])).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(r.statuses[0].limit_remaining, 0);
        let r = rls.call(one(&domain, &[("shadow_zero", "s")])).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
    }
    // Beside a real limit, a shadow one never refuses the request.
    let r = rls
        .call(request(
            &domain,
            vec![descriptor(&[("shadow", "s")]), descriptor(&[("user", "s")])],
        ))
        .await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!(r.statuses[1].limit_remaining, 9);
    rls.stop().await;
}

#[tokio::test]
async fn two_instances_on_one_redis_share_counters() {
    let domain = unique_name("shared");
    let store = shared_server().url();
    let rules = rules_file(&readme(&domain));
    let a = start_with(&store, rules.clone(), false, clock()).await;
    let b = start_with(&store, rules, false, clock()).await;
    let r = a.call(one(&domain, &[("tenant", "t")])).await;
    assert_eq!(codes(&r), (OK, vec![OK]));
    let r = b.call(one(&domain, &[("tenant", "t")])).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_naming_the_field() {
    let domain = unique_name("bad");
    let rls = start("memory", &readme(&domain), false, clock()).await;
    let mut no_key = descriptor(&[("user", "u")]);
    no_key.entries.push(Entry {
        key: String::new(),
        value: "v".into(),
    });
    let mut week = descriptor(&[("user", "u")]);
    week.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 5,
    });
    let mut unknown = descriptor(&[("user", "u")]);
    unknown.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let too_many: Vec<RateLimitDescriptor> = (0..17)
        .map(|i| descriptor(&[("user", &format!("u{i}"))]))
        .collect();
    for (req, field) in [
        (one("", &[("user", "u")]), "`domain`"),
        (request(&domain, vec![]), "`descriptors`"),
        (
            request(&domain, vec![RateLimitDescriptor::default()]),
            "`descriptors[0].entries`",
        ),
        (
            request(&domain, vec![no_key]),
            "`descriptors[0].entries[1].key`",
        ),
        (request(&domain, vec![week]), "`descriptors[0].limit.unit`"),
        (request(&domain, vec![unknown]), "UNKNOWN"),
        (request(&domain, too_many), "at most 16"),
        (one(&"d".repeat(257), &[("user", "u")]), "`domain`"),
        (
            one(&domain, &[("user", &"v".repeat(5000))]),
            "`descriptors[0].entries`",
        ),
    ] {
        let status = rls.error(req).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
    }
    rls.stop().await;
}

#[tokio::test]
async fn garbage_on_the_grpc_port_does_not_stop_the_service() {
    let domain = unique_name("garbage");
    let rls = start("memory", &readme(&domain), false, clock()).await;
    for garbage in [
        &b"\x00\x01\x02\xff\xfe garbage \r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00\xff\xff\xff",
    ] {
        let mut raw = std::net::TcpStream::connect(rls.addr).expect("connected");
        let _ = raw.write_all(garbage);
        let _ = raw.shutdown(std::net::Shutdown::Both);
    }
    let r = rls.call(one(&domain, &[("user", "g")])).await;
    assert_eq!(codes(&r), (OK, vec![OK]));
    rls.stop().await;
}

/// A connection that sends nothing within the header read timeout of its opening is
/// closed, its slot among `max_connections` given back; one that spoke stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_and_frees_its_slot() {
    use std::io::Read;
    let domain = unique_name("silent");
    let mut settings = Settings {
        store: "memory".to_string(),
        ..Settings::default()
    };
    // The test's own client holds one slot; the silent connection takes the other.
    settings.connections.max_connections = 2;
    settings.connections.header_read_timeout = std::time::Duration::from_millis(300);
    let rls = start_settings(settings, rules_file(&readme(&domain)), false, clock()).await;
    let mut silent = std::net::TcpStream::connect(rls.addr).expect("connected");
    silent
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("a read timeout");
    // Read (what the service sends first, its HTTP/2 settings) to the end, on a thread of
    // its own: the service runs on this runtime's workers meanwhile.
    let read = tokio::task::spawn_blocking(move || {
        let mut sink = Vec::new();
        silent.read_to_end(&mut sink).map_err(|e| e.kind())
    })
    .await
    .expect("the read");
    assert!(
        matches!(read, Ok(_) | Err(std::io::ErrorKind::ConnectionReset)),
        "the silent connection was not closed: {read:?}"
    );
    // A new connection gets a slot and its answer; the first client, which spoke at once,
    // is still served.
    let mut other = RateLimitServiceClient::connect(format!("http://{}", rls.addr))
        .await
        .expect("a second connection");
    let r = other
        .should_rate_limit(one(&domain, &[("user", "s")]))
        .await
        .expect("an answer")
        .into_inner();
    assert_eq!(codes(&r), (OK, vec![OK]));
    let r = rls.call(one(&domain, &[("user", "s")])).await;
    assert_eq!(codes(&r), (OK, vec![OK]));
    rls.stop().await;
}

/// `POST /json` with `body`: the status and the JSON answer.
async fn post_json(url: &str, body: Value) -> (u16, Value) {
    let a = common::call(reqwest::Method::POST, &format!("{url}/json"), Some(body)).await;
    (a.status, a.body)
}

#[tokio::test]
async fn json_answers_as_grpc_does() {
    let domain = unique_name("json");
    let rls = start("memory", &readme(&domain), false, clock()).await;
    let body = json!({
        "domain": domain,
        "descriptors": [{"entries": [{"key": "tenant", "value": "j"}]}],
    });
    let (status, answer) = post_json(&rls.url, body.clone()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["overallCode"], "OK", "{answer}");
    assert_eq!(answer["statuses"][0]["code"], "OK", "{answer}");
    assert_eq!(
        answer["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 1, "unit": "HOUR"})
    );
    assert!(answer["statuses"][0]["durationUntilReset"]
        .as_str()
        .is_some_and(|d| d.ends_with('s')));
    let (status, answer) = post_json(&rls.url, body).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["overallCode"], "OVER_LIMIT", "{answer}");
    // gRPC sees the same counter.
    let r = rls.call(one(&domain, &[("tenant", "j")])).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    // camelCase and a 64-bit hits_addend as a string, as protobuf's JSON mapping allows.
    let (status, answer) = post_json(
        &rls.url,
        json!({
            "domain": domain,
            "hitsAddend": 2,
            "descriptors": [{"entries": [{"key": "user", "value": "j"}], "hitsAddend": "3"}],
        }),
    )
    .await;
    assert_eq!(
        (status, answer["statuses"][0]["limitRemaining"].clone()),
        (200, json!(7))
    );
    // A wrong request: 400 naming the field.
    let (status, answer) = post_json(
        &rls.url,
        json!({"domain": domain, "descriptors": [{"entries": [{"key": "user"}], "bogus": 1}]}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "descriptors[0].bogus", "{answer}");
    let (status, answer) = post_json(&rls.url, json!({"domain": "", "descriptors": []})).await;
    assert_eq!(
        (status, answer["error"]["field"].clone()),
        (400, json!("domain"))
    );
    rls.stop().await;
}

/// `POST /v1/reload`: the status and the JSON answer.
async fn reload(url: &str) -> (u16, Value) {
    let a = common::call(reqwest::Method::POST, &format!("{url}/v1/reload"), None).await;
    (a.status, a.body)
}

#[tokio::test]
async fn a_reload_keeps_counters_and_a_broken_file_keeps_the_rules() {
    let domain = unique_name("reload");
    let rls = start("memory", &readme(&domain), false, clock()).await;
    let user = || one(&domain, &[("user", "r")]);
    assert_eq!(rls.call(user()).await.statuses[0].limit_remaining, 9);
    // The same rule for `user`, and a new one: the counter is kept.
    let grown = format!(
        "{}  - key: added\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n",
        readme(&domain)
    );
    std::fs::write(&rls.rules, grown).expect("written");
    let (status, answer) = reload(&rls.url).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rls.call(user()).await.statuses[0].limit_remaining, 8);
    let r = rls.call(one(&domain, &[("added", "a")])).await;
    assert!(
        r.statuses[0].current_limit.is_some(),
        "the new rule applies"
    );
    // A broken file: 422 naming the file and the line; the rules stay.
    std::fs::write(
        &rls.rules,
        format!("domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: fortnight, requests_per_unit: 1}}\n"),
    )
    .expect("written");
    let (status, answer) = reload(&rls.url).await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("rules.yaml:4"), "{message}");
    assert_eq!(rls.call(user()).await.statuses[0].limit_remaining, 7);
    rls.stop().await;
}

#[tokio::test]
async fn ratelimit_headers_when_enabled() {
    let domain = unique_name("headers");
    let rls = start("memory", &readme(&domain), true, clock()).await;
    let r = rls.call(one(&domain, &[("user", "x")])).await;
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    let rule = format!("{domain}.user");
    let policy = format!("\"{rule}\";q=10");
    // The hour's window has 3570 s to go (the clock is 30 s into it).
    let state = format!("\"{rule}\";r=9;t=3570");
    assert_eq!(
        headers,
        vec![
            ("RateLimit-Policy", policy.as_str()),
            ("RateLimit", state.as_str())
        ],
    );
    rls.stop().await;
    // Off by default.
    let rls = start("memory", &readme(&domain), false, clock()).await;
    let r = rls.call(one(&domain, &[("user", "x")])).await;
    assert!(r.response_headers_to_add.is_empty());
    rls.stop().await;
}

/// An LLM gateway's rules: a budget of tokens a minute charged after each answer
/// (`drain: true`), and one request a minute per user.
fn tokens_rules(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: llm_tokens\n    rate_limit: {{unit: minute, requests_per_unit: 1000, drain: true}}\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
    )
}

fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.hits_addend = Some(UInt64Value { value: hits });
    d
}

async fn a_drain_rule_charges_past_the_limit(store: &str) {
    let domain = unique_name("drain");
    let clock = clock();
    let rls = start(store, &tokens_rules(&domain), false, clock.clone()).await;
    let tokens = |hits| request(&domain, vec![with_hits(&[("llm_tokens", "t1")], hits)]);
    // At request time Envoy checks (hits 0); at the end of the answer it sends its tokens.
    let r = rls.call(tokens(0)).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        ((OK, vec![OK]), 1000)
    );
    let r = rls.call(tokens(1_800)).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        ((OK, vec![OK]), 0)
    );
    // In debt: the next check is refused, a further charge still counts and is OK.
    assert_eq!(codes(&rls.call(tokens(0)).await), (OVER, vec![OVER]));
    assert_eq!(codes(&rls.call(tokens(5)).await), (OK, vec![OK]));
    assert_eq!(codes(&rls.call(tokens(0)).await), (OVER, vec![OVER]));

    // All or nothing: a request refused by another limit charges nothing.
    let user = || descriptor(&[("user", "u1")]);
    let spend = request(&domain, vec![user()]);
    assert_eq!(codes(&rls.call(spend.clone()).await), (OK, vec![OK]));
    let both = request(
        &domain,
        vec![user(), with_hits(&[("llm_tokens", "t2")], 50)],
    );
    let r = rls.call(both).await;
    assert_eq!(codes(&r), (OVER, vec![OVER, OK]));
    let r = rls
        .call(request(
            &domain,
            vec![with_hits(&[("llm_tokens", "t2")], 0)],
        ))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 1000, "nothing was charged");

    // The debt drains with its window: a minute on, the budget is whole again.
    clock.advance(std::time::Duration::from_secs(60));
    let r = rls.call(tokens(0)).await;
    assert_eq!(
        (codes(&r), r.statuses[0].limit_remaining),
        ((OK, vec![OK]), 1000)
    );
    rls.stop().await;
}

#[tokio::test]
async fn a_drain_rule_charges_past_the_limit_on_memory() {
    a_drain_rule_charges_past_the_limit("memory").await;
}

#[tokio::test]
async fn a_drain_rule_charges_past_the_limit_on_redis() {
    a_drain_rule_charges_past_the_limit(&shared_server().url()).await;
}

#[tokio::test]
async fn a_drain_rule_charges_past_the_limit_on_a_redis_cluster() {
    a_drain_rule_charges_past_the_limit(&shared_cluster().url()).await;
}

#[test]
fn the_rls_table_of_the_config_file() {
    let file = paceline_server::config::parse(
        "/etc/paceline/paceline.toml",
        "[rls]\nlisten = \"127.0.0.1:8081\"\nconfig = \"rls\"\nresponse_headers = true\n",
    )
    .expect("parsed");
    let mut settings = Settings::default();
    settings.apply_file(file);
    assert_eq!(
        settings.rls,
        RlsSettings {
            listen: Some("127.0.0.1:8081".parse().expect("an address")),
            config: Some(PathBuf::from("/etc/paceline/rls")),
            response_headers: true,
        }
    );
    let e =
        paceline_server::config::parse("p.toml", "[rls]\nlisten = \"127.0.0.1:8081\"\nport = 1\n")
            .expect_err("an unknown key");
    assert!(e.to_string().contains("port"), "{e}");
    let e = paceline_server::config::parse("p.toml", "[rls]\nlisten = \"nowhere\"\n")
        .expect_err("a bad address");
    assert_eq!(e.field, "rls.listen");
}

/// A store that fails: `fail_closed` is UNAVAILABLE (503 on `/json`), `fail_open` OK.
#[tokio::test]
async fn a_store_failure_follows_the_failure_policy() {
    let mut redis = paceline_testkit::RedisServer::start().expect("a Redis");
    let domain = unique_name("failing");
    let rules = rules_file(&readme(&domain));
    let mut services = Vec::new();
    for policy in [
        paceline_store::FailurePolicy::FailClosed,
        paceline_store::FailurePolicy::FailOpen,
    ] {
        let settings = Settings {
            store: redis.url(),
            failure_policy: policy,
            ..Settings::default()
        };
        services.push(start_settings(settings, rules.clone(), false, clock()).await);
    }
    redis.kill();
    let closed = services[0].error(one(&domain, &[("user", "f")])).await;
    assert_eq!(closed.code(), tonic::Code::Unavailable, "{closed:?}");
    let body =
        json!({"domain": domain, "descriptors": [{"entries": [{"key": "user", "value": "f"}]}]});
    let (status, answer) = post_json(&services[0].url, body.clone()).await;
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (503, json!("store_unavailable"))
    );
    let open = services[1].call(one(&domain, &[("user", "f")])).await;
    assert_eq!(codes(&open), (OK, vec![OK]));
    let (status, answer) = post_json(&services[1].url, body).await;
    assert_eq!((status, answer["overallCode"].clone()), (200, json!("OK")));
    for service in services {
        service.stop().await;
    }
}

/// `/json` asks for the service's token, like `/v1/...`.
#[tokio::test]
async fn json_asks_for_the_service_s_token() {
    let domain = unique_name("token");
    let settings = Settings {
        auth_token: Some("s3cret".into()),
        ..Settings::default()
    };
    let rls = start_settings(settings, rules_file(&readme(&domain)), false, clock()).await;
    let body =
        json!({"domain": domain, "descriptors": [{"entries": [{"key": "user", "value": "t"}]}]});
    let (status, answer) = post_json(&rls.url, body.clone()).await;
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (401, json!("unauthenticated"))
    );
    let response = reqwest::Client::new()
        .post(format!("{}/json", rls.url))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status().as_u16(), 200);
    rls.stop().await;
}

/// Rules for the metrics' tests: a limit of 10, a shadow-mode limit of 2, a rule of 0, an
/// unlimited one, and a limit of 1 with `detailed_metric`.
fn metrics_rules(domain: &str) -> String {
    format!(
        "
domain: {domain}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 10}}
  - key: shadow
    shadow_mode: true
    rate_limit: {{unit: minute, requests_per_unit: 2}}
  - key: zero
    rate_limit: {{unit: minute, requests_per_unit: 0}}
  - key: free
    rate_limit: {{unlimited: true}}
  - key: client
    detailed_metric: true
    rate_limit: {{unit: minute, requests_per_unit: 1}}
"
    )
}

/// One sample of the exposition: its name, its labels (values unescaped) and its value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A label value after its opening quote, unescaped, and the rest after its closing quote;
/// `None` unless well formed (only `\\`, `\"` and `\n` are escapes).
fn label_value(text: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((out, &text[at + 1..])),
            '\\' => match chars.next()?.1 {
                '\\' => out.push('\\'),
                '"' => out.push('"'),
                'n' => out.push('\n'),
                _ => return None,
            },
            '\n' => return None,
            c => out.push(c),
        }
    }
    None
}

fn metric_name(text: &str) -> Option<(&str, &str)> {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let name = &text[..end];
    (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()))
        .then_some((name, &text[end..]))
}

/// One line of the text exposition: a sample, a comment (`None` inside), or an error.
fn parse_line(line: &str) -> Result<Option<Sample>, String> {
    let bad = || format!("a malformed line: {line:?}");
    if line == "# EOF" {
        return Ok(None);
    }
    if let Some(rest) = line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
        .or_else(|| line.strip_prefix("# UNIT "))
    {
        metric_name(rest).ok_or_else(bad)?;
        return Ok(None);
    }
    let (name, mut rest) = metric_name(line).ok_or_else(bad)?;
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = metric_name(rest).ok_or_else(bad)?;
            let after = after.strip_prefix("=\"").ok_or_else(bad)?;
            let (value, after) = label_value(after).ok_or_else(bad)?;
            labels.push((label.to_string(), value));
            rest = after.strip_prefix(',').unwrap_or(after);
            if !after.starts_with(',') && !after.starts_with('}') {
                return Err(bad());
            }
        }
    }
    let value = rest.strip_prefix(' ').ok_or_else(bad)?;
    let value: f64 = value.parse().map_err(|_| bad())?;
    Ok(Some(Sample {
        name: name.to_string(),
        labels,
        value,
    }))
}

/// `GET /metrics`, every line checked well formed, as samples.
async fn metrics(url: &str) -> Vec<Sample> {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("an answer")
        .text()
        .await
        .expect("text");
    text.split('\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| parse_line(l).unwrap_or_else(|e| panic!("{e}\n{text}")))
        .collect()
}

/// The RLS counters of `rule`: hits, over limit, near limit, within limit, shadow mode.
fn rule_counts(samples: &[Sample], rule: &str) -> [u64; 5] {
    let get = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name && s.labels == [("rule".to_string(), rule.to_string())])
            .map_or_else(|| panic!("no {name} for {rule:?}"), |s| s.value as u64)
    };
    [
        get("paceline_rls_hits_total"),
        get("paceline_rls_over_limit_total"),
        get("paceline_rls_near_limit_total"),
        get("paceline_rls_within_limit_total"),
        get("paceline_rls_shadow_mode_total"),
    ]
}

#[test]
fn the_exposition_parser_refuses_broken_lines() {
    assert!(parse_line("a_total{rule=\"x\\\"y\\n\"} 3").is_ok());
    for line in [
        "a_total{rule=\"x\"y\"} 3",
        "a_total{rule=\"x} 3",
        "a_total{rule=\"x\\q\"} 3",
        "a_total{rule=\"x\"}} 3",
        "a_total{rule=\"x\"} three",
        "} 3",
    ] {
        assert!(parse_line(line).is_err(), "{line}");
    }
}

/// Each rule's hits, over limit, near limit (the hits past 80 % of the limit), within limit
/// and shadow mode, over gRPC and `/json` alike.
#[tokio::test]
async fn metrics_count_each_rule_s_hits_by_outcome() {
    let domain = unique_name("metrics");
    let rls = start("memory", &metrics_rules(&domain), false, clock()).await;
    // A limit of 10, one hit at a time: the 9th and 10th near it, 2 over.
    for _ in 0..12 {
        rls.call(one(&domain, &[("user", "a")])).await;
    }
    // Several hits at once on /json: 7 (none near), 3 (2 past 8), 1 over.
    for (hits, status) in [(7, 200), (3, 200), (1, 429)] {
        let (got, answer) = post_json(
            &rls.url,
            json!({
                "domain": domain,
                "descriptors": [{"entries": [{"key": "user", "value": "b"}], "hitsAddend": hits}],
            }),
        )
        .await;
        assert_eq!(got, status, "{answer}");
    }
    // Shadow mode, a limit of 2: the 2nd near it, the 3rd over and let through.
    for _ in 0..3 {
        let r = rls.call(one(&domain, &[("shadow", "s")])).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
    }
    // A rule of 0 and an unlimited one.
    rls.call(one(&domain, &[("zero", "z")])).await;
    for _ in 0..2 {
        rls.call(one(&domain, &[("free", "f")])).await;
    }
    // `detailed_metric`: named after the request's value.
    for _ in 0..2 {
        rls.call(one(&domain, &[("client", "x")])).await;
    }
    // All or nothing: the rule of 0 refuses; the limit of 10 is within, not charged.
    let r = rls
        .call(request(
            &domain,
            vec![descriptor(&[("user", "c")]), descriptor(&[("zero", "z")])],
        ))
        .await;
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    // A check of no hits counts none.
    let mut check = descriptor(&[("user", "a")]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    rls.call(request(&domain, vec![check])).await;

    let samples = metrics(&rls.url).await;
    let rule = |r: &str| format!("{domain}.{r}");
    // [hits, over limit, near limit, within limit, shadow mode]
    assert_eq!(rule_counts(&samples, &rule("user")), [24, 3, 4, 21, 0]);
    assert_eq!(rule_counts(&samples, &rule("shadow")), [3, 1, 1, 2, 1]);
    assert_eq!(rule_counts(&samples, &rule("zero")), [2, 2, 0, 0, 0]);
    assert_eq!(rule_counts(&samples, &rule("free")), [2, 0, 0, 2, 0]);
    assert_eq!(rule_counts(&samples, &rule("client_x")), [2, 1, 1, 1, 0]);
    rls.stop().await;
}

/// `detailed_metric` labels carry the request's values, whatever they hold, and
/// `/metrics` stays well formed.
#[tokio::test]
async fn hostile_values_in_detailed_labels_keep_metrics_well_formed() {
    let domain = unique_name("hostile");
    let rls = start("memory", &metrics_rules(&domain), false, clock()).await;
    let values = [
        "quote\"d",
        "new\nline",
        "back\\slash",
        "}{",
        "\",rule=\"forged",
        "\\\"} 1\n# TYPE x counter",
        "carriage\rreturn\ttab",
        "ünïcødé ☃",
    ];
    for (i, value) in values.iter().enumerate() {
        if i % 2 == 0 {
            rls.call(one(&domain, &[("client", value)])).await;
        } else {
            let (status, answer) = post_json(
                &rls.url,
                json!({
                    "domain": domain,
                    "descriptors": [{"entries": [{"key": "client", "value": value}]}],
                }),
            )
            .await;
            assert_eq!(status, 200, "{answer}");
        }
    }
    let samples = metrics(&rls.url).await;
    for value in values {
        let rule = format!("{domain}.client_{value}");
        assert_eq!(rule_counts(&samples, &rule), [1, 0, 1, 1, 0], "{rule:?}");
    }
    // Nothing but the rules' own series, and nothing forged.
    for sample in samples
        .iter()
        .filter(|s| s.name.starts_with("paceline_rls_"))
    {
        assert_eq!(sample.labels.len(), 1, "{sample:?}");
        assert_eq!(sample.labels[0].0, "rule", "{sample:?}");
        assert!(sample.labels[0].1.starts_with(&domain), "{sample:?}");
    }
    rls.stop().await;
}

/// Past the cap on rule ids holding a request's values, new ones count under `(other)`;
/// the rules' own ids keep theirs.
#[tokio::test]
async fn detailed_labels_are_capped_then_counted_under_other() {
    use paceline_server::rls::{OTHER_RULES, RLS_RULE_LABELS};
    let domain = unique_name("capped");
    let rls = start("memory", &metrics_rules(&domain), false, clock()).await;
    let over = 5;
    let values: Vec<String> = (0..RLS_RULE_LABELS + over)
        .map(|i| format!("c{i}"))
        .collect();
    for chunk in values.chunks(paceline_store::MAX_LIMITS) {
        let descriptors = chunk.iter().map(|v| descriptor(&[("client", v)])).collect();
        let r = rls.call(request(&domain, descriptors)).await;
        assert_eq!(r.overall_code, OK);
    }
    rls.call(one(&domain, &[("user", "u")])).await;
    let samples = metrics(&rls.url).await;
    let detailed = samples
        .iter()
        .filter(|s| s.name == "paceline_rls_hits_total")
        .filter(|s| s.labels[0].1.starts_with(&format!("{domain}.client_")))
        .count();
    assert_eq!(detailed, RLS_RULE_LABELS);
    assert_eq!(
        rule_counts(&samples, &format!("{domain}.client_c0")),
        [1, 0, 1, 1, 0]
    );
    let last = &values[RLS_RULE_LABELS];
    assert!(
        !samples
            .iter()
            .any(|s| s.labels.iter().any(|(_, v)| v.ends_with(last.as_str()))),
        "{last} has a series"
    );
    assert_eq!(
        rule_counts(&samples, OTHER_RULES),
        [over as u64, 0, over as u64, over as u64, 0]
    );
    assert_eq!(
        rule_counts(&samples, &format!("{domain}.user")),
        [1, 0, 0, 1, 0]
    );
    rls.stop().await;
}
