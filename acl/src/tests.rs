//! Tests across modules: both file shapes into one model, every load error, the decisions,
//! the challenge-response against accounts, and reload.

use std::net::IpAddr;

use crate::config::{AclError, MAX_ACCOUNTS, MAX_ADDRESS_PATTERNS, MAX_FILE_BYTES};
use crate::*;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

const TOML: &str = r#"
trusted_addresses = ["10.9.9.9"]

[[accounts]]
access_key = "RocketMQ"
secret_key = "12345678"
default_topic_perm = "DENY"
default_group_perm = "SUB"
topic_perms = { topicA = "DENY", topicB = "PUB|SUB", topicC = "SUB" }
group_perms = { groupA = "DENY", groupB = "PUB|SUB", groupC = "SUB" }
trusted_addresses = ["192.168.0.*"]

[[accounts]]
access_key = "rocketmq2"
secret_key = "12345678"
admin = true
trusted_addresses = ["192.168.1.*"]
"#;

// RocketMQ's acl/src/test/resources/conf/plain_acl.yml (4.9.x), the same accounts.
const YAML: &str = r#"
globalWhiteRemoteAddresses:
- 10.9.9.9

accounts:
- accessKey: RocketMQ
  secretKey: 12345678
  whiteRemoteAddress: 192.168.0.*
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - topicA=DENY
  - topicB=PUB|SUB
  - topicC=SUB
  groupPerms:
  # the group should convert to retry topic
  - groupA=DENY
  - groupB=PUB|SUB
  - groupC=SUB

- accessKey: rocketmq2
  secretKey: 12345678
  whiteRemoteAddress: 192.168.1.*
  # if it is admin, it could access all resources
  admin: true
dataVersion:
- counter: 1
  timestamp: 1634197530497
"#;

#[test]
fn both_shapes_load_into_the_same_model() {
    let from_toml = Acl::from_toml_str(TOML).unwrap();
    let from_yaml = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    for acl in [&from_toml, &from_yaml] {
        assert_eq!(acl.accounts().count(), 2);
        let account = acl.account("RocketMQ").unwrap();
        assert_eq!(account.secret_key(), "12345678");
        assert!(!account.is_admin());
        assert_eq!(account.default_topic_perm(), Perm::Deny);
        assert_eq!(account.default_group_perm(), Perm::Sub);
        assert_eq!(account.topic_perm("topicA"), Perm::Deny);
        assert_eq!(account.topic_perm("topicB"), Perm::PubSub);
        assert_eq!(account.topic_perm("other"), Perm::Deny);
        assert_eq!(account.group_perm("groupB"), Perm::PubSub);
        assert_eq!(account.group_perm("other"), Perm::Sub);
        assert_eq!(account.trusted_addresses().len(), 1);
        assert!(account.allowed_addresses().is_none());
        let admin = acl.account("rocketmq2").unwrap();
        assert!(admin.is_admin());
        // Absent defaults are DENY, as in RocketMQ.
        assert_eq!(admin.default_topic_perm(), Perm::Deny);
        assert_eq!(acl.trusted_addresses().len(), 1);
    }
}

#[test]
fn empty_files_hold_no_accounts() {
    assert_eq!(Acl::from_toml_str("").unwrap().accounts().count(), 0);
    assert_eq!(
        Acl::from_rocketmq_yaml_str("").unwrap().accounts().count(),
        0
    );
    assert_eq!(
        Acl::from_rocketmq_yaml_str("globalWhiteRemoteAddresses:\n- 1.2.3.4\n")
            .unwrap()
            .accounts()
            .count(),
        0
    );
}

#[test]
fn debug_output_hides_secrets() {
    let acl = Acl::from_toml_str(TOML).unwrap();
    assert!(!format!("{acl:?}").contains("12345678"));
}

fn toml_error(text: &str) -> AclError {
    Acl::from_toml_str(text).expect_err("the file should be refused")
}

fn yaml_error(text: &str) -> AclError {
    Acl::from_rocketmq_yaml_str(text).expect_err("the file should be refused")
}

fn account_toml(extra: &str) -> String {
    format!("[[accounts]]\naccess_key = \"access-1\"\nsecret_key = \"secret-1\"\n{extra}\n")
}

fn account_yaml(extra: &str) -> String {
    format!("accounts:\n- accessKey: access-1\n  secretKey: secret-1\n{extra}\n")
}

