//! Progress while a network scenario runs: a line on stderr with throughput so far and the
//! time left, and the samples the report's throughput-over-time chart is drawn from.
//!
//! Owns the shared message counters ([`Counters`]: producers and consumers add to them) and
//! the sampling task. Never touches stdout (that is the summary's and `--json`'s) and never
//! decides when a run ends.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often counters are sampled for the chart.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// How often the progress line is redrawn on a terminal.
const TERMINAL_LINE_INTERVAL: Duration = Duration::from_secs(1);
/// How often a progress line is printed when stderr is a file or pipe (one line each).
const LOG_LINE_INTERVAL: Duration = Duration::from_secs(5);

/// Messages acknowledged to producers and received by consumers so far.
#[derive(Debug, Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub received: AtomicU64,
}

/// Counter values at one moment, `at_s` seconds after sampling started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at_s: f64,
    pub sent: u64,
    pub received: u64,
}

/// What the progress line estimates the time left from.
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    /// This many messages (sent, or received when `counts_received`).
    Messages { total: u64, counts_received: bool },
    /// Until this long after the start.
    Duration(Duration),
}

/// The running sampler; [`Progress::finish`] stops it and returns the samples.
pub struct Progress {
    task: JoinHandle<Vec<Sample>>,
    is_done: Arc<AtomicBool>,
}

impl Progress {
    /// Starts sampling `counters` now; prints a progress line labelled `label` unless `quiet`.
    pub fn start(label: &str, counters: Arc<Counters>, goal: Goal, quiet: bool) -> Progress {
        let is_done = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(sample(
            label.to_owned(),
            counters,
            goal,
            quiet,
            Arc::clone(&is_done),
        ));
        Progress { task, is_done }
    }

    /// Stops sampling (taking a last sample) and returns every sample.
    pub async fn finish(self) -> Vec<Sample> {
        self.is_done.store(true, Ordering::Release);
        self.task.await.unwrap_or_default()
    }
}

async fn sample(
    label: String,
    counters: Arc<Counters>,
    goal: Goal,
    quiet: bool,
    is_done: Arc<AtomicBool>,
) -> Vec<Sample> {
    let started = Instant::now();
    let is_terminal = std::io::stderr().is_terminal();
    let line_interval = if is_terminal {
        TERMINAL_LINE_INTERVAL
    } else {
        LOG_LINE_INTERVAL
    };
    let mut samples = vec![Sample {
        at_s: 0.0,
        sent: 0,
        received: 0,
    }];
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut last_line = started;
    loop {
        ticks.tick().await;
        let now = Instant::now();
        let current = Sample {
            at_s: now.duration_since(started).as_secs_f64(),
            sent: counters.sent.load(Ordering::Relaxed),
            received: counters.received.load(Ordering::Relaxed),
        };
        samples.push(current);
        let is_finished = is_done.load(Ordering::Acquire);
        if !quiet && (now.duration_since(last_line) >= line_interval || is_finished) {
            last_line = now;
            let line = progress_line(&label, &samples, goal);
            let mut stderr = std::io::stderr().lock();
            let _ = if is_terminal {
                write!(stderr, "\r\x1b[2K{line}")
            } else {
                writeln!(stderr, "{line}")
            };
            if is_finished && is_terminal {
                let _ = writeln!(stderr);
            }
            let _ = stderr.flush();
        }
        if is_finished {
            return samples;
        }
    }
}

