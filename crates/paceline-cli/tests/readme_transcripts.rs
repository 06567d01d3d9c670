//! The terminal transcripts of the README and the guides, replayed as written.
//!
//! Each ```` ```console ```` block is a run of commands (`$ ` lines, continued while a line
//! ends with `\` or a quote is open) and what they printed. The block's commands run in one
//! bash, from the repository's root, with this build's `paceline` first on `PATH`; a
//! document whose transcripts speak to the service (`localhost:7373`) gets a `paceline
//! serve` of its own on a free port, which the commands are pointed at. What each command
//! prints must be what the document shows: exactly for `paceline`, and for `curl` with the
//! leeway a live service needs (times that pass between two runs, and tokens drawn at
//! random). Every ```` ```bash ```` block of the documents must also be valid bash.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(document: &str) -> String {
    std::fs::read_to_string(root().join(document)).unwrap_or_else(|e| panic!("{document}: {e}"))
}

/// The fenced blocks of `markdown` whose info string is `language`: their text, and the
/// line their fence opens on.
fn blocks(markdown: &str, language: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut open: Option<(String, bool, usize, String)> = None;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line[..line.len() - trimmed.len()].to_string();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((indent, info.trim() == language, n + 1, String::new()));
                }
            }
            Some((fence, wanted, start, mut text)) => {
                if trimmed == "```" && indent == fence {
                    if wanted {
                        found.push((start, text));
                    }
                } else {
                    text.push_str(line.strip_prefix(fence.as_str()).unwrap_or(line));
                    text.push('\n');
                    open = Some((fence, wanted, start, text));
                }
            }
        }
    }
    found
}

/// One command of a transcript, and the lines it printed.
struct Step {
    command: String,
    output: Vec<String>,
}

/// Whether `command` goes on to the next line: a trailing `\`, or a single quote open.
fn continues(command: &str) -> bool {
    command.ends_with('\\') || command.matches('\'').count() % 2 == 1
}

fn steps(transcript: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = transcript.lines();
    while let Some(line) = lines.next() {
        if let Some(first) = line.strip_prefix("$ ") {
            let mut command = first.to_string();
            while continues(&command) {
                let Some(next) = lines.next() else { break };
                command.push('\n');
                command.push_str(next);
            }
            steps.push(Step {
                command,
                output: Vec::new(),
            });
        } else if let Some(step) = steps.last_mut() {
            step.output.push(line.to_string());
        } else {
            panic!("a transcript begins with output, not a `$ ` command: {line}");
        }
    }
    steps
}

/// Between two commands' outputs.
const SEPARATOR: &str = "@@ the command ends here @@";

/// Runs the commands of a transcript in one bash, from the repository's root, with this
/// build's `paceline` first on `PATH`; what each printed, in order.
fn run(commands: &[String]) -> Vec<String> {
    let bin = Path::new(env!("CARGO_BIN_EXE_paceline"))
        .parent()
        .expect("the binary's directory")
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut script = String::from("set -o pipefail\n");
    for command in commands {
        script.push_str(command);
        script.push_str(&format!("\nprintf '\\n%s\\n' '{SEPARATOR}'\n"));
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root())
        .env("PATH", path)
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let mut outputs: Vec<String> = text
        .split(&format!("\n{SEPARATOR}\n"))
        .map(|o| o.trim_end_matches('\n').to_string())
        .collect();
    // The text after the last separator is empty.
    outputs.pop();
    assert_eq!(
        outputs.len(),
        commands.len(),
        "the transcript did not run to its end: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        text
    );
    outputs
}

/// A time (or a length that depends on one): an answer between 0 and twice the value
/// shown, and 0 when 0 is shown.
fn time_like(shown: f64, answered: f64) -> bool {
    if shown == 0.0 {
        answered == 0.0
    } else {
        (0.0..=2.0 * shown).contains(&answered)
    }
}

