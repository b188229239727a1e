//! Pull requests: a queue's messages from an offset, long-polled at the broker, with the
//! answer's records decoded at once or later.
//!
//! Owns: what a pull asks for ([`PullArgs`]), its answer ([`PullResult`], [`PullStatus`]: the
//! pull consumer hands them to the application, the push consumer reads them), and the answer
//! before its records are decoded ([`UndecodedPull`], with the [`Pending`] it will add to a push
//! consumer's cache). Never: where to pull from or what to do with the messages (the pull and
//! push consumers).

use std::time::Duration;

use bytes::Bytes;
use shardmq_schema::wire;

use super::missing_body;
use crate::error::{Error, Result};
use crate::message::MessageExt;
use crate::pool::ConnectionPool;
use crate::record::{decode_pulled, Pulled};

/// Time a pull may take beyond its long-poll hold before the client gives up on it.
pub(crate) const PULL_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

/// How a pull ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullStatus {
    /// Messages are in [`PullResult::messages`].
    Found,
    /// Nothing at or after the offset (within the wait).
    NoNewMessage,
    /// Messages arrived, but none matched the tag expression in this pull's budget; pull
    /// again at once from `next_begin_offset`.
    NoMatchedMessage,
    /// The offset is outside `[min_offset, max_offset]`; resume from `next_begin_offset`.
    OffsetIllegal,
}

impl PullStatus {
    /// RocketMQ's name of the status.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PullStatus::Found => "FOUND",
            PullStatus::NoNewMessage => "NO_NEW_MSG",
            PullStatus::NoMatchedMessage => "NO_MATCHED_MSG",
            PullStatus::OffsetIllegal => "OFFSET_ILLEGAL",
        }
    }
}

/// The answer to a pull.
#[derive(Debug, Clone)]
#[must_use]
pub struct PullResult {
    pub status: PullStatus,
    /// Where to pull from next.
    pub next_begin_offset: i64,
    /// Smallest offset still stored in the queue.
    pub min_offset: i64,
    /// One past the largest visible offset.
    pub max_offset: i64,
    /// The messages found (after the exact tag match), in queue order.
    pub messages: Vec<MessageExt>,
    /// The broker id the answering broker suggests pulling this queue from next (0: the
    /// master; see the broker's `slave_read_enable`). The client follows it by itself.
    pub suggest_which_broker_id: i64,
}

/// What an answer not decoded yet will add to the cache (an upper bound).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pending {
    pub messages: usize,
    pub bytes: usize,
    /// The largest offset it may hold.
    pub last_offset: Option<i64>,
}

/// What a pull asks for.
#[derive(Debug, Clone)]
pub(crate) struct PullArgs<'a> {
    pub group: &'a str,
    pub topic: &'a str,
    pub broker_name: &'a str,
    pub queue_id: u32,
    pub offset: i64,
    pub max_messages: u32,
    /// Most record bytes (0: the broker's own limit).
    pub max_bytes: u32,
    pub tag_expression: &'a str,
    /// `TAG` or `SQL92`.
    pub expression_type: &'a str,
    pub suspend: Duration,
    /// The group's offset to commit with the pull, if any.
    pub commit_offset: Option<i64>,
}

/// A pull answer whose records are not decoded yet.
#[derive(Debug)]
pub(crate) struct UndecodedPull {
    address: String,
    /// What was pulled: the topic, the queue and the offset asked for, which every record of
    /// the answer must match.
    topic: String,
    queue_id: u32,
    offset: i64,
    pub status: PullStatus,
    pub next_begin_offset: i64,
    pub min_offset: i64,
    pub max_offset: i64,
    /// The stored records, concatenated (a slice of the answer's frame).
    records: Bytes,
    /// Which broker id to pull this queue from next (0: the master).
    pub suggest_which_broker_id: i64,
}

impl UndecodedPull {
    /// What decoding and caching this answer will add, for flow control: its records (found by
    /// their total sizes, without decoding), their bytes and the last offset it can hold.
    pub(crate) fn pending(&self) -> Pending {
        let mut messages = 0;
        let mut at = 0usize;
        while let Some(size) = self
            .records
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        {
            messages += 1;
            if size == 0 {
                break;
            }
            at += size;
        }
        Pending {
            messages,
            bytes: self.records.len(),
            last_offset: Some(self.next_begin_offset - 1),
        }
    }

