//! Fuzzes the CommitLog record decoder (`shardmq_codec`, the record codec the broker and the client share): what recovery, every
//! read and `verify` run on bytes from disk (docs/storage-format.md §4.8).
//!
//! What must hold for any bytes:
//! - `decode_entry`, `decode_message` and `parse_unchecked` never panic, and neither does any
//!   accessor of a view they return;
//! - an accepted message's fields lie inside its total size, the field lengths add up to it
//!   (invariant 1), its body matches the body CRC and the record matches its `__CRC32#`
//!   trailer (invariant 7), so no damaged record is ever accepted;
//! - a blank filler is accepted only with a size from 8 to the bytes available;
//! - a record whose structure parses, once given a well-formed `__CRC32#` trailer and correct
//!   CRCs (the fuzzer rarely guesses CRCs, so the target fixes them up), is accepted;
//! - what the broker accepts, the client's decoder accepts and reads the same way.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shardmq_codec::{
    decode_entry, decode_message, peek_total_size, record_crc, Entry, RecordView, BLANK_MIN_BYTES,
    CRC_PROPERTY_BYTES, CRC_TRAILER_BYTES, NAME_VALUE_SEPARATOR, PROPERTY_CRC32,
    PROPERTY_SEPARATOR,
};

fuzz_target!(|data: &[u8]| {
    let _ = peek_total_size(data);
    if let Ok(view) = RecordView::parse_unchecked(data) {
        read_every_field(&view);
        assert!(view.total_size() as usize <= data.len());
        if let Some(fixed) = with_correct_crcs(&view) {
            let accepted = decode_message(&fixed).unwrap_or_else(|error| {
                panic!("a well-formed record with correct CRCs is refused: {error}")
            });
            read_every_field(&accepted);
            check_accepted(&fixed, &accepted);
        }
    }
    match decode_entry(data) {
        Ok(Entry::Message(view)) => {
            read_every_field(&view);
            check_accepted(data, &view);
        }
        Ok(Entry::Blank(size)) => {
            assert!(size as usize >= BLANK_MIN_BYTES && size as usize <= data.len());
            assert!(
                decode_message(data).is_err(),
                "a blank filler decoded as a message"
            );
        }
        Err(_) => assert!(decode_message(data).is_err()),
    }
});

/// `view`'s bytes with a well-formed `__CRC32#` property last and both CRCs computed, or
/// `None` when its properties are too short to hold the CRC property.
fn with_correct_crcs(view: &RecordView<'_>) -> Option<Vec<u8>> {
    let mut record = view.bytes().to_vec();
    let total = record.len();
    let properties_len = view.properties_bytes().len();
    if properties_len < CRC_PROPERTY_BYTES {
        return None;
    }
    let trailer_at = total - CRC_PROPERTY_BYTES;
    record[trailer_at..trailer_at + PROPERTY_CRC32.len()]
        .copy_from_slice(PROPERTY_CRC32.as_bytes());
    record[trailer_at + PROPERTY_CRC32.len()] = NAME_VALUE_SEPARATOR;
    record[total - 1] = PROPERTY_SEPARATOR;
    if properties_len > CRC_PROPERTY_BYTES {
        record[trailer_at - 1] = PROPERTY_SEPARATOR;
    }
    record[8..12].copy_from_slice(&crc32fast::hash(view.body()).to_be_bytes());
    let crc = record_crc(&record);
    record[total - CRC_TRAILER_BYTES..total - 1].copy_from_slice(format!("{crc:010}").as_bytes());
    Some(record)
}

fn read_every_field(view: &RecordView<'_>) {
    let _ = (
        view.bytes(),
        view.total_size(),
        view.body_crc(),
        view.queue_id(),
        view.flag(),
        view.queue_offset(),
        view.physical_offset(),
        view.sys_flag(),
        view.born_timestamp_ms(),
        view.born_host(),
        view.store_timestamp_ms(),
        view.store_host(),
        view.reconsume_times(),
        view.prepared_transaction_offset(),
        view.body(),
        view.topic_bytes(),
        view.topic(),
        view.properties_bytes(),
        view.tags(),
        view.unique_key(),
    );
    for (key, value) in view.properties() {
        let _ = (key.len(), value.len());
    }
    for key in view.keys() {
        assert!(!key.is_empty() && !key.contains(' '));
    }
}

/// What an accepted message promises.
fn check_accepted(data: &[u8], view: &RecordView<'_>) {
    let total = view.total_size() as usize;
    assert_eq!(
        view.bytes(),
        &data[..total],
        "the view is not the record's bytes"
    );
    assert_eq!(
        view.body_crc(),
        crc32fast::hash(view.body()),
        "accepted a damaged body"
    );
    let digits = &view.bytes()[total - CRC_TRAILER_BYTES..total - 1];
    let stored: u32 = std::str::from_utf8(digits)
        .expect("accepted CRC digits are ASCII")
        .parse()
        .expect("accepted CRC digits are a number");
    assert_eq!(
        stored,
        record_crc(view.bytes()),
        "accepted a record whose whole-record CRC does not match"
    );
    assert_eq!(
        decode_message(data).map(|v| v.bytes()).ok(),
        Some(view.bytes())
    );

    // The client reads a record the broker accepts, with the same fields, unless the topic is
    // not UTF-8. (This target once found `decode_message` serving properties that were not
    // `name 0x01 value 0x02` pairs, which the client refused; the broker now refuses them too,
    // so the pair condition below always holds for an accepted record.)
    let is_text = std::str::from_utf8(view.topic_bytes()).is_ok()
        && std::str::from_utf8(view.properties_bytes()).is_ok_and(|text| {
            text.split('\u{2}')
                .filter(|pair| !pair.is_empty())
                .all(|pair| pair.contains('\u{1}'))
        });
    let decoded = shardmq_client::decode_records(&Bytes::copy_from_slice(view.bytes()), "fuzz");
    match decoded {
        Ok(messages) => {
            assert_eq!(messages.len(), 1);
            let message = &messages[0];
            assert_eq!(message.topic().as_bytes(), view.topic_bytes());
            assert_eq!(message.queue_id, view.queue_id());
            assert_eq!(message.queue_offset, view.queue_offset() as i64);
            assert_eq!(message.commit_log_offset, view.physical_offset() as i64);
            assert_eq!(message.flag, view.flag());
            // The client inflates a compressed body and clears bit 0x1 when that succeeds.
            assert_eq!(message.sys_flag & !1, view.sys_flag() & !1);
            assert_eq!(message.born_timestamp_ms, view.born_timestamp_ms());
            assert_eq!(message.store_timestamp_ms, view.store_timestamp_ms());
            assert_eq!(message.born_host, view.born_host());
            assert_eq!(message.store_host, view.store_host());
            assert_eq!(message.reconsume_times, view.reconsume_times());
            if message.sys_flag == view.sys_flag() {
                assert_eq!(&message.body[..], view.body());
            }
        }
        Err(error) => assert!(
            !is_text,
            "the broker accepts a record the client refuses: {error}"
        ),
    }
}