/// JSON as a document shows it against JSON as the service answered it, under `key`:
/// fields ending in `_ms` are times, `lease` a token drawn anew at each run (same parts,
/// same length, the same policy and key), everything else exact.
fn json_matches(shown: &Value, answered: &Value, key: &str) -> Result<(), String> {
    let at = |what: String| Err(format!("`{key}`: {what}"));
    match (shown, answered) {
        (Value::Object(s), Value::Object(a)) => {
            let (mut sk, mut ak): (Vec<_>, Vec<_>) = (s.keys().collect(), a.keys().collect());
            sk.sort();
            ak.sort();
            if sk != ak {
                return at(format!("fields {sk:?} shown, {ak:?} answered"));
            }
            s.iter()
                .try_for_each(|(k, v)| json_matches(v, &a[k.as_str()], k))
        }
        (Value::Array(s), Value::Array(a)) => {
            if s.len() != a.len() {
                return at(format!("{} items shown, {} answered", s.len(), a.len()));
            }
            s.iter()
                .zip(a)
                .try_for_each(|(s, a)| json_matches(s, a, key))
        }
        (Value::Number(s), Value::Number(a)) if key.ends_with("_ms") => {
            let (s, a) = (
                s.as_f64().unwrap_or(f64::NAN),
                a.as_f64().unwrap_or(f64::NAN),
            );
            if time_like(s, a) {
                Ok(())
            } else {
                at(format!("{a} answered, not a time like the {s} shown"))
            }
        }
        (Value::String(s), Value::String(a)) if key == "lease" => {
            let (s, a): (Vec<&str>, Vec<&str>) = (s.split('.').collect(), a.split('.').collect());
            let middle = |parts: &[&str]| parts[1..parts.len().saturating_sub(1)].join(".");
            let same_shape = s.len() == a.len()
                && s.last().map(|p| p.len()) == a.last().map(|p| p.len())
                && (s.len() < 3 || middle(&s) == middle(&a));
            if same_shape {
                Ok(())
            } else {
                at(format!("the token {a:?} is not of the shape shown, {s:?}"))
            }
        }
        _ if shown == answered => Ok(()),
        _ => at(format!("{answered} answered, {shown} shown")),
    }
}

/// A header line as shown against as answered: the same name, and the same value but for
/// times (`Retry-After`, a `t=` parameter) and the length of a body holding times.
fn header_matches(shown: &str, answered: &str) -> Result<(), String> {
    let (Some((sn, sv)), Some((an, av))) = (shown.split_once(": "), answered.split_once(": "))
    else {
        return Err(format!("`{answered}` answered, `{shown}` shown"));
    };
    if !sn.eq_ignore_ascii_case(an) {
        return Err(format!("header `{an}` answered, `{sn}` shown"));
    }
    let all_loose = ["content-length", "retry-after"].contains(&sn.to_ascii_lowercase().as_str());
    let (s, a) = (tokens(sv), tokens(av));
    let s_all = &s;
    let matches = s.len() == a.len()
        && s.iter().zip(&a).enumerate().all(|(i, (s, a))| {
            let loose = all_loose || (i > 0 && s_all[i - 1].ends_with("t="));
            match (s.parse::<f64>(), a.parse::<f64>()) {
                (Ok(s), Ok(a)) if loose => time_like(s, a),
                _ => s == a,
            }
        });
    if matches {
        Ok(())
    } else {
        Err(format!("`{answered}` answered, `{shown}` shown"))
    }
}

/// A header value cut into runs of digits (with a decimal point) and runs of the rest.
fn tokens(value: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut last_numeric = None;
    for c in value.chars() {
        let numeric = c.is_ascii_digit() || (c == '.' && last_numeric == Some(true));
        match out.last_mut() {
            Some(run) if last_numeric == Some(numeric) => run.push(c),
            _ => out.push(c.to_string()),
        }
        last_numeric = Some(numeric);
    }
    out
}

/// What `curl` printed as the document shows it against as the service answered: the
/// status line exactly, headers by [`header_matches`] (less `date`, which the documents
/// leave out), and JSON bodies by [`json_matches`].
fn curl_output_matches(shown: &[String], answered: &str) -> Result<(), String> {
    let mut in_headers = answered.starts_with("HTTP/");
    let answered: Vec<&str> = answered
        .lines()
        .filter(|line| {
            if line.is_empty() {
                in_headers = false;
            }
            !(in_headers && line.to_ascii_lowercase().starts_with("date: "))
        })
        .collect();
    if shown.len() != answered.len() {
        return Err(format!(
            "{} lines shown, {} answered:\n{}",
            shown.len(),
            answered.len(),
            answered.join("\n")
        ));
    }
    for (s, a) in shown.iter().zip(&answered) {
        if s.starts_with('{') || s.starts_with('[') {
            let parse = |text: &str| {
                serde_json::from_str::<Value>(text).map_err(|e| format!("not JSON ({e}): {text}"))
            };
            json_matches(&parse(s)?, &parse(a)?, "body")?;
        } else if s.starts_with("HTTP/") || s.is_empty() {
            if s != a {
                return Err(format!("`{a}` answered, `{s}` shown"));
            }
        } else {
            header_matches(s, a)?;
        }
    }
    Ok(())
}

