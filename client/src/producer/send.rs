//! Sending with retries: a send is admitted into the window (`window.rs`), waits for its turn
//! when it is ordered, then each attempt picks a queue (`select.rs`), sends to its broker's
//! master within what is left of the send timeout, and on a retriable failure looks the route
//! up again and tries another broker; a topic with no route yet goes to a master that may
//! create it. The same for a transaction's half message, except after a timeout.
//!
//! Owns: the checks before a send, the choice of request per attempt (a run of records the
//! client encodes, for a broker of protocol 2 and a batch without delays; wire messages
//! otherwise), the run's buffers (reused from send to send), the retry loops, and turning the
//! broker's answer into a [`BatchSendResult`]. Never: encoding (`api/`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use shardmq_schema::{wire, FrameError};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::select::QueueChoice;
use super::window::Admission;
use super::ProducerInner;
use crate::api::{BatchSendResult, RecordRun, RunSettings, SendResult, Stored};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::host::local_ipv4;
use crate::message::{now_ms, Message};
use crate::message_id::MessageId;
use crate::route::MessageQueue;

/// The lowest protocol version whose brokers take a run of records (`SendRecordsRequest`).
pub(crate) const RECORD_RUNS_PROTOCOL_VERSION: u32 = 2;

/// Most run buffers a producer keeps for reuse (one per send in flight is enough).
const MAX_POOLED_RUN_BUFFERS: usize = 16;

/// Largest run buffer kept for reuse; a larger one (a batch of large bodies) is freed.
const MAX_POOLED_RUN_BUFFER_BYTES: usize = 8 << 20;

/// Whether a batch goes to a broker that settled on `protocol_version` as a run of records the
/// client encodes (`SendRecordsRequest`), rather than as wire messages (`SendRequest`): the
/// broker must speak protocol 2, and no message may name a delay level, delivery time or
/// delay (the broker places those in a schedule queue under another topic).
pub(crate) fn uses_record_runs(protocol_version: u32, messages: &[Message]) -> bool {
    protocol_version >= RECORD_RUNS_PROTOCOL_VERSION && !messages.iter().any(Message::is_delayed)
}

/// Where an admitted send goes on each attempt: round-robin, or one queue (an ordered send's,
/// chosen when it was admitted).
#[derive(Debug, Clone)]
pub(super) enum Target {
    RoundRobin,
    Queue(MessageQueue),
}

impl Target {
    fn choice(&self) -> QueueChoice<'_> {
        match self {
            Target::RoundRobin => QueueChoice::RoundRobin,
            Target::Queue(queue) => QueueChoice::Fixed(queue),
        }
    }
}