#[test]
fn toml_errors_name_the_fault() {
    let cases: Vec<(String, &str)> = vec![
        ("accounts = 3".into(), "does not parse as acl.toml"),
        (account_toml("colour = \"blue\""), "unknown field"),
        (
            format!("{}{}", account_toml(""), account_toml("")),
            "\"access-1\" appears in more than one account",
        ),
        (
            "[[accounts]]\naccess_key = \"access-1\"\nsecret_key = \"secret\"\n".into(),
            "account \"access-1\": secret key is 6 characters; RocketMQ needs at least 7",
        ),
        (
            "[[accounts]]\naccess_key = \"abc\"\nsecret_key = \"secret-1\"\n".into(),
            "access key is 3 characters",
        ),
        (
            format!(
                "[[accounts]]\naccess_key = \"{}\"\nsecret_key = \"secret-1\"\n",
                "k".repeat(300)
            ),
            "account #1: access key is 300 bytes, over the limit of 256",
        ),
        (
            account_toml("default_topic_perm = \"ALL\""),
            "default topic permission is \"ALL\"",
        ),
        (
            account_toml("topic_perms = { t = \"pub\" }"),
            "topic permissions is \"pub\"",
        ),
        (
            account_toml("group_perms = { g = 3 }"),
            "group_perms is \"3\"",
        ),
        (
            account_toml("topic_perms = { \"%RETRY%g\" = \"SUB\" }"),
            "retry topic",
        ),
        (
            account_toml("topic_perms = { \"\" = \"SUB\" }"),
            "names \"\"",
        ),
        (
            account_toml("trusted_addresses = [\"300.1.1.1\"]"),
            "account \"access-1\": trusted addresses: address pattern \"300.1.1.1\"",
        ),
        (
            account_toml("allowed_addresses = [\"10.*.1.1\"]"),
            "allowed addresses",
        ),
        (
            "trusted_addresses = [\"10.0.0.1-\"]".into(),
            "trusted addresses: address pattern",
        ),
    ];
    for (text, expected) in cases {
        let message = toml_error(&text).to_string();
        assert!(
            message.contains(expected),
            "{message:?} should contain {expected:?}"
        );
        assert!(!message.contains("secret-1"), "{message:?} quotes a secret");
    }
}

#[test]
fn yaml_errors_name_the_fault() {
    let cases: Vec<(String, &str)> = vec![
        ("accounts: [".into(), "does not parse as plain_acl.yml"),
        ("accounts: 3".into(), "does not parse as plain_acl.yml"),
        (account_yaml("  colour: blue"), "unknown field"),
        ("accounts:\n- secretKey: secret-1\n".into(), "account #1: access key is 0 characters"),
        ("accounts:\n- accessKey: access-1\n".into(), "secret key is 0 characters"),
        (
            "accounts:\n- accessKey: access-1\n  secretKey: secret-1\n- accessKey: access-1\n  secretKey: secret-2\n".into(),
            "appears in more than one account",
        ),
        (account_yaml("  topicPerms:\n  - topicA"), "topicPerms entry \"topicA\" is not NAME=PERMISSION"),
        (account_yaml("  topicPerms:\n  - a=PUB=SUB"), "is not NAME=PERMISSION"),
        (account_yaml("  topicPerms:\n  - topicA=READ"), "topic permissions is \"READ\""),
        (account_yaml("  groupPerms:\n  - g=SUB\n  - g=PUB"), "group permissions names \"g\" more than once"),
        (account_yaml("  defaultGroupPerm: ANY"), "default group permission is \"ANY\""),
        (account_yaml("  whiteRemoteAddress: 192.168.1.1,2,3"), "address pattern"),
        ("globalWhiteRemoteAddresses:\n- 192.168.*.5\n".into(), "trusted addresses: address pattern"),
        (account_yaml("  admin: maybe"), "does not parse"),
    ];
    for (text, expected) in cases {
        let message = yaml_error(&text).to_string();
        assert!(
            message.contains(expected),
            "{message:?} should contain {expected:?}"
        );
        assert!(!message.contains("secret-1"), "{message:?} quotes a secret");
    }
}

#[test]
fn sizes_are_bounded() {
    let huge = format!("# {}", "x".repeat(MAX_FILE_BYTES as usize));
    assert!(matches!(toml_error(&huge), AclError::FileTooLarge { .. }));
    assert!(matches!(yaml_error(&huge), AclError::FileTooLarge { .. }));

    let mut many = String::new();
    for index in 0..=MAX_ACCOUNTS {
        many.push_str(&format!(
            "[[accounts]]\naccess_key = \"access-{index}\"\nsecret_key = \"secret-key\"\n"
        ));
    }
    assert!(toml_error(&many)
        .to_string()
        .contains("accounts: 10001, over the limit of 10000"));

    let patterns = vec!["\"1.1.1.1\""; MAX_ADDRESS_PATTERNS + 1].join(",");
    let message = toml_error(&format!("trusted_addresses = [{patterns}]")).to_string();
    assert!(message.contains("over the limit of 256"), "{message}");
}

