//! `shardmq dlq`: a consumer group's dead letters (`%DLQ%<group>`): list them, or send them
//! again to the topic they were first sent to.
//!
//! Owns: reading a whole dead-letter topic with a pull consumer (no offsets are committed: the
//! dead letters stay, and nothing else consumes them) and rebuilding the original message for a
//! resend. The console (`console/messages.rs`) calls the same functions for its DLQ page, its
//! queue-range query and its resend. Never: protocol details (the library has them).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;
use shardmq_client::{
    Error, Message, MessageExt, Producer, PullConsumer, PullOptions, PullStatus, TagExpression,
};

use crate::cli::{CredentialsOf, DlqCommand, Settings};
use crate::output::{self, print_json};

/// Most messages one pull of the dead-letter queue asks for.
const DLQ_PULL_BATCH: u32 = 32;

pub async fn run(context: &Settings, command: DlqCommand) -> Result<()> {
    match command {
        DlqCommand::List { group, max } => {
            let letters = read_dead_letters(context, &group, max).await?;
            for letter in &letters {
                if context.is_json {
                    print_json(&dead_letter_json(letter));
                } else {
                    println!("{}", dead_letter_text(letter));
                }
            }
            if !context.is_json {
                eprintln!("{} dead letter(s) in %DLQ%{group}", letters.len());
            }
            Ok(())
        }
        DlqCommand::Resend { group, id, all } => {
            let letters = read_dead_letters(context, &group, u64::MAX).await?;
            let chosen = choose_letters(&letters, id.as_deref(), all);
            if chosen.is_empty() {
                match id {
                    Some(id) => bail!("no dead letter of group {group} has id {id}"),
                    None => {
                        if !context.is_json {
                            eprintln!("%DLQ%{group} is empty: nothing to resend");
                        }
                        return Ok(());
                    }
                }
            }
            resend(context, &chosen).await
        }
    }
}

/// The dead letters `id` names (by msg id or first id), or all of them when `all`.
pub(crate) fn choose_letters<'a>(
    letters: &'a [MessageExt],
    id: Option<&str>,
    all: bool,
) -> Vec<&'a MessageExt> {
    letters
        .iter()
        .filter(|letter| {
            all || id
                .is_some_and(|id| letter.msg_id() == id || letter.origin_message_id() == Some(id))
        })
        .collect()
}

/// Every message of the group's dead-letter topic, oldest first, at most `max`.
pub(crate) async fn read_dead_letters(
    context: &Settings,
    group: &str,
    max: u64,
) -> Result<Vec<MessageExt>> {
    let topic = format!("%DLQ%{group}");
    let consumer = PullConsumer::builder()
        .namesrv(&context.namesrv)
        .request_timeout(context.request_timeout)
        .credentials_of(context)
        .group(group)
        .build()
        .await?;
    let outcome = read_topic(&consumer, &topic, max).await;
    consumer.shutdown().await;
    match outcome {
        Err(error) if is_topic_not_found(&error) => Ok(Vec::new()),
        other => other,
    }
}

fn is_topic_not_found(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<Error>(),
        Some(Error::TopicNotFound { .. })
    )
}

async fn read_topic(consumer: &PullConsumer, topic: &str, max: u64) -> Result<Vec<MessageExt>> {
    let options = PullOptions {
        max_messages: DLQ_PULL_BATCH,
        max_bytes: 0,
        tags: TagExpression::parse("*")?,
        wait: Duration::ZERO,
    };
    let mut letters = Vec::new();
    for queue in consumer.queues(topic).await? {
        let (min, max_offset) = consumer.queue_offsets(&queue).await?;
        let left = max.saturating_sub(letters.len() as u64);
        letters.extend(read_queue_range(consumer, &queue, &options, min..max_offset, left).await?);
    }
    letters.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    Ok(letters)
}

