//! The accounts file, in ShardMQ's `acl.toml` shape or RocketMQ's `plain_acl.yml` shape,
//! read into one [`Acl`] after checking every field and size.
//!
//! Owns the two file shapes (serde structs that mirror the text) and the validation that
//! turns either into the model; does no I/O beyond `load` reading one bounded file. Text
//! enters through [`Acl::from_toml_str`], [`Acl::from_rocketmq_yaml_str`] or [`Acl::load`];
//! a model or an [`AclError`] naming the account and the field leaves. The shapes are
//! documented in `docs/acl.md`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::address::{AddressPattern, BadPattern};
use crate::model::{Account, Acl, RETRY_TOPIC_PREFIX};
use crate::perm::Perm;

/// The largest accounts file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// The most accounts one file may hold.
pub const MAX_ACCOUNTS: usize = 10_000;
/// The most per-topic plus per-group entries one account may hold.
pub const MAX_PERMS_PER_ACCOUNT: usize = 10_000;
/// The most address patterns in one list (global or per account).
pub const MAX_ADDRESS_PATTERNS: usize = 256;
/// RocketMQ refuses an access key or secret key of 6 characters or fewer
/// (`AclConstants.ACCESS_KEY_MIN_LENGTH`/`SECRET_KEY_MIN_LENGTH` = 6, checked with `<=`).
pub const MIN_KEY_CHARS: usize = 7;
/// The longest access key or secret key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// The longest topic or group name in a permission entry, in bytes (RocketMQ's group limit).
pub const MAX_RESOURCE_NAME_BYTES: usize = 255;

/// Which shape a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclFormat {
    /// ShardMQ's `acl.toml`.
    Toml,
    /// RocketMQ's `plain_acl.yml`.
    RocketMqYaml,
}

impl AclFormat {
    /// By extension: `.toml`, or `.yml`/`.yaml`.
    pub fn of_path(path: &Path) -> Option<AclFormat> {
        match path.extension()?.to_str()? {
            "toml" => Some(AclFormat::Toml),
            "yml" | "yaml" => Some(AclFormat::RocketMqYaml),
            _ => None,
        }
    }
}

/// Why a file was refused. `account` is the access key of the entry at fault (or its
/// position, `#3`, when the key itself is at fault); secrets are never quoted.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unknown file type; name it *.toml (acl.toml) or *.yml (plain_acl.yml)")]
    UnknownFormat { path: PathBuf },
    #[error("the accounts file is {bytes} bytes, over the limit of {limit} bytes")]
    FileTooLarge { bytes: u64, limit: u64 },
    #[error("the accounts file does not parse as {format}: {message}")]
    Syntax {
        format: &'static str,
        message: String,
    },
    #[error("access key {access_key:?} appears in more than one account")]
    DuplicateAccessKey { access_key: String },
    #[error("account {account}: {field} is {chars} characters; RocketMQ needs at least {min}")]
    KeyTooShort {
        account: String,
        field: &'static str,
        chars: usize,
        min: usize,
    },
    #[error("account {account}: {field} is {bytes} bytes, over the limit of {limit}")]
    KeyTooLong {
        account: String,
        field: &'static str,
        bytes: usize,
        limit: usize,
    },
    #[error(
        "account {account}: {field} is {word:?}; the permissions are DENY, PUB, SUB and PUB|SUB"
    )]
    UnknownPermission {
        account: String,
        field: &'static str,
        word: String,
    },
    #[error("account {account}: {field} entry {entry:?} is not NAME=PERMISSION")]
    BadPermissionEntry {
        account: String,
        field: &'static str,
        entry: String,
    },
    #[error("account {account}: {field} names {name:?} more than once")]
    DuplicateResource {
        account: String,
        field: &'static str,
        name: String,
    },
    #[error("account {account}: {field} names {name:?}, which is empty, longer than {limit} bytes, or a retry topic (give the group's permission instead)")]
    BadResourceName {
        account: String,
        field: &'static str,
        name: String,
        limit: usize,
    },
    #[error("{what}: {count}, over the limit of {limit}")]
    TooMany {
        what: String,
        count: usize,
        limit: usize,
    },
    #[error("{place}: {source}")]
    BadAddress { place: String, source: BadPattern },
}