/// How a send picks its queue, as the caller asked.
#[derive(Debug, Clone, Copy)]
pub(super) enum Choice<'a> {
    RoundRobin,
    ByKey(&'a str),
    Fixed(&'a MessageQueue),
}

impl ProducerInner {
    /// Checks `messages` (non-empty, one topic) and admits them into the window: an ordered
    /// send gets its queue now, and its place in that queue's order.
    pub(super) async fn admit(
        &self,
        messages: &[Message],
        choice: Choice<'_>,
    ) -> Result<(Target, Admission)> {
        self.check_running()?;
        let first = messages.first().ok_or_else(|| {
            Error::InvalidArgument("a batch needs at least one message".to_owned())
        })?;
        let topic = first.topic();
        crate::message::check_topic_name(topic)?;
        let mut body_bytes = 0;
        for message in messages {
            if message.topic() != topic {
                return Err(Error::InvalidArgument(format!(
                    "a batch goes to one topic; it has {topic} and {}",
                    message.topic()
                )));
            }
            message.validate_content(self.max_message_bytes)?;
            body_bytes += message.body().len();
        }
        let target = match choice {
            Choice::RoundRobin => Target::RoundRobin,
            Choice::Fixed(queue) if queue.topic != topic => {
                return Err(Error::InvalidArgument(format!(
                    "queue {queue} is not a queue of topic {topic}"
                )))
            }
            Choice::Fixed(queue) => Target::Queue(queue.clone()),
            Choice::ByKey(key) => {
                let (queue, _) = self.target(topic, QueueChoice::ByKey(key), None).await?;
                Target::Queue(queue)
            }
        };
        let ordered_queue = match &target {
            Target::Queue(queue) => Some(queue),
            Target::RoundRobin => None,
        };
        let admission = self.window.admit(body_bytes, ordered_queue).await?;
        Ok((target, admission))
    }

    /// Sends admitted `messages` (checked by [`admit`](Self::admit)) with retries, once their
    /// turn has come; the send timeout runs from then. `admission` is released when the send
    /// ends.
    pub(super) async fn send_admitted(
        &self,
        messages: &[Message],
        target: &Target,
        mut admission: Admission,
    ) -> Result<BatchSendResult> {
        admission.wait_for_turn().await;
        let mut run = None;
        let outcome = self.send_with_retries(messages, target, &mut run).await;
        if let Some(run) = run {
            self.give_back(run.records);
        }
        drop(admission);
        outcome
    }

    async fn send_with_retries(
        &self,
        messages: &[Message],
        target: &Target,
        run: &mut Option<RecordRun>,
    ) -> Result<BatchSendResult> {
        let topic = messages[0].topic();
        let choice = target.choice();
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
                .send_to(&address, topic, queue_id, messages, run, remaining)
                .await
            {
                Ok(stored) => {
                    let queue = match queue {
                        Some(queue) => queue,
                        None => MessageQueue::new(
                            topic,
                            self.broker_name_at(&address).await,
                            stored.queue_id,
                        ),
                    };
                    let ids = messages.iter().map(|m| m.unique_id().clone()).collect();
                    return Ok(BatchSendResult::new(stored, queue, ids));
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

    /// One attempt: `messages` to `queue_id` of the broker at `address`, as a run of records
    /// when the broker takes one (`run` holds it from an earlier attempt, reused when the
    /// broker's address family is the same), else as wire messages.
    async fn send_to(
        &self,
        address: &str,
        topic: &str,
        queue_id: Option<u32>,
        messages: &[Message],
        run: &mut Option<RecordRun>,
        timeout: Duration,
    ) -> Result<Stored> {
        let connection = self.instance.pool.get(address).await?;
        let outcome = if uses_record_runs(connection.protocol_version(), messages) {
            tracing::trace!(target: crate::connection::TIMELINE, stage = "encode_begins", count = messages.len());
            let run = self.run_for(&connection, messages, run)?;
            tracing::trace!(target: crate::connection::TIMELINE, stage = "encode_ends");
            connection
                .send_records(timeout, topic, queue_id, &self.group, run)
                .await
        } else {
            let messages =
                &*crate::compression::compress_bodies(messages, self.compress_over_bytes);
            check_announced_limit(&connection, messages)?;
            self.instance
                .pool
                .send_messages(address, timeout, topic, queue_id, &self.group, messages)
                .await
        };
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

    /// The run of `messages` for a send on `connection`: `run` as it is when it was encoded for
    /// a broker of the same address family, else encoded (again) into a reused buffer.
    fn run_for<'r>(
        &self,
        connection: &Connection,
        messages: &[Message],
        run: &'r mut Option<RecordRun>,
    ) -> Result<&'r RecordRun> {
        let store_host = connection.peer_address();
        let is_reusable = run
            .as_ref()
            .is_some_and(|run| run.is_store_host_v6 == store_host.is_ipv6());
        if !is_reusable {
            if let Some(old) = run.take() {
                self.give_back(old.records);
            }
            let settings = RunSettings {
                born_host: SocketAddr::new(local_ipv4().into(), connection.local_address().port()),
                store_host,
                born_timestamp_ms: now_ms(),
                compress_over_bytes: self.compress_over_bytes,
                max_body_bytes: connection.server().map_or(0, |s| s.max_message_bytes),
            };
            *run = Some(RecordRun::encode(self.take_buffer(), messages, &settings)?);
        }
        Ok(run.as_ref().expect("encoded above"))
    }

    /// A buffer for a run: one a finished send gave back, or a new one.
    fn take_buffer(&self) -> BytesMut {
        self.run_buffers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    /// Keeps a finished run's memory for the next send, when nothing else holds it any more
    /// (the connection's writer drops its share once the bytes are on the socket).
    fn give_back(&self, records: Bytes) {
        let Ok(mut buffer) = records.try_into_mut() else {
            return;
        };
        if buffer.capacity() > MAX_POOLED_RUN_BUFFER_BYTES {
            return;
        }
        buffer.clear();
        let mut buffers = self
            .run_buffers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buffers.len() < MAX_POOLED_RUN_BUFFERS {
            buffers.push(buffer);
        }
    }

    /// Sends one message as a ONE_WAY frame (a run of records when the broker takes one).
    pub(super) async fn send_one_way_to(
        &self,
        address: &str,
        queue_id: u32,
        message: &Message,
    ) -> Result<()> {
        let connection = self.instance.pool.get(address).await?;
        let messages = std::slice::from_ref(message);
        if uses_record_runs(connection.protocol_version(), messages) {
            let mut run = None;
            let sent = match self.run_for(&connection, messages, &mut run) {
                Ok(encoded) => {
                    connection
                        .send_records_one_way(
                            self.send_timeout,
                            message.topic(),
                            Some(queue_id),
                            &self.group,
                            encoded,
                        )
                        .await
                }
                Err(error) => Err(error),
            };
            if let Some(run) = run {
                self.give_back(run.records);
            }
            return sent;
        }
        let messages = &*crate::compression::compress_bodies(messages, self.compress_over_bytes);
        check_announced_limit(&connection, messages)?;
        self.instance
            .pool
            .send_one_way(
                address,
                self.send_timeout,
                &self.group,
                &messages[0],
                Some(queue_id),
            )
            .await
    }

    /// Stores a half message, with retries (not after a timeout: the broker may have stored
    /// it). Returns the broker's address and the result (whose commit log offset names the
    /// half message when the transaction ends).
    pub(super) async fn send_half(&self, message: &Message) -> Result<(String, SendResult)> {
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
                Ok(stored) => {
                    let ids: Vec<MessageId> = vec![message.unique_id().clone()];
                    let sent = BatchSendResult::new(stored, queue, ids)
                        .into_single()
                        .expect("a send of one message has one result");
                    return Ok((address, sent));
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

/// Refuses a body over the broker's announced `max_message_bytes` before it is sent.
fn check_announced_limit(connection: &Connection, messages: &[Message]) -> Result<()> {
    let announced = connection.server().map_or(0, |s| s.max_message_bytes);
    if announced > 0 {
        if let Some(message) = messages.iter().find(|m| m.body().len() > announced) {
            return Err(Error::InvalidArgument(format!(
                "message body is {} bytes, over the broker {}'s max_message_bytes ({announced})",
                message.body().len(),
                connection.address()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_records_go_to_brokers_of_protocol_2_without_delays() {
        let plain = [Message::new("t", "a"), Message::new("t", "b")];
        assert!(uses_record_runs(2, &plain));
        assert!(uses_record_runs(3, &plain));
        // A broker that only speaks protocol 1 gets wire messages.
        assert!(!uses_record_runs(1, &plain));
        assert!(!uses_record_runs(0, &plain));
        // A message with a delay level, a delivery time or a delay keeps the batch on
        // SendRequest: the broker schedules it under another topic.
        for delayed in [
            Message::new("t", "c").with_delay_level(3),
            Message::new("t", "c").with_deliver_at_ms(1_700_000_000_000),
            Message::new("t", "c").with_delay(Duration::from_millis(500)),
        ] {
            let batch = [plain[0].clone(), delayed];
            assert!(!uses_record_runs(2, &batch));
        }
    }
}
