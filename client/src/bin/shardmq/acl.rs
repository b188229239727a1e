//! `shardmq acl`: the accounts of an `acl.toml` (docs/acl.md), listed and changed in place.
//!
//! Owns: reading the file as TOML, changing one account, checking the result with the same
//! loader the broker and the name server use (`shardmq_acl::Acl::from_toml_str`) and writing
//! it atomically (a temporary file renamed over the old one), so a server's reload never sees
//! half a file and a change that would not load is refused before anything is written. The
//! servers pick the change up within their reload interval (500 ms). Comments in the file are
//! not kept. RocketMQ's `plain_acl.yml` is read by the servers but not edited here.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::json;
use toml::{Table, Value};

use crate::cli::{AccountArgs, AclCommand, Settings};
use crate::output::print_json;

pub fn run(context: &Settings, command: AclCommand) -> Result<()> {
    match command {
        AclCommand::List { file } => list(context, &file),
        AclCommand::Add { file, account } => change(&file, |accounts| {
            let key = &account.access_key;
            if find(accounts, key).is_some() {
                bail!("an account with access key {key:?} exists already; use `acl update`");
            }
            let Some(secret) = &account.secret_key else {
                bail!("a new account needs --secret-key");
            };
            let mut table = Table::new();
            table.insert("access_key".into(), Value::String(key.clone()));
            table.insert("secret_key".into(), Value::String(secret.clone()));
            apply(&mut table, &account)?;
            accounts.push(Value::Table(table));
            Ok(format!("account {key:?} added"))
        }),
        AclCommand::Update { file, account } => change(&file, |accounts| {
            let key = &account.access_key;
            let Some(index) = find(accounts, key) else {
                bail!("no account has access key {key:?}; use `acl add`");
            };
            let Value::Table(table) = &mut accounts[index] else {
                bail!("account {key:?} is not a table");
            };
            if let Some(secret) = &account.secret_key {
                table.insert("secret_key".into(), Value::String(secret.clone()));
            }
            apply(table, &account)?;
            Ok(format!("account {key:?} updated"))
        }),
        AclCommand::Remove { file, access_key } => change(&file, |accounts| {
            let Some(index) = find(accounts, &access_key) else {
                bail!("no account has access key {access_key:?}");
            };
            accounts.remove(index);
            Ok(format!("account {access_key:?} removed"))
        }),
    }
}

fn list(context: &Settings, file: &Path) -> Result<()> {
    let acl =
        shardmq_acl::Acl::load(file).with_context(|| format!("reading {}", file.display()))?;
    let mut accounts: Vec<_> = acl.accounts().collect();
    accounts.sort_by(|a, b| a.access_key().cmp(b.access_key()));
    let perms = |map: &std::collections::HashMap<String, shardmq_acl::Perm>| {
        let mut entries: Vec<(String, String)> = map
            .iter()
            .map(|(name, perm)| (name.clone(), perm.to_string()))
            .collect();
        entries.sort();
        entries
    };
    let patterns = |list: &[shardmq_acl::AddressPattern]| {
        list.iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    if context.is_json {
        for account in accounts {
            print_json(&json!({
                "access_key": account.access_key(),
                "admin": account.is_admin(),
                "default_topic_perm": account.default_topic_perm().to_string(),
                "default_group_perm": account.default_group_perm().to_string(),
                "topic_perms": perms(account.topic_perms()).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                "group_perms": perms(account.group_perms()).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                "trusted_addresses": patterns(account.trusted_addresses()),
                "allowed_addresses": account.allowed_addresses().map(patterns),
            }));
        }
        return Ok(());
    }
    println!(
        "trusted addresses: {}",
        display_list(&patterns(acl.trusted_addresses()))
    );
    for account in accounts {
        println!(
            "{}{}  topics: default {}{}  groups: default {}{}{}{}",
            account.access_key(),
            if account.is_admin() { " (admin)" } else { "" },
            account.default_topic_perm(),
            perms(account.topic_perms())
                .iter()
                .map(|(name, perm)| format!(", {name}={perm}"))
                .collect::<String>(),
            account.default_group_perm(),
            perms(account.group_perms())
                .iter()
                .map(|(name, perm)| format!(", {name}={perm}"))
                .collect::<String>(),
            if account.trusted_addresses().is_empty() {
                String::new()
            } else {
                format!(
                    "  trusted: {}",
                    display_list(&patterns(account.trusted_addresses()))
                )
            },
            account
                .allowed_addresses()
                .map(|list| format!("  allowed from: {}", display_list(&patterns(list))))
                .unwrap_or_default(),
        );
    }
    Ok(())
}

fn display_list(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items.join(", ")
    }
}

