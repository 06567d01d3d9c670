//! `paceline simulate --plot` and `--compare`: what a policy did to a script's traffic, drawn
//! (SVG or PNG, with `plotters`) and tabulated.
//!
//! A plot has one row per key (the busiest keys first; with `--compare`, one row per policy
//! and key), and three charts a row, over the script's virtual time:
//!
//! * **requests**: each request a mark at its arrival, in order from the bottom: admitted at
//!   once (green dot), admitted after a delay (orange, a line from its arrival to its slot),
//!   rejected (red cross). Above [`DENSE`] requests the row shows, per slice of time, how
//!   many arrived of each kind instead (stacked bars);
//! * **admitted cost and allowance**: the cost admitted so far, counted when it acts (at its
//!   slot), against the requested cost and against the policy's **allowance**: the most a
//!   client that reserved every slot from the key's first request would have had by then (the
//!   same policy, paced from idle with cost 1: exact for every algorithm, since it is the
//!   algorithm's own answer);
//! * **delays**: how the delays of the requests admitted after one are distributed.
//!
//! Peeks and resets change nothing and are not drawn.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Once};

use paceline_core::{round_to_micros, Op};
use paceline_store::Policy;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::simulate::{Outcome, SimOp};

/// Above this many requests in a row, the requests chart aggregates them per slice of time.
pub const DENSE: usize = 2_000;

/// The most rows a plot holds (keys, or policies × keys).
pub const MAX_ROWS: usize = 8;

/// The most keys one policy's plot shows.
const MAX_KEYS: usize = 6;

/// Slices of time of a dense requests chart.
const SLICES: usize = 120;

/// Bars of a delays chart.
const DELAY_BINS: usize = 24;

/// About the most points a line of a chart holds.
const MAX_LINE_POINTS: usize = 2_000;

/// The most points of an allowance curve.
const MAX_ALLOWANCE: u64 = 200_000;

const WIDTH: u32 = 1_500;
const ROW_HEIGHT: u32 = 300;
const HEADER: u32 = 40;

const AT_ONCE: RGBColor = RGBColor(0x1b, 0x9e, 0x3e);
const DELAYED: RGBColor = RGBColor(0xe6, 0x8a, 0x00);
const REJECTED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const ALLOWANCE: RGBColor = RGBColor(0x1f, 0x5f, 0xbf);
const REQUESTED: RGBColor = RGBColor(0x99, 0x99, 0x99);

/// One replay of the script: the policy it ran with (its label) and what it did.
pub struct Run<'a> {
    pub label: String,
    pub outcomes: &'a [Outcome],
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    AtOnce,
    Delayed,
    Rejected,
}

/// One drawn request.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    pub t_us: u64,
    pub delay_us: u64,
    pub cost: u64,
    pub kind: Kind,
}

impl Mark {
    /// When an admitted request acts.
    fn acts_at(&self) -> u64 {
        self.t_us.saturating_add(self.delay_us)
    }
}

