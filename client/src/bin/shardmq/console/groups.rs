//! The consumer groups page's API: every group, one group's members and per-queue progress,
//! and resetting its offsets.
//!
//! Owns: reading the page's requests into the calls `shardmq group …` makes
//! (`commands::group_progress_of`, `commands::parse_reset_target`, the admin API). Never: an
//! offset operation of its own.

use std::collections::{BTreeSet, HashMap};

use axum::extract::{Path, Query};
use axum::Json;
use serde_json::{json, Value};

use super::session::Caller;
use super::{error_text, failures_json, flag_field, text_field, ApiResult, JsonBody};
use crate::commands::{group_progress_of, parse_reset_target};
use crate::output;

/// `GET /api/groups`: every group the master brokers know.
pub async fn list(caller: Caller) -> ApiResult {
    let groups = caller.admin.group_list().await?;
    let mut answer = output::groups_json(&groups.value);
    answer["failures"] = failures_json(&groups.failures);
    Ok(Json(answer))
}

/// `GET /api/groups/{group}?topic=T`: the group's progress on every queue of its topics (or of
/// `topic`), and its live members per topic with the queues of the topic each holds
/// (`queues: null`: the member does not report them).
pub async fn detail(
    caller: Caller,
    Path(group): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let topic = query
        .get("topic")
        .filter(|topic| !topic.is_empty())
        .cloned();
    let progress = group_progress_of(&caller.admin, &group, topic).await?;
    let topics: BTreeSet<&str> = progress
        .value
        .iter()
        .map(|queue| queue.queue.topic.as_str())
        .collect();
    let mut members = Vec::new();
    for topic in topics {
        let entry = match caller.admin.consumer_members(&group, topic).await {
            Ok(clients) => {
                let ids: Vec<&str> = clients.iter().map(|c| c.client_id.as_str()).collect();
                let held: Vec<Value> = clients
                    .iter()
                    .map(|client| {
                        let queues = client.held_queues.as_ref().map(|queues| {
                            queues
                                .iter()
                                .filter(|queue| queue.topic == topic)
                                .map(|queue| {
                                    json!({
                                        "broker_name": queue.broker_name,
                                        "queue_id": queue.queue_id,
                                    })
                                })
                                .collect::<Vec<Value>>()
                        });
                        json!({ "client_id": client.client_id, "queues": queues })
                    })
                    .collect();
                json!({ "topic": topic, "members": ids, "assignment": held })
            }
            Err(error) => {
                json!({ "topic": topic, "error": error_text(&anyhow::Error::new(error)) })
            }
        };
        members.push(entry);
    }
    let mut answer = output::progress_json(&group, &progress.value);
    answer["members"] = Value::Array(members);
    answer["failures"] = failures_json(&progress.failures);
    Ok(Json(answer))
}

/// `POST /api/groups/{group}/reset` `{topic, to, force}`: `to` is `first`, `last`, ms since the
/// epoch or an RFC 3339 time, as `group reset-offset --to` takes it.
pub async fn reset(
    caller: Caller,
    Path(group): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult {
    let topic = text_field(&body, "topic")?;
    let target = parse_reset_target(text_field(&body, "to")?)?;
    let is_forced = flag_field(&body, "force")?;
    let resets = caller
        .admin
        .reset_offset(&group, topic, target, is_forced)
        .await?;
    Ok(Json(output::resets_json(&group, &resets)))
}