/// Reads `file` (an empty one when it does not exist), lets `edit` change its accounts,
/// checks the result loads, and writes it atomically.
fn change(file: &Path, edit: impl FnOnce(&mut Vec<Value>) -> Result<String>) -> Result<()> {
    if shardmq_acl::AclFormat::of_path(file) != Some(shardmq_acl::AclFormat::Toml) {
        bail!(
            "{}: `shardmq acl` edits acl.toml files (a .toml path); edit a plain_acl.yml by hand",
            file.display()
        );
    }
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", file.display())),
    };
    let mut document: Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", file.display()))?;
    let mut accounts = match document.remove("accounts") {
        None => Vec::new(),
        Some(Value::Array(accounts)) => accounts,
        Some(_) => bail!("{}: `accounts` is not an array of tables", file.display()),
    };
    let said = edit(&mut accounts)?;
    document.insert("accounts".into(), Value::Array(accounts));
    let new_text = toml::to_string(&document).context("writing the accounts as TOML")?;
    shardmq_acl::Acl::from_toml_str(&new_text).with_context(|| {
        format!(
            "the change would make {} invalid; nothing written",
            file.display()
        )
    })?;
    let temporary = file.with_extension("toml.tmp");
    std::fs::write(&temporary, new_text)
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, file).with_context(|| format!("replacing {}", file.display()))?;
    println!("{said} in {}", file.display());
    Ok(())
}

fn find(accounts: &[Value], access_key: &str) -> Option<usize> {
    accounts
        .iter()
        .position(|account| account.get("access_key").and_then(Value::as_str) == Some(access_key))
}

/// Sets in `table` what `args` gives (the access and secret keys are set by the caller).
fn apply(table: &mut Table, args: &AccountArgs) -> Result<()> {
    if let Some(admin) = args.admin {
        table.insert("admin".into(), Value::Boolean(admin));
    }
    if let Some(perm) = &args.default_topic_perm {
        table.insert("default_topic_perm".into(), Value::String(perm.clone()));
    }
    if let Some(perm) = &args.default_group_perm {
        table.insert("default_group_perm".into(), Value::String(perm.clone()));
    }
    for (key, entries) in [
        ("topic_perms", &args.topic_perm),
        ("group_perms", &args.group_perm),
    ] {
        if entries.is_empty() {
            continue;
        }
        let map = table
            .entry(key)
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(map) = map else {
            bail!("`{key}` is not a table");
        };
        for entry in entries {
            let Some((name, perm)) = entry.split_once('=') else {
                bail!(
                    "--{} {entry:?}: expected NAME=PERM, for example orders=PUB",
                    key.trim_end_matches('s').replace('_', "-")
                );
            };
            if perm.eq_ignore_ascii_case("none") {
                map.remove(name);
            } else {
                map.insert(name.to_owned(), Value::String(perm.to_owned()));
            }
        }
    }
    for (key, list) in [
        ("trusted_addresses", &args.trusted_address),
        ("allowed_addresses", &args.allowed_address),
    ] {
        if !list.is_empty() {
            let values = list
                .iter()
                .filter(|pattern| !pattern.is_empty())
                .map(|pattern| Value::String(pattern.clone()))
                .collect();
            table.insert(key.into(), Value::Array(values));
            if list.iter().all(String::is_empty) {
                table.remove(key);
            }
        }
    }
    Ok(())
}