/// `label: 12,345 sent (40,100/s now, 39,870/s avg) · 12,300 received (...) · 3.1 s · ETA 4 s`
fn progress_line(label: &str, samples: &[Sample], goal: Goal) -> String {
    let last = samples.last().copied().unwrap_or(Sample {
        at_s: 0.0,
        sent: 0,
        received: 0,
    });
    // "Now" is the last second's rate.
    let window_start = samples
        .iter()
        .rev()
        .find(|sample| last.at_s - sample.at_s >= 1.0)
        .copied()
        .unwrap_or(samples[0]);
    let rate = |now: u64, then: u64, seconds: f64| {
        if seconds > 0.0 {
            (now - then) as f64 / seconds
        } else {
            0.0
        }
    };
    let window_s = last.at_s - window_start.at_s;
    // Before anything moves, show the counter this run is about ("0 received" for a consumer).
    let primary = match goal {
        Goal::Messages {
            counts_received: true,
            ..
        } => "received",
        _ if label == "consume" => "received",
        _ => "sent",
    };
    let nothing_yet = last.sent == 0 && last.received == 0;
    let mut parts = vec![];
    for (name, total, then) in [
        ("sent", last.sent, window_start.sent),
        ("received", last.received, window_start.received),
    ] {
        if total > 0 || (nothing_yet && name == primary) {
            parts.push(format!(
                "{} {name} ({}/s now, {}/s avg)",
                group_digits(total),
                group_digits(rate(total, then, window_s) as u64),
                group_digits(rate(total, 0, last.at_s) as u64)
            ));
        }
    }
    let eta = match goal {
        Goal::Duration(duration) => Some((duration.as_secs_f64() - last.at_s).max(0.0)),
        Goal::Messages {
            total,
            counts_received,
        } => {
            let done = if counts_received {
                last.received
            } else {
                last.sent
            };
            let average = rate(done, 0, last.at_s);
            (average > 0.0).then(|| total.saturating_sub(done) as f64 / average)
        }
    };
    let eta = eta.map_or_else(
        || "ETA ?".to_owned(),
        |seconds| format!("ETA {seconds:.0} s"),
    );
    format!(
        "{label}: {} · {:.1} s · {eta}",
        parts.join(" · "),
        last.at_s
    )
}

/// `1234567` → `1,234,567`.
pub fn group_digits(value: u64) -> String {
    let digits = value.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// Throughput over time from the samples: `(bucket end in s, sent/s, received/s)` for buckets
/// of whole [`SAMPLE_INTERVAL`]s, wide enough that there are at most `max_points`.
pub fn throughput_series(samples: &[Sample], max_points: usize) -> Vec<(f64, f64, f64)> {
    if samples.len() < 2 || max_points == 0 {
        return Vec::new();
    }
    let step = (samples.len() - 1).div_ceil(max_points).max(1);
    let mut series = Vec::new();
    let mut previous = samples[0];
    // The last sample too, when the steps do not land on it.
    let last = samples
        .last()
        .filter(|_| !(samples.len() - 1).is_multiple_of(step));
    for sample in samples.iter().skip(step).step_by(step).chain(last) {
        let seconds = sample.at_s - previous.at_s;
        if seconds > 0.0 {
            series.push((
                sample.at_s,
                (sample.sent - previous.sent) as f64 / seconds,
                (sample.received - previous.received) as f64 / seconds,
            ));
        }
        previous = *sample;
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(count: usize, per_sample: u64) -> Vec<Sample> {
        (0..count)
            .map(|index| Sample {
                at_s: index as f64 * 0.1,
                sent: index as u64 * per_sample,
                received: 0,
            })
            .collect()
    }

    #[test]
    fn digits_are_grouped_by_three() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
    }

    #[test]
    fn series_keeps_rates_and_point_count() {
        let series = throughput_series(&samples(101, 100), 20);
        assert!(series.len() <= 21, "{}", series.len());
        for (_, sent_per_s, received_per_s) in &series {
            assert!((sent_per_s - 1_000.0).abs() < 1e-6);
            assert_eq!(*received_per_s, 0.0);
        }
        let last = series.last().unwrap();
        assert!((last.0 - 10.0).abs() < 1e-9);
    }

    #[test]
    fn eta_follows_the_average_rate() {
        let line = progress_line(
            "produce",
            &samples(11, 100),
            Goal::Messages {
                total: 2_000,
                counts_received: false,
            },
        );
        assert!(line.contains("1,000 sent"), "{line}");
        assert!(line.contains("ETA 1 s"), "{line}");
    }

    #[test]
    fn a_consumer_that_has_received_nothing_yet_says_so() {
        let idle = [Sample {
            at_s: 1.0,
            sent: 0,
            received: 0,
        }];
        let line = progress_line(
            "consume",
            &idle,
            Goal::Messages {
                total: 10,
                counts_received: true,
            },
        );
        assert!(line.contains("0 received"), "{line}");
        assert!(!line.contains("sent"), "{line}");
    }
}
