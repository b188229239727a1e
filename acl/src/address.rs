//! Address patterns: RocketMQ's `whiteRemoteAddress` language, for IPv4 and IPv6.
//!
//! Owns the parsing of one pattern and the match of one remote address against it; knows
//! nothing of accounts or files. Text enters through [`AddressPattern::parse`], which refuses
//! anything RocketMQ's `RemoteAddressStrategyFactory` refuses and a few things it accepts but
//! matches in surprising ways (see `docs/acl.md`); addresses are matched by
//! [`AddressPattern::matches`], which allocates nothing.
//!
//! The forms, in the order RocketMQ tries them:
//! - blank: matches nothing (RocketMQ's `BlankRemoteAddressStrategy`);
//! - `*`, `*.*.*.*`, `*:*:*:*:*:*:*:*`: matches everything;
//! - a list in braces in the last group: `192.168.1.{1,2,3}`, `2001:db8::{1,a}`;
//! - a comma list of whole addresses: `192.168.1.1,192.168.1.2`;
//! - a range: exact groups, then one `*` or `a-b` group, then only `*` groups; IPv4 groups
//!   left off at the end count as `*` (`192.168.*` is `192.168.*.*`); IPv6 ranges are
//!   hexadecimal and `::` stands for zero groups (`2::ac5:78:1-200:*`);
//! - one address.

use std::fmt;
use std::net::IpAddr;

/// The longest pattern accepted, in bytes.
pub const MAX_PATTERN_BYTES: usize = 16 * 1024;
/// The most addresses one list pattern (comma or braces) may name.
pub const MAX_ADDRESSES_PER_PATTERN: usize = 256;

/// One parsed pattern; [`fmt::Display`] gives back the text it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPattern {
    text: String,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Nothing,
    Everything,
    List(Vec<IpAddr>),
    V4([Group; 4]),
    V6([Group; 8]),
}

/// One group of a range pattern: an inclusive range (an exact value is a range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    low: u16,
    high: u16,
}

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("address pattern {pattern:?}: {reason}")]
pub struct BadPattern {
    pub pattern: String,
    pub reason: String,
}

impl AddressPattern {
    pub fn parse(text: &str) -> Result<AddressPattern, BadPattern> {
        let bad = |reason: String| BadPattern {
            pattern: text.chars().take(64).collect(),
            reason,
        };
        if text.len() > MAX_PATTERN_BYTES {
            return Err(bad(format!(
                "{} bytes, over the limit of {MAX_PATTERN_BYTES}",
                text.len()
            )));
        }
        let trimmed = text.trim();
        let kind = if trimmed.is_empty() {
            Kind::Nothing
        } else if matches!(trimmed, "*" | "*.*.*.*" | "*:*:*:*:*:*:*:*") {
            Kind::Everything
        } else if trimmed.ends_with('}') {
            Kind::List(parse_braces(trimmed).map_err(bad)?)
        } else if trimmed.contains(',') {
            Kind::List(parse_list(trimmed.split(',')).map_err(bad)?)
        } else if trimmed.contains('*') || trimmed.contains('-') {
            if trimmed.contains(':') {
                Kind::V6(parse_v6_range(trimmed).map_err(bad)?)
            } else {
                Kind::V4(parse_v4_range(trimmed).map_err(bad)?)
            }
        } else {
            Kind::List(parse_list(std::iter::once(trimmed)).map_err(bad)?)
        };
        Ok(AddressPattern {
            text: text.to_owned(),
            kind,
        })
    }

    /// Whether `remote` matches; an IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`) is read
    /// as the IPv4 address.
    pub fn matches(&self, remote: IpAddr) -> bool {
        let remote = remote.to_canonical();
        match (&self.kind, remote) {
            (Kind::Nothing, _) => false,
            (Kind::Everything, _) => true,
            (Kind::List(addresses), _) => addresses.contains(&remote),
            (Kind::V4(groups), IpAddr::V4(v4)) => groups_match(groups, v4.octets().map(u16::from)),
            (Kind::V6(groups), IpAddr::V6(v6)) => groups_match(groups, v6.segments()),
            _ => false,
        }
    }
}

impl fmt::Display for AddressPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn groups_match<const N: usize>(groups: &[Group; N], values: [u16; N]) -> bool {
    groups
        .iter()
        .zip(values)
        .all(|(group, value)| group.low <= value && value <= group.high)
}

fn parse_address(text: &str) -> Result<IpAddr, String> {
    let text = text.trim();
    text.parse::<IpAddr>()
        .map(|address| address.to_canonical())
        .map_err(|_| format!("{text:?} is not an IPv4 or IPv6 address"))
}

fn parse_list<'a>(items: impl Iterator<Item = &'a str>) -> Result<Vec<IpAddr>, String> {
    let mut addresses = Vec::new();
    for item in items {
        if addresses.len() == MAX_ADDRESSES_PER_PATTERN {
            return Err(format!(
                "names more than {MAX_ADDRESSES_PER_PATTERN} addresses"
            ));
        }
        addresses.push(parse_address(item)?);
    }
    Ok(addresses)
}

