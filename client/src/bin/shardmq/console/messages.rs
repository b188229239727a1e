//! The messages page's and the DLQ page's API: queries by id, by key and by queue and offset
//! range (or time), a resend of a stored message, a group's dead letters and their resend.
//!
//! Owns: reading the page's requests into the calls `shardmq message …` and `shardmq dlq …`
//! make (the admin API's queries, `dlq::read_queue_range`, `dlq::read_dead_letters`,
//! `dlq::resend_each`), and the size limits of what a page is sent. Never: a query or a send
//! of its own.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Path, Query};
use axum::Json;
use serde_json::{json, Value};
use shardmq_client::{MessageExt, MessageQueue, PullConsumer, PullOptions, TagExpression};

use super::session::Caller;
use super::{error_text, failures_json, flag_field, optional_text, text_field};
use super::{ApiError, ApiResult, JsonBody};
use crate::cli::{CredentialsOf, TimeRange};
use crate::commands::time_range;
use crate::dlq::{self, Resent};
use crate::output;

/// Most body bytes of one message sent to the page (as text and as hex); a longer body is cut
/// and marked `body_is_truncated`.
const MAX_SHOWN_BODY_BYTES: usize = 64 * 1024;

/// Most messages a queue-range query returns.
const MAX_RANGE_MESSAGES: u64 = 100;

/// Most messages a key query asks each broker for.
const MAX_KEY_RESULTS: u32 = 64;

/// Most dead letters the DLQ page lists, and reads to find the ones to resend.
const MAX_DEAD_LETTERS: u64 = 10_000;

/// Most messages one pull of a queue-range query asks for.
const RANGE_PULL_BATCH: u32 = 32;

/// The consumer group a queue-range query pulls as when the page names none (nothing is
/// committed for it).
const DEFAULT_BROWSE_GROUP: &str = "shardmq-console";

/// A stored message as the page shows it: `output::message_json`'s fields, the body (cut to
/// [`MAX_SHOWN_BODY_BYTES`]) as text and hex, every property and where it is stored.
fn message_view(message: &MessageExt) -> Value {
    let mut value = output::message_json(message);
    let shown = &message.body[..message.body.len().min(MAX_SHOWN_BODY_BYTES)];
    value["body"] = json!(String::from_utf8_lossy(shown));
    value["body_hex"] = json!(shown.iter().map(|b| format!("{b:02x}")).collect::<String>());
    value["body_bytes"] = json!(message.body.len());
    value["body_is_truncated"] = json!(shown.len() < message.body.len());
    let all: serde_json::Map<String, Value> = message
        .properties()
        .map(|(name, value)| (name.to_owned(), Value::from(value)))
        .collect();
    value["all_properties"] = Value::Object(all);
    value["commit_log_offset"] = json!(message.commit_log_offset);
    value["store_host"] = json!(message.store_host.to_string());
    value["born_host"] = json!(message.born_host.to_string());
    value["retry_topic"] = json!(message.retry_topic());
    value["origin_message_id"] = json!(message.origin_message_id());
    value["resend_topic"] = json!(dlq::origin_topic(message));
    value
}

fn messages_view(messages: &[MessageExt]) -> Value {
    Value::Array(messages.iter().map(message_view).collect())
}

/// The store-time range of a query string's `begin` and `end` (ms or RFC 3339).
fn range_of(query: &HashMap<String, String>) -> Result<(i64, i64), ApiError> {
    let non_empty = |name: &str| query.get(name).filter(|text| !text.is_empty()).cloned();
    let range = TimeRange {
        begin: non_empty("begin"),
        end: non_empty("end"),
    };
    Ok(time_range(&range)?)
}

fn required<'a>(query: &'a HashMap<String, String>, name: &str) -> Result<&'a str, ApiError> {
    query
        .get(name)
        .map(String::as_str)
        .filter(|text| !text.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("`{name}` is required")))
}

fn number<T: std::str::FromStr>(
    query: &HashMap<String, String>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match query.get(name).filter(|text| !text.is_empty()) {
        None => Ok(None),
        Some(text) => {
            text.trim().parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("`{name}` {text:?} is not a whole number"))
            })
        }
    }
}

