//! Fuzzes the SQL92 filter (`shardmq_filter`), which the broker compiles from any consumer's
//! subscription and evaluates against every stored message's properties at pull time.
//!
//! The input's first byte splits the rest into an expression and property text (`name=value`
//! lines). What must hold:
//! - compiling never panics, whatever the text;
//! - a refusal names a position within the text (at most one past its end);
//! - a compiled expression evaluates against any properties without panicking, and the
//!   properties it reads are listed sorted and without repeats.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardmq_filter::Expression;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let split = usize::from(split).min(rest.len());
    let (source, properties) = rest.split_at(split);
    let Ok(source) = std::str::from_utf8(source) else {
        return;
    };
    let properties = String::from_utf8_lossy(properties);
    match Expression::compile(source) {
        Err(error) => assert!(
            error.position <= source.chars().count() + 1,
            "{error} is past the end of {source:?}"
        ),
        Ok(expression) => {
            let pairs: Vec<(&str, &str)> = properties
                .lines()
                .filter_map(|line| line.split_once('='))
                .collect();
            let lookup = |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| *value)
            };
            let _ = expression.matches(lookup);
            assert!(expression
                .properties()
                .windows(2)
                .all(|pair| pair[0] < pair[1]));
        }
    }
});
