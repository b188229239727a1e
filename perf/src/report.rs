//! Turning measurements into reports: latency percentiles from an HdrHistogram, throughput in
//! messages and MiB per second, and the JSON fields every scenario shares.
//!
//! Latencies are recorded in nanoseconds and reported in microseconds. "MB" in reports and in
//! JSON field names means MiB (2^20 bytes), as fio reports bandwidth.

use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

/// Largest latency the histogram tracks exactly; longer ones are recorded as this value.
const MAX_TRACKED_LATENCY_NS: u64 = 600 * 1_000_000_000;
/// Significant decimal digits the histogram keeps (0.1% relative error).
const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

const BYTES_PER_MIB: f64 = (1u64 << 20) as f64;

/// An empty latency histogram in nanoseconds, from 1 ns to ten minutes.
pub fn latency_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_TRACKED_LATENCY_NS, LATENCY_SIGNIFICANT_DIGITS)
        .context("cannot create the latency histogram")
}

/// Records one latency, clamped into the histogram's range.
pub fn record_latency(histogram: &mut Histogram<u64>, latency: Duration) {
    let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
    histogram.saturating_record(nanos.max(1));
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
}

impl LatencySummary {
    pub fn of(histogram: &Histogram<u64>) -> LatencySummary {
        let us = |nanos: u64| nanos as f64 / 1_000.0;
        LatencySummary {
            count: histogram.len(),
            mean_us: histogram.mean() / 1_000.0,
            p50_us: us(histogram.value_at_quantile(0.50)),
            p90_us: us(histogram.value_at_quantile(0.90)),
            p99_us: us(histogram.value_at_quantile(0.99)),
            p999_us: us(histogram.value_at_quantile(0.999)),
            p9999_us: us(histogram.value_at_quantile(0.9999)),
            max_us: us(histogram.max()),
        }
    }

    pub fn to_human(self) -> String {
        format!(
            "p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  max {:.1}  mean {:.1}  ({} samples)",
            self.p50_us,
            self.p90_us,
            self.p99_us,
            self.p999_us,
            self.p9999_us,
            self.max_us,
            self.mean_us,
            self.count
        )
    }

    pub fn add_json(self, object: &mut Map<String, Value>) {
        object.insert("latency_samples".into(), json!(self.count));
        object.insert("mean_us".into(), json!(round(self.mean_us)));
        object.insert("p50_us".into(), json!(round(self.p50_us)));
        object.insert("p90_us".into(), json!(round(self.p90_us)));
        object.insert("p99_us".into(), json!(round(self.p99_us)));
        object.insert("p999_us".into(), json!(round(self.p999_us)));
        object.insert("p9999_us".into(), json!(round(self.p9999_us)));
        object.insert("max_us".into(), json!(round(self.max_us)));
    }
}

/// Messages and bytes moved in a span of time.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    pub messages: u64,
    /// Message bodies only: what a user calls the data.
    pub payload_bytes: u64,
    /// What the component wrote (records with headers and properties).
    pub stored_bytes: u64,
    pub elapsed: Duration,
}

impl Throughput {
    fn per_second(self, amount: f64) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            amount / seconds
        } else {
            0.0
        }
    }

    pub fn messages_per_second(self) -> f64 {
        self.per_second(self.messages as f64)
    }

    pub fn payload_mib_per_second(self) -> f64 {
        self.per_second(self.payload_bytes as f64 / BYTES_PER_MIB)
    }

    pub fn stored_mib_per_second(self) -> f64 {
        self.per_second(self.stored_bytes as f64 / BYTES_PER_MIB)
    }

    pub fn to_human(self) -> String {
        format!(
            "{:.0} msgs/s, {:.1} MiB/s payload ({:.1} MiB/s stored), {} messages in {:.3} s",
            self.messages_per_second(),
            self.payload_mib_per_second(),
            self.stored_mib_per_second(),
            self.messages,
            self.elapsed.as_secs_f64()
        )
    }

    pub fn add_json(self, object: &mut Map<String, Value>) {
        object.insert("elapsed_s".into(), json!(round(self.elapsed.as_secs_f64())));
        object.insert(
            "msgs_per_sec".into(),
            json!(round(self.messages_per_second())),
        );
        object.insert(
            "mb_per_sec".into(),
            json!(round(self.payload_mib_per_second())),
        );
        object.insert(
            "stored_mb_per_sec".into(),
            json!(round(self.stored_mib_per_second())),
        );
        object.insert("stored_bytes".into(), json!(self.stored_bytes));
    }
}