// ---- decisions ----

#[test]
fn defaults_and_overrides() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let remote = ip("10.0.0.1");
    let check = |need: Need<'_>| acl.authorize(Some("RocketMQ"), remote, &[need]);
    // Per-topic entries override the DENY default, both ways.
    assert!(check(Need::Topic("topicB", Action::Pub)).is_ok());
    assert!(check(Need::Topic("topicC", Action::Sub)).is_ok());
    assert!(check(Need::Topic("topicC", Action::Pub)).is_err());
    assert!(check(Need::Topic("other", Action::Sub)).is_err());
    assert!(check(Need::Topic("other", Action::Any)).is_err());
    assert!(check(Need::Topic("topicC", Action::Any)).is_ok());
    // DENY on a resource wins over a default that would allow it.
    assert!(check(Need::Group("groupA", Action::Sub)).is_err());
    assert!(check(Need::Group("other", Action::Sub)).is_ok());
    assert!(check(Need::Group("other", Action::Pub)).is_err());
    assert!(check(Need::Topic("topicA", Action::Sub)).is_err());
}

#[test]
fn refusals_name_account_resource_and_permission() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let remote = ip("10.0.0.1");
    let refused = acl
        .authorize(
            Some("RocketMQ"),
            remote,
            &[
                Need::Topic("topicB", Action::Pub),
                Need::Topic("topicA", Action::Sub),
            ],
        )
        .unwrap_err();
    assert_eq!(
        refused,
        Denied::MissingPermission {
            access_key: "RocketMQ".into(),
            resource: Resource::Topic("topicA".into()),
            needed: Action::Sub,
            held: Perm::Deny,
        }
    );
    assert_eq!(
        refused.to_string(),
        r#"account "RocketMQ" lacks SUB on topic "topicA" (it holds DENY)"#
    );
    let refused = acl
        .authorize(Some("RocketMQ"), remote, &[Need::Admin])
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        r#"account "RocketMQ" is not an admin, and the request needs the admin flag"#
    );
    let refused = acl.authorize(Some("nobody-here"), remote, &[]).unwrap_err();
    assert_eq!(
        refused.to_string(),
        r#"no account has access key "nobody-here""#
    );
    let refused = acl.authorize(None, remote, &[]).unwrap_err();
    assert_eq!(refused, Denied::NoCredentials { remote });
}

#[test]
fn retry_topics_are_checked_as_the_group_sub() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let remote = ip("10.0.0.1");
    let check = |need: Need<'_>| acl.authorize(Some("RocketMQ"), remote, &[need]);
    // groupC holds SUB: pulling its retry topic and sending back to it are allowed, even
    // though the topic default is DENY.
    assert!(check(Need::Topic("%RETRY%groupC", Action::Sub)).is_ok());
    assert!(check(Need::Topic("%RETRY%groupC", Action::Pub)).is_ok());
    assert!(check(Need::Topic("%RETRY%other", Action::Sub)).is_ok());
    let refused = check(Need::Topic("%RETRY%groupA", Action::Pub)).unwrap_err();
    assert_eq!(
        refused.to_string(),
        r#"account "RocketMQ" lacks SUB on group "groupA" (it holds DENY)"#
    );
}

#[test]
fn trace_topic_is_open_for_publishing() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let remote = ip("10.0.0.1");
    assert!(acl
        .authorize(
            Some("RocketMQ"),
            remote,
            &[Need::Topic(TRACE_TOPIC, Action::Pub)]
        )
        .is_ok());
    assert!(acl
        .authorize(
            Some("RocketMQ"),
            remote,
            &[Need::Topic(TRACE_TOPIC, Action::Sub)]
        )
        .is_err());
}

#[test]
fn admin_flag() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let remote = ip("10.0.0.1");
    // An admin without per-resource entries may do everything (RocketMQ's checkPerm).
    let needs = [
        Need::Admin,
        Need::Topic("any", Action::Pub),
        Need::Group("any", Action::Sub),
    ];
    assert!(acl.authorize(Some("rocketmq2"), remote, &needs).is_ok());
    // An admin with entries is held to them and to its defaults.
    let acl =
        Acl::from_toml_str(&account_toml("admin = true\ntopic_perms = { t = \"SUB\" }")).unwrap();
    assert!(acl
        .authorize(Some("access-1"), remote, &[Need::Admin])
        .is_ok());
    assert!(acl
        .authorize(Some("access-1"), remote, &[Need::Topic("t", Action::Sub)])
        .is_ok());
    assert!(acl
        .authorize(Some("access-1"), remote, &[Need::Topic("t", Action::Pub)])
        .is_err());
    assert!(acl
        .authorize(Some("access-1"), remote, &[Need::Topic("u", Action::Sub)])
        .is_err());
}

