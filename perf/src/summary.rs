//! The end of a network scenario: the human summary on stdout, the `--json` line, and the
//! `--report DIR` files (JSON and SVG chart).
//!
//! Owns the shape of the results every network scenario shares ([`Outcome`]); the scenarios
//! fill it in. The `--json` line always has `scenario`, `messages`, `msgs_per_sec`,
//! `mb_per_sec`, `p50_us`, `p90_us`, `p99_us`, `p999_us`, `p9999_us`, `max_us`, `lost` and
//! `duplicates` (`null` when the scenario could not check delivery), then the scenario's
//! parameters and extra figures.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use crate::chart::{self, Chart, Curve, Series};
use crate::progress::{self, Sample};
use crate::report::{self, LatencySummary, Throughput};

/// Most points of the throughput-over-time chart and of its JSON.
const MAX_SERIES_POINTS: usize = 240;

/// A latency histogram with what it measures.
pub struct Latency {
    /// JSON key prefix (`""` for the primary latency, whose keys are `p50_us`, ...).
    pub key: &'static str,
    /// What it measures, for people.
    pub label: String,
    pub histogram: Histogram<u64>,
}

/// Everything a network scenario reports.
pub struct Outcome {
    pub scenario: &'static str,
    /// The scenario's parameters, in the order they should print.
    pub parameters: Vec<(&'static str, Value)>,
    /// Messages the throughput counts.
    pub messages: u64,
    pub body_bytes: usize,
    pub elapsed: Duration,
    /// The first is the primary latency; others are reported with their key prefix.
    pub latencies: Vec<Latency>,
    /// Acknowledged messages never received; `None` when not checked.
    pub lost: Option<u64>,
    /// Deliveries of a message already received; `None` when not checked.
    pub duplicates: Option<u64>,
    /// Other figures, in the order they should print.
    pub figures: Vec<(&'static str, Value)>,
    pub samples: Vec<Sample>,
}

impl Outcome {
    fn throughput(&self) -> Throughput {
        let payload_bytes = self.messages * self.body_bytes as u64;
        Throughput {
            messages: self.messages,
            payload_bytes,
            stored_bytes: 0,
            elapsed: self.elapsed,
        }
    }

    /// The one-line JSON object.
    pub fn to_json(&self) -> Value {
        let throughput = self.throughput();
        let mut object = Map::new();
        object.insert("scenario".into(), json!(self.scenario));
        object.insert("messages".into(), json!(self.messages));
        object.insert(
            "elapsed_s".into(),
            json!(report::round(self.elapsed.as_secs_f64())),
        );
        object.insert(
            "msgs_per_sec".into(),
            json!(report::round(throughput.messages_per_second())),
        );
        object.insert(
            "mb_per_sec".into(),
            json!(report::round(throughput.payload_mib_per_second())),
        );
        for latency in &self.latencies {
            let summary = LatencySummary::of(&latency.histogram);
            let mut fields = Map::new();
            summary.add_json(&mut fields);
            for (name, value) in fields {
                object.insert(format!("{}{name}", latency.key), value);
            }
        }
        object.insert("lost".into(), json!(self.lost));
        object.insert("duplicates".into(), json!(self.duplicates));
        for (name, value) in self.parameters.iter().chain(&self.figures) {
            object.insert((*name).into(), value.clone());
        }
        Value::Object(object)
    }

    /// Prints the human summary, then the JSON line when `as_json`.
    pub fn print(&self, as_json: bool) {
        let parameters: Vec<String> = self
            .parameters
            .iter()
            .map(|(name, value)| format!("{name} {}", plain(value)))
            .collect();
        println!("{}: {}", self.scenario, parameters.join(", "));
        let throughput = self.throughput();
        println!(
            "throughput: {:.0} msgs/s, {:.2} MiB/s, {} messages in {:.3} s",
            throughput.messages_per_second(),
            throughput.payload_mib_per_second(),
            self.messages,
            self.elapsed.as_secs_f64()
        );
        for latency in &self.latencies {
            println!(
                "{} (µs): {}",
                latency.label,
                LatencySummary::of(&latency.histogram).to_human()
            );
        }
        let checked =
            |value: Option<u64>| value.map_or("not checked".to_owned(), |v| v.to_string());
        println!(
            "delivery: lost {}, duplicates {}",
            checked(self.lost),
            checked(self.duplicates)
        );
        if !self.figures.is_empty() {
            let figures: Vec<String> = self
                .figures
                .iter()
                .map(|(name, value)| format!("{name} {}", plain(value)))
                .collect();
            println!("also: {}", figures.join(", "));
        }
        if as_json {
            println!("{}", self.to_json());
        }
    }

    /// Writes `<scenario>.json` and `<scenario>.svg` into `directory`; returns their paths.
    pub fn write_report(&self, directory: &Path) -> Result<(String, String)> {
        std::fs::create_dir_all(directory)
            .with_context(|| format!("cannot create {}", directory.display()))?;
        let series = progress::throughput_series(&self.samples, MAX_SERIES_POINTS);
        let curves: Vec<Curve> = self
            .latencies
            .iter()
            .map(|latency| Curve {
                label: latency.label.clone(),
                points: report::latency_curve(&latency.histogram),
            })
            .collect();
        let mut full = self.to_json();
        let object = full.as_object_mut().expect("to_json makes an object");
        object.insert(
            "latency_curves".into(),
            Value::Array(
                curves
                    .iter()
                    .map(|curve| {
                        json!({
                            "label": curve.label,
                            "points": curve.points.iter().map(|&(quantile, us)| json!({
                                "percentile": report::round(quantile * 100.0 * 1_000.0) / 1_000.0,
                                "latency_us": report::round(us),
                            })).collect::<Vec<_>>(),
                        })
                    })
                    .collect(),
            ),
        );
        object.insert(
            "throughput_over_time".into(),
            Value::Array(
                series
                    .iter()
                    .map(|&(at_s, sent, received)| {
                        json!({
                            "at_s": report::round(at_s),
                            "sent_per_sec": report::round(sent),
                            "received_per_sec": report::round(received),
                        })
                    })
                    .collect(),
            ),
        );
        let has_sent = series.iter().any(|point| point.1 > 0.0);
        let has_received = series.iter().any(|point| point.2 > 0.0);
        let mut lines = Vec::new();
        if has_sent || !has_received {
            lines.push(Series {
                label: "sent (acknowledged) msgs/s".to_owned(),
                points: series.iter().map(|&(at, sent, _)| (at, sent)).collect(),
            });
        }
        if has_received {
            lines.push(Series {
                label: "received msgs/s".to_owned(),
                points: series
                    .iter()
                    .map(|&(at, _, received)| (at, received))
                    .collect(),
            });
        }
        let throughput = self.throughput();
        let parameters: Vec<String> = self
            .parameters
            .iter()
            .map(|(name, value)| format!("{name} {}", plain(value)))
            .collect();
        let subtitle = format!(
            "{:.0} msgs/s, {:.2} MiB/s, {} messages in {:.1} s; lost {}, duplicates {}",
            throughput.messages_per_second(),
            throughput.payload_mib_per_second(),
            self.messages,
            self.elapsed.as_secs_f64(),
            self.lost.map_or("–".to_owned(), |v| v.to_string()),
            self.duplicates.map_or("–".to_owned(), |v| v.to_string()),
        );
        let svg = chart::render(&Chart {
            title: format!("shardmq-perf {}: {}", self.scenario, parameters.join(", ")),
            subtitle,
            curves,
            series: lines,
        });
        let json_path = directory.join(format!("{}.json", self.scenario));
        let svg_path = directory.join(format!("{}.svg", self.scenario));
        let pretty = serde_json::to_string_pretty(&full).context("cannot encode the report")?;
        std::fs::write(&json_path, pretty + "\n")
            .with_context(|| format!("cannot write {}", json_path.display()))?;
        std::fs::write(&svg_path, svg)
            .with_context(|| format!("cannot write {}", svg_path.display()))?;
        Ok((
            json_path.display().to_string(),
            svg_path.display().to_string(),
        ))
    }

    /// Prints the results and writes the report when asked.
    pub fn finish(&self, as_json: bool, report_dir: Option<&Path>) -> Result<()> {
        if let Some(directory) = report_dir {
            let (json_path, svg_path) = self.write_report(directory)?;
            eprintln!("report: {json_path}, {svg_path}");
        }
        self.print(as_json);
        Ok(())
    }
}

/// Below this share of the asked `--rate` a run says it missed its rate.
const RATE_MET_SHARE: f64 = 0.95;

/// Figures of a `--rate` run: the rate achieved and whether it fell short of the one asked;
/// a shortfall is also printed to stderr (latencies were then measured at a lower load than
/// asked, and queueing behind the late sends is in them).
pub fn rate_figures(
    asked: Option<f64>,
    messages: u64,
    elapsed: Duration,
) -> Vec<(&'static str, Value)> {
    let Some(asked) = asked else {
        return Vec::new();
    };
    let achieved = messages as f64 / elapsed.as_secs_f64().max(1e-9);
    let is_missed = achieved < asked * RATE_MET_SHARE;
    if is_missed {
        eprintln!(
            "rate missed: asked for {asked:.0} msgs/s, sent {achieved:.0} msgs/s ({:.0}%); the producers could not keep up, so the figures are for the lower rate",
            100.0 * achieved / asked
        );
    }
    vec![
        ("achieved_rate", json!(crate::report::round(achieved))),
        ("rate_missed", json!(is_missed)),
    ]
}

/// A JSON value as a person writes it (strings without quotes).
fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "–".to_owned(),
        other => other.to_string(),
    }
}
