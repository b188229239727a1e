//! RocketMQ's delay levels (`messageDelayLevel`): the default list, its grammar (`1s 5s 10m 2h`)
//! and its limits. Config owns it because `BrokerConfig::validate` checks it; the schedule
//! service (`schedule.rs`) and the retry path read the parsed levels.

/// RocketMQ's `messageDelayLevel`.
pub const DEFAULT_DELAY_LEVELS: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";
/// Most delay levels a broker may define.
pub const MAX_DELAY_LEVELS: usize = 64;
/// Longest delay a level may have (a level is a retry step, not a calendar).
pub const MAX_LEVEL_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;
/// Parses `1s 5s 10m 2h` (units `ms`, `s`, `m`, `h`, `d`) into milliseconds per level.
pub fn parse_delay_levels(text: &str) -> Result<Vec<u64>, String> {
    let levels: Vec<u64> = text
        .split_whitespace()
        .map(parse_duration_ms)
        .collect::<Result<_, _>>()?;
    if levels.is_empty() || levels.len() > MAX_DELAY_LEVELS {
        return Err(format!(
            "delay_levels has {} levels; it needs 1..={MAX_DELAY_LEVELS}",
            levels.len()
        ));
    }
    if let Some(too_long) = levels.iter().find(|&&ms| ms > MAX_LEVEL_DELAY_MS) {
        return Err(format!(
            "delay level of {too_long} ms is over the longest a level may wait ({MAX_LEVEL_DELAY_MS} ms)"
        ));
    }
    Ok(levels)
}

/// `250ms`, `5s`, `10m`, `2h`, `1d` → milliseconds.
pub fn parse_duration_ms(token: &str) -> Result<u64, String> {
    let digits_end = token
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(token.len());
    let (number, unit) = token.split_at(digits_end);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("delay `{token}` must be a number and a unit (ms, s, m, h, d)"))?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "delay `{token}` has unit `{unit}`; use ms, s, m, h or d"
            ))
        }
    };
    number
        .checked_mul(unit_ms)
        .filter(|&ms| ms > 0)
        .ok_or_else(|| format!("delay `{token}` must be positive and under 2^64 ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_levels_are_rocketmqs() {
        let levels = parse_delay_levels(DEFAULT_DELAY_LEVELS).unwrap();
        assert_eq!(levels.len(), 18);
        assert_eq!(levels[0], 1_000);
        assert_eq!(levels[2], 10_000);
        assert_eq!(levels[17], 7_200_000);
        assert_eq!(
            parse_delay_levels("200ms 1d").unwrap(),
            vec![200, 86_400_000]
        );
        assert!(parse_delay_levels("").unwrap_err().contains("1..="));
        assert!(parse_delay_levels("5x").unwrap_err().contains("unit"));
        assert!(parse_delay_levels("0s").is_err());
        assert!(parse_delay_levels("30d").unwrap_err().contains("longest"));
    }
}