/// The requests of a run that decided something (not peeks or resets), by key, the busiest
/// keys first (ties: the key seen first), and with each key the policy of its first request.
pub fn by_key(outcomes: &[Outcome]) -> Vec<(String, Arc<Policy>, Vec<Mark>)> {
    let mut order: Vec<(String, Arc<Policy>, Vec<Mark>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for o in outcomes {
        let Some(d) = &o.decision else { continue };
        if o.op == SimOp::Peek {
            continue;
        }
        let delay_us = round_to_micros(d.delay);
        let kind = match (d.allowed, delay_us) {
            (false, _) => Kind::Rejected,
            (true, 0) => Kind::AtOnce,
            (true, _) => Kind::Delayed,
        };
        let mark = Mark {
            t_us: o.t_us,
            delay_us: if d.allowed { delay_us } else { 0 },
            cost: o.cost,
            kind,
        };
        let index = *at.entry(o.key.as_str()).or_insert_with(|| {
            order.push((o.key.clone(), Arc::clone(&o.policy), Vec::new()));
            order.len() - 1
        });
        order[index].2.push(mark);
    }
    // A stable sort: equally busy keys stay in the order they were first seen.
    order.sort_by_key(|(_, _, marks)| std::cmp::Reverse(marks.len()));
    order
}

/// The policy's allowance from idle at `t0`: the times of the first slots a client that
/// reserved every one (cost 1) would get, up to `t_end` and at most `cap` of them; `None` for
/// a policy without a rate (`concurrency`).
pub fn allowance(policy: &Policy, t0: u64, t_end: u64, cap: u64) -> Option<Vec<u64>> {
    if matches!(policy, Policy::Concurrency(_)) {
        return None;
    }
    let cap = cap.min(MAX_ALLOWANCE);
    let mut state = None;
    let mut now = t0;
    let mut slots = Vec::new();
    // Every round either books a slot or moves the clock forward: bounded either way.
    for _ in 0..cap.saturating_mul(4).saturating_add(16) {
        if slots.len() as u64 >= cap {
            break;
        }
        let d = policy.apply(&mut state, now, Op::pace(), 1).ok()?;
        let delay = round_to_micros(d.delay);
        if d.allowed {
            let slot = now.saturating_add(delay);
            if slot > t_end {
                break;
            }
            slots.push(slot);
        } else if delay == 0 {
            break;
        } else {
            // A policy whose pace can refuse (`exec_evenly`): ask again when it says.
            now = now.saturating_add(delay);
            if now > t_end {
                break;
            }
        }
    }
    slots.sort_unstable();
    Some(slots)
}

/// One row of a plot.
struct Row {
    title: String,
    policy: Arc<Policy>,
    marks: Vec<Mark>,
}

/// The picture format `path` names: `svg` or `png` (its extension, in any case).
pub fn format_of(path: &Path) -> Result<&'static str, String> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("svg") => Ok("svg"),
        Some("png") => Ok("png"),
        _ => Err(format!(
            "`{}` is neither .svg nor .png; name the file FILE.svg or FILE.png",
            path.display()
        )),
    }
}