/// The messages of one queue in the offset range `offsets`, oldest first, at least `max` of
/// them when there are (a pull may bring a few more; the caller truncates). Nothing is
/// committed.
pub(crate) async fn read_queue_range(
    consumer: &PullConsumer,
    queue: &shardmq_client::MessageQueue,
    options: &PullOptions,
    offsets: std::ops::Range<i64>,
    max: u64,
) -> Result<Vec<MessageExt>> {
    let mut messages = Vec::new();
    let mut offset = offsets.start;
    while offset < offsets.end && (messages.len() as u64) < max {
        let result = consumer
            .pull_with(queue, offset, options)
            .await
            .with_context(|| format!("reading {queue} at offset {offset}"))?;
        if result.status == PullStatus::Found {
            messages.extend(
                result
                    .messages
                    .into_iter()
                    .filter(|message| message.queue_offset < offsets.end),
            );
        }
        if result.next_begin_offset <= offset {
            break;
        }
        offset = result.next_begin_offset;
    }
    Ok(messages)
}

/// The topic a resend of `message` goes to: the original topic of a retry or dead-letter copy
/// (RETRY_TOPIC), else its own; `None` for a copy that names no original topic.
pub(crate) fn origin_topic(message: &MessageExt) -> Option<&str> {
    match message.retry_topic() {
        Some(topic) => Some(topic),
        None if shardmq_client::system_topics::is_system_topic(message.topic()) => None,
        None => Some(message.topic()),
    }
}

/// One message sent again by [`resend_each`].
pub(crate) struct Resent {
    /// The msg id of the stored message that was resent.
    pub source_msg_id: String,
    /// The topic it went to and the send's result.
    pub outcome: Result<(String, shardmq_client::SendResult)>,
}

/// Sends each message as a new message to its original topic ([`origin_topic`]), with its
/// body, tag, keys, user properties and first id.
pub(crate) async fn resend_each(
    context: &Settings,
    messages: &[&MessageExt],
) -> Result<Vec<Resent>> {
    let producer = Producer::builder()
        .namesrv(&context.namesrv)
        .request_timeout(context.request_timeout)
        .credentials_of(context)
        .build()
        .await?;
    let mut resent = Vec::new();
    for stored in messages {
        let outcome = match origin_topic(stored) {
            None => Err(anyhow::anyhow!(
                "message {} of {} names no original topic (RETRY_TOPIC); not resent",
                stored.msg_id(),
                stored.topic()
            )),
            Some(topic) => {
                let mut message = Message::new(topic, stored.body.clone())
                    .with_unique_id(stored.origin_message_id().unwrap_or(&stored.msg_id()));
                if let Some(tags) = stored.tags() {
                    message = message.with_tags(tags);
                }
                message = message.with_keys(stored.keys());
                for (name, value) in stored.user_properties() {
                    message = message.with_property(name, value);
                }
                match producer.send(message).await {
                    Ok(result) => Ok((topic.to_owned(), result)),
                    Err(error) => Err(anyhow::Error::new(error)
                        .context(format!("resending message {}", stored.msg_id()))),
                }
            }
        };
        resent.push(Resent {
            source_msg_id: stored.msg_id(),
            outcome,
        });
    }
    producer.shutdown().await;
    Ok(resent)
}

/// Resends the dead letters and prints each outcome.
async fn resend(context: &Settings, letters: &[&MessageExt]) -> Result<()> {
    let mut outcome = Ok(());
    for resent in resend_each(context, letters).await? {
        match resent.outcome {
            Ok((topic, result)) => {
                if context.is_json {
                    let mut value = output::send_result_json(&result);
                    value["topic"] = json!(topic);
                    value["dead_letter_msg_id"] = json!(resent.source_msg_id);
                    print_json(&value);
                } else {
                    println!("resent to {topic}: {}", output::send_result_text(&result));
                }
            }
            Err(error) => outcome = Err(error),
        }
    }
    outcome
}

fn dead_letter_json(letter: &MessageExt) -> serde_json::Value {
    let mut value = output::message_json(letter);
    value["retry_topic"] = json!(letter.retry_topic());
    value["origin_message_id"] = json!(letter.origin_message_id());
    value
}

fn dead_letter_text(letter: &MessageExt) -> String {
    format!(
        "{} original_topic={} origin_msg_id={} reconsume_times={}",
        output::message_text(letter),
        letter.retry_topic().unwrap_or("-"),
        letter.origin_message_id().unwrap_or("-"),
        letter.reconsume_times
    )
}