// ---- ShardMQ's acl.toml ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    #[serde(default)]
    trusted_addresses: Vec<String>,
    #[serde(default)]
    accounts: Vec<TomlAccount>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlAccount {
    access_key: String,
    secret_key: String,
    #[serde(default)]
    admin: bool,
    default_topic_perm: Option<String>,
    default_group_perm: Option<String>,
    #[serde(default)]
    topic_perms: toml::Table,
    #[serde(default)]
    group_perms: toml::Table,
    #[serde(default)]
    trusted_addresses: Vec<String>,
    allowed_addresses: Option<Vec<String>>,
}

// ---- RocketMQ's plain_acl.yml ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlFile {
    global_white_remote_addresses: Option<Vec<String>>,
    accounts: Option<Vec<YamlAccount>>,
    /// Written by RocketMQ's admin tools; ignored.
    #[serde(default, rename = "dataVersion")]
    _data_version: serde_yaml::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlAccount {
    access_key: Option<String>,
    secret_key: Option<String>,
    white_remote_address: Option<String>,
    #[serde(default)]
    admin: bool,
    default_topic_perm: Option<String>,
    default_group_perm: Option<String>,
    topic_perms: Option<Vec<String>>,
    group_perms: Option<Vec<String>>,
}

/// The shape both files are read into before validation.
struct RawAccount {
    access_key: String,
    secret_key: String,
    is_admin: bool,
    default_topic_perm: Option<String>,
    default_group_perm: Option<String>,
    topic_perms: Vec<(String, String)>,
    group_perms: Vec<(String, String)>,
    trusted_addresses: Vec<String>,
    allowed_addresses: Option<Vec<String>>,
}

impl Acl {
    /// Reads a file, its shape chosen by extension ([`AclFormat::of_path`]).
    pub fn load(path: &Path) -> Result<Acl, AclError> {
        let format = AclFormat::of_path(path).ok_or_else(|| AclError::UnknownFormat {
            path: path.to_owned(),
        })?;
        let text = read_bounded(path)?;
        Acl::parse(&text, format)
    }

    pub fn parse(text: &str, format: AclFormat) -> Result<Acl, AclError> {
        match format {
            AclFormat::Toml => Acl::from_toml_str(text),
            AclFormat::RocketMqYaml => Acl::from_rocketmq_yaml_str(text),
        }
    }

    pub fn from_toml_str(text: &str) -> Result<Acl, AclError> {
        check_size(text)?;
        let file: TomlFile = toml::from_str(text).map_err(|error| AclError::Syntax {
            format: "acl.toml",
            message: error.to_string(),
        })?;
        check_count("accounts", file.accounts.len(), MAX_ACCOUNTS)?;
        let mut accounts = Vec::with_capacity(file.accounts.len());
        for (index, account) in file.accounts.into_iter().enumerate() {
            let label = label(&account.access_key, index);
            accounts.push(RawAccount {
                topic_perms: table_entries(&label, "topic_perms", account.topic_perms)?,
                group_perms: table_entries(&label, "group_perms", account.group_perms)?,
                access_key: account.access_key,
                secret_key: account.secret_key,
                is_admin: account.admin,
                default_topic_perm: account.default_topic_perm,
                default_group_perm: account.default_group_perm,
                trusted_addresses: account.trusted_addresses,
                allowed_addresses: account.allowed_addresses,
            });
        }
        build(file.trusted_addresses, accounts)
    }

