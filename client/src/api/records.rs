//! Send requests of protocol 2: a batch the client encodes itself as a run of stored records
//! (`docs/storage-format.md` §4, format 3), sent as one `SendRecordsRequest` whose records
//! leave as the bytes they were encoded into, and its constant-size answer
//! (`docs/protocol.md`, "Send a run of records").
//!
//! Owns: encoding messages into a run ([`RecordRun::encode`]: one buffer per batch, nothing
//! allocated per message but a compressed body), the request (ONE_WAY too), and reading the
//! answer into where each record went ([`Stored`]). Never: choosing the queue, retrying or
//! deciding which request a batch needs (`producer/`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, Vector, WIPOffset};
use shardmq_codec::{
    RecordBuilder, RecordHeader, CRC_PROPERTY_BYTES, PROPERTY_KEYS, PROPERTY_TAGS,
    PROPERTY_UNIQUE_KEY, SYS_FLAG_COMPRESSED,
};
use shardmq_schema::{wire, VerifiedFrame};

use super::missing_body;
use super::send::{is_stored, Stored};
use crate::compression::compressed_body;
use crate::connection::{Body, Connection};
use crate::error::{Error, Result};
use crate::message::Message;

/// Bytes of a record besides its body, topic and properties, at most (both hosts IPv6).
const MAX_FIXED_RECORD_BYTES: usize = 115;

/// What a run's records say besides the messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunSettings {
    /// This client's address as the broker sees it (its local IPv4 address, the connection's
    /// port).
    pub born_host: SocketAddr,
    /// The broker's address; the broker writes its own over it, of the same family.
    pub store_host: SocketAddr,
    pub born_timestamp_ms: i64,
    /// Bodies longer than this are zlib-compressed (0: never).
    pub compress_over_bytes: usize,
    /// The broker's `max_message_bytes` (0: not stated).
    pub max_body_bytes: usize,
}

/// A batch encoded as a run of stored records, ready to be sent to any broker of the store
/// host's address family and to any queue: the queue id and store host are storage fields,
/// which the broker writes and which the producer's CRC leaves out (§4.5), so a retry sends
/// the same bytes.
#[derive(Debug)]
pub(crate) struct RecordRun {
    pub records: Bytes,
    /// Each record's length, in order: the answer's physical offsets follow from them.
    pub lengths: Vec<u32>,
    pub is_store_host_v6: bool,
}

/// An upper bound of `message`'s record size with an uncompressed body.
fn record_bytes_bound(message: &Message) -> usize {
    let keys: usize = message.keys().iter().map(|key| key.len() + 1).sum();
    let properties: usize = message
        .properties()
        .iter()
        .map(|(name, value)| name.len() + value.len() + 2)
        .sum();
    MAX_FIXED_RECORD_BYTES
        + message.body().len()
        + message.topic().len()
        + message
            .tags()
            .map_or(0, |tags| PROPERTY_TAGS.len() + tags.len() + 2)
        + PROPERTY_KEYS.len()
        + keys
        + 2
        + PROPERTY_UNIQUE_KEY.len()
        + message.unique_id().text_len()
        + 2
        + properties
        + CRC_PROPERTY_BYTES
}

impl RecordRun {
    /// Encodes `messages` (one topic, checked) into `buffer` (emptied first; its memory is
    /// reused), one record each: header and body, then `TAGS`, `KEYS` (keys joined by single
    /// spaces), `UNIQ_KEY` (written as text straight from its 16 bytes) and the user
    /// properties, then the CRC property and both CRCs (`RecordBuilder`).
    pub(crate) fn encode(
        mut buffer: BytesMut,
        messages: &[Message],
        settings: &RunSettings,
    ) -> Result<RecordRun> {
        buffer.clear();
        buffer.reserve(messages.iter().map(record_bytes_bound).sum());
        let mut lengths = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let length =
                encode_record(&mut buffer, message, settings).map_err(|error| match error {
                    Error::InvalidArgument(why) if messages.len() > 1 => {
                        Error::InvalidArgument(format!("message {index} of the batch: {why}"))
                    }
                    other => other,
                })?;
            lengths.push(length);
        }
        Ok(RecordRun {
            records: buffer.freeze(),
            lengths,
            is_store_host_v6: settings.store_host.is_ipv6(),
        })
    }

    /// How many records the run holds.
    pub(crate) fn count(&self) -> usize {
        self.lengths.len()
    }
}

