//! The floor of the broker's per-byte work on this machine: what one core spends per 1 KiB
//! message on the work that issue 22's design requires once per byte, with nothing else around
//! it (no event loop, no parsing, no ConsumeQueue, no disk).
//!
//! A sender thread pinned to one core writes 1,000-record frames over loopback TCP; a receiver
//! thread pinned to another reads each frame whole into a reused buffer and then, by stage:
//! - `recv`: nothing more (the socket's receive copy);
//! - `crc`: also a CRC32 of each record's 1 KiB body (the run check's one pass);
//! - `copy`: also copies each record into a 64 MiB ring (the storage shard's one copy).
//!
//! It prints the receiver thread's CPU time per message for each stage (`CLOCK_THREAD_CPUTIME_ID`),
//! the median of five runs, and how often the receiver slept waiting for the sender. While the
//! receiver outruns the sender (the `recv` stage sleeps most), its time includes going to sleep
//! and waking up, so the differences between the stages are not each stage's exact cost; the
//! last line, where the receiver is the slower side, is the floor of the three together.
//!
//! ```text
//! cargo run --release -p shardmq-perf --example per_byte_floor -- [frames] [receiver core] [sender core]
//! ```
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;

/// A stored record of a 1 KiB body (the body plus about 128 bytes of head, topic and properties).
const RECORD: usize = 1152;
const BODY: usize = 1024;
const RECORDS_PER_FRAME: usize = 1000;
const FRAME: usize = RECORD * RECORDS_PER_FRAME;
const RING: usize = 64 << 20;
/// Runs of each stage; the median is shown.
const RUNS: usize = 5;

fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "cannot pin to core {core}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

fn thread_cpu_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Stage {
    Recv,
    Crc,
    Copy,
}

fn run(stage: Stage, frames: usize, receiver_core: usize, sender_core: usize) -> (f64, i64) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let sender = thread::spawn(move || {
        pin(sender_core);
        let frame: Vec<u8> = (0..FRAME).map(|i| (i * 31 % 251) as u8).collect();
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).ok();
        for _ in 0..frames {
            stream.write_all(&frame).expect("send frame");
        }
    });
    let (mut stream, _) = listener.accept().expect("accept");
    pin(receiver_core);
    let mut frame = vec![0u8; FRAME];
    // Written once before the clock starts, so that its page faults are not timed.
    let mut ring = vec![1u8; RING];
    let mut at = 0usize;
    let mut crcs = 0u32;
    let switches_before = voluntary_switches();
    let start = thread_cpu_ns();
    for _ in 0..frames {
        stream.read_exact(&mut frame).expect("receive frame");
        if stage >= Stage::Crc {
            for record in frame.chunks_exact(RECORD) {
                crcs ^= crc32fast::hash(&record[RECORD - BODY..]);
            }
        }
        if stage >= Stage::Copy {
            for record in frame.chunks_exact(RECORD) {
                if at + RECORD > RING {
                    at = 0;
                }
                ring[at..at + RECORD].copy_from_slice(record);
                at += RECORD;
            }
        }
    }
    let spent = thread_cpu_ns() - start;
    let slept = voluntary_switches() - switches_before;
    sender.join().expect("sender");
    std::hint::black_box((crcs, &ring));
    (
        spent as f64 / 1e3 / (frames * RECORDS_PER_FRAME) as f64,
        slept,
    )
}

/// This thread's voluntary context switches (each a sleep: the receiver waited for the sender).
fn voluntary_switches() -> i64 {
    // SAFETY: a zeroed rusage is a valid value for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid rusage for getrusage to fill.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_nvcsw
}

fn main() {
    let mut args = std::env::args().skip(1);
    let frames: usize = args.next().map_or(4000, |a| a.parse().expect("frames"));
    let receiver_core: usize = args.next().map_or(0, |a| a.parse().expect("receiver core"));
    let sender_core: usize = args.next().map_or(1, |a| a.parse().expect("sender core"));
    for (name, stage) in [
        ("recv", Stage::Recv),
        ("recv + crc", Stage::Crc),
        ("recv + crc + ring copy", Stage::Copy),
    ] {
        let mut runs: Vec<(f64, i64)> = (0..RUNS)
            .map(|_| run(stage, frames, receiver_core, sender_core))
            .collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (median, slept) = runs[RUNS / 2];
        let all: Vec<String> = runs.iter().map(|(us, _)| format!("{us:.3}")).collect();
        println!(
            "{name:<24} {median:.3} µs of the receiver's CPU a message (median of {RUNS}: {}; \
             the median run slept {slept} times waiting for the sender)",
            all.join(" ")
        );
    }
}
