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
                "redis://user:pw@127.0.0.1:1",
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
