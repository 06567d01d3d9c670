//! `paceline serve` with Envoy's rate limit service: the real binary, its gRPC called with
//! Envoy's own client, and a bad rules file refused at start.

mod common;

use std::process::Command;

use common::{launch, write};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

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
    // A drain rule is refused the same way, until this build can charge past a limit.
    let rules = write(
        dir.path(),
        "drain.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, drain: true}\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["serve", "--listen", "127.0.0.1:0", "--rls-config", &rules])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("drain.yaml:3") && err.contains("drain") && err.contains("not supported"),
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

#[test]
fn rls_listen_serves_grpc_from_the_binary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = write(dir.path(), "rules.yaml", RULES);
    let mut command = Command::new(env!("CARGO_BIN_EXE_paceline"));
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--rls-listen", "127.0.0.1:0", "--rls-config", &rules])
        .env_remove("PACELINE_AUTH_TOKEN");
    let (_service, ports) = launch(
        &mut command,
        &["listening on http://", "listening on grpc://"],
    );
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
