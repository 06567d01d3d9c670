//! `paceline simulate --plot` and `--compare`, run by the real binary: a plot of every golden
//! script, as SVG and PNG, holds exactly the marks of its decisions; `--compare`'s table
//! agrees with the decisions of separate runs.
//!
//! The plots are kept for a look under the target directory's
//! `tmp/plots/` (`CARGO_TARGET_TMPDIR`).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::golden::{args_of, golden_dir, scripts, simulate};
use serde_json::Value;

/// The colours of the marks (as the SVG writes them, and RGB in the PNG).
const AT_ONCE: (&str, [u8; 3]) = ("#1B9E3E", [0x1b, 0x9e, 0x3e]);
const DELAYED: (&str, [u8; 3]) = ("#E68A00", [0xe6, 0x8a, 0x00]);
const REJECTED: (&str, [u8; 3]) = ("#D62728", [0xd6, 0x27, 0x28]);

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plots");
    std::fs::create_dir_all(&dir).expect("a writable target directory");
    dir
}

/// Per key (in the order the plot draws them: the busiest first, ties in order of first
/// appearance), the marks the decisions call for: (at once, delayed, rejected).
fn expected_marks(output: &str) -> Vec<(String, [usize; 3])> {
    let mut keys: Vec<(String, [usize; 3])> = Vec::new();
    for line in output.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON decision");
        if v["op"] == "peek" || v.get("allowed").is_none() {
            continue;
        }
        let key = v["key"].as_str().expect("a key").to_string();
        let kind = match (v["allowed"].as_bool(), v["delay_ms"].as_f64()) {
            (Some(false), _) => 2,
            (Some(true), Some(0.0)) => 0,
            _ => 1,
        };
        match keys.iter_mut().find(|(k, _)| *k == key) {
            Some((_, counts)) => counts[kind] += 1,
            None => {
                let mut counts = [0; 3];
                counts[kind] = 1;
                keys.push((key, counts));
            }
        }
    }
    keys.sort_by_key(|(_, c)| std::cmp::Reverse(c.iter().sum::<usize>()));
    keys
}

struct Svg {
    /// Filled circles by fill colour.
    circles: BTreeMap<String, usize>,
    /// Lines by stroke colour.
    lines: BTreeMap<String, usize>,
    texts: Vec<String>,
    width: f64,
    height: f64,
}

fn read_svg(path: &Path) -> Svg {
    let text = std::fs::read_to_string(path).expect("the plot was written");
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{}: not valid XML: {e}", path.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg", "{}", path.display());
    let number = |name: &str| {
        root.attribute(name)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("the svg element has no numeric {name}"))
    };
    let mut svg = Svg {
        circles: BTreeMap::new(),
        lines: BTreeMap::new(),
        texts: Vec::new(),
        width: number("width"),
        height: number("height"),
    };
    for node in root.descendants().filter(|n| n.is_element()) {
        match node.tag_name().name() {
            "circle" => {
                let fill = node.attribute("fill").unwrap_or_default().to_string();
                *svg.circles.entry(fill).or_default() += 1;
            }
            "line" => {
                let stroke = node.attribute("stroke").unwrap_or_default().to_string();
                *svg.lines.entry(stroke).or_default() += 1;
            }
            "text" => {
                let content: String = node
                    .descendants()
                    .filter(|n| n.is_text())
                    .filter_map(|n| n.text())
                    .collect::<String>()
                    .trim()
                    .to_string();
                svg.texts.push(content);
            }
            _ => {}
        }
    }
    svg
}

