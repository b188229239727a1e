//! The metrics page's data: every broker's counters, sampled every [`SAMPLE_INTERVAL`] by one
//! task for as long as the console runs, the last [`HISTORY`] kept in memory, so that a page
//! opened now shows the last minutes at once.
//!
//! Owns: the sampler and its bounded history. The samples are `broker status` answers (totals
//! since each broker's start and its uptime, from which the page computes rates; the
//! replication lag), asked with the console's own account (the command line's), not a
//! browser's; and each interval's send latency percentiles, from the change of the brokers'
//! latency histogram between two samples ([`percentile_us`]). Never: rates (the page computes
//! them from two samples) or anything per topic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use shardmq_client::{now_ms, Admin, BrokerStatus};

use super::{error_text, ApiResult, Console};

/// How often every broker is sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// How far back samples are kept.
const HISTORY: Duration = Duration::from_secs(10 * 60);

/// Most brokers sampled (the first ones the name servers list).
const MAX_SAMPLED_BROKERS: usize = 64;

/// One broker's counters at one time.
struct Sample {
    at_ms: i64,
    status: BrokerStatus,
    /// Send latency percentiles over the interval since the broker's previous sample.
    send_latency: Option<Percentiles>,
}

/// Latency percentiles over some sends, each the upper bound (µs) of the histogram bucket it
/// falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Percentiles {
    sends: u64,
    p50_us: u64,
    p90_us: u64,
    p99_us: u64,
}

/// The sends the `later` histogram counts beyond `earlier`'s, per bucket; `None` when the two
/// do not line up (other bounds, or fewer counts: the broker restarted between them).
fn interval_counts(earlier: &BrokerStatus, later: &BrokerStatus) -> Option<Vec<u64>> {
    if earlier.send_latency_bounds_us != later.send_latency_bounds_us
        || earlier.send_latency_counts.len() != later.send_latency_counts.len()
        || later.uptime_ms < earlier.uptime_ms
    {
        return None;
    }
    earlier
        .send_latency_counts
        .iter()
        .zip(&later.send_latency_counts)
        .map(|(before, after)| after.checked_sub(*before))
        .collect()
}

/// The `quantile` (0 < q <= 1) of the sends `counts` holds per bucket (bucket i: more than
/// `bounds_us[i-1]`, at most `bounds_us[i]`; one more count than bounds, the last for sends
/// slower than every bound), estimated as the upper bound of the bucket holding the sends'
/// ⌈q·n⌉-th fastest; a send in the overflow bucket is estimated as the last bound. `None` when
/// there is no send or no bound.
fn percentile_us(bounds_us: &[u64], counts: &[u64], quantile: f64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    let last_bound = *bounds_us.last()?;
    if total == 0 {
        return None;
    }
    let rank = ((quantile * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bucket, count) in counts.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(bounds_us.get(bucket).copied().unwrap_or(last_bound));
        }
    }
    Some(last_bound)
}

fn percentiles(bounds_us: &[u64], counts: &[u64]) -> Option<Percentiles> {
    Some(Percentiles {
        sends: counts.iter().sum(),
        p50_us: percentile_us(bounds_us, counts, 0.50)?,
        p90_us: percentile_us(bounds_us, counts, 0.90)?,
        p99_us: percentile_us(bounds_us, counts, 0.99)?,
    })
}

fn percentiles_json(percentiles: Option<Percentiles>) -> Value {
    match percentiles {
        Some(p) => json!({
            "sends": p.sends,
            "p50_us": p.p50_us,
            "p90_us": p.p90_us,
            "p99_us": p.p99_us,
        }),
        None => Value::Null,
    }
}

/// One broker's history.
#[derive(Default)]
struct BrokerHistory {
    name: String,
    samples: VecDeque<Sample>,
    /// Why the last sample failed (`None` when it succeeded).
    error: Option<String>,
    last_seen_ms: i64,
}

