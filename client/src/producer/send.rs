//! Sending with retries: each attempt picks a queue (`select.rs`), sends to its broker's
//! master within what is left of the send timeout, and on a retriable failure looks the route up
//! again and tries another broker; a topic with no route yet goes to a master that may create
//! it. The same for a transaction's half message, except after a timeout.
//!
//! Owns: the retry loops, compression and the broker's size limits before a send, and turning
//! the broker's answer into [`SendResult`]s. Never: encoding (`api/send.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use shardmq_schema::{wire, FrameError};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::select::QueueChoice;
use super::ProducerInner;
use crate::api::{SendAnswer, SendResult, SendStatus};
use crate::error::{Error, Result};
use crate::message::Message;
use crate::route::MessageQueue;

impl ProducerInner {
    /// Sends `messages` (one topic, checked non-empty) with retries; one result per message.
    pub(super) async fn send(
        &self,
        messages: &[Message],
        choice: QueueChoice<'_>,
    ) -> Result<Vec<SendResult>> {
        self.check_running()?;
        for message in messages {
            message.validate(self.max_message_bytes)?;
        }
        let topic = messages[0].topic();
        if let QueueChoice::Fixed(queue) = choice {
            if queue.topic != topic {
                return Err(Error::InvalidArgument(format!(
                    "queue {queue} is not a queue of topic {topic}"
                )));
            }
        }
        let deadline = Instant::now() + self.send_timeout;
        let mut failed_broker: Option<String> = None;
        let mut last_error = None;
        let mut attempts = 0;
        while attempts <= self.retries {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            attempts += 1;
            // `queue` is `None` for a topic without a route: the broker picks the queue.
            let (address, queue) = match self.target(topic, choice, failed_broker.as_deref()).await
            {
                Ok((queue, address)) => (address, Some(queue)),
                Err(Error::TopicNotFound { .. }) if matches!(choice, QueueChoice::RoundRobin) => {
                    let address = self
                        .auto_create_target(topic, failed_broker.as_deref())
                        .await?;
                    (address, None)
                }
                Err(error) => return Err(error),
            };
            let queue_id = queue.as_ref().map(|queue| queue.queue_id);
            match self
                .send_to(&address, topic, queue_id, messages, remaining)
                .await
            {
                Ok(answer) => {
                    let queue = match queue {
                        Some(queue) => queue,
                        None => MessageQueue::new(
                            topic,
                            self.broker_name_at(&address).await,
                            answer.queue_id,
                        ),
                    };
                    return Ok(results(answer, queue, messages));
                }
                Err(Error::Status { status, .. })
                    if status == wire::Status::TOPIC_NOT_FOUND && queue.is_none() =>
                {
                    // The broker does not create topics on first send.
                    return Err(Error::TopicNotFound {
                        topic: topic.to_owned(),
                    });
                }
                Err(error) if error.is_retriable() => {
                    warn!(%topic, %address, attempt = attempts, %error, "send failed; retrying");
                    // The broker may be gone, paused or refusing writes (a master replaced by
                    // failover): look again where the topic lives.
                    let _ = self.instance.namesrv.fetch_route(topic).await;
                    // Broker names to avoid with a route; addresses without one.
                    failed_broker = Some(queue.map_or(address, |queue| queue.broker_name));
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        let last = last_error.unwrap_or(Error::Timeout {
            operation: "send",
            address: String::new(),
            timeout: self.send_timeout,
        });
        Err(Error::SendFailed {
            topic: topic.to_owned(),
            attempts,
            last: Box::new(last),
        })
    }

    /// For a topic no broker hosts yet: the address of a master broker of the cluster
    /// (round-robin, avoiding the one that just failed) to send to with no queue named, so
    /// that a broker that creates topics on first send (`--auto-create-topics`) creates it.
    /// RocketMQ does the same through the route of its default topic `TBW102`.
    async fn auto_create_target(&self, topic: &str, failed: Option<&str>) -> Result<String> {
        let clusters = self.instance.namesrv.cluster_info().await?;
        let masters: Vec<&str> = clusters
            .iter()
            .flat_map(|cluster| cluster.master_addresses())
            .collect();
        if masters.is_empty() {
            return Err(Error::TopicNotFound {
                topic: topic.to_owned(),
            });
        }
        let start = self.queue_counter(topic).fetch_add(1, Ordering::Relaxed);
        let address = (0..masters.len())
            .map(|step| masters[(start + step) % masters.len()])
            .find(|address| Some(*address) != failed)
            .unwrap_or(masters[start % masters.len()]);
        debug!(%topic, %address, "no route yet; sending where the broker may create the topic");
        Ok(address.to_owned())
    }

    /// The broker name the broker at `address` gave in its handshake.
    async fn broker_name_at(&self, address: &str) -> String {
        match self.instance.pool.get(address).await {
            Ok(connection) => connection
                .server()
                .map(|server| server.broker_name.clone())
                .unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    async fn send_to(
        &self,
        address: &str,
        topic: &str,
        queue_id: Option<u32>,
        messages: &[Message],
        timeout: Duration,
    ) -> Result<SendAnswer> {
        let connection = self.instance.pool.get(address).await?;
        let messages = &*crate::compression::compress_bodies(messages, self.compress_over_bytes);
        let announced = connection.server().map_or(0, |s| s.max_message_bytes);
        if announced > 0 {
            for message in messages {
                if message.body().len() > announced {
                    return Err(Error::InvalidArgument(format!(
                        "message body is {} bytes, over the broker {address}'s max_message_bytes ({announced})",
                        message.body().len()
                    )));
                }
            }
        }
        let outcome = self
            .instance
            .pool
            .send_messages(address, timeout, topic, queue_id, &self.group, messages)
            .await;
        match outcome {
            Err(Error::Frame {
                source:
                    FrameError::TooLarge {
                        length_bytes,
                        max_frame_bytes,
                    },
                ..
            }) => Err(Error::InvalidArgument(format!(
                "the send request is {length_bytes} bytes, over the broker {address}'s max_frame_bytes ({max_frame_bytes}); send fewer messages per batch"
            ))),
            other => other,
        }
    }

    /// Stores a half message, with retries (not after a timeout: the broker may have stored
    /// it). Returns the broker's address, the result and the half message's CommitLog offset.
    pub(super) async fn send_half(&self, message: &Message) -> Result<(String, SendResult, i64)> {
        let topic = message.topic();
        let deadline = Instant::now() + self.send_timeout;
        let mut failed_broker: Option<String> = None;
        let mut last_error = None;
        let mut attempts = 0;
        while attempts <= self.retries {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            attempts += 1;
            let (queue, address) = self
                .target(topic, QueueChoice::RoundRobin, failed_broker.as_deref())
                .await?;
            match self
                .instance
                .pool
                .send_half(
                    &address,
                    remaining,
                    Some(queue.queue_id),
                    &self.group,
                    message,
                )
                .await
            {
                Ok(answer) => {
                    let half_commit_log_offset = answer.stored[0].commit_log_offset;
                    let sent = results(answer, queue, std::slice::from_ref(message)).remove(0);
                    return Ok((address, sent, half_commit_log_offset));
                }
                Err(error) if error.is_retriable() && !matches!(error, Error::Timeout { .. }) => {
                    warn!(%topic, %address, attempt = attempts, %error, "half message send failed; retrying");
                    let _ = self.instance.namesrv.fetch_route(topic).await;
                    failed_broker = Some(queue.broker_name);
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(Error::SendFailed {
            topic: topic.to_owned(),
            attempts,
            last: Box::new(last_error.unwrap_or(Error::Timeout {
                operation: "send half message",
                address: String::new(),
                timeout: self.send_timeout,
            })),
        })
    }
}

fn results(answer: SendAnswer, queue: MessageQueue, messages: &[Message]) -> Vec<SendResult> {
    let status = SendStatus::from_wire(answer.status);
    let queue = MessageQueue {
        queue_id: answer.queue_id,
        ..queue
    };
    answer
        .stored
        .into_iter()
        .zip(messages)
        .map(|(stored, message)| SendResult {
            status,
            msg_id: if stored.unique_id.is_empty() {
                message.unique_id().to_owned()
            } else {
                stored.unique_id
            },
            offset_msg_id: stored.offset_msg_id,
            queue: queue.clone(),
            queue_offset: stored.queue_offset,
        })
        .collect()
}