/// Replays every transcript of `document`, against a service started with `args` when
/// they speak to one.
fn replay(document: &str, args: &[&str]) {
    let markdown = read(document);
    let transcripts = blocks(&markdown, "console");
    assert!(!transcripts.is_empty(), "{document}: no transcripts");
    let needs_service = transcripts
        .iter()
        .any(|(_, t)| t.contains("localhost:7373"));
    let service = needs_service.then(|| common::start(args));
    for (line, transcript) in transcripts {
        let steps = steps(&transcript);
        let commands: Vec<String> = steps
            .iter()
            .map(|s| match &service {
                Some(service) => s
                    .command
                    .replace("localhost:7373", &format!("localhost:{}", service.port)),
                None => s.command.clone(),
            })
            .collect();
        for (step, answered) in steps.iter().zip(run(&commands)) {
            let verdict = if step.command.starts_with("curl") {
                curl_output_matches(&step.output, &answered)
            } else if step.output.join("\n") == answered {
                Ok(())
            } else {
                Err(format!("printed:\n{answered}"))
            };
            if let Err(why) = verdict {
                panic!(
                    "{document}:{line}: `{}` no longer prints what the document shows: {why}",
                    step.command
                );
            }
        }
    }
}

fn needs_curl() {
    let curl = Command::new("curl").arg("--version").output();
    assert!(
        curl.is_ok_and(|o| o.status.success()),
        "the transcripts run curl: install it (apt-get install curl)"
    );
}

#[test]
fn the_readme_transcript_of_the_service() {
    needs_curl();
    replay("README.md", &["--store", "memory"]);
}

#[test]
fn the_service_guide_transcripts() {
    needs_curl();
    replay("docs/service.md", &["--store", "memory"]);
}

#[test]
fn the_queue_guide_transcripts_with_its_config_file() {
    needs_curl();
    // The guide's discord.toml: its TOML block that configures the queue.
    let config = blocks(&read("docs/queue.md"), "toml")
        .into_iter()
        .map(|(_, text)| text)
        .find(|text| text.starts_with("[queues.discord-roles]"))
        .expect("docs/queue.md shows its discord.toml");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = common::write(dir.path(), "discord.toml", &config);
    replay("docs/queue.md", &["--config", &file]);
}

#[test]
fn the_simulate_guide_transcripts() {
    replay("docs/simulate.md", &[]);
}

#[test]
fn every_bash_block_is_valid_bash() {
    let mut checked = 0;
    for &document in paceline_testkit::docs::DOCUMENTS {
        for (line, script) in blocks(&read(document), "bash") {
            let out = Command::new("bash")
                .args(["-n", "-c", &script])
                .output()
                .expect("bash runs");
            assert!(
                out.status.success(),
                "{document}:{line}: not valid bash: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} bash blocks found");
}

#[test]
fn a_changed_answer_is_caught() {
    // The leeway given to a live service stops at what can change between two runs.
    let shown =
        [r#"{"allowed":true,"delay_ms":0.0,"remaining":1,"reset_after_ms":60000.0}"#.to_string()];
    let later = r#"{"allowed":true,"delay_ms":0.0,"remaining":1,"reset_after_ms":59990.5}"#;
    assert_eq!(curl_output_matches(&shown, later), Ok(()));
    let other = r#"{"allowed":true,"delay_ms":0.0,"remaining":0,"reset_after_ms":60000.0}"#;
    assert!(curl_output_matches(&shown, other).is_err());
    let delayed = r#"{"allowed":true,"delay_ms":5.0,"remaining":1,"reset_after_ms":60000.0}"#;
    assert!(curl_output_matches(&shown, delayed).is_err());
    assert_eq!(
        header_matches(
            r#"ratelimit: "inline";r=0;t=120"#,
            r#"ratelimit: "inline";r=0;t=119"#
        ),
        Ok(())
    );
    assert!(header_matches(
        r#"ratelimit: "inline";r=0;t=120"#,
        r#"ratelimit: "inline";r=1;t=120"#
    )
    .is_err());
}