#[test]
fn trusted_addresses_pass_without_checks() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let denied_topic = [Need::Topic("topicA", Action::Pub), Need::Admin];
    // Global: no account needed.
    assert!(acl.is_trusted(None, ip("10.9.9.9")));
    assert!(acl.authorize(None, ip("10.9.9.9"), &denied_topic).is_ok());
    assert!(acl
        .authorize(Some("unknown-key"), ip("10.9.9.9"), &denied_topic)
        .is_ok());
    // Per account: only for that account.
    assert!(acl.is_trusted(Some("RocketMQ"), ip("192.168.0.20")));
    assert!(acl
        .authorize(Some("RocketMQ"), ip("192.168.0.20"), &denied_topic)
        .is_ok());
    assert!(!acl.is_trusted(Some("RocketMQ"), ip("192.168.1.20")));
    assert!(acl
        .authorize(Some("RocketMQ"), ip("192.168.1.20"), &denied_topic)
        .is_err());
    assert!(!acl.is_trusted(None, ip("192.168.0.20")));
    assert!(acl
        .authorize(None, ip("192.168.0.20"), &denied_topic)
        .is_err());
}

#[test]
fn allowed_addresses_refuse_other_addresses() {
    let acl = Acl::from_toml_str(&account_toml(
        "default_topic_perm = \"PUB\"\nallowed_addresses = [\"10.0.0.*\", \"::1\"]\ntrusted_addresses = [\"192.168.*\"]",
    ))
    .unwrap();
    let needs = [Need::Topic("t", Action::Pub)];
    assert!(acl
        .authorize(Some("access-1"), ip("10.0.0.5"), &needs)
        .is_ok());
    assert!(acl.authorize(Some("access-1"), ip("::1"), &needs).is_ok());
    let refused = acl
        .authorize(Some("access-1"), ip("10.0.1.5"), &needs)
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        r#"account "access-1" may not connect from 10.0.1.5"#
    );
    // The restriction comes first: a trusted address outside it is still refused.
    assert!(!acl.is_trusted(Some("access-1"), ip("192.168.0.1")));
    assert!(acl
        .authorize(Some("access-1"), ip("192.168.0.1"), &needs)
        .is_err());
}

// ---- authentication against accounts ----

#[test]
fn rocketmq_request_verification() {
    use std::collections::BTreeMap;
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let mut request = BTreeMap::from([
        ("AccessKey".to_string(), "RocketMQ".to_string()),
        ("topic".to_string(), "topicB".to_string()),
    ]);
    request.insert(
        "Signature".into(),
        rocketmq_signature("12345678", &request, b"hello"),
    );
    assert_eq!(
        acl.verify_rocketmq_request(&request, b"hello")
            .unwrap()
            .access_key(),
        "RocketMQ"
    );
    assert_eq!(
        acl.verify_rocketmq_request(&request, b"hellO").unwrap_err(),
        Denied::BadSignature {
            access_key: "RocketMQ".into()
        }
    );
    request.insert("AccessKey".into(), "unknown-key".into());
    assert!(matches!(
        acl.verify_rocketmq_request(&request, b"hello"),
        Err(Denied::UnknownAccount { .. })
    ));
    request.remove("AccessKey");
    assert_eq!(
        acl.verify_rocketmq_request(&request, b"hello").unwrap_err(),
        Denied::NoAccessKey
    );
}

