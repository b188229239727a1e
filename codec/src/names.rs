//! Names of topics and groups: RocketMQ's rules.
//!
//! Owns the validation every request path applies before a name reaches storage or a file path
//! (a topic name becomes a directory name, so this is also what keeps `..` and `/` out). It sits
//! in the codec because the stored record holds the topic and the store checks it on append;
//! the broker's `naming` module re-exports it beside the system topic names.

/// Longest topic name (RocketMQ's limit; also what a version-1 record can hold).
pub const MAX_TOPIC_NAME_BYTES: usize = crate::MAX_TOPIC_BYTES;
/// Longest consumer or producer group name.
pub const MAX_GROUP_NAME_BYTES: usize = 255;

/// `^[%|a-zA-Z0-9_-]+$` and at most `max_bytes` long.
pub fn is_valid_name(name: &str, max_bytes: usize) -> bool {
    !name.is_empty()
        && name.len() <= max_bytes
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
}

/// Why a topic name is refused, or `Ok`.
pub fn check_topic_name(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("topic name is empty".into());
    }
    if topic.len() > MAX_TOPIC_NAME_BYTES {
        return Err(format!(
            "topic name is {} bytes, over the limit of {MAX_TOPIC_NAME_BYTES}",
            topic.len()
        ));
    }
    if !is_valid_name(topic, MAX_TOPIC_NAME_BYTES) {
        return Err(format!(
            "topic name `{}` must match ^[%|a-zA-Z0-9_-]+$",
            topic.escape_debug()
        ));
    }
    Ok(())
}

/// Why a group name is refused, or `Ok`.
pub fn check_group_name(group: &str) -> Result<(), String> {
    if !is_valid_name(group, MAX_GROUP_NAME_BYTES) {
        return Err(format!(
            "group name `{}` must match ^[%|a-zA-Z0-9_-]+$ and be at most {MAX_GROUP_NAME_BYTES} bytes",
            group.escape_debug()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rocketmq_rules() {
        assert!(check_topic_name("Orders_2024-eu").is_ok());
        assert!(check_topic_name("%RETRY%group").is_ok());
        assert!(check_topic_name("").is_err());
        assert!(check_topic_name("a/b").is_err());
        assert!(check_topic_name("..").is_err());
        assert!(check_topic_name("sp ace").is_err());
        assert!(check_topic_name(&"x".repeat(128)).is_err());
        assert!(check_topic_name(&"x".repeat(127)).is_ok());
        assert!(check_group_name(&"g".repeat(255)).is_ok());
        assert!(check_group_name(&"g".repeat(256)).is_err());
    }
}