    /// The records, concatenated, as they arrived (the decoded messages share this memory).
    pub(crate) fn records(&self) -> &Bytes {
        &self.records
    }

    /// Decodes and checks the records (`broker_name`: where they were pulled from).
    pub(crate) fn decode(self, broker_name: &str) -> Result<PullResult> {
        let messages = if self.records.is_empty() {
            Vec::new()
        } else {
            let pulled = Pulled {
                topic: &self.topic,
                queue_id: self.queue_id,
                from_offset: self.offset,
            };
            decode_pulled(&self.records, broker_name, pulled).map_err(|error| {
                Error::CorruptRecord {
                    address: self.address.clone(),
                    reason: error.to_string(),
                }
            })?
        };
        Ok(PullResult {
            status: self.status,
            next_begin_offset: self.next_begin_offset,
            min_offset: self.min_offset,
            max_offset: self.max_offset,
            messages,
            suggest_which_broker_id: self.suggest_which_broker_id,
        })
    }
}

impl ConnectionPool {
    /// Pulls from one queue, waiting up to `args.suspend` at the broker when nothing is there.
    pub(crate) async fn pull(&self, address: &str, args: &PullArgs<'_>) -> Result<PullResult> {
        self.pull_undecoded(address, args)
            .await?
            .decode(args.broker_name)
    }

    /// Like [`pull`](Self::pull), leaving the records undecoded: the answer's status and
    /// offsets are known at once (a push consumer sends its next pull from them and decodes
    /// this answer while that one travels).
    pub(crate) async fn pull_undecoded(
        &self,
        address: &str,
        args: &PullArgs<'_>,
    ) -> Result<UndecodedPull> {
        let timeout = args.suspend + PULL_TIMEOUT_MARGIN;
        let frame = self
            .request(address, "pull", timeout, |builder| {
                let group = builder.create_string(args.group);
                let topic = builder.create_string(args.topic);
                let expression = builder.create_string(args.tag_expression);
                let expression_type = builder.create_string(args.expression_type);
                let request = wire::PullRequest::create(
                    builder,
                    &wire::PullRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: args.queue_id as i32,
                        queue_offset: args.offset,
                        max_messages: args.max_messages,
                        max_bytes: args.max_bytes,
                        tag_expression: Some(expression),
                        suspend_timeout_ms: u32::try_from(args.suspend.as_millis())
                            .unwrap_or(u32::MAX),
                        commit_offset: args.commit_offset.unwrap_or(-1),
                        expression_type: Some(expression_type),
                    },
                );
                (wire::Body::PullRequest, request.as_union_value())
            })
            .await?;
        let header = frame.frame();
        let status = match header.status() {
            wire::Status::OK => PullStatus::Found,
            wire::Status::PULL_NOT_FOUND => PullStatus::NoNewMessage,
            wire::Status::PULL_RETRY_IMMEDIATELY => PullStatus::NoMatchedMessage,
            wire::Status::PULL_OFFSET_MOVED => PullStatus::OffsetIllegal,
            other => return Err(Error::from_status(address, other, header.message())),
        };
        let response = header
            .body_as_pull_response()
            .ok_or_else(|| missing_body(address, "PullResponse"))?;
        let records = match response.records().filter(|r| !r.is_empty()) {
            Some(records) if status == PullStatus::Found => frame
                .share(records.bytes())
                .unwrap_or_else(|| Bytes::copy_from_slice(records.bytes())),
            _ => Bytes::new(),
        };
        Ok(UndecodedPull {
            address: address.to_owned(),
            topic: args.topic.to_owned(),
            queue_id: args.queue_id,
            offset: args.offset,
            status,
            next_begin_offset: response.next_begin_offset(),
            min_offset: response.min_offset(),
            max_offset: response.max_offset(),
            records,
            suggest_which_broker_id: response.suggest_which_broker_id(),
        })
    }
}
