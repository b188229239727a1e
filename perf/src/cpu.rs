//! CPU time, read from the kernel: the whole process's (user and system, every thread, with
//! `getrusage(RUSAGE_SELF)`: microsecond resolution, unlike `/proc/self/stat`'s clock ticks)
//! and the calling thread's (`CLOCK_THREAD_CPUTIME_ID`).
//!
//! Owns nothing else. The `produce` scenario reads the process's before and after its timed
//! part and reports the difference per message (`client_cpu_us_per_msg`): what the client
//! crate (and the harness building its messages) costs per message sent. The harness's own
//! share, building the messages, is measured on the producer threads around each build.

use std::time::Duration;

/// CPU time a process or thread has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub user: Duration,
    pub system: Duration,
}

impl CpuTime {
    #[must_use]
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// What was used between `earlier` and `self`.
    #[must_use]
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

/// User and system CPU time of the whole process so far.
#[must_use]
pub fn process_cpu_time() -> CpuTime {
    // SAFETY: `getrusage` writes a `rusage` into the zeroed struct we pass it and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return CpuTime::default();
        }
        usage
    };
    let time = |value: libc::timeval| {
        Duration::from_secs(value.tv_sec.max(0) as u64)
            + Duration::from_micros(value.tv_usec.max(0) as u64)
    };
    CpuTime {
        user: time(usage.ru_utime),
        system: time(usage.ru_stime),
    }
}

/// CPU time (user and system together) the calling thread has used so far.
#[must_use]
pub fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through the valid pointer it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(now.tv_sec.max(0) as u64) + Duration::from_nanos(now.tv_nsec.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(duration: Duration) {
        let mut state = 1u64;
        let started = std::time::Instant::now();
        while started.elapsed() < duration {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
        }
        std::hint::black_box(state);
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let process_before = process_cpu_time();
        let thread_before = thread_cpu_time();
        spin(Duration::from_millis(30));
        assert!(process_cpu_time().total() > process_before.total());
        assert!(thread_cpu_time() > thread_before);
        let used = process_cpu_time().since(&process_before);
        assert_eq!(used.total(), used.user + used.system);
    }
}