/// Draws `runs` into `path` (`.svg` or `.png`); the error names what went wrong.
pub fn draw(path: &Path, runs: &[Run<'_>]) -> Result<(), String> {
    let format = format_of(path)?;
    let (rows, keys) = rows(runs);
    let height = HEADER + ROW_HEIGHT * rows.len().max(1) as u32;
    let header = header(runs, &rows, keys);
    // Both backends measure text with the font (the SVG names it, and leaves the drawing
    // to the viewer's `sans-serif`).
    register_font();
    match format {
        "svg" => {
            let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
            paint(&root, &header, &rows).map_err(|e| e.to_string())?;
            root.present().map_err(|e| e.to_string())
        }
        _ => {
            let mut pixels = vec![0u8; (WIDTH * height * 3) as usize];
            {
                let root =
                    BitMapBackend::with_buffer(&mut pixels, (WIDTH, height)).into_drawing_area();
                paint(&root, &header, &rows).map_err(|e| e.to_string())?;
                root.present().map_err(|e| e.to_string())?;
            }
            write_png(path, WIDTH, height, &pixels)
        }
    }
}

/// The rows to draw: each run's busiest keys, at most [`MAX_ROWS`] in all; and how many
/// keys (of every run) there are.
fn rows(runs: &[Run<'_>]) -> (Vec<Row>, usize) {
    let keys_per_run = (MAX_ROWS / runs.len().max(1)).clamp(1, MAX_KEYS);
    let mut rows = Vec::new();
    let mut keys = 0;
    for run in runs {
        let of_run = by_key(run.outcomes);
        keys += of_run.len();
        for (key, policy, marks) in of_run.into_iter().take(keys_per_run) {
            let title = if runs.len() > 1 {
                format!("{}  key {}", printable(&run.label), printable(&key))
            } else {
                format!("key {}  ({policy})", printable(&key))
            };
            rows.push(Row {
                title,
                policy,
                marks,
            });
        }
    }
    rows.truncate(MAX_ROWS);
    (rows, keys)
}

/// `text` with its control characters replaced by U+FFFD: a key may hold any character,
/// and XML (the SVG) allows none of them.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// The plot's title line: what is drawn, and what is left out.
fn header(runs: &[Run<'_>], rows: &[Row], keys: usize) -> String {
    let requests: usize = runs.iter().map(|r| r.outcomes.len()).sum();
    let mut text = if runs.len() > 1 {
        format!(
            "paceline simulate: the same traffic through {} policies",
            runs.len()
        )
    } else {
        format!("paceline simulate: {} requests", requests)
    };
    if rows.is_empty() {
        text.push_str(" (no request decided anything: nothing to draw)");
    } else if rows.len() < keys {
        text.push_str(&format!(
            " ({} of {} rows drawn, the busiest keys)",
            rows.len(),
            keys
        ));
    }
    text
}

/// The time span every row shares, in seconds: from the first arrival to the last arrival
/// or slot.
fn span(rows: &[Row]) -> Range<f64> {
    let first = rows
        .iter()
        .flat_map(|r| r.marks.iter().map(|m| m.t_us))
        .min()
        .unwrap_or(0);
    let last = rows
        .iter()
        .flat_map(|r| r.marks.iter().map(Mark::acts_at))
        .max()
        .unwrap_or(0);
    let (a, b) = (secs(first), secs(last));
    let width = (b - a).max(1e-3);
    (a - width * 0.02)..(b + width * 0.03)
}

/// An axis label for a time or a delay: as many decimals as the axis's span needs.
fn decimals(span: f64) -> impl Fn(&f64) -> String {
    let places = if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else if span >= 0.2 {
        2
    } else {
        3
    };
    move |v: &f64| format!("{v:.places$}")
}

/// An axis label for counts: whole numbers only (others are left blank).
fn whole(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-6 && *v > -0.5 {
        format!("{}", v.round().abs())
    } else {
        String::new()
    }
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn paint<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    header: &str,
    rows: &[Row],
) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(HEADER);
    top.draw(&Text::new(
        header.to_string(),
        (12, 12),
        ("sans-serif", 18).into_font(),
    ))?;
    let x = span(rows);
    for (row, area) in rows.iter().zip(body.split_evenly((rows.len().max(1), 1))) {
        let (left, rest) = area.split_horizontally((45).percent_width());
        let (middle, right) = rest.split_horizontally((55).percent_width());
        requests(&left, row, x.clone())?;
        cost(&middle, row, x.clone())?;
        delays(&right, row)?;
    }
    Ok(())
}

/// The requests chart of a row.
fn requests<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    row: &Row,
    x: Range<f64>,
) -> Drawn<DB> {
    let time_label = decimals(x.end - x.start);
    let marks = &row.marks;
    if marks.len() > DENSE {
        return requests_dense(area, row, x);
    }
    let n = marks.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(&row.title, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        .build_cartesian_2d(x, -0.5..n - 0.5)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .x_label_formatter(&time_label)
        .y_desc("request")
        .y_label_formatter(&whole)
        .label_style(("sans-serif", 11))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let size = if marks.len() <= 60 {
        4
    } else if marks.len() <= 400 {
        2
    } else {
        1
    };
    let at = |i: usize| i as f64;
    chart
        .draw_series(
            marks
                .iter()
                .enumerate()
                .filter(|(_, m)| m.kind == Kind::AtOnce)
                .map(|(i, m)| Circle::new((secs(m.t_us), at(i)), size, AT_ONCE.filled())),
        )?
        .label("admitted at once")
        .legend(|(x, y)| Circle::new((x + 6, y), 4, AT_ONCE.filled()));
    chart
        .draw_series(
            marks
                .iter()
                .enumerate()
                .filter(|(_, m)| m.kind == Kind::Delayed)
                .map(|(i, m)| {
                    PathElement::new(
                        vec![(secs(m.t_us), at(i)), (secs(m.acts_at()), at(i))],
                        DELAYED.stroke_width(1),
                    )
                }),
        )?
        .label("admitted after a delay (arrival to slot)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], DELAYED.stroke_width(2)));
    chart.draw_series(
        marks
            .iter()
            .enumerate()
            .filter(|(_, m)| m.kind == Kind::Delayed)
            .map(|(i, m)| Circle::new((secs(m.acts_at()), at(i)), size, DELAYED.filled())),
    )?;
    chart
        .draw_series(
            marks
                .iter()
                .enumerate()
                .filter(|(_, m)| m.kind == Kind::Rejected)
                .map(|(i, m)| {
                    Cross::new((secs(m.t_us), at(i)), size + 1, REJECTED.stroke_width(2))
                }),
        )?
        .label("rejected")
        .legend(|(x, y)| Cross::new((x + 6, y), 4, REJECTED.stroke_width(2)));
    legend(&mut chart)
}

/// The requests chart of a dense row: per slice of time, the requests that arrived in it,
/// stacked by kind.
fn requests_dense<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    row: &Row,
    x: Range<f64>,
) -> Drawn<DB> {
    let time_label = decimals(x.end - x.start);
    // Slices over the arrivals' own span (the axis is padded, and shared by every row).
    let first = row
        .marks
        .iter()
        .map(|m| secs(m.t_us))
        .fold(f64::INFINITY, f64::min);
    let last = row
        .marks
        .iter()
        .map(|m| secs(m.t_us))
        .fold(f64::NEG_INFINITY, f64::max);
    let width = ((last - first) / SLICES as f64).max(1e-6);
    let mut counts = vec![[0u64; 3]; SLICES];
    for m in &row.marks {
        let slice = (((secs(m.t_us) - first) / width) as usize).min(SLICES - 1);
        let kind = match m.kind {
            Kind::AtOnce => 0,
            Kind::Delayed => 1,
            Kind::Rejected => 2,
        };
        counts[slice][kind] += 1;
    }
    let top = counts
        .iter()
        .map(|c| c.iter().sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let title = format!(
        "{}  ({} requests, per slice of time)",
        row.title,
        row.marks.len()
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        // Room above the bars for the legend.
        .build_cartesian_2d(x.clone(), 0.0..top * 1.5)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .x_label_formatter(&time_label)
        .y_desc("requests")
        .y_label_formatter(&whole)
        .label_style(("sans-serif", 11))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let labels = [
        ("admitted at once", AT_ONCE),
        ("admitted after a delay", DELAYED),
        ("rejected", REJECTED),
    ];
    for (kind, (label, color)) in labels.into_iter().enumerate() {
        chart
            .draw_series(counts.iter().enumerate().filter(|(_, c)| c[kind] > 0).map(
                |(slice, c)| {
                    let below: u64 = c[..kind].iter().sum();
                    let left = first + slice as f64 * width;
                    Rectangle::new(
                        [
                            (left, below as f64),
                            (left + width, (below + c[kind]) as f64),
                        ],
                        color.filled(),
                    )
                },
            ))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 10, y + 4)], color.filled()));
    }
    legend_at(&mut chart, SeriesLabelPosition::UpperRight)
}