/// Appends `message`'s record to `buffer`; returns its length.
fn encode_record(buffer: &mut BytesMut, message: &Message, settings: &RunSettings) -> Result<u32> {
    let compressed = (!message.is_body_compressed())
        .then(|| compressed_body(message.body(), settings.compress_over_bytes))
        .flatten();
    let (body, is_compressed): (&[u8], bool) = match &compressed {
        Some(smaller) => (smaller, true),
        None => (message.body(), message.is_body_compressed()),
    };
    if settings.max_body_bytes > 0 && body.len() > settings.max_body_bytes {
        return Err(Error::InvalidArgument(format!(
            "message body is {} bytes, over the broker's max_message_bytes ({})",
            body.len(),
            settings.max_body_bytes
        )));
    }
    let header = RecordHeader {
        topic: message.topic(),
        queue_id: 0,
        flag: message.flag(),
        body,
        sys_flag: if is_compressed {
            SYS_FLAG_COMPRESSED
        } else {
            0
        },
        born_timestamp_ms: settings.born_timestamp_ms,
        born_host: settings.born_host,
        store_host: settings.store_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    };
    let invalid = |error: shardmq_codec::RecordError| Error::InvalidArgument(error.to_string());
    let mut record = RecordBuilder::begin(buffer, &header).map_err(invalid)?;
    if let Some(tags) = message.tags() {
        record.property(PROPERTY_TAGS, tags).map_err(invalid)?;
    }
    let keys = message.keys();
    if !keys.is_empty() {
        let joined_len = keys.iter().map(String::len).sum::<usize>() + keys.len() - 1;
        record
            .property_with(PROPERTY_KEYS, joined_len, |out| join_keys(keys, out))
            .map_err(invalid)?;
    }
    let unique_id = message.unique_id();
    if !unique_id.is_empty() {
        record
            .property_with(PROPERTY_UNIQUE_KEY, unique_id.text_len(), |out| {
                unique_id.write_text(out);
            })
            .map_err(invalid)?;
    }
    for (name, value) in message.properties() {
        record.property(name, value).map_err(invalid)?;
    }
    record.finish().map_err(invalid)
}

/// Writes `keys` separated by single spaces into `out`, which is exactly that long.
fn join_keys(keys: &[String], out: &mut [u8]) {
    let mut at = 0;
    for (index, key) in keys.iter().enumerate() {
        if index > 0 {
            out[at] = b' ';
            at += 1;
        }
        out[at..at + key.len()].copy_from_slice(key.as_bytes());
        at += key.len();
    }
    debug_assert_eq!(at, out.len());
}

/// The request's body: everything but the records, which `records` (the frame's trailing
/// vector) holds.
fn records_request(
    builder: &mut FlatBufferBuilder<'static>,
    records: WIPOffset<Vector<'static, u8>>,
    topic: &str,
    queue_id: Option<u32>,
    producer_group: &str,
    count: usize,
) -> Body {
    let topic = builder.create_string(topic);
    let group = (!producer_group.is_empty()).then(|| builder.create_string(producer_group));
    let request = wire::SendRecordsRequest::create(
        builder,
        &wire::SendRecordsRequestArgs {
            topic: Some(topic),
            queue_id: queue_id.map_or(-1, |id| id as i32),
            producer_group: group,
            records: Some(records),
            count: count as u32,
        },
    );
    (wire::Body::SendRecordsRequest, request.as_union_value())
}

impl Connection {
    /// Sends `run` (records of `topic`) to one queue of this broker (`None`: the broker picks
    /// one) and waits for the answer.
    pub(crate) async fn send_records(
        &self,
        timeout: Duration,
        topic: &str,
        queue_id: Option<u32>,
        producer_group: &str,
        run: &RecordRun,
    ) -> Result<Stored> {
        let frame = self
            .request_with_trailing("send", timeout, run.records.clone(), |builder, records| {
                records_request(
                    builder,
                    records,
                    topic,
                    queue_id,
                    producer_group,
                    run.count(),
                )
            })
            .await?;
        records_answer(self.address(), &frame, &run.lengths)
    }

    /// Sends `run` as a ONE_WAY frame: no answer, so no result and no error from the broker.
    pub(crate) async fn send_records_one_way(
        &self,
        timeout: Duration,
        topic: &str,
        queue_id: Option<u32>,
        producer_group: &str,
        run: &RecordRun,
    ) -> Result<()> {
        self.one_way_with_trailing(timeout, run.records.clone(), |builder, records| {
            records_request(
                builder,
                records,
                topic,
                queue_id,
                producer_group,
                run.count(),
            )
        })
        .await
    }
}

