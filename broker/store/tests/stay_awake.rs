//! The vendored glommio's `StayAwake` guard (vendor/glommio/PATCHES.md, the second patch),
//! which the store holds while a durable write is in flight under sync flush: an idle executor
//! with no polling before parking sleeps through a timer wait, but polls through it while a
//! guard lives, as long as its CPU has nothing else to run.
//!
//! Told apart by the thread's context switches (`getrusage(RUSAGE_THREAD)`): sleeping is a
//! voluntary switch; a `sched_yield` that lets another thread run is an involuntary one. A
//! wait with a guard and another thread on the CPU may park (the patch backs off), so such an
//! attempt is retried; a wait with a guard, no other thread and a sleep fails the test.
//! Alone in its test binary, so that no test threads of its own share the cores.

use std::sync::mpsc;
use std::time::Duration;

/// This thread's (voluntary, involuntary) context switches so far.
fn switches() -> (i64, i64) {
    // SAFETY: a zeroed rusage is a valid value for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid rusage for getrusage to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    (usage.ru_nvcsw, usage.ru_nivcsw)
}

/// The (voluntary, involuntary) switches of one 1 ms timer wait, with a guard or without (the
/// patch polls for at most 2 ms of an idle period).
async fn one_wait(held: bool) -> (i64, i64) {
    let guard = held.then(|| glommio::executor().stay_awake());
    let before = switches();
    glommio::timer::sleep(Duration::from_millis(1)).await;
    let after = switches();
    drop(guard);
    (after.0 - before.0, after.1 - before.1)
}

#[test]
fn a_stay_awake_guard_keeps_an_idle_executor_polling() {
    let (done, outcome) = mpsc::channel();
    let executor = glommio::LocalExecutorBuilder::default()
        .spin_before_park(Duration::ZERO)
        .spawn(move || async move {
            let mut contended = Vec::new();
            for _ in 0..10 {
                let (parked, _) = one_wait(false).await;
                assert!(parked > 0, "an idle executor with no guard sleeps");
                let (slept, yielded_to_others) = one_wait(true).await;
                if slept == 0 {
                    done.send(Ok(()))
                        .expect("the test's thread waits for the outcome");
                    return;
                }
                assert!(
                    yielded_to_others > 0,
                    "with a guard and nothing else on its CPU the executor slept {slept} times"
                );
                contended.push((slept, yielded_to_others));
                // The patch ignores guards for 100 ms after a contended yield.
                glommio::timer::sleep(Duration::from_millis(150)).await;
            }
            done.send(Err(format!(
                "another thread wanted the CPU in every attempt (sleeps, involuntary switches): \
                 {contended:?}"
            )))
            .expect("the test's thread waits for the outcome");
        })
        .expect("executor");
    // A spin loop that stopped seeing timers would hang here: fail instead.
    match outcome.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => {}
        Ok(Err(message)) => panic!("{message}"),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("the executor did not finish its timer waits within 60 s")
        }
        // An assertion failed on the executor's thread: its panic comes out of the join.
        Err(mpsc::RecvTimeoutError::Disconnected) => {}
    }
    executor.join().expect("executor ran");
}