/// The admitted-cost chart of a row: admitted (at the slot), requested, and the allowance.
fn cost<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, row: &Row, x: Range<f64>) -> Drawn<DB> {
    let time_label = decimals(x.end - x.start);
    let marks = &row.marks;
    let requested: u64 = marks.iter().map(|m| m.cost).sum();
    let mut admitted: Vec<(u64, u64)> = marks
        .iter()
        .filter(|m| m.kind != Kind::Rejected)
        .map(|m| (m.acts_at(), m.cost))
        .collect();
    admitted.sort_unstable();
    let t0 = marks.iter().map(|m| m.t_us).min().unwrap_or(0);
    let t_end = (x.end * 1e6) as u64;
    let top = requested.max(1) as f64 * 1.1;
    let allowance = allowance(&row.policy, t0, t_end, top.ceil() as u64 + 1);
    let mut chart = ChartBuilder::on(area)
        .caption("admitted cost and allowance", ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(48)
        .build_cartesian_2d(x.clone(), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .x_label_formatter(&time_label)
        .y_desc("cost")
        .y_label_formatter(&whole)
        .label_style(("sans-serif", 11))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let arrivals: Vec<(u64, u64)> = marks.iter().map(|m| (m.t_us, m.cost)).collect();
    chart
        .draw_series(LineSeries::new(
            steps(&arrivals, Some(x.end)),
            REQUESTED.stroke_width(1),
        ))?
        .label("requested")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], REQUESTED.stroke_width(2)));
    if let Some(slots) = allowance {
        let ones: Vec<(u64, u64)> = slots.iter().map(|&t| (t, 1)).collect();
        // Drawn to the axis's end only if no slot was left out (capped at
        // MAX_ALLOWANCE, the line ends at its last slot rather than go flat).
        let capped = ones.len() as u64 >= MAX_ALLOWANCE;
        let mut line = steps(&ones, (!capped).then_some(x.end));
        line.retain(|&(_, y)| y <= top);
        // Wide and light, under the admitted line: where a client took every slot, the two
        // coincide and both stay visible.
        chart
            .draw_series(LineSeries::new(line, ALLOWANCE.mix(0.45).stroke_width(6)))?
            .label("allowance (every slot reserved)")
            .legend(|(x, y)| {
                PathElement::new(
                    vec![(x, y), (x + 12, y)],
                    ALLOWANCE.mix(0.45).stroke_width(6),
                )
            });
    }
    chart
        .draw_series(LineSeries::new(
            steps(&admitted, Some(x.end)),
            AT_ONCE.stroke_width(2),
        ))?
        .label("admitted (when it acts)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], AT_ONCE.stroke_width(2)));
    legend(&mut chart)
}