/// Where the records of a run with `lengths` went, from the broker's answer: record `i` sits at
/// the first physical offset plus the lengths before it, except where the answer says a
/// record starts a new CommitLog segment (the sum restarts there).
pub(crate) fn records_answer(
    address: &str,
    frame: &VerifiedFrame,
    lengths: &[u32],
) -> Result<Stored> {
    let header = frame.frame();
    let status = header.status();
    if !is_stored(status) {
        return Err(Error::from_status(address, status, header.message()));
    }
    let unexpected = |detail: String| Error::UnexpectedResponse {
        address: address.to_owned(),
        detail,
    };
    let response = header
        .body_as_send_records_response()
        .ok_or_else(|| missing_body(address, "SendRecordsResponse"))?;
    if response.count() as usize != lengths.len() {
        return Err(unexpected(format!(
            "{} records stored of a run of {}",
            response.count(),
            lengths.len()
        )));
    }
    let store_host_text = response.store_host().unwrap_or_default();
    let store_host: SocketAddr = store_host_text
        .parse()
        .map_err(|_| unexpected(format!("store host `{store_host_text}` is not host:port")))?;
    let first = u64::try_from(response.first_physical_offset())
        .map_err(|_| unexpected("no first physical offset".to_owned()))?;
    let mut segment_starts = response
        .segment_starts()
        .unwrap_or_default()
        .iter()
        .peekable();
    let mut physical_offsets = Vec::with_capacity(lengths.len());
    let mut next = first;
    for (index, &length) in lengths.iter().enumerate() {
        if let Some(start) = segment_starts.next_if(|start| start.index() as usize == index) {
            next = start.physical_offset();
        }
        physical_offsets.push(next);
        next += u64::from(length);
    }
    if let Some(start) = segment_starts.next() {
        return Err(unexpected(format!(
            "segment start at record {}, out of order or beyond the run",
            start.index()
        )));
    }
    Ok(Stored {
        status,
        queue_id: u32::try_from(response.queue_id()).unwrap_or(0),
        first_queue_offset: response.first_queue_offset(),
        store_host,
        storage_shard: response.storage_shard(),
        physical_offsets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message_id::MessageId;

    fn settings() -> RunSettings {
        RunSettings {
            born_host: "10.0.0.7:40000".parse().unwrap(),
            store_host: "127.0.0.1:10911".parse().unwrap(),
            born_timestamp_ms: 1_700_000_000_123,
            compress_over_bytes: 4096,
            max_body_bytes: 0,
        }
    }

    #[test]
    fn a_run_holds_each_message_as_a_record_the_broker_accepts() {
        let id = MessageId::from_bytes([7; 16]);
        let messages = vec![
            Message::new("Orders", "first")
                .with_tags("created")
                .with_keys(["k1", "k2"])
                .with_property("region", "eu")
                .with_flag(-3)
                .with_unique_id(id.clone()),
            Message::new("Orders", "x".repeat(10_000)),
            Message::new("Orders", "no id").with_unique_id(""),
        ];
        let run = RecordRun::encode(BytesMut::new(), &messages, &settings()).unwrap();
        assert_eq!(run.count(), 3);
        assert_eq!(
            run.lengths.iter().map(|&l| l as usize).sum::<usize>(),
            run.records.len()
        );
        let rules = shardmq_codec::RunRules {
            topic: "Orders",
            max_body_bytes: 1 << 20,
            max_records: 16,
            store_host_is_v6: false,
            reserved_properties: &["DELAY", "REAL_TOPIC"],
        };
        let mut seen = Vec::new();
        let count = shardmq_codec::check_run(&run.records, &rules, |record| {
            seen.push((
                record.tags.map(str::to_owned),
                record.keys.map(str::to_owned),
                record.unique_key.map(str::to_owned),
            ));
        })
        .expect("the run passes the broker's check");
        assert_eq!(count, 3);
        assert_eq!(
            seen[0],
            (
                Some("created".to_owned()),
                Some("k1 k2".to_owned()),
                Some(id.to_string())
            )
        );
        assert_eq!(seen[2], (None, None, None), "an empty id is left out");
        // Parsed without the record CRC check: it holds once the broker has written its fields.
        let first =
            shardmq_codec::RecordView::parse_unchecked(&run.records[..run.lengths[0] as usize])
                .expect("a valid record");
        assert_eq!(first.body(), b"first");
        assert_eq!(first.flag(), -3);
        assert_eq!(first.born_timestamp_ms(), 1_700_000_000_123);
        assert_eq!(first.born_host(), settings().born_host);
        let properties: Vec<(&str, &str)> = first.properties().collect();
        let names: Vec<&str> = properties.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["TAGS", "KEYS", "UNIQ_KEY", "region", "__CRC32#"]);
        let second_bytes =
            &run.records[run.lengths[0] as usize..(run.lengths[0] + run.lengths[1]) as usize];
        let second =
            shardmq_codec::RecordView::parse_unchecked(second_bytes).expect("a valid record");
        assert_eq!(second.sys_flag() & SYS_FLAG_COMPRESSED, SYS_FLAG_COMPRESSED);
        assert!(second.body().len() < 10_000);
    }

    /// A `SendRecordsResponse` frame as the broker writes it.
    fn records_response(
        status: wire::Status,
        first_physical_offset: i64,
        segment_starts: &[(u32, u64)],
        count: u32,
    ) -> VerifiedFrame {
        let mut encoder = shardmq_schema::FrameEncoder::new();
        let bytes = encoder
            .encode(|b| {
                let starts: Vec<wire::SegmentStart> = segment_starts
                    .iter()
                    .map(|&(index, offset)| wire::SegmentStart::new(index, offset))
                    .collect();
                let starts = b.create_vector(&starts);
                let store_host = b.create_string("10.1.2.3:10911");
                let body = wire::SendRecordsResponse::create(
                    b,
                    &wire::SendRecordsResponseArgs {
                        queue_id: 5,
                        count,
                        first_queue_offset: 70,
                        first_physical_offset,
                        segment_starts: Some(starts),
                        store_host: Some(store_host),
                        storage_shard: 1,
                    },
                );
                shardmq_schema::build_frame(
                    b,
                    &shardmq_schema::FrameHeader::response(9, status),
                    wire::Body::SendRecordsResponse,
                    Some(body.as_union_value()),
                )
            })
            .unwrap();
        let mut buffer = BytesMut::from(&bytes[..]);
        shardmq_schema::FrameDecoder::new()
            .decode(&mut buffer)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn each_records_offset_follows_from_the_first_and_the_segment_starts() {
        let lengths = [100, 200, 300, 400, 500];
        // Records 2 and 4 start new segments (at 4096 and 8192); the sum restarts there.
        let frame = records_response(wire::Status::OK, 3_900, &[(2, 4_096), (4, 8_192)], 5);
        let stored = records_answer("b", &frame, &lengths).unwrap();
        assert_eq!(stored.physical_offsets, [3_900, 4_000, 4_096, 4_396, 8_192]);
        assert_eq!(stored.queue_id, 5);
        assert_eq!(stored.first_queue_offset, 70);
        assert_eq!(stored.storage_shard, 1);
        assert_eq!(stored.store_host, "10.1.2.3:10911".parse().unwrap());
        // Each offset id is the broker's: store host, shard 1 in the top byte, offset.
        let result = crate::api::BatchSendResult::new(
            stored,
            crate::route::MessageQueue::new("t", "b", 0),
            vec![MessageId::from_bytes([1; 16]); 5],
        );
        assert_eq!(result.queue.queue_id, 5);
        assert_eq!(result.queue_offset(4), 74);
        assert_eq!(
            result.offset_msg_id(2).unwrap(),
            "0A01020300002A9F0100000000001000"
        );
        assert_eq!(result.get(4).unwrap().commit_log_offset(), 8_192);
        assert_eq!(result.get(5), None);

        let flushed_late = records_response(wire::Status::FLUSH_DISK_TIMEOUT, 0, &[], 5);
        let stored = records_answer("b", &flushed_late, &lengths).unwrap();
        assert_eq!(stored.physical_offsets, [0, 100, 300, 600, 1_000]);
        assert_eq!(stored.status, wire::Status::FLUSH_DISK_TIMEOUT);
    }

    #[test]
    fn an_answer_that_does_not_fit_the_run_is_refused() {
        let lengths = [100, 200];
        let short = records_response(wire::Status::OK, 0, &[], 1);
        assert!(matches!(
            records_answer("b", &short, &lengths),
            Err(Error::UnexpectedResponse { .. })
        ));
        let beyond = records_response(wire::Status::OK, 0, &[(7, 4_096)], 2);
        assert!(matches!(
            records_answer("b", &beyond, &lengths),
            Err(Error::UnexpectedResponse { .. })
        ));
        let mut encoder = shardmq_schema::FrameEncoder::new();
        let refused = encoder
            .encode_error_response(9, wire::Status::MESSAGE_TOO_LARGE, "too large")
            .unwrap();
        let mut buffer = BytesMut::from(&refused[..]);
        let refused = shardmq_schema::FrameDecoder::new()
            .decode(&mut buffer)
            .unwrap()
            .unwrap();
        let error = records_answer("b", &refused, &lengths).unwrap_err();
        assert_eq!(error.status(), Some(wire::Status::MESSAGE_TOO_LARGE));
    }

    #[test]
    fn a_body_over_the_brokers_limit_is_refused_before_sending() {
        let limited = RunSettings {
            max_body_bytes: 4,
            ..settings()
        };
        let messages = [Message::new("T", "small"), Message::new("T", "12345")];
        let error = RecordRun::encode(BytesMut::new(), &messages, &limited).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("message 0 of the batch: message body is 5 bytes, over the broker's max_message_bytes (4)"),
            "{error}"
        );
    }
}
