//! The report's chart: one self-contained SVG file (no scripts, fonts or links) with two
//! panels, the latency percentile curve and throughput over time, that any browser opens.
//!
//! Owns drawing only: it gets labelled points and returns SVG text. The latency panel follows
//! HdrHistogram's plots: the x axis is "number of nines", `log10(1 / (1 - percentile))`, so
//! 90%, 99%, 99.9% … are evenly spaced and the tail is visible; the y axis is logarithmic in
//! latency. The throughput panel is linear in both axes.

use std::fmt::Write;

/// Plot colours, one per line.
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 780.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 930.0;
/// The latency panel's plot area, top and bottom.
const LATENCY_TOP: f64 = 100.0;
const LATENCY_BOTTOM: f64 = 400.0;
/// The throughput panel's plot area, top and bottom.
const THROUGHPUT_TOP: f64 = 490.0;
const THROUGHPUT_BOTTOM: f64 = 720.0;
/// The rightmost percentile the x axis may reach: 99.9999%.
const MAX_NINES: f64 = 6.0;

/// A latency percentile curve: `(quantile 0..=1, latency in µs)`, quantile 1 being the maximum.
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A throughput line: `(seconds since the start, messages per second)`.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub subtitle: String,
    pub curves: Vec<Curve>,
    pub series: Vec<Series>,
}

/// The chart as SVG text.
pub fn render(chart: &Chart) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    text(&mut svg, WIDTH / 2.0, 28.0, "middle", 16.0, &chart.title);
    text(&mut svg, WIDTH / 2.0, 50.0, "middle", 12.0, &chart.subtitle);
    latency_panel(&mut svg, &chart.curves);
    throughput_panel(&mut svg, &chart.series);
    svg.push_str("</svg>\n");
    svg
}

fn latency_panel(svg: &mut String, curves: &[Curve]) {
    text(
        svg,
        WIDTH / 2.0,
        LATENCY_TOP - 18.0,
        "middle",
        14.0,
        "Latency by percentile",
    );
    let finite_nines = curves
        .iter()
        .flat_map(|curve| &curve.points)
        .filter(|&&(quantile, _)| quantile < 1.0)
        .map(|&(quantile, _)| nines(quantile))
        .fold(0.0f64, f64::max);
    let x_max = finite_nines.ceil().clamp(2.0, MAX_NINES);
    let latencies: Vec<f64> = curves
        .iter()
        .flat_map(|curve| curve.points.iter().map(|&(_, us)| us.max(0.1)))
        .collect();
    if latencies.is_empty() {
        no_data(svg, LATENCY_TOP, LATENCY_BOTTOM);
        return;
    }
    let low = latencies.iter().copied().fold(f64::MAX, f64::min);
    let high = latencies.iter().copied().fold(0.0f64, f64::max);
    let y_low = low.log10().floor();
    let y_high = high.log10().ceil().max(y_low + 1.0);
    let x_of = |quantile: f64| {
        let position = if quantile >= 1.0 {
            x_max
        } else {
            nines(quantile).min(x_max)
        };
        LEFT + (RIGHT - LEFT) * position / x_max
    };
    let y_of = |us: f64| {
        let fraction = (us.max(0.1).log10() - y_low) / (y_high - y_low);
        LATENCY_BOTTOM - (LATENCY_BOTTOM - LATENCY_TOP) * fraction
    };
    frame(svg, LATENCY_TOP, LATENCY_BOTTOM);
    // x ticks: 0%, 90%, 99%, 99.9% …
    for tick in 0..=(x_max as u32) {
        let x = LEFT + (RIGHT - LEFT) * f64::from(tick) / x_max;
        grid_line(svg, x, LATENCY_TOP, x, LATENCY_BOTTOM);
        text(
            svg,
            x,
            LATENCY_BOTTOM + 16.0,
            "middle",
            12.0,
            &percentile_label(tick),
        );
    }
    text(
        svg,
        (LEFT + RIGHT) / 2.0,
        LATENCY_BOTTOM + 34.0,
        "middle",
        12.0,
        "percentile (the rightmost point of each line is the maximum)",
    );
    // y ticks: 1, 2, 5 per decade when few decades, else decades only.
    let decades = (y_high - y_low) as i32;
    let multiples: &[f64] = if decades <= 3 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    for decade in (y_low as i32)..=(y_high as i32) {
        for &multiple in multiples {
            let us = multiple * 10f64.powi(decade);
            if us.log10() > y_high + 1e-9 {
                continue;
            }
            let y = y_of(us);
            grid_line(svg, LEFT, y, RIGHT, y);
            text(svg, LEFT - 6.0, y + 4.0, "end", 11.0, &latency_label(us));
        }
    }
    vertical_label(
        svg,
        22.0,
        (LATENCY_TOP + LATENCY_BOTTOM) / 2.0,
        "latency (log scale)",
    );
    for (index, curve) in curves.iter().enumerate() {
        let points: Vec<(f64, f64)> = curve
            .points
            .iter()
            .map(|&(quantile, us)| (x_of(quantile), y_of(us)))
            .collect();
        polyline(svg, &points, COLOURS[index % COLOURS.len()]);
    }
    legend(
        svg,
        LATENCY_TOP,
        curves.iter().map(|curve| curve.label.as_str()),
    );
}