/// A cumulative step line through `(time µs, amount)` points sorted by time, from 0, and
/// held level to `end` seconds if given.
fn steps(points: &[(u64, u64)], end: Option<f64>) -> Vec<(f64, f64)> {
    let mut line = Vec::with_capacity(points.len() * 2 + 2);
    let mut total = 0.0;
    for &(t, amount) in points {
        let at = secs(t);
        if let Some(&(_, y)) = line.last() {
            line.push((at, y));
        } else {
            line.push((at, 0.0));
        }
        total += amount as f64;
        line.push((at, total));
    }
    if let (Some(end), Some(&(_, y))) = (end, line.last()) {
        line.push((end, y));
    }
    thin(line)
}

/// At most about [`MAX_LINE_POINTS`] of a rising line's points, evenly picked (the first and
/// the last kept): a chart a few hundred pixels wide shows no more, and the SVG stays small.
fn thin(line: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if line.len() <= MAX_LINE_POINTS {
        return line;
    }
    let step = line.len().div_ceil(MAX_LINE_POINTS);
    let last = line.len() - 1;
    line.into_iter()
        .enumerate()
        .filter(|&(i, _)| i % step == 0 || i == last)
        .map(|(_, p)| p)
        .collect()
}

/// The delays chart of a row.
fn delays<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, row: &Row) -> Drawn<DB> {
    let delays: Vec<f64> = row
        .marks
        .iter()
        .filter(|m| m.kind == Kind::Delayed)
        .map(|m| m.delay_us as f64 / 1e3)
        .collect();
    let longest = delays.iter().copied().fold(0.0, f64::max).max(1.0);
    let width = longest / DELAY_BINS as f64;
    let mut bins = [0u64; DELAY_BINS];
    for d in &delays {
        bins[((d / width) as usize).min(DELAY_BINS - 1)] += 1;
    }
    let top = bins.iter().copied().max().unwrap_or(0).max(1) as f64;
    let caption = format!("delays ({} delayed)", delays.len());
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(40)
        .build_cartesian_2d(0.0..longest * 1.02, 0.0..top * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("delay (ms)")
        .x_label_formatter(&decimals(longest))
        .y_desc("requests")
        .x_labels(6)
        .y_label_formatter(&whole)
        .label_style(("sans-serif", 11))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(
        bins.iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| {
                let left = i as f64 * width;
                Rectangle::new([(left, 0.0), (left + width, c as f64)], DELAYED.filled())
            }),
    )?;
    if delays.is_empty() {
        area.draw(&Text::new(
            "no request was delayed".to_string(),
            (60, ROW_HEIGHT as i32 / 2),
            ("sans-serif", 13).into_font(),
        ))?;
    }
    Ok(())
}

