//! The topics page's API: list, create or update (queues, permission), delete, and one
//! topic's route and per-queue offsets.
//!
//! Owns: reading the page's forms into the same calls `shardmq topic …` makes
//! (`commands::upsert_topic_on`, `commands::delete_topic_on`, the admin API). Never: a topic
//! operation of its own.

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::Json;
use serde_json::{json, Value};
use shardmq_client::{TopicConfig, DEFAULT_TOPIC_QUEUES};

use super::session::Caller;
use super::{failures_json, flag_field, optional_text, text_field, ApiError, ApiResult, JsonBody};
use crate::commands::{delete_topic_on, upsert_topic_on};
use crate::output;

/// `GET /api/topics?system=true`: the topics the name servers route.
pub async fn list(caller: Caller, Query(query): Query<HashMap<String, String>>) -> ApiResult {
    let with_system = query.get("system").is_some_and(|value| value == "true");
    let mut topics = caller.admin.topic_list().await?;
    if !with_system {
        topics.retain(|topic| !shardmq_client::system_topics::is_system_topic(topic));
    }
    Ok(Json(json!({ "topics": topics })))
}

/// A queue count field: absent means `default`.
fn count_field(body: &Value, name: &str, default: u32) -> Result<u32, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_u64()
            .and_then(|count| u32::try_from(count).ok())
            .ok_or_else(|| ApiError::bad_request(format!("`{name}` must be a whole number"))),
    }
}

/// `POST /api/topics` `{topic, queues, read_queues?, write_queues?, perm, ordered, broker?,
/// cluster?, update}`: creates the topic (an error where it exists) or, with `update`, creates
/// or updates it: on `broker`, or else on every master of `cluster` (of every cluster).
pub async fn upsert(caller: Caller, JsonBody(body): JsonBody) -> ApiResult {
    let queues = count_field(&body, "queues", DEFAULT_TOPIC_QUEUES)?;
    let config = TopicConfig {
        name: text_field(&body, "topic")?.to_owned(),
        read_queues: count_field(&body, "read_queues", queues)?,
        write_queues: count_field(&body, "write_queues", queues)?,
        perm: count_field(&body, "perm", 6)?,
        is_ordered: flag_field(&body, "ordered")?,
    };
    let is_create = !flag_field(&body, "update")?;
    let done = upsert_topic_on(
        &caller.admin,
        &config,
        optional_text(&body, "broker")?,
        optional_text(&body, "cluster")?,
        is_create,
    )
    .await?;
    Ok(Json(json!({
        "topic": output::topic_config_json(&config),
        "brokers": done.value,
        "failures": failures_json(&done.failures),
    })))
}

/// `DELETE /api/topics/{topic}?broker=ADDR&force=true`.
pub async fn delete(
    caller: Caller,
    Path(topic): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let broker = query.get("broker").filter(|broker| !broker.is_empty());
    let is_forced = query.get("force").is_some_and(|value| value == "true");
    let brokers =
        delete_topic_on(&caller.admin, &topic, broker.map(String::as_str), is_forced).await?;
    Ok(Json(json!({ "topic": topic, "deleted_on": brokers })))
}

/// `GET /api/topics/{topic}`: its route, and each queue's offsets (or why they are missing:
/// a broker of the route that does not answer).
pub async fn detail(caller: Caller, Path(topic): Path<String>) -> ApiResult {
    let route = caller.admin.route(&topic).await?;
    let mut answer = json!({ "topic": topic, "route": output::route_json(&route) });
    match caller.admin.topic_stats(&topic).await {
        Ok(stats) => answer["stats"] = output::stats_json(&topic, &stats),
        Err(error) => {
            answer["stats_error"] = json!(super::error_text(&anyhow::Error::new(error)));
        }
    }
    Ok(Json(answer))
}
