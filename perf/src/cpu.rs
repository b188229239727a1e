//! The CPU time this process has used (user + system, every thread), read with
//! `getrusage(RUSAGE_SELF)`: microsecond resolution, unlike `/proc/self/stat`'s clock ticks.
//!
//! Owns nothing else. The `produce` scenario reads it before and after its timed part and reports
//! the difference per message (`client_cpu_us_per_msg`): what the client crate (and the harness
//! building its messages) costs per message sent.

use std::time::Duration;

/// User plus system CPU time of the whole process so far.
#[must_use]
pub fn process_cpu_time() -> Duration {
    // SAFETY: `getrusage` writes a `rusage` into the zeroed struct we pass it and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let time = |value: libc::timeval| {
        Duration::from_secs(value.tv_sec.max(0) as u64)
            + Duration::from_micros(value.tv_usec.max(0) as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu_time();
        let mut state = 1u64;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(30) {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
        }
        std::hint::black_box(state);
        assert!(process_cpu_time() > before);
    }
}
