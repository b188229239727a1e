//! Fuzzes the CommitLog record encoder against its decoders: whatever a producer sends and the
//! storage shard patches in, `encode_record` + `patch_record` must give bytes that
//! `decode_message` (the broker's reads, recovery and `verify`) and the client's
//! `decode_records` read back field for field (docs/storage-format.md §4.2–4.6).
//!
//! What must hold: the encoder refuses exactly the inputs the format cannot hold (empty or
//! over-long topic, properties over 65,535 bytes, a separator byte in a property); what it
//! accepts is `encoded_len` bytes long, decodes with both CRCs matching, and every field reads
//! back as given (the sys flag with the host bits set from the addresses).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use shardmq_codec::{
    decode_message, encode_record, encoded_len, patch_record, RecordError, RecordInput, StorePatch,
    MAX_PROPERTIES_BYTES, MAX_TOPIC_BYTES, PROPERTY_CRC32, SYS_FLAG_BORN_HOST_V6,
    SYS_FLAG_STORE_HOST_V6,
};

#[derive(Debug, Arbitrary)]
struct Host {
    is_v6: bool,
    octets: [u8; 16],
    port: u16,
}

impl Host {
    fn address(&self) -> SocketAddr {
        let ip = if self.is_v6 {
            IpAddr::V6(Ipv6Addr::from(self.octets))
        } else {
            IpAddr::V4(Ipv4Addr::new(
                self.octets[0],
                self.octets[1],
                self.octets[2],
                self.octets[3],
            ))
        };
        SocketAddr::new(ip, self.port)
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    topic: String,
    queue_id: u32,
    flag: i32,
    body: Vec<u8>,
    properties: Vec<(String, String)>,
    sys_flag: u32,
    born_timestamp_ms: i64,
    born_host: Host,
    store_host: Host,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    queue_offset: u64,
    physical_offset: u64,
    store_timestamp_ms: i64,
}

fuzz_target!(|input: Input| {
    let properties: Vec<(&str, &str)> = input
        .properties
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    let record_input = RecordInput {
        topic: &input.topic,
        queue_id: input.queue_id,
        flag: input.flag,
        body: &input.body,
        properties: &properties,
        sys_flag: input.sys_flag,
        born_timestamp_ms: input.born_timestamp_ms,
        born_host: input.born_host.address(),
        store_host: input.store_host.address(),
        reconsume_times: input.reconsume_times,
        prepared_transaction_offset: input.prepared_transaction_offset,
    };
    let properties_bytes: usize = properties
        .iter()
        .map(|(key, value)| key.len() + value.len() + 2)
        .sum::<usize>()
        + PROPERTY_CRC32.len()
        + 12;
    let has_separator = properties
        .iter()
        .any(|(key, value)| key.contains(['\u{1}', '\u{2}']) || value.contains(['\u{1}', '\u{2}']));

    // Something before the record, as in a batch.
    let mut buffer = BytesMut::from(&b"earlier records"[..]);
    let start = buffer.len();
    let record_len = match encode_record(&mut buffer, &record_input) {
        Ok(len) => len,
        Err(error) => {
            let is_expected = match error {
                RecordError::EmptyTopic => input.topic.is_empty(),
                RecordError::TopicTooLong(_) => input.topic.len() > MAX_TOPIC_BYTES,
                RecordError::PropertiesTooLong(_) => properties_bytes > MAX_PROPERTIES_BYTES,
                RecordError::SeparatorInProperty => has_separator,
                _ => false,
            };
            assert!(is_expected, "encode_record refused {input:?}: {error}");
            assert_eq!(buffer.len(), start, "a refused record left bytes behind");
            return;
        }
    };
    assert!(
        !input.topic.is_empty()
            && input.topic.len() <= MAX_TOPIC_BYTES
            && properties_bytes <= MAX_PROPERTIES_BYTES
            && !has_separator,
        "encode_record accepted what the format cannot hold"
    );
    let record = &mut buffer[start..];
    assert_eq!(record.len(), encoded_len(&record_input));
    assert_eq!(record.len(), record_len as usize);
    patch_record(
        record,
        StorePatch {
            queue_id: input.queue_id,
            queue_offset: input.queue_offset,
            physical_offset: input.physical_offset,
            store_timestamp_ms: input.store_timestamp_ms,
            store_host: None,
        },
    );

    let view = decode_message(record)
        .unwrap_or_else(|error| panic!("an encoded and patched record does not decode: {error}"));
    let born_host = record_input.born_host;
    let store_host = record_input.store_host;
    let mut sys_flag = input.sys_flag & !(SYS_FLAG_BORN_HOST_V6 | SYS_FLAG_STORE_HOST_V6);
    if born_host.is_ipv6() {
        sys_flag |= SYS_FLAG_BORN_HOST_V6;
    }
    if store_host.is_ipv6() {
        sys_flag |= SYS_FLAG_STORE_HOST_V6;
    }
    assert_eq!(view.total_size() as usize, record.len());
    assert_eq!(view.topic(), input.topic);
    assert_eq!(view.queue_id(), input.queue_id);
    assert_eq!(view.flag(), input.flag);
    assert_eq!(view.body(), &input.body[..]);
    assert_eq!(view.sys_flag(), sys_flag);
    assert_eq!(view.born_timestamp_ms(), input.born_timestamp_ms);
    assert_eq!(view.born_host(), born_host);
    assert_eq!(view.store_host(), store_host);
    assert_eq!(view.reconsume_times(), input.reconsume_times);
    assert_eq!(
        view.prepared_transaction_offset(),
        input.prepared_transaction_offset
    );
    assert_eq!(view.queue_offset(), input.queue_offset);
    assert_eq!(view.physical_offset(), input.physical_offset);
    assert_eq!(view.store_timestamp_ms(), input.store_timestamp_ms);
    let stored: Vec<(&str, &str)> = view.properties().collect();
    assert_eq!(stored.len(), properties.len() + 1, "properties: {stored:?}");
    assert_eq!(&stored[..properties.len()], &properties[..]);
    assert_eq!(stored[properties.len()].0, PROPERTY_CRC32);

    let messages = shardmq_client::decode_records(&Bytes::copy_from_slice(record), "fuzz")
        .unwrap_or_else(|error| panic!("the client refuses a record the broker wrote: {error}"));
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.topic(), input.topic);
    assert_eq!(message.queue_id, input.queue_id);
    assert_eq!(message.queue_offset, input.queue_offset as i64);
    assert_eq!(message.commit_log_offset, input.physical_offset as i64);
    assert_eq!(message.flag, input.flag);
    assert_eq!(message.sys_flag, sys_flag);
    assert_eq!(message.born_host, born_host);
    assert_eq!(message.store_host, store_host);
    assert_eq!(message.store_timestamp_ms, input.store_timestamp_ms);
    assert_eq!(&message.body[..], &input.body[..]);
    let client_properties: Vec<(&str, &str)> = message.properties().collect();
    assert_eq!(&client_properties[..properties.len()], &properties[..]);
});
