//! No file content makes the loaders or the address-pattern parser panic: every input is
//! either a model or an error.

use proptest::prelude::*;
use shardmq_acl::{Acl, AclFormat, AddressPattern};

/// Fragments of both file shapes, so that random files get past the syntax often enough to
/// reach validation.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("accounts:\n- accessKey: ".to_owned()),
        Just("  secretKey: ".to_owned()),
        Just("  whiteRemoteAddress: ".to_owned()),
        Just("  topicPerms:\n  - ".to_owned()),
        Just("globalWhiteRemoteAddresses:\n- ".to_owned()),
        Just("[[accounts]]\naccess_key = ".to_owned()),
        Just("secret_key = ".to_owned()),
        Just("topic_perms = { ".to_owned()),
        Just("trusted_addresses = [".to_owned()),
        Just("\"192.168.{1,2}\"".to_owned()),
        Just("PUB|SUB".to_owned()),
        Just("=".to_owned()),
        Just("\n".to_owned()),
        "[ -~]{0,12}",
        "[0-9.:*{},-]{0,20}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn loaders_never_panic(parts in proptest::collection::vec(fragment(), 0..24)) {
        let text = parts.concat();
        let _ = Acl::parse(&text, AclFormat::Toml);
        let _ = Acl::parse(&text, AclFormat::RocketMqYaml);
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = Acl::parse(&text, AclFormat::Toml);
        let _ = Acl::parse(&text, AclFormat::RocketMqYaml);
        let _ = AddressPattern::parse(&text);
    }

    #[test]
    fn address_patterns_never_panic_and_match_without_panicking(
        text in "[0-9a-fA-F.:*{},\\- ]{0,40}",
        v4 in any::<[u8; 4]>(),
        v6 in any::<[u16; 8]>(),
    ) {
        if let Ok(pattern) = AddressPattern::parse(&text) {
            let _ = pattern.matches(std::net::IpAddr::from(v4));
            let _ = pattern.matches(std::net::IpAddr::from(v6));
        }
    }
}
