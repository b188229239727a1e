//! Fuzzes the client's decoding of pulled records (`shardmq_client::decode_records`): the
//! bytes of `PullResponse.records` and query responses, as a broker (or anything posing as
//! one) sends them (docs/storage-format.md §4.2–4.5).
//!
//! What must hold for any bytes: no panic; every message returned has a body that matches its
//! record's body CRC and lies inside the input; the records returned tile the input from its
//! start (their total sizes add up to the input's length).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

/// Bytes before the body length field with IPv4 hosts; 24 more with IPv6 ones.
const BODY_LENGTH_AT_IPV4: usize = 84;

fuzz_target!(|data: &[u8]| {
    let records = Bytes::copy_from_slice(data);
    let Ok(messages) = shardmq_client::decode_records(&records, "fuzz") else {
        return;
    };
    let mut at = 0usize;
    for message in &messages {
        let total_size = u32::from_be_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        assert!(total_size >= BODY_LENGTH_AT_IPV4 && at + total_size <= data.len());
        let record = &data[at..at + total_size];
        let body_crc = u32::from_be_bytes(record[8..12].try_into().expect("4 bytes"));
        assert_eq!(
            crc32fast::hash(&message.body),
            body_crc,
            "a damaged body was accepted"
        );
        // A body shares the response's memory and lies inside its record (an empty one may
        // be a static empty `Bytes`).
        if !message.body.is_empty() {
            let body_start = (message.body.as_ptr() as usize)
                .checked_sub(records.as_ptr() as usize)
                .expect("the body lies in the response");
            assert!(body_start >= at && body_start + message.body.len() <= at + total_size);
        }
        let _ = (
            message.msg_id(),
            message.tags(),
            message.keys(),
            message.user_properties().count(),
            message.is_compressed(),
            format!("{message:?}"),
        );
        at += total_size;
    }
    assert_eq!(at, data.len(), "decoded records do not cover the input");
});
