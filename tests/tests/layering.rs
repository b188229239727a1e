//! The layers of the workspace, locked in (docs/architecture.md):
//!
//! - every crate depends only on the crates below it on the ladder (`codec`, `schema` <
//!   `store` < `base` < `services` < `broker`; the client, name server, perf and tests beside
//!   it), read from every `Cargo.toml`: a climbing dependency fails here even where the
//!   compiler would accept it;
//! - inside the broker crate, `mesh` < `storage/` | `network/` < `control/` < `runtime`: the
//!   network shard never names the storage shard or the control plane, the storage shard never
//!   names the network shard or the control plane, the mesh names neither shard, and nothing
//!   but `runtime` and `main` starts the control plane. Read from the sources (`crate::` paths,
//!   comments left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shardmq crates each package may depend on (normal, dev and build dependencies alike).
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let set = |names: &[&'static str]| names.iter().copied().collect::<BTreeSet<_>>();
    BTreeMap::from([
        ("shardmq-schema", set(&[])),
        ("shardmq-codec", set(&[])),
        ("shardmq-remoting", set(&[])),
        ("shardmq-filter", set(&[])),
        ("shardmq-acl", set(&[])),
        ("shardmq-tls", set(&[])),
        ("shardmq-store", set(&["shardmq-codec", "shardmq-filter"])),
        (
            "shardmq-base",
            set(&[
                "shardmq-store",
                "shardmq-codec",
                "shardmq-schema",
                "shardmq-tls",
            ]),
        ),
        (
            "shardmq-services",
            set(&[
                "shardmq-base",
                "shardmq-store",
                "shardmq-codec",
                "shardmq-schema",
                "shardmq-acl",
                "shardmq-tls",
            ]),
        ),
        (
            "shardmq-broker",
            set(&[
                "shardmq-services",
                "shardmq-base",
                "shardmq-store",
                "shardmq-codec",
                "shardmq-schema",
                "shardmq-remoting",
                "shardmq-filter",
                "shardmq-acl",
                "shardmq-tls",
            ]),
        ),
        (
            "shardmq-namesrv",
            set(&[
                "shardmq-schema",
                "shardmq-codec",
                "shardmq-remoting",
                "shardmq-acl",
                "shardmq-tls",
            ]),
        ),
        (
            "shardmq-client",
            set(&[
                "shardmq-schema",
                "shardmq-codec",
                "shardmq-filter",
                "shardmq-acl",
                "shardmq-tls",
            ]),
        ),
        (
            "shardmq-perf",
            set(&[
                "shardmq-store",
                "shardmq-client",
                "shardmq-codec",
                "shardmq-schema",
            ]),
        ),
        (
            "shardmq-tests",
            set(&[
                "shardmq-schema",
                "shardmq-codec",
                "shardmq-client",
                "shardmq-remoting",
                "shardmq-tls",
            ]),
        ),
        (
            "shardmq-fuzz",
            set(&[
                "shardmq-schema",
                "shardmq-codec",
                "shardmq-store",
                "shardmq-client",
                "shardmq-remoting",
                "shardmq-filter",
            ]),
        ),
    ])
}

/// (package name, shardmq dependencies) of the manifest at `path`.
fn manifest(path: &Path) -> (String, BTreeSet<String>) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let value: toml::Value = text
        .parse()
        .unwrap_or_else(|e| panic!("{} is not TOML: {e}", path.display()));
    let name = value["package"]["name"].as_str().unwrap().to_owned();
    let mut dependencies = BTreeSet::new();
    for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(deps) = value.get(table).and_then(toml::Value::as_table) {
            dependencies.extend(
                deps.keys()
                    .filter(|dep| dep.starts_with("shardmq-"))
                    .cloned(),
            );
        }
    }
    (name, dependencies)
}

/// Every package manifest: the workspace's members, and the fuzz crate (a workspace of its own).
fn manifests() -> Vec<PathBuf> {
    let root = workspace();
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let value: toml::Value = text.parse().unwrap();
    let mut paths: Vec<PathBuf> = value["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|member| root.join(member.as_str().unwrap()).join("Cargo.toml"))
        .collect();
    paths.push(root.join("fuzz").join("Cargo.toml"));
    paths
}

/// What `dependencies` of `package` climb or leave the ladder, as readable lines.
fn climbs(package: &str, dependencies: &BTreeSet<String>) -> Vec<String> {
    let allowed = allowed();
    let Some(may) = allowed.get(package) else {
        return vec![format!(
            "{package} is not on the ladder: give it a place in tests/tests/layering.rs and docs/architecture.md"
        )];
    };
    dependencies
        .iter()
        .filter(|dep| !may.contains(dep.as_str()))
        .map(|dep| format!("{package} depends on {dep}, which it may not (it may use {may:?})"))
        .collect()
}

#[test]
fn crate_dependencies_point_down_the_ladder() {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for path in manifests() {
        let (package, dependencies) = manifest(&path);
        problems.extend(climbs(&package, &dependencies));
        seen.insert(package);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Every crate of the ladder is still there (a renamed crate must be renamed here too).
    let missing: Vec<_> = allowed()
        .into_keys()
        .filter(|package| !seen.contains(*package))
        .collect();
    assert!(missing.is_empty(), "no manifest for {missing:?}");
}

#[test]
fn the_ladder_check_refuses_a_climb() {
    let climbing: BTreeSet<String> = ["shardmq-codec", "shardmq-base"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let problems = climbs("shardmq-store", &climbing);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("shardmq-store depends on shardmq-base"));
    assert_eq!(climbs("shardmq-new", &BTreeSet::new()).len(), 1);
}

/// `source` without `//` and `/* */` comments (string contents are kept: a path in a string
/// is not an import, and none of ours holds one).
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |end| &after[end..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |end| &after[end + 2..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The broker's top-level modules that `source` names through `crate::` paths, alone
/// (`crate::storage::…`) or in a group (`use crate::{mesh, storage};`).
fn named_modules(source: &str) -> BTreeSet<String> {
    let code = strip_comments(source);
    let mut names = BTreeSet::new();
    let ident = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    names.insert(name);
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// What the broker crate's module groups may not name: (files, forbidden modules).
fn broker_rules() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("mesh.rs", &["network", "storage", "control", "runtime"]),
        ("network", &["storage", "control", "runtime"]),
        ("storage", &["network", "control", "runtime"]),
        ("control", &["storage", "runtime"]),
    ]
}

/// The climbs in the broker's sources under `src`, as readable lines.
fn broker_climbs(src: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (group, forbidden) in broker_rules() {
        let path = src.join(group);
        let files = if path.is_dir() {
            rust_files(&path)
        } else {
            vec![path]
        };
        assert!(
            !files.is_empty(),
            "{group} has no sources under {}",
            src.display()
        );
        for file in files {
            let source = std::fs::read_to_string(&file).unwrap();
            for name in named_modules(&source) {
                if forbidden.contains(&name.as_str()) {
                    problems.push(format!(
                        "{} names crate::{name}: {group} may not name {forbidden:?}",
                        file.strip_prefix(src).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn broker_modules_do_not_climb() {
    let src = workspace().join("broker").join("src");
    let problems = broker_climbs(&src);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_module_check_sees_paths_and_groups_but_not_comments() {
    let source = "use crate::mesh::StorageRequest;\n\
                  use crate::{config, storage};\n\
                  // crate::control is only mentioned here\n\
                  /* and crate::runtime here */\n\
                  fn f() { crate::network::accept(); }\n";
    let names = named_modules(source);
    let expected: BTreeSet<String> = ["mesh", "config", "storage", "network"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, expected);
}