    pub fn from_rocketmq_yaml_str(text: &str) -> Result<Acl, AclError> {
        check_size(text)?;
        // RocketMQ reads an empty file as no accounts.
        let file: Option<YamlFile> =
            serde_yaml::from_str(text).map_err(|error| AclError::Syntax {
                format: "plain_acl.yml",
                message: error.to_string(),
            })?;
        let Some(file) = file else {
            return Ok(Acl::default());
        };
        let yaml_accounts = file.accounts.unwrap_or_default();
        check_count("accounts", yaml_accounts.len(), MAX_ACCOUNTS)?;
        let mut accounts = Vec::with_capacity(yaml_accounts.len());
        for (index, account) in yaml_accounts.into_iter().enumerate() {
            let access_key = account.access_key.unwrap_or_default();
            let label = label(&access_key, index);
            accounts.push(RawAccount {
                secret_key: account.secret_key.unwrap_or_default(),
                is_admin: account.admin,
                default_topic_perm: account.default_topic_perm,
                default_group_perm: account.default_group_perm,
                topic_perms: list_entries(&label, "topicPerms", account.topic_perms)?,
                group_perms: list_entries(&label, "groupPerms", account.group_perms)?,
                // RocketMQ's one string may itself be a list (`a,b` or `a.b.c.{1,2}`).
                trusted_addresses: account.white_remote_address.into_iter().collect(),
                allowed_addresses: None,
                access_key,
            });
        }
        build(
            file.global_white_remote_addresses.unwrap_or_default(),
            accounts,
        )
    }
}

fn read_bounded(path: &Path) -> Result<String, AclError> {
    let io_error = |source| AclError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io_error)?;
    check_size(&text)?;
    Ok(text)
}

fn check_size(text: &str) -> Result<(), AclError> {
    let bytes = text.len() as u64;
    if bytes > MAX_FILE_BYTES {
        return Err(AclError::FileTooLarge {
            bytes,
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(())
}

fn check_count(what: &str, count: usize, limit: usize) -> Result<(), AclError> {
    if count > limit {
        return Err(AclError::TooMany {
            what: what.to_owned(),
            count,
            limit,
        });
    }
    Ok(())
}

/// How errors name an account: its access key, or its position when the key is unusable.
fn label(access_key: &str, index: usize) -> String {
    if access_key.is_empty() || access_key.len() > MAX_KEY_BYTES {
        format!("#{}", index + 1)
    } else {
        format!("{access_key:?}")
    }
}

fn table_entries(
    account: &str,
    field: &'static str,
    table: toml::Table,
) -> Result<Vec<(String, String)>, AclError> {
    table
        .into_iter()
        .map(|(name, value)| match value {
            toml::Value::String(word) => Ok((name, word)),
            other => Err(AclError::UnknownPermission {
                account: account.to_owned(),
                field,
                word: other.to_string(),
            }),
        })
        .collect()
}

/// RocketMQ's `NAME=PERM` strings (`Permission.parseResourcePerms`), both sides trimmed.
fn list_entries(
    account: &str,
    field: &'static str,
    entries: Option<Vec<String>>,
) -> Result<Vec<(String, String)>, AclError> {
    entries
        .unwrap_or_default()
        .into_iter()
        .map(|entry| match entry.split_once('=') {
            Some((name, word)) if !word.contains('=') => {
                Ok((name.trim().to_owned(), word.trim().to_owned()))
            }
            _ => Err(AclError::BadPermissionEntry {
                account: account.to_owned(),
                field,
                entry: entry.chars().take(MAX_RESOURCE_NAME_BYTES).collect(),
            }),
        })
        .collect()
}

fn build(trusted: Vec<String>, raw_accounts: Vec<RawAccount>) -> Result<Acl, AclError> {
    let trusted_addresses = patterns("trusted addresses", &trusted)?;
    let mut accounts = HashMap::with_capacity(raw_accounts.len());
    for (index, raw) in raw_accounts.into_iter().enumerate() {
        let account = build_account(raw, index)?;
        if accounts.contains_key(&account.access_key) {
            return Err(AclError::DuplicateAccessKey {
                access_key: account.access_key,
            });
        }
        accounts.insert(account.access_key.clone(), account);
    }
    Ok(Acl {
        trusted_addresses,
        accounts,
    })
}

fn build_account(raw: RawAccount, index: usize) -> Result<Account, AclError> {
    let account = label(&raw.access_key, index);
    check_key(&account, "access key", &raw.access_key)?;
    check_key(&account, "secret key", &raw.secret_key)?;
    check_count(
        &format!("account {account}: permission entries"),
        raw.topic_perms.len() + raw.group_perms.len(),
        MAX_PERMS_PER_ACCOUNT,
    )?;
    let allowed_addresses = match &raw.allowed_addresses {
        Some(list) => Some(patterns(
            &format!("account {account}: allowed addresses"),
            list,
        )?),
        None => None,
    };
    Ok(Account {
        default_topic_perm: default_perm(
            &account,
            "default topic permission",
            raw.default_topic_perm,
        )?,
        default_group_perm: default_perm(
            &account,
            "default group permission",
            raw.default_group_perm,
        )?,
        topic_perms: resource_perms(&account, "topic permissions", raw.topic_perms)?,
        group_perms: resource_perms(&account, "group permissions", raw.group_perms)?,
        trusted_addresses: patterns(
            &format!("account {account}: trusted addresses"),
            &raw.trusted_addresses,
        )?,
        allowed_addresses,
        access_key: raw.access_key,
        secret_key: raw.secret_key,
        is_admin: raw.is_admin,
    })
}

fn check_key(account: &str, field: &'static str, key: &str) -> Result<(), AclError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(AclError::KeyTooLong {
            account: account.to_owned(),
            field,
            bytes: key.len(),
            limit: MAX_KEY_BYTES,
        });
    }
    let chars = key.chars().count();
    if chars < MIN_KEY_CHARS {
        return Err(AclError::KeyTooShort {
            account: account.to_owned(),
            field,
            chars,
            min: MIN_KEY_CHARS,
        });
    }
    Ok(())
}