/// `GET /api/messages/id?id=ID&topic=T&begin=&end=`: every stored copy with that unique id
/// or offset id (only those of `topic` when given).
pub async fn by_id(caller: Caller, Query(query): Query<HashMap<String, String>>) -> ApiResult {
    let id = required(&query, "id")?;
    let topic = query.get("topic").filter(|topic| !topic.is_empty());
    let (begin_ms, end_ms) = range_of(&query)?;
    let answer = caller.admin.query_by_any_id(id, begin_ms, end_ms).await?;
    let found: Vec<MessageExt> = answer
        .value
        .into_iter()
        .filter(|message| topic.is_none_or(|topic| message.topic() == topic))
        .collect();
    Ok(Json(json!({
        "messages": messages_view(&found),
        "failures": failures_json(&answer.failures),
    })))
}

/// `GET /api/messages/key?topic=T&key=K&max=N&begin=&end=`.
pub async fn by_key(caller: Caller, Query(query): Query<HashMap<String, String>>) -> ApiResult {
    let topic = required(&query, "topic")?;
    let key = required(&query, "key")?;
    let max = number::<u32>(&query, "max")?.unwrap_or(32);
    if max == 0 || max > MAX_KEY_RESULTS {
        return Err(ApiError::bad_request(format!(
            "`max` is {max}; it must be 1 to {MAX_KEY_RESULTS}"
        )));
    }
    let (begin_ms, end_ms) = range_of(&query)?;
    let found = caller
        .admin
        .query_by_key(topic, key, begin_ms, end_ms, max)
        .await?;
    Ok(Json(json!({
        "messages": messages_view(&found.value),
        "failures": failures_json(&found.failures),
    })))
}

/// `GET /api/messages/range?topic=T&queue=Q&broker=B&from=OFFSET|time=TIME&count=N&group=G`:
/// up to `count` messages of one queue from an offset, or from the first stored at or after a
/// time. `broker` may be left out when one broker hosts the topic.
pub async fn by_range(caller: Caller, Query(query): Query<HashMap<String, String>>) -> ApiResult {
    let topic = required(&query, "topic")?;
    let queue_id = number::<u32>(&query, "queue")?
        .ok_or_else(|| ApiError::bad_request("`queue` (the queue id) is required"))?;
    let count = number::<u64>(&query, "count")?.unwrap_or(20);
    if count == 0 || count > MAX_RANGE_MESSAGES {
        return Err(ApiError::bad_request(format!(
            "`count` is {count}; it must be 1 to {MAX_RANGE_MESSAGES}"
        )));
    }
    let from = number::<i64>(&query, "from")?;
    let time = query.get("time").filter(|text| !text.is_empty()).cloned();
    let group = query
        .get("group")
        .filter(|group| !group.is_empty())
        .map_or(DEFAULT_BROWSE_GROUP, String::as_str);
    let consumer = PullConsumer::builder()
        .namesrv(&caller.settings.namesrv)
        .request_timeout(caller.settings.request_timeout)
        .credentials_of(&caller.settings)
        .group(group)
        .build()
        .await?;
    let outcome = read_range(&consumer, &query, topic, queue_id, from, time, count).await;
    consumer.shutdown().await;
    Ok(Json(outcome?))
}

async fn read_range(
    consumer: &PullConsumer,
    query: &HashMap<String, String>,
    topic: &str,
    queue_id: u32,
    from: Option<i64>,
    time: Option<String>,
    count: u64,
) -> Result<Value, ApiError> {
    let queues: Vec<MessageQueue> = consumer
        .queues(topic)
        .await?
        .into_iter()
        .filter(|queue| queue.queue_id == queue_id)
        .collect();
    let queue = match query.get("broker").filter(|broker| !broker.is_empty()) {
        Some(broker) => queues
            .into_iter()
            .find(|queue| &queue.broker_name == broker)
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "broker {broker} has no queue {queue_id} of {topic}"
                ))
            })?,
        None if queues.len() == 1 => queues.into_iter().next().expect("one queue"),
        None if queues.is_empty() => {
            return Err(ApiError::not_found(format!(
                "topic {topic} has no readable queue {queue_id}"
            )))
        }
        None => {
            let names: Vec<&str> = queues.iter().map(|q| q.broker_name.as_str()).collect();
            return Err(ApiError::bad_request(format!(
                "queue {queue_id} of {topic} is on several brokers ({}); choose one",
                names.join(", ")
            )));
        }
    };
    let (min_offset, max_offset) = consumer.queue_offsets(&queue).await?;
    let start = match (from, time) {
        (Some(offset), _) => offset.max(min_offset),
        (None, Some(text)) => {
            let range = TimeRange {
                begin: Some(text),
                end: None,
            };
            let (at_ms, _) = time_range(&range)?;
            consumer.offset_by_time(&queue, at_ms).await?
        }
        (None, None) => min_offset,
    };
    let end = max_offset.min(start.saturating_add(i64::try_from(count).unwrap_or(i64::MAX)));
    let options = PullOptions {
        max_messages: RANGE_PULL_BATCH,
        max_bytes: 0,
        tags: TagExpression::parse("*").map_err(anyhow::Error::from)?,
        wait: Duration::ZERO,
    };
    let mut messages = dlq::read_queue_range(consumer, &queue, &options, start..end, count).await?;
    messages.truncate(usize::try_from(count).unwrap_or(usize::MAX));
    Ok(json!({
        "topic": topic,
        "broker_name": queue.broker_name,
        "queue_id": queue_id,
        "min_offset": min_offset,
        "max_offset": max_offset,
        "start_offset": start,
        "messages": messages_view(&messages),
    }))
}