fn throughput_panel(svg: &mut String, series: &[Series]) {
    text(
        svg,
        WIDTH / 2.0,
        THROUGHPUT_TOP - 18.0,
        "middle",
        14.0,
        "Throughput over time",
    );
    let points = series.iter().flat_map(|line| &line.points);
    let x_end = points.clone().map(|&(at, _)| at).fold(0.0f64, f64::max);
    let y_peak = points.map(|&(_, rate)| rate).fold(0.0f64, f64::max);
    if x_end <= 0.0 {
        no_data(svg, THROUGHPUT_TOP, THROUGHPUT_BOTTOM);
        return;
    }
    let x_step = nice_step(x_end / 8.0);
    let x_max = (x_end / x_step).ceil() * x_step;
    let y_step = nice_step((y_peak * 1.05).max(1.0) / 5.0);
    let y_max = ((y_peak * 1.05).max(1.0) / y_step).ceil() * y_step;
    let x_of = |at: f64| LEFT + (RIGHT - LEFT) * at / x_max;
    let y_of = |rate: f64| THROUGHPUT_BOTTOM - (THROUGHPUT_BOTTOM - THROUGHPUT_TOP) * rate / y_max;
    frame(svg, THROUGHPUT_TOP, THROUGHPUT_BOTTOM);
    let mut at = 0.0;
    while at <= x_max + x_step / 2.0 {
        let x = x_of(at);
        grid_line(svg, x, THROUGHPUT_TOP, x, THROUGHPUT_BOTTOM);
        text(
            svg,
            x,
            THROUGHPUT_BOTTOM + 16.0,
            "middle",
            11.0,
            &trim_number(at),
        );
        at += x_step;
    }
    text(
        svg,
        (LEFT + RIGHT) / 2.0,
        THROUGHPUT_BOTTOM + 34.0,
        "middle",
        12.0,
        "seconds since the start",
    );
    let mut rate = 0.0;
    while rate <= y_max + y_step / 2.0 {
        let y = y_of(rate);
        grid_line(svg, LEFT, y, RIGHT, y);
        text(svg, LEFT - 6.0, y + 4.0, "end", 11.0, &rate_label(rate));
        rate += y_step;
    }
    vertical_label(
        svg,
        22.0,
        (THROUGHPUT_TOP + THROUGHPUT_BOTTOM) / 2.0,
        "messages per second",
    );
    for (index, line) in series.iter().enumerate() {
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|&(at, rate)| (x_of(at), y_of(rate)))
            .collect();
        polyline(svg, &points, COLOURS[index % COLOURS.len()]);
    }
    legend(
        svg,
        THROUGHPUT_TOP,
        series.iter().map(|line| line.label.as_str()),
    );
}

/// `log10(1 / (1 - quantile))`: 0 for 0%, 1 for 90%, 2 for 99% …
fn nines(quantile: f64) -> f64 {
    (1.0 / (1.0 - quantile).max(1e-12)).log10()
}

fn percentile_label(nines: u32) -> String {
    match nines {
        0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        _ => format!("99.{}%", "9".repeat(nines as usize - 2)).replace("99.%", "99%"),
    }
}

