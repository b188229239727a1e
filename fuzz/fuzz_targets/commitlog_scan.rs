//! Fuzzes the CommitLog scanner (`shardmq_store::scan::scan_window`), which recovery
//! and `verify` run over every segment to find where the valid data ends
//! (docs/storage-format.md §4.10).
//!
//! The input's first bytes choose the window's place in a segment and whether the window
//! reaches the file's end; the rest is the window. What must hold:
//! - the scan never panics;
//! - the records it reports are valid, contiguous from the window's start, each at its own
//!   physical offset, and lie inside the window and the segment;
//! - it stops where the reported records end, at a position inside the segment (or at its
//!   end), and asks for more bytes only when the window does not reach the file's end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardmq_codec::decode_message;
use shardmq_store::scan::{scan_window, ScanStop};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (control, window) = data.split_at(4);
    // Segments of 64 KiB .. 16 MiB (multiples of 4 KiB), windows anywhere in the first
    // segment or the second.
    let segment_bytes = 4096 * (16 + u64::from(control[0]) * 16);
    let segment_base = if control[1] & 1 == 0 {
        0
    } else {
        segment_bytes
    };
    let window_position =
        (u64::from(u16::from_be_bytes([control[2], control[3] & 0x7F])) * 8).min(segment_bytes);
    let is_file_end = control[3] & 0x80 != 0;

    let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
    let stop = scan_window(
        window,
        segment_base,
        window_position,
        segment_bytes,
        is_file_end,
        &mut |position, view| records.push((position, view.bytes().to_vec())),
    );

    let mut expected_position = window_position;
    for (position, bytes) in &records {
        assert_eq!(*position, expected_position, "records are not contiguous");
        let at = usize::try_from(position - window_position).unwrap();
        assert_eq!(&window[at..at + bytes.len()], &bytes[..]);
        let view = decode_message(bytes).expect("a reported record decodes");
        assert_eq!(view.physical_offset(), segment_base + position);
        assert!(
            position + bytes.len() as u64 <= segment_bytes,
            "accepted a record at {position} of {} bytes that runs past the segment's end ({segment_bytes})",
            bytes.len()
        );
        expected_position += bytes.len() as u64;
    }
    assert!(expected_position <= window_position + window.len() as u64);
    let stop_position = match &stop {
        ScanStop::NeedMore { position } => {
            assert!(!is_file_end, "asked for more bytes at the file's end");
            *position
        }
        ScanStop::SegmentEnd { position }
        | ScanStop::DataEnd { position }
        | ScanStop::Invalid { position, .. } => *position,
    };
    assert_eq!(
        stop_position, expected_position,
        "the scan stopped elsewhere than after its last record"
    );
    assert!(
        stop_position <= segment_bytes,
        "the scan stopped past the segment's end"
    );
});