fn resent_json(resent: &[Resent]) -> (Value, Vec<String>) {
    let mut errors = Vec::new();
    let items = resent
        .iter()
        .map(|one| match &one.outcome {
            Ok((topic, result)) => {
                let mut value = output::send_result_json(result);
                value["topic"] = json!(topic);
                value["source_msg_id"] = json!(one.source_msg_id);
                value
            }
            Err(error) => {
                let text = error_text(error);
                errors.push(text.clone());
                json!({ "source_msg_id": one.source_msg_id, "error": text })
            }
        })
        .collect();
    (Value::Array(items), errors)
}

/// `POST /api/messages/resend` `{id, topic?}`: sends the stored message with that id again to
/// its original topic (a retry or dead-letter copy: the topic it was first sent to), under its
/// first id, as `dlq resend` does.
pub async fn resend(caller: Caller, JsonBody(body): JsonBody) -> ApiResult {
    let id = text_field(&body, "id")?;
    let topic = optional_text(&body, "topic")?;
    let found = caller.admin.query_by_any_id(id, 0, 0).await?;
    let Some(message) = found
        .value
        .iter()
        .find(|message| topic.is_none_or(|topic| message.topic() == topic))
    else {
        let whose = topic.map_or(String::new(), |topic| format!(" of topic {topic}"));
        return Err(ApiError::not_found(format!(
            "no broker holds a message{whose} with id {id}"
        )));
    };
    let resent = dlq::resend_each(&caller.settings, &[message]).await?;
    let (items, errors) = resent_json(&resent);
    if let Some(error) = errors.into_iter().next() {
        return Err(anyhow::anyhow!(error).into());
    }
    Ok(Json(json!({ "resent": items })))
}

/// `GET /api/dlq/{group}?max=N`: the group's dead letters, oldest first.
pub async fn dead_letters(
    caller: Caller,
    Path(group): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let max = number::<u64>(&query, "max")?.unwrap_or(1000);
    if max == 0 || max > MAX_DEAD_LETTERS {
        return Err(ApiError::bad_request(format!(
            "`max` is {max}; it must be 1 to {MAX_DEAD_LETTERS}"
        )));
    }
    shardmq_client::check_group_name(&group).map_err(anyhow::Error::from)?;
    let letters = dlq::read_dead_letters(&caller.settings, &group, max)
        .await
        .with_context(|| format!("reading %DLQ%{group}"))?;
    Ok(Json(
        json!({ "group": group, "dead_letters": messages_view(&letters) }),
    ))
}

/// `POST /api/dlq/{group}/resend` `{id}` or `{all: true}`: sends dead letters again to the
/// topic they were first sent to (they stay in the dead-letter topic).
pub async fn resend_dead_letters(
    caller: Caller,
    Path(group): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult {
    let is_all = flag_field(&body, "all")?;
    let id = optional_text(&body, "id")?;
    if !is_all && id.is_none() {
        return Err(ApiError::bad_request("give `id`, or `all: true`"));
    }
    shardmq_client::check_group_name(&group).map_err(anyhow::Error::from)?;
    let letters = dlq::read_dead_letters(&caller.settings, &group, MAX_DEAD_LETTERS).await?;
    let chosen = dlq::choose_letters(&letters, id, is_all);
    if chosen.is_empty() {
        if let Some(id) = id {
            return Err(ApiError::not_found(format!(
                "no dead letter of group {group} has id {id}"
            )));
        }
    }
    let resent = dlq::resend_each(&caller.settings, &chosen).await?;
    let (items, errors) = resent_json(&resent);
    Ok(Json(json!({ "resent": items, "errors": errors })))
}
