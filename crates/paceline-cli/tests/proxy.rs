//! `paceline proxy` from the outside: bad flags exit 2 naming the flag.

use std::process::Command;

fn proxy(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("proxy")
        .args(args)
        .output()
        .expect("paceline runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    for (args, named) in [
        (vec!["--upstream", "ftp://example.com"], "--upstream"),
        (vec!["--upstream", "not a url"], "--upstream"),
        (
            vec!["--upstream", "http://example.com", "--dialect", "soap"],
            "--dialect",
        ),
        (
            vec!["--upstream", "http://example.com", "--max-wait=-1s"],
            "--max-wait",
        ),
        (
            vec![
                "--upstream",
                "http://example.com",
                "--global-limit",
                "gcra:rate=0/s",
            ],
            "--global-limit",
        ),
        (
            vec![
                "--upstream",
                "http://example.com",
                "--store",
                "mysql://user:pw@127.0.0.1:1",
            ],
            "--store",
        ),
    ] {
        let (code, stderr) = proxy(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("pw@"),
            "credentials are never printed: {stderr}"
        );
    }
}

#[test]
fn an_unreachable_redis_store_exits_1_naming_the_store_without_credentials() {
    let (code, stderr) = proxy(&[
        "--upstream",
        "http://example.com",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "redis://user:pw@127.0.0.1:1",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("store"), "{stderr}");
    assert!(
        !stderr.contains("pw@"),
        "credentials are never printed: {stderr}"
    );
}

#[test]
fn a_config_file_gives_the_settings_and_flags_win() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("proxy.toml");
    let file = path.to_str().expect("a UTF-8 path");
    // A key the proxy does not know is named.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\nlisten_on = \"x\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("listen_on"), "{stderr}");
    // A bad value in the file is named by the file and its key.
    std::fs::write(
        &path,
        "upstream = \"http://example.com\"\ndialect = \"soap\"\n",
    )
    .unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("proxy.toml: `dialect`"), "{stderr}");
    // A flag given wins over the file: the file's dialect is not looked at, the flag's
    // upstream is.
    let (code, stderr) = proxy(&[
        "--config",
        file,
        "--dialect",
        "discord",
        "--upstream",
        "ftp://x",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upstream"), "{stderr}");
    assert!(!stderr.contains("dialect"), "{stderr}");
    // Without an upstream anywhere.
    std::fs::write(&path, "store = \"memory\"\n").unwrap();
    let (code, stderr) = proxy(&["--config", file]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upstream: required"), "{stderr}");
    let (code, stderr) = proxy(&["--config", "/nonexistent/proxy.toml"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--config"), "{stderr}");
}
