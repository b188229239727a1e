//! The cluster page's API: every broker the name servers know, each with its runtime status
//! (`shardmq broker status`) or the error that came instead, and the controller's status when
//! `--controller` names one.
//!
//! Owns: asking every broker in turn and keeping one broker's failure to that broker. Never:
//! history (`metrics.rs` keeps it).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use shardmq_client::ClusterInfo;

use super::session::Caller;
use super::{error_text, ApiResult, Console};
use crate::output;

/// Every broker instance of `clusters`: (cluster, broker name, broker id, address).
fn instances(clusters: &[ClusterInfo]) -> Vec<(&str, &str, i64, &str)> {
    clusters
        .iter()
        .flat_map(|cluster| {
            cluster.brokers.iter().flat_map(move |broker| {
                broker.addresses.iter().map(move |(id, address)| {
                    (
                        cluster.name.as_str(),
                        broker.broker_name.as_str(),
                        *id,
                        address.as_str(),
                    )
                })
            })
        })
        .collect()
}

/// Each broker instance with its status, or `"error"` when it did not answer.
async fn broker_statuses(caller: &Caller, clusters: &[ClusterInfo]) -> Vec<Value> {
    let mut brokers = Vec::new();
    for (cluster, broker_name, id, address) in instances(clusters) {
        let mut entry = json!({
            "cluster_name": cluster,
            "broker_name": broker_name,
            "broker_id": id,
            "address": address,
            "is_master": id == 0,
        });
        match caller.admin.broker_status(address).await {
            Ok(status) => {
                entry["is_up"] = json!(true);
                entry["status"] = output::broker_status_json(&status, None);
            }
            Err(error) => {
                entry["is_up"] = json!(false);
                entry["error"] = json!(error_text(&anyhow::Error::new(error)));
            }
        }
        brokers.push(entry);
    }
    brokers
}

/// `GET /api/cluster`.
pub async fn cluster(State(console): State<Arc<Console>>, caller: Caller) -> ApiResult {
    let clusters = caller.admin.cluster_info().await?;
    let brokers = broker_statuses(&caller, &clusters).await;
    let controller = controller_status(&console, &caller).await;
    Ok(Json(json!({
        "namesrv": caller.settings.namesrv,
        "clusters": output::clusters_json(&clusters)["clusters"],
        "brokers": brokers,
        "controller": controller,
    })))
}

/// The first configured controller that answers, as `controller status --json` prints it; the
/// errors of all when none does; `null` when no controller is configured.
async fn controller_status(console: &Console, caller: &Caller) -> Value {
    if console.controllers.is_empty() {
        return Value::Null;
    }
    let mut errors = Vec::new();
    for address in &console.controllers {
        match caller.admin.controller_status(address).await {
            Ok(status) => return json!({ "status": output::controller_status_json(&status) }),
            Err(error) => errors.push(format!(
                "{address}: {}",
                error_text(&anyhow::Error::new(error))
            )),
        }
    }
    json!({ "error": errors.join("; ") })
}
