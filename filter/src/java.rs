//! The Java library behaviour RocketMQ's filter leans on, reproduced so the same message
//! matches the same expression here and there: `Integer.parseInt`, `Long.parseLong`,
//! `Double.valueOf`, `Boolean.valueOf` on property strings, and `Double.compare`.
//!
//! Pure functions on `&str` and numbers; nothing here allocates. Known gaps, all of which make a
//! string Java would read unreadable here (so the comparison is abandoned as RocketMQ abandons a
//! failed conversion): non-ASCII decimal digits (`Character.digit` accepts them) and hexadecimal
//! floating-point strings (`0x1p3`).

use std::cmp::Ordering;

/// `Integer.parseInt` / `Long.parseLong` (radix 10), range-checked against `[min, max]`: an
/// optional `+` or `-`, then one or more ASCII digits, nothing else (no spaces).
pub(crate) fn parse_integer(text: &str, min: i64, max: i64) -> Option<i64> {
    let (is_negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulate negatively, as Java does, so that `min` itself (e.g. Long.MIN_VALUE) parses.
    let mut value: i64 = 0;
    for byte in digits.bytes() {
        if !byte.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_sub(i64::from(byte - b'0'))?;
    }
    let value = if is_negative {
        value
    } else {
        value.checked_neg()?
    };
    (min..=max).contains(&value).then_some(value)
}

pub(crate) fn parse_int(text: &str) -> Option<i32> {
    parse_integer(text, i64::from(i32::MIN), i64::from(i32::MAX)).map(|value| value as i32)
}

pub(crate) fn parse_long(text: &str) -> Option<i64> {
    parse_integer(text, i64::MIN, i64::MAX)
}

/// `Double.valueOf(String)`: surrounding characters at or below U+0020 are trimmed (Java's
/// `String.trim`), then an optional sign and `NaN`, `Infinity`, or decimal digits with an
/// optional `.` and exponent, and an optional `f`/`F`/`d`/`D` suffix.
pub(crate) fn parse_double(text: &str) -> Option<f64> {
    let text = text.trim_matches(|c: char| c <= ' ');
    let (sign, body) = match text.as_bytes().first()? {
        b'-' => (-1.0, &text[1..]),
        b'+' => (1.0, &text[1..]),
        _ => (1.0, text),
    };
    match body {
        "NaN" => return Some(f64::NAN),
        "Infinity" => return Some(sign * f64::INFINITY),
        _ => {}
    }
    let body = body.strip_suffix(['f', 'F', 'd', 'D']).unwrap_or(body);
    if !is_decimal_float(body) {
        return None;
    }
    // The shape is checked above, so Rust's parser reads exactly what Java's would.
    body.parse::<f64>().ok().map(|value| sign * value)
}

/// `digits [. digits] [e|E [+|-] digits]` with at least one digit before the exponent.
fn is_decimal_float(body: &str) -> bool {
    let bytes = body.as_bytes();
    let mut index = 0;
    let mut mantissa_digits = 0;
    while index < bytes.len() && bytes[index].is_ascii_digit() {
        index += 1;
        mantissa_digits += 1;
    }
    if index < bytes.len() && bytes[index] == b'.' {
        index += 1;
        while index < bytes.len() && bytes[index].is_ascii_digit() {
            index += 1;
            mantissa_digits += 1;
        }
    }
    if mantissa_digits == 0 {
        return false;
    }
    if index < bytes.len() && (bytes[index] == b'e' || bytes[index] == b'E') {
        index += 1;
        if index < bytes.len() && (bytes[index] == b'+' || bytes[index] == b'-') {
            index += 1;
        }
        let exponent_start = index;
        while index < bytes.len() && bytes[index].is_ascii_digit() {
            index += 1;
        }
        if index == exponent_start {
            return false;
        }
    }
    index == bytes.len()
}

/// `Boolean.valueOf(String)`: true exactly when the text is "true" in any case.
pub(crate) fn parse_boolean(text: &str) -> bool {
    text.eq_ignore_ascii_case("true")
}

/// `Double.compare`: numeric order, except that -0.0 sorts below 0.0 and NaN (every NaN) is
/// equal to itself and above everything else.
pub(crate) fn compare_doubles(left: f64, right: f64) -> Ordering {
    if left < right {
        return Ordering::Less;
    }
    if left > right {
        return Ordering::Greater;
    }
    java_bits(left).cmp(&java_bits(right))
}

/// `Double.doubleToLongBits`: the bits as a signed long, every NaN folded into one.
fn java_bits(value: f64) -> i64 {
    if value.is_nan() {
        0x7ff8_0000_0000_0000
    } else {
        value.to_bits() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_as_java_does() {
        assert_eq!(parse_int("42"), Some(42));
        assert_eq!(parse_int("+42"), Some(42));
        assert_eq!(parse_int("-2147483648"), Some(i32::MIN));
        assert_eq!(parse_int("2147483648"), None);
        assert_eq!(parse_long("2147483648"), Some(2_147_483_648));
        assert_eq!(parse_long("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_long("9223372036854775808"), None);
        for text in [
            "", "-", "+", " 1", "1 ", "1.0", "1e3", "0x10", "abc", "1_000",
        ] {
            assert_eq!(parse_int(text), None, "{text:?}");
        }
    }

    #[test]
    fn doubles_parse_as_java_does() {
        assert_eq!(parse_double("2.25"), Some(2.25));
        assert_eq!(parse_double(" 2.25\t"), Some(2.25));
        assert_eq!(parse_double("1."), Some(1.0));
        assert_eq!(parse_double(".5"), Some(0.5));
        assert_eq!(parse_double("-1e3"), Some(-1000.0));
        assert_eq!(parse_double("2.5f"), Some(2.5));
        assert_eq!(parse_double("7D"), Some(7.0));
        assert_eq!(parse_double("-Infinity"), Some(f64::NEG_INFINITY));
        assert!(parse_double("NaN").is_some_and(f64::is_nan));
        for text in [
            "", ".", "e5", "1e", "1e+", "inf", "infinity", "nan", "1.2.3", "abc", "1ff",
        ] {
            assert_eq!(parse_double(text), None, "{text:?}");
        }
    }

    #[test]
    fn booleans_parse_as_java_does() {
        assert!(parse_boolean("true"));
        assert!(parse_boolean("TrUe"));
        assert!(!parse_boolean("yes"));
        assert!(!parse_boolean(" true"));
    }

    #[test]
    fn doubles_compare_as_java_does() {
        assert_eq!(compare_doubles(1.0, 2.0), Ordering::Less);
        assert_eq!(compare_doubles(-0.0, 0.0), Ordering::Less);
        assert_eq!(compare_doubles(f64::NAN, f64::NAN), Ordering::Equal);
        assert_eq!(compare_doubles(f64::NAN, f64::INFINITY), Ordering::Greater);
        assert_eq!(compare_doubles(-1.0, f64::NAN), Ordering::Less);
    }
}