/// An absent default is DENY, as in RocketMQ (`parsePermFromString(null)`).
fn default_perm(
    account: &str,
    field: &'static str,
    word: Option<String>,
) -> Result<Perm, AclError> {
    match word {
        None => Ok(Perm::Deny),
        Some(word) => parse_perm(account, field, &word),
    }
}

fn parse_perm(account: &str, field: &'static str, word: &str) -> Result<Perm, AclError> {
    Perm::parse(word).ok_or_else(|| AclError::UnknownPermission {
        account: account.to_owned(),
        field,
        word: word.chars().take(32).collect(),
    })
}

fn resource_perms(
    account: &str,
    field: &'static str,
    entries: Vec<(String, String)>,
) -> Result<HashMap<String, Perm>, AclError> {
    let mut perms = HashMap::with_capacity(entries.len());
    for (name, word) in entries {
        if name.is_empty()
            || name.len() > MAX_RESOURCE_NAME_BYTES
            || name.starts_with(RETRY_TOPIC_PREFIX)
        {
            return Err(AclError::BadResourceName {
                account: account.to_owned(),
                field,
                name: name.chars().take(MAX_RESOURCE_NAME_BYTES).collect(),
                limit: MAX_RESOURCE_NAME_BYTES,
            });
        }
        let perm = parse_perm(account, field, &word)?;
        if perms.insert(name.clone(), perm).is_some() {
            return Err(AclError::DuplicateResource {
                account: account.to_owned(),
                field,
                name,
            });
        }
    }
    Ok(perms)
}

fn patterns(place: &str, texts: &[String]) -> Result<Vec<AddressPattern>, AclError> {
    check_count(place, texts.len(), MAX_ADDRESS_PATTERNS)?;
    texts
        .iter()
        .map(|text| {
            AddressPattern::parse(text).map_err(|source| AclError::BadAddress {
                place: place.to_owned(),
                source,
            })
        })
        .collect()
}