fn latency_label(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{} s", trim_number(us / 1_000_000.0))
    } else if us >= 1_000.0 {
        format!("{} ms", trim_number(us / 1_000.0))
    } else {
        format!("{} µs", trim_number(us))
    }
}

fn rate_label(rate: f64) -> String {
    if rate >= 1_000_000.0 {
        format!("{}M", trim_number(rate / 1_000_000.0))
    } else if rate >= 1_000.0 {
        format!("{}k", trim_number(rate / 1_000.0))
    } else {
        trim_number(rate)
    }
}

/// A number without trailing zeros: `2`, `0.5`, `12.25`.
fn trim_number(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

/// The 1, 2 or 5 × 10^k at or above `rough`.
fn nice_step(rough: f64) -> f64 {
    if rough <= 0.0 || !rough.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|multiple| multiple * magnitude)
        .find(|&step| step >= rough)
        .unwrap_or(10.0 * magnitude)
}

fn frame(svg: &mut String, top: f64, bottom: f64) {
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{}" height="{}" fill="none" stroke="#333333"/>"##,
        RIGHT - LEFT,
        bottom - top
    );
}

fn no_data(svg: &mut String, top: f64, bottom: f64) {
    frame(svg, top, bottom);
    text(
        svg,
        (LEFT + RIGHT) / 2.0,
        (top + bottom) / 2.0,
        "middle",
        13.0,
        "no data",
    );
}

fn grid_line(svg: &mut String, x1: f64, y1: f64, x2: f64, y2: f64) {
    let _ = writeln!(
        svg,
        r##"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="#dddddd"/>"##
    );
}

fn polyline(svg: &mut String, points: &[(f64, f64)], colour: &str) {
    let mut coordinates = String::new();
    for (x, y) in points {
        let _ = write!(coordinates, "{x:.1},{y:.1} ");
    }
    let _ = writeln!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
        coordinates.trim_end()
    );
    if let Some(&(x, y)) = points.last() {
        let _ = writeln!(
            svg,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
        );
    }
}

fn legend<'a>(svg: &mut String, top: f64, labels: impl Iterator<Item = &'a str>) {
    for (index, label) in labels.enumerate() {
        let y = top + 16.0 + 16.0 * index as f64;
        let colour = COLOURS[index % COLOURS.len()];
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="3"/>"#,
            LEFT + 10.0,
            LEFT + 30.0
        );
        text(svg, LEFT + 36.0, y + 4.0, "start", 12.0, label);
    }
}

fn text(svg: &mut String, x: f64, y: f64, anchor: &str, size: f64, content: &str) {
    let _ = writeln!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-size="{size}">{}</text>"#,
        escape(content)
    );
}

fn vertical_label(svg: &mut String, x: f64, y: f64, content: &str) {
    let _ = writeln!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="middle" transform="rotate(-90 {x:.1} {y:.1})">{}</text>"#,
        escape(content)
    );
}

/// `content` with XML's special characters escaped.
fn escape(content: &str) -> String {
    content
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_one_svg_document_with_both_panels() {
        let svg = render(&Chart {
            title: "produce <batch 1> & co".to_owned(),
            subtitle: String::new(),
            curves: vec![Curve {
                label: "send".to_owned(),
                points: vec![(0.0, 80.0), (0.5, 100.0), (0.99, 400.0), (1.0, 2_500.0)],
            }],
            series: vec![Series {
                label: "sent".to_owned(),
                points: vec![(0.5, 1_000.0), (1.0, 1_200.0)],
            }],
        });
        assert!(svg.starts_with("<svg "));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("Latency by percentile"));
        assert!(svg.contains("Throughput over time"));
        assert!(svg.contains("&lt;batch 1&gt; &amp; co"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    #[test]
    fn labels_read_naturally() {
        assert_eq!(percentile_label(0), "0%");
        assert_eq!(percentile_label(1), "90%");
        assert_eq!(percentile_label(2), "99%");
        assert_eq!(percentile_label(4), "99.99%");
        assert_eq!(latency_label(500.0), "500 µs");
        assert_eq!(latency_label(2_000.0), "2 ms");
        assert_eq!(rate_label(25_000.0), "25k");
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(130.0), 200.0);
    }
}