/// A chart over seconds (or milliseconds) and amounts.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws a chart's legend.
/// Draws a chart's legend in its lower right corner, which every chart here leaves empty
/// (requests arrive in order and cumulative lines rise: their marks are above and left).
fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> Drawn<DB> {
    legend_at(chart, SeriesLabelPosition::LowerRight)
}

/// Draws a chart's legend at `position`.
fn legend_at<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    position: SeriesLabelPosition,
) -> Drawn<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 11))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
}

/// Lets the backends measure and draw text: a font shipped inside the binary (no system
/// font needed).
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is a valid TrueType file of a dependency: this cannot fail; if it ever
        // did, text would be missing from PNGs (and the PNG test fails on it).
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::HACK_REGULAR,
        );
    });
}

/// Writes RGB `pixels` as a PNG file.
fn write_png(path: &Path, width: u32, height: u32, pixels: &[u8]) -> Result<(), String> {
    let file = std::fs::File::create(path)
        .map_err(|e| format!("cannot create `{}`: {e}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    writer
        .write_image_data(pixels)
        .map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    writer
        .finish()
        .map_err(|e| format!("cannot write `{}`: {e}", path.display()))
}

/// `--compare`'s numbers for one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub admitted: u64,
    pub rejected: u64,
    /// Delays of the admitted requests (at once counts as 0), in µs.
    pub delay_p50_us: u64,
    pub delay_p99_us: u64,
    pub delay_max_us: u64,
    /// The most requests of one key that act (admitted, at their slot) within any span of
    /// [`BURST_SPAN_US`]: what the policy lets reach the service at once.
    pub longest_burst: u64,
}

/// The span of a burst in [`Summary::longest_burst`]: 100 ms.
pub const BURST_SPAN_US: u64 = 100_000;

/// The numbers of `--compare` for `outcomes`.
pub fn summarize(outcomes: &[Outcome]) -> Summary {
    let mut delays = Vec::new();
    let mut rejected = 0;
    let mut longest_burst = 0;
    for (_, _, marks) in by_key(outcomes) {
        let mut acting: Vec<u64> = Vec::with_capacity(marks.len());
        for m in &marks {
            match m.kind {
                Kind::Rejected => rejected += 1,
                _ => {
                    delays.push(m.delay_us);
                    acting.push(m.acts_at());
                }
            }
        }
        acting.sort_unstable();
        // The widest window [acting[first], acting[first] + span) over the sorted times.
        let mut first = 0;
        for (last, &t) in acting.iter().enumerate() {
            while t - acting[first] >= BURST_SPAN_US {
                first += 1;
            }
            longest_burst = longest_burst.max((last - first + 1) as u64);
        }
    }
    delays.sort_unstable();
    Summary {
        admitted: delays.len() as u64,
        rejected,
        delay_p50_us: rank(&delays, 0.50),
        delay_p99_us: rank(&delays, 0.99),
        delay_max_us: delays.last().copied().unwrap_or(0),
        longest_burst,
    }
}

/// The nearest-rank percentile `q` of sorted `values` (0 when empty).
fn rank(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let at = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[at - 1]
}

/// `--compare`'s table: one line per run, columns aligned.
pub fn table(runs: &[(String, Summary)]) -> String {
    let ms = |us: u64| format!("{:.3}", us as f64 / 1e3);
    let mut lines = vec![[
        "policy".to_string(),
        "admitted".into(),
        "rejected".into(),
        "delay p50 ms".into(),
        "delay p99 ms".into(),
        "delay max ms".into(),
        "longest burst".into(),
    ]];
    for (label, s) in runs {
        lines.push([
            label.clone(),
            s.admitted.to_string(),
            s.rejected.to_string(),
            ms(s.delay_p50_us),
            ms(s.delay_p99_us),
            ms(s.delay_max_us),
            s.longest_burst.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let mut text = format!("{:<w$}", line[0], w = widths[0]);
        for c in 1..7 {
            text.push_str(&format!("  {:>w$}", line[c], w = widths[c]));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: &str) -> Policy {
        spec.parse().expect("a valid spec")
    }

    #[test]
    fn the_allowance_is_the_policy_paced_from_idle() {
        // A burst of 3 at once, then one every 100 ms.
        let slots = allowance(&policy("gcra:rate=10/s,burst=3"), 1_000_000, 1_350_000, 100);
        assert_eq!(
            slots,
            Some(vec![
                1_000_000, 1_000_000, 1_000_000, 1_100_000, 1_200_000, 1_300_000
            ])
        );
        // Aligned windows: the rest of the current one, then each window's limit at its start.
        let slots = allowance(
            &policy("fixed_window:limit=2,window=1s"),
            500_000,
            2_000_000,
            100,
        );
        assert_eq!(
            slots,
            Some(vec![
                500_000, 500_000, 1_000_000, 1_000_000, 2_000_000, 2_000_000
            ])
        );
        // Capped, and none for leases.
        let capped = allowance(&policy("gcra:rate=1000/s"), 0, u64::MAX / 4, 7);
        assert_eq!(capped.map(|s| s.len()), Some(7));
        assert_eq!(
            allowance(&policy("concurrency:limit=2,lease=1s"), 0, 10, 10),
            None
        );
    }

    #[test]
    fn a_burst_is_what_acts_within_100_ms() {
        let summary = |spec: &str, script: &str| {
            summarize(&crate::simulate::outcomes(policy(spec), script).expect("a valid script"))
        };
        // A steady client, one request a second, all admitted at once: no burst.
        let steady = "{\"op\": \"limit\"}\n{\"sleep_ms\": 1000}\n".repeat(10);
        assert_eq!(summary("gcra:rate=1/s", &steady).longest_burst, 1);
        // Six at once: a bucket of 5 lets 5 through together.
        let flood = "{\"op\": \"limit\"}\n".repeat(6);
        assert_eq!(summary("gcra:rate=1/s,burst=5", &flood).longest_burst, 5);
        // Paced into one window: a fixed window's backlog acts together at its start.
        let backlog = "{\"op\": \"pace\"}\n".repeat(25);
        let s = summary("fixed_window:limit=10,window=1s", &backlog);
        assert_eq!((s.admitted, s.longest_burst), (25, 10));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(rank(&[], 0.5), 0);
        assert_eq!(rank(&[7], 0.99), 7);
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!((rank(&values, 0.5), rank(&values, 0.99)), (50, 99));
        assert_eq!(rank(&[1, 2, 3], 0.5), 2);
    }

    #[test]
    fn a_long_line_is_thinned_keeping_its_ends() {
        let line: Vec<(f64, f64)> = (0..10_001).map(|i| (i as f64, i as f64)).collect();
        let thinned = thin(line);
        assert!(thinned.len() <= MAX_LINE_POINTS + 1, "{}", thinned.len());
        assert_eq!(thinned.first(), Some(&(0.0, 0.0)));
        assert_eq!(thinned.last(), Some(&(10_000.0, 10_000.0)));
        assert!(thinned.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn the_summary_counts_decisions_and_the_longest_burst_per_key() {
        let script = "{\"key\": \"a\", \"op\": \"limit\"}\n".repeat(4)
            + &"{\"key\": \"b\", \"op\": \"pace\"}\n".repeat(3)
            + "{\"key\": \"a\", \"op\": \"peek\"}\n{\"key\": \"a\", \"op\": \"reset\"}\n";
        let outcomes = crate::simulate::outcomes(policy("gcra:rate=1/s,burst=2"), &script)
            .expect("a valid script");
        let s = summarize(&outcomes);
        // a: 2 at once, 2 rejected; b: 2 at once, then one after 1 s. Peek and reset: none.
        assert_eq!((s.admitted, s.rejected), (5, 2));
        assert_eq!((s.delay_p50_us, s.delay_max_us), (0, 1_000_000));
        // At most 2 of one key act within 100 ms (b's third acts 1 s later).
        assert_eq!(s.longest_burst, 2);
        let table = table(&[("gcra:rate=1/s,burst=2".into(), s)]);
        assert_eq!(table.lines().count(), 2);
        assert!(
            table.lines().nth(1).is_some_and(|l| l.ends_with(" 2")),
            "{table}"
        );
    }
}