fn plot(args: &[String], input: &Path, to: &Path) -> String {
    let mut with_plot = args.to_vec();
    with_plot.extend(["--plot".to_string(), to.display().to_string()]);
    let out = simulate(&with_plot, input);
    assert!(
        out.status.success(),
        "{}: {}",
        input.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[test]
fn every_golden_script_plots_as_svg_with_a_mark_per_decision() {
    let dir = artifacts();
    let mut plotted = 0;
    for script in scripts() {
        let args = args_of(&script);
        if args.first().map(String::as_str) != Some("--policy") {
            continue; // a queue script: plots are of policies
        }
        let name = script.file_stem().and_then(|s| s.to_str()).expect("a name");
        let svg_path = dir.join(format!("{name}.svg"));
        let output = plot(&args, &script, &svg_path);
        // The plot changes nothing of the decisions printed.
        let expected_output =
            std::fs::read_to_string(script.with_extension("out.jsonl")).expect("the golden output");
        assert_eq!(output, expected_output, "{name}");
        let keys = expected_marks(&output);
        assert!(
            !keys.is_empty() && keys.len() <= 6,
            "{name}: {} keys",
            keys.len()
        );
        let rows = keys.len();
        let svg = read_svg(&svg_path);
        assert_eq!(svg.height, f64::from(40 + 300 * rows as u32), "{name}");
        assert_eq!(svg.width, 1500.0, "{name}");
        let total = |kind: usize| keys.iter().map(|(_, c)| c[kind]).sum::<usize>();
        // Each row's legend holds one green dot and one red cross (two lines).
        let count =
            |map: &BTreeMap<String, usize>, colour: &str| map.get(colour).copied().unwrap_or(0);
        assert_eq!(
            count(&svg.circles, AT_ONCE.0),
            total(0) + rows,
            "{name}: green dots"
        );
        assert_eq!(
            count(&svg.circles, DELAYED.0),
            total(1),
            "{name}: orange dots at the slots"
        );
        assert_eq!(
            count(&svg.lines, REJECTED.0),
            2 * (total(2) + rows),
            "{name}: red crosses"
        );
        for (key, counts) in &keys {
            assert!(
                svg.texts
                    .iter()
                    .any(|t| t.starts_with(&format!("key {key} "))),
                "{name}: no row for key {key}"
            );
            assert!(
                svg.texts
                    .iter()
                    .any(|t| *t == format!("delays ({} delayed)", counts[1])),
                "{name}: key {key}'s delays chart"
            );
        }
        let legends = |label: &str| svg.texts.iter().filter(|t| *t == label).count();
        assert_eq!(legends("admitted (when it acts)"), rows, "{name}");
        assert_eq!(legends("requested"), rows, "{name}");
        let allowance = legends("allowance (every slot reserved)");
        if args[1].starts_with("concurrency:") {
            assert_eq!(allowance, 0, "{name}: leases have no rate allowance");
        } else {
            assert_eq!(allowance, rows, "{name}");
        }
        plotted += 1;
    }
    assert!(plotted >= 10, "only {plotted} golden scripts were plotted");
}

/// The RGB pixels of a PNG, with its size.
fn read_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::fs::File::open(path).expect("the plot was written");
    let decoder = png::Decoder::new(std::io::BufReader::new(file));
    let mut reader = decoder
        .read_info()
        .unwrap_or_else(|e| panic!("{}: not a PNG: {e}", path.display()));
    let mut pixels = vec![0; reader.output_buffer_size().expect("a bounded image")];
    let info = reader.next_frame(&mut pixels).expect("one frame");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    pixels.truncate(info.buffer_size());
    (info.width, info.height, pixels)
}

fn pixels_of(pixels: &[u8], rgb: [u8; 3]) -> usize {
    pixels.chunks_exact(3).filter(|p| *p == rgb).count()
}

#[test]
fn every_golden_script_plots_as_png_with_its_series_and_text() {
    let dir = artifacts();
    for script in scripts() {
        let args = args_of(&script);
        if args.first().map(String::as_str) != Some("--policy") {
            continue;
        }
        let name = script.file_stem().and_then(|s| s.to_str()).expect("a name");
        let png_path = dir.join(format!("{name}.png"));
        let output = plot(&args, &script, &png_path);
        let keys = expected_marks(&output);
        let (width, height, pixels) = read_png(&png_path);
        assert_eq!(
            (width, height),
            (1500, 40 + 300 * keys.len() as u32),
            "{name}"
        );
        // Orange and red are drawn by the legends and by marks alone (green is also the
        // admitted-cost line): a kind that occurs covers more than each row's legend does,
        // one that does not occur, exactly the legends.
        let legend = legend_pixels(&dir);
        for (colour, what, kind, legend) in [
            (DELAYED.1, "delayed", 1, legend[0]),
            (REJECTED.1, "rejected", 2, legend[1]),
        ] {
            let occurs = keys.iter().any(|(_, c)| c[kind] > 0);
            let seen = pixels_of(&pixels, colour);
            let legends = legend * keys.len();
            if occurs {
                assert!(
                    seen > legends,
                    "{name}: no {what} marks ({seen} pixels, legends {legends})"
                );
            } else {
                assert_eq!(
                    seen, legends,
                    "{name}: {what} pixels without a {what} request"
                );
            }
        }
        assert!(pixels_of(&pixels, AT_ONCE.1) > 0, "{name}: no green");
        // Text is drawn (the font ships in the binary): black glyph pixels in the title.
        let title_black = pixels[..(1500 * 40 * 3) as usize]
            .chunks_exact(3)
            .filter(|p| p.iter().all(|&c| c < 64))
            .count();
        assert!(
            title_black > 100,
            "{name}: the title has no text ({title_black} dark pixels)"
        );
    }
}

/// The orange and red pixels of one row's legends: the plot of a single request, admitted
/// at once, draws those colours in its legends only.
fn legend_pixels(dir: &Path) -> [usize; 2] {
    let input = dir.join("legends.jsonl");
    std::fs::write(&input, "{\"op\": \"limit\"}\n").expect("writable");
    let png_path = dir.join("legends.png");
    plot(
        &["--policy".into(), "gcra:rate=1/h".into()],
        &input,
        &png_path,
    );
    let (_, _, pixels) = read_png(&png_path);
    let counts = [
        pixels_of(&pixels, DELAYED.1),
        pixels_of(&pixels, REJECTED.1),
    ];
    assert!(
        counts.iter().all(|&c| c > 0),
        "the legends draw each colour: {counts:?}"
    );
    counts
}

#[test]
fn a_dense_script_is_drawn_per_slice_of_time_and_stays_small() {
    let dir = artifacts();
    let mut script = String::new();
    for i in 0..20_000u64 {
        script.push_str(&format!("{{\"at_ms\": {}}}\n", i * 5));
        if i % 3 == 0 {
            script.push_str("{\"key\": \"api\", \"op\": \"limit\"}\n");
        } else {
            script.push_str("{\"key\": \"api\", \"op\": \"pace\", \"max_wait_ms\": 50}\n");
        }
    }
    let input = dir.join("dense.jsonl");
    std::fs::write(&input, script).expect("writable");
    let svg_path = dir.join("dense.svg");
    let args = [
        "--policy".to_string(),
        "gcra:rate=150/s,burst=10".to_string(),
    ];
    let output = plot(&args, &input, &svg_path);
    let keys = expected_marks(&output);
    assert_eq!(keys.len(), 1);
    let [at_once, delayed, rejected] = keys[0].1;
    assert!(
        at_once > 0 && delayed > 0 && rejected > 0,
        "{:?}",
        keys[0].1
    );
    let size = std::fs::metadata(&svg_path).expect("written").len();
    assert!(
        size < 1_000_000,
        "a dense plot of 20,000 requests takes {size} bytes"
    );
    let svg = read_svg(&svg_path);
    assert!(
        svg.texts.iter().any(
            |t| t == "key api  (gcra:rate=150/s,burst=10)  (20000 requests, per slice of time)"
        ),
        "{:?}",
        svg.texts
    );
    // No mark per request: only the legends' dots.
    assert_eq!(svg.circles.get(AT_ONCE.0).copied().unwrap_or(0), 0);
    let png_path = dir.join("dense.png");
    plot(&args, &input, &png_path);
    let (_, _, pixels) = read_png(&png_path);
    for colour in [AT_ONCE.1, DELAYED.1, REJECTED.1] {
        assert!(pixels_of(&pixels, colour) > 200, "{colour:?}");
    }
}

/// Splits `--compare`'s table into its cells.
fn table_rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| {
            // The policy column is padded; the numbers are separated by two spaces or more.
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

#[test]
fn compare_tabulates_each_policy_as_its_own_run_decides() {
    let script = golden_dir().join("gcra.jsonl");
    let specs = [
        "gcra:rate=10/s,burst=3",
        "fixed_window:limit=5,window=1s",
        "sliding_log:limit=5,window=1s",
    ];
    let mut args = vec!["--policy".to_string(), specs[0].to_string()];
    for spec in &specs[1..] {
        args.extend(["--compare".to_string(), spec.to_string()]);
    }
    let svg_path = artifacts().join("compare.svg");
    let table = plot(&args, &script, &svg_path);
    let rows = table_rows(&table);
    assert_eq!(rows[0][0], "policy");
    assert_eq!(rows.len(), 1 + specs.len(), "{table}");
    let svg = read_svg(&svg_path);
    for (row, spec) in rows[1..].iter().zip(specs) {
        assert_eq!(row[0], spec);
        // The same numbers from the policy's own run's decisions.
        let out = simulate(&["--policy".to_string(), spec.to_string()], &script);
        let decisions = String::from_utf8(out.stdout).expect("UTF-8");
        let mut delays = Vec::new();
        let mut rejected = 0;
        for line in decisions.lines() {
            let v: Value = serde_json::from_str(line).expect("JSON");
            if v["op"] == "peek" || v.get("allowed").is_none() {
                continue;
            }
            if v["allowed"] == true {
                delays.push(v["delay_ms"].as_f64().expect("a delay"));
            } else {
                rejected += 1;
            }
        }
        delays.sort_by(f64::total_cmp);
        assert_eq!(row[1], delays.len().to_string(), "{spec}: admitted");
        assert_eq!(row[2], rejected.to_string(), "{spec}: rejected");
        let max = delays.last().copied().unwrap_or(0.0);
        assert_eq!(row[5], format!("{max:.3}"), "{spec}: the longest delay");
        let p50 = delays[(delays.len() as f64 * 0.5).ceil() as usize - 1];
        assert_eq!(row[3], format!("{p50:.3}"), "{spec}: the median delay");
        // Side by side: every policy has its rows in the plot.
        assert!(
            svg.texts
                .iter()
                .any(|t| t.starts_with(&format!("{spec}  key "))),
            "no row of {spec} in the compared plot"
        );
    }
    // gcra's burst of 3 admits 3 requests of a key at once, no more.
    assert_eq!(rows[1][6], "3", "{table}");
}

#[test]
fn plot_and_compare_refuse_what_they_cannot_do() {
    let script = golden_dir().join("gcra.jsonl");
    let run = |extra: &[&str]| {
        let mut args = vec!["--policy".to_string(), "gcra:rate=10/s,burst=3".to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        simulate(&args, &script)
    };
    let jpg = artifacts().join("plot.jpg");
    let out = run(&["--plot", jpg.to_str().expect("UTF-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--plot") && stderr.contains(".svg"),
        "{stderr}"
    );
    let out = run(&["--compare", "gcra:rate=0/s"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--compare") && stderr.contains("rate"),
        "{stderr}"
    );
    let many: Vec<&str> = ["--compare", "gcra:rate=1/s"].repeat(8);
    let out = run(&many);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 7"));
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args([
            "simulate",
            "--queue",
            "fixed_window:limit=1,window=1s",
            "--plot",
            "x.svg",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "a queue script is not plotted");
}

#[test]
fn a_key_with_control_characters_still_makes_valid_svg() {
    let dir = artifacts();
    let input = dir.join("control.jsonl");
    std::fs::write(
        &input,
        "{\"key\": \"a\\u0001b\\u001b[31m\", \"op\": \"limit\"}\n",
    )
    .expect("writable");
    let svg_path = dir.join("control.svg");
    let output = plot(
        &["--policy".to_string(), "gcra:rate=1/s".to_string()],
        &input,
        &svg_path,
    );
    assert!(output.contains("\"allowed\":true"), "{output}");
    let svg = read_svg(&svg_path);
    assert!(
        svg.texts
            .iter()
            .any(|t| t.starts_with("key a\u{fffd}b\u{fffd}[31m ")),
        "{:?}",
        svg.texts
    );
}
