//! Names of topics and groups: RocketMQ's rules (from the codec, which the store shares), and
//! which topics are the system's own (from the protocol, shared with the client).

pub use shardmq_codec::names::{
    check_group_name, check_topic_name, is_valid_name, MAX_GROUP_NAME_BYTES, MAX_TOPIC_NAME_BYTES,
};

/// The system topic names live with the protocol, shared with the client (`schedule.rs`,
/// `timer.rs`, `network/send_back.rs` and `transaction.rs` use them).
pub use shardmq_schema::system_topics::{
    is_system_topic, DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX, SCHEDULE_TOPIC, TIMER_TOPIC,
    TRANSACTION_HALF_TOPIC, TRANSACTION_OP_TOPIC, TRANSACTION_TOPIC_PREFIX,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_topics_are_recognised() {
        assert!(is_system_topic("SCHEDULE_TOPIC_XXXX"));
        assert!(is_system_topic("%DLQ%g"));
        assert!(is_system_topic("RMQ_SYS_TRANS_HALF_TOPIC"));
        assert!(!is_system_topic("orders"));
    }
}