/// `prefix{a,b,c}`: the braces must hold the whole last group (RocketMQ's
/// `MultipleRemoteAddressStrategy` via `AclUtils.getAddresses`).
fn parse_braces(text: &str) -> Result<Vec<IpAddr>, String> {
    let open = text
        .rfind('{')
        .ok_or_else(|| "a '}' without '{'".to_owned())?;
    let prefix = &text[..open];
    if !(prefix.ends_with('.') || prefix.ends_with(':')) {
        return Err("braces must hold the whole last group".to_owned());
    }
    let inner = &text[open + 1..text.len() - 1];
    if inner.contains(['{', '}']) {
        return Err("only one pair of braces, in the last group".to_owned());
    }
    let full: Vec<String> = inner
        .split(',')
        .take(MAX_ADDRESSES_PER_PATTERN + 1)
        .map(|item| format!("{prefix}{}", item.trim()))
        .collect();
    parse_list(full.iter().map(String::as_str))
}

/// Reads one range group: `*`, `low-high` or an exact value, in `radix`, at most `max`.
fn parse_group(text: &str, radix: u32, max: u16) -> Result<(Group, bool), String> {
    let text = text.trim();
    let value = |digits: &str| -> Result<u16, String> {
        let digits = digits.trim();
        let is_digits = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
        match u32::from_str_radix(digits, radix) {
            Ok(value) if is_digits && value <= u32::from(max) && digits.len() <= 5 => {
                Ok(value as u16)
            }
            _ => Err(format!("group {text:?} is not a number from 0 to {max}")),
        }
    };
    if text == "*" {
        return Ok((Group { low: 0, high: max }, true));
    }
    if let Some((low, high)) = text.split_once('-') {
        let (low, high) = (value(low)?, value(high)?);
        if low > high {
            return Err(format!("range {text:?} runs backwards"));
        }
        return Ok((Group { low, high }, true));
    }
    let exact = value(text)?;
    Ok((
        Group {
            low: exact,
            high: exact,
        },
        false,
    ))
}

/// Checks the shape shared by both families: the first group exact, then at most one
/// wildcard or range, then only `*`.
fn check_shape(parsed: &[(Group, bool)], max: u16) -> Result<(), String> {
    let Some(first_wild) = parsed.iter().position(|(_, is_wild)| *is_wild) else {
        return Err("no '*' or range group".to_owned());
    };
    if first_wild == 0 {
        return Err("the first group must be a number".to_owned());
    }
    let is_any = |group: &Group| group.low == 0 && group.high == max;
    if parsed[first_wild + 1..]
        .iter()
        .any(|(group, _)| !is_any(group))
    {
        // RocketMQ ignores the groups after the range (`1.2.3-4.5` matches `1.2.3.9`);
        // refusing says so instead.
        return Err("after a '*' or range group only '*' may follow".to_owned());
    }
    Ok(())
}

fn parse_v4_range(text: &str) -> Result<[Group; 4], String> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() > 4 {
        return Err("more than 4 groups".to_owned());
    }
    let mut parsed = Vec::with_capacity(4);
    for part in &parts {
        parsed.push(parse_group(part, 10, 255)?);
    }
    if parsed.len() < 4 && !parsed.last().is_some_and(|(_, is_wild)| *is_wild) {
        return Err("fewer than 4 groups and the last is not '*' or a range".to_owned());
    }
    while parsed.len() < 4 {
        parsed.push((Group { low: 0, high: 255 }, true));
    }
    check_shape(&parsed, 255)?;
    Ok([parsed[0].0, parsed[1].0, parsed[2].0, parsed[3].0])
}

