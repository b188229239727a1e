//! Evaluation allocates nothing: the broker runs `matches` on every message it serves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use shardmq_filter::Expression;

struct CountingAllocator;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn matches_does_not_allocate() {
    let expression = Expression::compile(
        "(a BETWEEN 1 AND 10 OR b > 2.5) AND c IN ('x', 'y', 'z') AND d IS NOT NULL \
         AND TAGS NOT CONTAINS 'test' AND NOT (c = 'no') AND e IS NULL AND f = TRUE AND a > -1",
    )
    .unwrap();
    let message = [
        ("a", "5"),
        ("b", "1.5"),
        ("c", "y"),
        ("d", ""),
        ("TAGS", "TagA"),
        ("f", "true"),
    ];
    let lookup = |name: &str| {
        message
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
    };
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut matched = 0;
    for _ in 0..1000 {
        matched += usize::from(expression.matches(lookup));
    }
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(matched, 1000);
    assert_eq!(after - before, 0, "matches allocated");
}
