//! The metrics page's data: every broker's counters, sampled every [`SAMPLE_INTERVAL`] by one
//! task for as long as the console runs, the last [`HISTORY`] kept in memory, so that a page
//! opened now shows the last minutes at once.
//!
//! Owns: the sampler and its bounded history. The samples are `broker status` answers (totals
//! since each broker's start and its uptime, from which the page computes rates; the
//! replication lag), asked with the console's own account (the command line's), not a
//! browser's. Never: rates (the page computes them from two samples) or anything per topic.

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
                    history.samples.push_back(Sample { at_ms, status });
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
                        })
                    })
                    .collect();
                json!({
                    "address": address,
                    "name": history.name,
                    "is_up": history.error.is_none(),
                    "error": history.error,
                    "samples": samples,
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