fn parse_v6_range(text: &str) -> Result<[Group; 8], String> {
    let split = |side: &str| -> Result<Vec<(Group, bool)>, String> {
        if side.is_empty() {
            return Ok(Vec::new());
        }
        side.split(':')
            .take(9)
            .map(|part| parse_group(part, 16, u16::MAX))
            .collect()
    };
    let mut parsed = match text.split_once("::") {
        Some((left, right)) => {
            if right.contains("::") {
                return Err("'::' more than once".to_owned());
            }
            let (left, right) = (split(left)?, split(right)?);
            if left.len() + right.len() > 7 {
                return Err("more than 8 groups".to_owned());
            }
            let zeros = 8 - left.len() - right.len();
            let mut all = left;
            all.extend(std::iter::repeat_n(
                (Group { low: 0, high: 0 }, false),
                zeros,
            ));
            all.extend(right);
            all
        }
        None => split(text)?,
    };
    if parsed.len() != 8 {
        return Err(format!(
            "{} groups; an IPv6 range names 8 (use '::' for zeros)",
            parsed.len()
        ));
    }
    check_shape(&parsed, u16::MAX)?;
    let mut groups = [Group { low: 0, high: 0 }; 8];
    for (slot, (group, _)) in groups.iter_mut().zip(parsed.drain(..)) {
        *slot = group;
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(text: &str) -> IpAddr {
        IpAddr::V4(text.parse::<Ipv4Addr>().unwrap())
    }

    fn v6(text: &str) -> IpAddr {
        IpAddr::V6(text.parse::<Ipv6Addr>().unwrap())
    }

    fn pattern(text: &str) -> AddressPattern {
        AddressPattern::parse(text).unwrap_or_else(|error| panic!("{error}"))
    }

    #[test]
    fn blank_matches_nothing_and_stars_match_everything() {
        assert!(!pattern("").matches(v4("1.2.3.4")));
        assert!(!pattern("  ").matches(v6("::1")));
        for star in ["*", "*.*.*.*", "*:*:*:*:*:*:*:*"] {
            assert!(pattern(star).matches(v4("1.2.3.4")), "{star}");
            assert!(pattern(star).matches(v6("2001:db8::1")), "{star}");
        }
    }

    #[test]
    fn one_address() {
        let p = pattern("192.168.0.1");
        assert!(p.matches(v4("192.168.0.1")));
        assert!(!p.matches(v4("192.168.0.2")));
        // The mapped form of the same address is the same client.
        assert!(p.matches(v6("::ffff:192.168.0.1")));
        let p = pattern("2001:DB8::1");
        assert!(p.matches(v6("2001:db8:0:0:0:0:0:1")));
        assert!(!p.matches(v6("2001:db8::2")));
        assert!(!p.matches(v4("0.0.0.1")));
    }

    #[test]
    fn comma_list_names_whole_addresses() {
        let p = pattern("192.168.1.1, 192.168.1.2,10.0.0.1");
        assert!(p.matches(v4("192.168.1.2")));
        assert!(p.matches(v4("10.0.0.1")));
        assert!(!p.matches(v4("192.168.1.3")));
        // RocketMQ refuses this shorthand too: "2" is not an address.
        assert!(AddressPattern::parse("192.168.1.1,2,3").is_err());
    }

    #[test]
    fn braces_list_the_last_group() {
        let p = pattern("192.168.1.{1,2,3}");
        for last in 1..=3 {
            assert!(p.matches(v4(&format!("192.168.1.{last}"))));
        }
        assert!(!p.matches(v4("192.168.1.4")));
        let p = pattern("2001:db8::{1,a}");
        assert!(p.matches(v6("2001:db8::a")));
        assert!(!p.matches(v6("2001:db8::b")));
        for bad in [
            "192.168.{1,2}",
            "192.168.1{1,2}",
            "192.168.{1,2}.{3}",
            "192.168.1.{1,300}",
        ] {
            assert!(AddressPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ipv4_ranges_and_wildcards() {
        let p = pattern("192.168.0.*");
        assert!(p.matches(v4("192.168.0.0")) && p.matches(v4("192.168.0.255")));
        assert!(!p.matches(v4("192.168.1.1")));
        let p = pattern("192.168.1.1-5");
        assert!(p.matches(v4("192.168.1.1")) && p.matches(v4("192.168.1.5")));
        assert!(!p.matches(v4("192.168.1.0")) && !p.matches(v4("192.168.1.6")));
        let p = pattern("192.168.*");
        assert!(p.matches(v4("192.168.7.9")));
        assert!(!p.matches(v4("192.169.7.9")));
        let p = pattern("10.1-3.*.*");
        assert!(p.matches(v4("10.2.200.1")));
        assert!(!p.matches(v4("10.4.0.0")));
        assert!(!pattern("10.*").matches(v6("::1")));
    }

    #[test]
    fn ipv4_range_refusals() {
        for bad in [
            "*.168.1.1",       // first group must be exact
            "192.168.1.5-1",   // backwards
            "192.168.1.-5",    // no low end
            "192.168.1.1-256", // past 255
            "192.168.*.5",     // RocketMQ would silently ignore the 5
            "192.168.1.1.*",   // five groups
            "192.168.{1,2}.*", // braces only in the last group, and then no '*'
            "192.168.a.*",
            "1.2.3.4-",
        ] {
            assert!(AddressPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ipv6_ranges_and_wildcards() {
        let p = pattern("2::ac5:78:1-200:*");
        assert!(p.matches(v6("2::ac5:78:1:ffff")));
        assert!(p.matches(v6("2::ac5:78:200:0")));
        assert!(!p.matches(v6("2::ac5:78:201:0")));
        assert!(!p.matches(v6("2::ac5:79:1:0")));
        let p = pattern("2001:db8:0:0:0:0:0:*");
        assert!(p.matches(v6("2001:db8::abcd")));
        assert!(!p.matches(v6("2001:db8::1:abcd")));
        for bad in [
            "2001:db8:*",
            "*::1",
            "2001::1-0",
            "2001::*::1",
            "2001::fffff-*",
            "1:2:3:4:5:6:7:8:*",
        ] {
            assert!(AddressPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_are_bounded() {
        let long = format!("1.1.1.1{}", " ".repeat(MAX_PATTERN_BYTES));
        assert!(AddressPattern::parse(&long).is_err());
        let many = vec!["1.1.1.1"; MAX_ADDRESSES_PER_PATTERN + 1].join(",");
        assert!(AddressPattern::parse(&many).is_err());
        let many = vec!["1.1.1.1"; MAX_ADDRESSES_PER_PATTERN].join(",");
        assert!(AddressPattern::parse(&many).is_ok());
    }
}