/// Percentiles at which a latency curve is sampled: 0 to 99.9999 in steps of "nines" (each
/// decade of `1 / (1 - quantile)` gets a few points), then the maximum.
pub fn curve_quantiles() -> Vec<f64> {
    let mut quantiles = Vec::new();
    let mut nines = 0.0f64;
    while nines <= 6.0 + 1e-9 {
        quantiles.push(1.0 - 10f64.powf(-nines));
        nines += 0.25;
    }
    quantiles.push(1.0);
    quantiles
}

/// `(quantile, latency_us)` points of `histogram` at [`curve_quantiles`], up to the quantile
/// the sample count supports (a curve past 99.99% from 1,000 samples only repeats the maximum).
pub fn latency_curve(histogram: &Histogram<u64>) -> Vec<(f64, f64)> {
    if histogram.is_empty() {
        return Vec::new();
    }
    let samples = histogram.len() as f64;
    curve_quantiles()
        .into_iter()
        .filter(|&quantile| quantile == 1.0 || (1.0 - quantile) * samples >= 1.0)
        .map(|quantile| {
            let nanos = histogram.value_at_quantile(quantile);
            (quantile, nanos as f64 / 1_000.0)
        })
        .collect()
}

/// Three decimals are plenty for reports and keep the JSON readable.
pub fn round(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_reported_in_microseconds() {
        let mut histogram = latency_histogram().unwrap();
        for micros in 1..=1_000u64 {
            record_latency(&mut histogram, Duration::from_micros(micros));
        }
        let summary = LatencySummary::of(&histogram);
        assert_eq!(summary.count, 1_000);
        assert!((summary.p50_us - 500.0).abs() <= 1.0, "{summary:?}");
        assert!((summary.p90_us - 900.0).abs() <= 1.0, "{summary:?}");
        assert!((summary.p99_us - 990.0).abs() <= 1.0, "{summary:?}");
        assert!((summary.max_us - 1_000.0).abs() <= 1.0, "{summary:?}");
    }

    #[test]
    fn curve_rises_to_the_maximum_and_stops_where_samples_run_out() {
        let mut histogram = latency_histogram().unwrap();
        for micros in 1..=1_000u64 {
            record_latency(&mut histogram, Duration::from_micros(micros));
        }
        let curve = latency_curve(&histogram);
        assert!(
            curve.windows(2).all(|pair| pair[0].1 <= pair[1].1),
            "{curve:?}"
        );
        let (last_quantile, last_us) = *curve.last().unwrap();
        assert_eq!(last_quantile, 1.0);
        assert!((last_us - 1_000.0).abs() <= 1.0);
        // 1,000 samples support 99.9% but not 99.99%.
        assert!(
            curve.iter().all(|&(q, _)| q == 1.0 || q <= 0.999 + 1e-9),
            "{curve:?}"
        );
    }

    #[test]
    fn throughput_divides_by_elapsed_time() {
        let throughput = Throughput {
            messages: 1_000,
            payload_bytes: 1 << 20,
            stored_bytes: 2 << 20,
            elapsed: Duration::from_millis(500),
        };
        assert_eq!(throughput.messages_per_second(), 2_000.0);
        assert_eq!(throughput.payload_mib_per_second(), 2.0);
        assert_eq!(throughput.stored_mib_per_second(), 4.0);
    }
}