/// The sampler's history, shared with the handler.
#[derive(Default)]
pub struct Metrics {
    brokers: Mutex<BTreeMap<String, BrokerHistory>>,
    /// Why the last round could not list the brokers (`None` when it could).
    cluster_error: Mutex<Option<String>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every change is a whole insert, push or replace: a panic elsewhere leaves it consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    /// Samples every broker the name servers list, every [`SAMPLE_INTERVAL`], forever.
    pub async fn run_sampler(self: Arc<Self>, admin: Arc<Admin>) {
        let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.sample_once(&admin).await;
        }
    }

    async fn sample_once(&self, admin: &Admin) {
        let clusters = match admin.cluster_info().await {
            Ok(clusters) => clusters,
            Err(error) => {
                *locked(&self.cluster_error) = Some(error_text(&anyhow::Error::new(error)));
                return;
            }
        };
        *locked(&self.cluster_error) = None;
        let instances: Vec<(String, String)> = clusters
            .iter()
            .flat_map(|cluster| &cluster.brokers)
            .flat_map(|broker| {
                broker.addresses.iter().map(|(id, address)| {
                    let name = match id {
                        0 => broker.broker_name.clone(),
                        _ => format!("{}/{id}", broker.broker_name),
                    };
                    (address.clone(), name)
                })
            })
            .take(MAX_SAMPLED_BROKERS)
            .collect();
        for (address, name) in instances {
            let answer = admin.broker_status(&address).await;
            let at_ms = now_ms();
            let mut brokers = locked(&self.brokers);
            let history = brokers.entry(address).or_default();
            history.name = name;
            history.last_seen_ms = at_ms;
            match answer {
                Ok(status) => {
                    history.error = None;
                    let send_latency = history.samples.back().and_then(|previous| {
                        let counts = interval_counts(&previous.status, &status)?;
                        percentiles(&status.send_latency_bounds_us, &counts)
                    });
                    history.samples.push_back(Sample {
                        at_ms,
                        status,
                        send_latency,
                    });
                }
                Err(error) => history.error = Some(error_text(&anyhow::Error::new(error))),
            }
        }
        let horizon_ms = now_ms() - i64::try_from(HISTORY.as_millis()).unwrap_or(i64::MAX);
        let mut brokers = locked(&self.brokers);
        brokers.retain(|_, history| history.last_seen_ms >= horizon_ms);
        for history in brokers.values_mut() {
            while history
                .samples
                .front()
                .is_some_and(|sample| sample.at_ms < horizon_ms)
            {
                history.samples.pop_front();
            }
        }
    }

    fn to_json(&self) -> Value {
        let brokers: Vec<Value> = locked(&self.brokers)
            .iter()
            .map(|(address, history)| {
                let samples: Vec<Value> = history
                    .samples
                    .iter()
                    .map(|sample| {
                        json!({
                            "at_ms": sample.at_ms,
                            "uptime_ms": sample.status.uptime_ms,
                            "messages_in": sample.status.messages_in,
                            "messages_out": sample.status.messages_out,
                            "bytes_in": sample.status.bytes_in,
                            "bytes_out": sample.status.bytes_out,
                            "replica_lag_bytes": sample.status.replica_lag_bytes,
                            "send_latency": percentiles_json(sample.send_latency),
                        })
                    })
                    .collect();
                // Over every kept sample since the broker's last restart.
                let window = match (history.samples.front(), history.samples.back()) {
                    (Some(first), Some(last)) => interval_counts(&first.status, &last.status)
                        .and_then(|counts| {
                            percentiles(&last.status.send_latency_bounds_us, &counts)
                        }),
                    _ => None,
                };
                json!({
                    "address": address,
                    "name": history.name,
                    "is_up": history.error.is_none(),
                    "error": history.error,
                    "samples": samples,
                    "send_latency_window": percentiles_json(window),
                })
            })
            .collect();
        json!({
            "now_ms": now_ms(),
            "interval_ms": SAMPLE_INTERVAL.as_millis(),
            "history_ms": HISTORY.as_millis(),
            "error": *locked(&self.cluster_error),
            "brokers": brokers,
        })
    }
}

/// `GET /api/metrics`: every sampled broker's history of the last minutes.
pub async fn metrics(State(console): State<Arc<Console>>) -> ApiResult {
    Ok(Json(console.metrics.to_json()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: [u64; 3] = [100, 200, 400];

    #[test]
    fn a_percentile_is_the_upper_bound_of_its_bucket() {
        // 50 sends at most 100 µs, 40 in (100, 200], 9 in (200, 400], 1 slower than 400.
        let counts = [50, 40, 9, 1];
        assert_eq!(percentile_us(&BOUNDS, &counts, 0.50), Some(100));
        assert_eq!(percentile_us(&BOUNDS, &counts, 0.51), Some(200));
        assert_eq!(percentile_us(&BOUNDS, &counts, 0.90), Some(200));
        assert_eq!(percentile_us(&BOUNDS, &counts, 0.99), Some(400));
        // The overflow bucket is estimated as the last bound.
        assert_eq!(percentile_us(&BOUNDS, &counts, 1.0), Some(400));
        assert_eq!(percentile_us(&BOUNDS, &[0, 0, 0, 0], 0.5), None);
        assert_eq!(percentile_us(&[], &[3], 0.5), None);
        assert_eq!(
            percentiles(&BOUNDS, &[0, 1, 0, 0]),
            Some(Percentiles {
                sends: 1,
                p50_us: 200,
                p90_us: 200,
                p99_us: 200
            })
        );
    }

    fn status(uptime_ms: u64, counts: &[u64]) -> BrokerStatus {
        BrokerStatus {
            uptime_ms,
            send_latency_bounds_us: BOUNDS.to_vec(),
            send_latency_counts: counts.to_vec(),
            ..BrokerStatus::default()
        }
    }

    #[test]
    fn an_interval_counts_the_sends_between_two_samples() {
        let earlier = status(1_000, &[5, 5, 0, 0]);
        let later = status(3_000, &[5, 105, 1, 0]);
        let counts = interval_counts(&earlier, &later).unwrap();
        assert_eq!(counts, vec![0, 100, 1, 0]);
        assert_eq!(
            percentiles(&BOUNDS, &counts),
            Some(Percentiles {
                sends: 101,
                p50_us: 200,
                p90_us: 200,
                p99_us: 200
            })
        );
        // A restart (counts or uptime going back) or a broker without the histogram: none.
        assert_eq!(interval_counts(&later, &status(500, &[0, 1, 0, 0])), None);
        assert_eq!(interval_counts(&later, &status(4_000, &[0, 0, 0, 0])), None);
        let old = BrokerStatus::default();
        assert_eq!(
            interval_counts(&old, &old).and_then(|c| percentiles(&[], &c)),
            None
        );
    }
}
