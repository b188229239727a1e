//! `shardmq dlq`: a consumer group's dead letters (`%DLQ%<group>`): list them, or send them
//! again to the topic they were first sent to.
//!
//! Owns: reading a whole dead-letter topic with a pull consumer (no offsets are committed: the
//! dead letters stay, and nothing else consumes them) and rebuilding the original message for a
//! resend. Never: protocol details (the library has them).

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
            let chosen: Vec<&MessageExt> = letters
                .iter()
                .filter(|letter| {
                    all || id.as_deref().is_some_and(|id| {
                        letter.msg_id() == id || letter.origin_message_id() == Some(id)
                    })
                })
                .collect();
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

/// Every message of the group's dead-letter topic, oldest first, at most `max`.
async fn read_dead_letters(context: &Settings, group: &str, max: u64) -> Result<Vec<MessageExt>> {
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
        let mut offset = min;
        while offset < max_offset && (letters.len() as u64) < max {
            let result = consumer
                .pull_with(&queue, offset, &options)
                .await
                .with_context(|| format!("reading {queue} at offset {offset}"))?;
            if result.status == PullStatus::Found {
                letters.extend(result.messages);
            }
            if result.next_begin_offset <= offset {
                break;
            }
            offset = result.next_begin_offset;
        }
    }
    letters.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    Ok(letters)
}

/// Sends each dead letter as a new message to its original topic, with its body, tag, keys,
/// user properties and first id.
async fn resend(context: &Settings, letters: &[&MessageExt]) -> Result<()> {
    let producer = Producer::builder()
        .namesrv(&context.namesrv)
        .request_timeout(context.request_timeout)
        .credentials_of(context)
        .build()
        .await?;
    let mut outcome = Ok(());
    for letter in letters {
        let Some(topic) = letter.retry_topic() else {
            outcome = Err(anyhow::anyhow!(
                "dead letter {} names no original topic (RETRY_TOPIC); not resent",
                letter.msg_id()
            ));
            continue;
        };
        let mut message = Message::new(topic, letter.body.clone())
            .with_unique_id(letter.origin_message_id().unwrap_or(&letter.msg_id()));
        if let Some(tags) = letter.tags() {
            message = message.with_tags(tags);
        }
        message = message.with_keys(letter.keys());
        for (name, value) in letter.user_properties() {
            message = message.with_property(name, value);
        }
        match producer.send(message).await {
            Ok(result) => {
                if context.is_json {
                    let mut value = output::send_result_json(&result);
                    value["topic"] = json!(topic);
                    value["dead_letter_msg_id"] = json!(letter.msg_id());
                    print_json(&value);
                } else {
                    println!("resent to {topic}: {}", output::send_result_text(&result));
                }
            }
            Err(error) => {
                outcome = Err(anyhow::Error::new(error)
                    .context(format!("resending dead letter {}", letter.msg_id())));
            }
        }
    }
    producer.shutdown().await;
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
