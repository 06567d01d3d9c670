//! `paceline serve` with Envoy's rate limit service: the real binary, its gRPC called with
//! Envoy's own client, and a bad rules file refused at start.

mod common;

use std::process::Command;

use common::{exits_cleanly, launch, post, signal, write, Service};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

const RULES: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 2
";

#[test]
fn a_bad_rules_file_exits_2_naming_file_line_and_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = write(
        dir.path(),
        "limits.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--rls-listen", "127.0.0.1:0", "--rls-config", &rules])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("limits.yaml:4") && err.contains("descriptors[0].rate_limit.unit"),
        "{err}"
    );
    // An RLS listener with no rules.
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--rls-listen",
            "127.0.0.1:0",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rls-config"));
}

/// The binary serving [`RULES`] (written in `dir`) over gRPC beside HTTP: the service and
/// its ports (HTTP, then gRPC).
fn serve_rules(dir: &std::path::Path) -> (Service, Vec<u16>) {
    let rules = write(dir, "rules.yaml", RULES);
    let mut command = Command::new(env!("CARGO_BIN_EXE_paceline"));
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--rls-listen", "127.0.0.1:0", "--rls-config", &rules])
        .env_remove("PACELINE_AUTH_TOKEN");
    launch(
        &mut command,
        &["listening on http://", "listening on grpc://"],
    )
}

#[test]
fn rls_listen_serves_grpc_from_the_binary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_service, ports) = serve_rules(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let codes: Vec<i32> = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", ports[1]))
            .await
            .expect("connected");
        let mut codes = Vec::new();
        for _ in 0..3 {
            let request = RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "remote_address".into(),
                        value: "10.1.1.1".into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            };
            let answer = client
                .should_rate_limit(request)
                .await
                .expect("an answer")
                .into_inner();
            codes.push(answer.overall_code);
        }
        codes
    });
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, vec![ok, ok, over]);
}

/// One descriptor `remote_address=ADDR` of domain `edge`; `hits` 0 checks without counting.
fn ask(addr: &str, hits: Option<u64>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: addr.into(),
            }],
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

#[test]
fn sighup_reads_the_rules_again_keeping_counters_and_a_broken_file_keeps_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut service, ports) = serve_rules(dir.path());
    let rules = dir.path().join("rules.yaml");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut client = runtime.block_on(async {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", ports[1]))
            .await
            .expect("connected")
    });
    let mut call = |request: RateLimitRequest| -> RateLimitResponse {
        runtime.block_on(async {
            client
                .should_rate_limit(request)
                .await
                .expect("an answer")
                .into_inner()
        })
    };
    let first = call(ask("10.2.2.2", None));
    assert_eq!(first.statuses[0].limit_remaining, 1);
    // A rule added: SIGHUP, then checks (counting nothing) until the new rule answers.
    let grown =
        format!("{RULES}  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n");
    std::fs::write(&rules, grown).expect("written");
    signal(&service, "HUP");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut check = ask("10.2.2.2", Some(0));
        check.descriptors[0].entries[0].key = "user".into();
        if call(check).statuses[0].current_limit.is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rules were not read again"
        );
    }
    // The unchanged rule's counter was kept: one of two counted.
    let checked = call(ask("10.2.2.2", Some(0)));
    assert_eq!(checked.statuses[0].limit_remaining, 1);
    // A broken file keeps the rules; the reload says where, and the log warns.
    std::fs::write(&rules, "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
        .expect("written");
    let reply = post(service.port, "/v1/reload", "");
    assert_eq!(reply.status, 422, "{}", reply.body);
    assert!(reply.body.contains("rules.yaml:4"), "{}", reply.body);
    let after = call(ask("10.2.2.2", None));
    assert_eq!(after.statuses[0].limit_remaining, 0);
    let mut user = ask("u", None);
    user.descriptors[0].entries[0].key = "user".into();
    assert_eq!(
        call(user).statuses[0].limit_remaining,
        4,
        "the added rule stays"
    );
    // The client's connection closed (its runtime would not be driven to answer the
    // service's GOAWAY while this thread waits for the exit).
    drop(client);
    drop(runtime);
    signal(&service, "TERM");
    exits_cleanly(&mut service);
    let log = service.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("reload failed")
            && l.contains("rules.yaml:4")),
        "{log}"
    );
}