#[test]
fn challenge_response() {
    let acl = Acl::from_rocketmq_yaml_str(YAML).unwrap();
    let server_nonce = challenge().unwrap();
    let client_nonce = challenge().unwrap();
    let proof = client_proof("12345678", &server_nonce, "RocketMQ", &client_nonce);
    let account = acl
        .verify_proof(&server_nonce, "RocketMQ", &client_nonce, &proof)
        .unwrap();
    assert_eq!(account.access_key(), "RocketMQ");

    let bad_proof = Denied::BadProof {
        access_key: "RocketMQ".into(),
    };
    let wrong_secret = client_proof("87654321", &server_nonce, "RocketMQ", &client_nonce);
    assert_eq!(
        acl.verify_proof(&server_nonce, "RocketMQ", &client_nonce, &wrong_secret)
            .unwrap_err(),
        bad_proof
    );
    let other_nonce = challenge().unwrap();
    assert_eq!(
        acl.verify_proof(&other_nonce, "RocketMQ", &client_nonce, &proof)
            .unwrap_err(),
        bad_proof
    );
    assert_eq!(
        acl.verify_proof(&server_nonce, "RocketMQ", &other_nonce, &proof)
            .unwrap_err(),
        bad_proof
    );
    assert_eq!(
        acl.verify_proof(&server_nonce, "RocketMQ", &client_nonce, &proof[..31])
            .unwrap_err(),
        bad_proof
    );
    // The same secret under another account's key does not prove that account.
    let borrowed = client_proof("12345678", &server_nonce, "RocketMQ", &client_nonce);
    assert!(acl
        .verify_proof(&server_nonce, "rocketmq2", &client_nonce, &borrowed)
        .is_err());
    assert_eq!(
        acl.verify_proof(&server_nonce, "unknown-key", &client_nonce, &proof)
            .unwrap_err(),
        Denied::UnknownAccount {
            access_key: "unknown-key".into()
        }
    );
}

// ---- reload ----

mod reload {
    use super::*;
    use std::fs;
    use std::time::{Duration, SystemTime};

    /// Writes the file and moves its modification time forward, so that a rewrite within the
    /// file system's time granularity is still a change.
    fn write(path: &std::path::Path, text: &str, step: u64) {
        fs::write(path, text).unwrap();
        let file = fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + step))
            .unwrap();
    }

    #[test]
    fn valid_change_invalid_change_and_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.toml");
        write(&path, &account_toml("default_topic_perm = \"SUB\""), 1);
        let store = AclStore::open(&path).unwrap();
        assert_eq!(store.format(), AclFormat::Toml);
        let before = store.current();
        assert_eq!(
            before.account("access-1").unwrap().default_topic_perm(),
            Perm::Sub
        );

        // Unchanged: nothing happens.
        assert!(!store.reload_if_changed().unwrap());
        assert!(std::sync::Arc::ptr_eq(&before, &store.current()));

        // A valid change replaces the model for later readers; earlier readers keep theirs.
        write(&path, &account_toml("default_topic_perm = \"PUB\""), 2);
        assert!(store.reload_if_changed().unwrap());
        assert_eq!(
            store
                .current()
                .account("access-1")
                .unwrap()
                .default_topic_perm(),
            Perm::Pub
        );
        assert_eq!(
            before.account("access-1").unwrap().default_topic_perm(),
            Perm::Sub
        );

        // An invalid change keeps the old model and reports the error once.
        write(&path, &account_toml("default_topic_perm = \"WRITE\""), 3);
        let error = store.reload_if_changed().unwrap_err();
        assert!(error.to_string().contains("\"WRITE\""), "{error}");
        assert_eq!(
            store
                .current()
                .account("access-1")
                .unwrap()
                .default_topic_perm(),
            Perm::Pub
        );
        assert!(!store.reload_if_changed().unwrap());

        // Fixing the file loads it.
        write(&path, &account_toml("default_topic_perm = \"DENY\""), 4);
        assert!(store.reload_if_changed().unwrap());
        assert_eq!(
            store
                .current()
                .account("access-1")
                .unwrap()
                .default_topic_perm(),
            Perm::Deny
        );

        // A vanished file is an error; the model stays.
        fs::remove_file(&path).unwrap();
        assert!(matches!(
            store.reload_if_changed(),
            Err(AclError::Io { .. })
        ));
        assert_eq!(store.current().accounts().count(), 1);
    }

    #[test]
    fn length_change_with_same_time_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain_acl.yml");
        write(&path, &account_yaml("  defaultTopicPerm: SUB"), 1);
        let store = AclStore::open(&path).unwrap();
        assert_eq!(store.format(), AclFormat::RocketMqYaml);
        write(&path, &account_yaml("  defaultTopicPerm: PUB|SUB"), 1);
        assert!(store.reload_if_changed().unwrap());
        assert_eq!(
            store
                .current()
                .account("access-1")
                .unwrap()
                .default_topic_perm(),
            Perm::PubSub
        );
    }

    #[test]
    fn open_refuses_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.json");
        write(&path, "{}", 1);
        assert!(matches!(
            AclStore::open(&path),
            Err(AclError::UnknownFormat { .. })
        ));
        let path = dir.path().join("acl.toml");
        assert!(matches!(AclStore::open(&path), Err(AclError::Io { .. })));
        write(&path, "accounts = 1", 1);
        assert!(matches!(
            AclStore::open(&path),
            Err(AclError::Syntax { .. })
        ));
    }
}
