//! The client's modules stay layered: reading the sources, each top-level module's `crate::`
//! and `super::` paths may only point down, so the module graph has no cycle. Checked for the
//! library (`src/lib.rs` and its modules; `push/*.rs` counts as `push`) and for the `shardmq`
//! binary (`src/bin/shardmq/`).
//!
//! Owns: a small source scanner (comments, strings and `#[cfg(test)]` items dropped; `mod x {`
//! blocks followed so that `super::` resolves) and the cycle check. A path naming an item of
//! the crate root (not one of its modules) counts as an edge to the root, and the root depends
//! on every module it declares, so a module that reaches back into `lib.rs` or `main.rs` makes
//! a cycle too. Calls to methods defined in another module (`impl ConnectionPool` blocks spread
//! over several modules) need no path and are not seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Name of the crate root in the graph.
const ROOT: &str = "<root>";

/// `source` without comments, with string and char literals emptied (so that their text is not
/// read as code), keeping line breaks so that line numbers still hold.
fn strip_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    Some(_) => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                } else if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{1}'), or else a lifetime or label.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` (already stripped) with every `#[cfg(test)]` item blanked out, line breaks kept.
fn strip_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let chars: Vec<char> = code.chars().collect();
    let mark: Vec<char> = MARK.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < chars.len() {
        if !chars[i..].starts_with(&mark) {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        // The item ends at the first `;` or at the `}` closing the first `{`, outside any
        // parentheses or brackets (a `[u8; 4]` in a signature is not the end), or before the
        // `}` closing what holds it.
        let mut nesting = 0i32;
        let mut end = chars.len();
        for (j, c) in chars.iter().enumerate().skip(i + mark.len()) {
            match c {
                '(' | '[' => nesting += 1,
                ')' | ']' => nesting -= 1,
                ';' if nesting == 0 => {
                    end = j + 1;
                    break;
                }
                '{' if nesting == 0 => {
                    end = (closing_brace(&chars, j) + 1).min(chars.len());
                    break;
                }
                '}' if nesting == 0 => {
                    end = j;
                    break;
                }
                _ => {}
            }
        }
        out.extend(chars[i..end].iter().filter(|c| **c == '\n'));
        i = end;
    }
    out
}

/// Index in `chars` of the `}` matching the `{` at `open`.
fn closing_brace(chars: &[char], open: usize) -> usize {
    let mut depth = 0;
    for (index, c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return index;
                }
            }
            _ => {}
        }
    }
    chars.len()
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// One path reference: the module path it resolves to, plus the first segment after it (or
/// each first segment of a `{…}` group), and the line.
struct Reference {
    line: usize,
    targets: Vec<Vec<String>>,
}

/// Every `crate::`, `super::` and `self::` path in `code`, resolved against `module` (the
/// path of the file's module), following inline `mod x {` blocks.
fn references(code: &str, module: &[String]) -> Vec<Reference> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    // Inline modules open at these brace depths.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut line = 1;
    let mut i = 0;
    let word_at = |i: usize| -> String {
        chars[i..]
            .iter()
            .take_while(|c| is_ident_char(**c))
            .collect()
    };
    let skip_space = |mut i: usize| -> usize {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c == '{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == '}' {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(_, at)| *at == depth) {
                inline.pop();
            }
            i += 1;
            continue;
        }
        if !is_ident_char(c) || (i > 0 && is_ident_char(chars[i - 1])) {
            i += 1;
            continue;
        }
        let word = word_at(i);
        let after = i + word.chars().count();
        if word == "mod" {
            // `mod name {` opens an inline module; `mod name;` names a file.
            let name_at = skip_space(after);
            let name = word_at(name_at);
            let brace_at = skip_space(name_at + name.chars().count());
            if !name.is_empty() && chars.get(brace_at) == Some(&'{') {
                inline.push((name, depth));
            }
            i = after;
            continue;
        }
        let is_path_start = matches!(word.as_str(), "crate" | "super" | "self")
            && chars.get(after) == Some(&':')
            && chars.get(after + 1) == Some(&':')
            && !(i >= 2 && chars[i - 1] == ':' && chars[i - 2] == ':');
        if !is_path_start {
            i = after;
            continue;
        }
        let mut path: Vec<String> = module.to_vec();
        path.extend(inline.iter().map(|(name, _)| name.clone()));
        let mut j = i;
        loop {
            let segment = word_at(j);
            let segment_end = j + segment.chars().count();
            let has_more =
                chars.get(segment_end) == Some(&':') && chars.get(segment_end + 1) == Some(&':');
            match segment.as_str() {
                "crate" if j == i => path.clear(),
                "super" => {
                    path.pop();
                }
                "self" => {}
                _ => break,
            }
            if !has_more {
                break;
            }
            j = skip_space(segment_end + 2);
        }
        let mut targets = Vec::new();
        if chars.get(j) == Some(&'{') {
            // `crate::{a::X, b}`: the first segment of each entry.
            let group_end = closing_brace(&chars, j);
            let mut expect_segment = true;
            let mut nesting = 0;
            let mut k = j + 1;
            while k < group_end {
                let ch = chars[k];
                if ch == '{' {
                    nesting += 1;
                } else if ch == '}' {
                    nesting -= 1;
                } else if ch == ',' && nesting == 0 {
                    expect_segment = true;
                } else if is_ident_char(ch) && expect_segment && nesting == 0 {
                    let segment = word_at(k);
                    let mut target = path.clone();
                    target.push(segment.clone());
                    targets.push(target);
                    expect_segment = false;
                    k += segment.chars().count();
                    continue;
                }
                k += 1;
            }
        } else {
            let segment = word_at(j);
            let mut target = path.clone();
            if !segment.is_empty() {
                target.push(segment);
            }
            targets.push(target);
        }
        found.push(Reference { line, targets });
        i = j.max(after);
    }
    found
}

/// The `mod x;` / `pub mod x;` / `pub(crate) mod x;` declarations of a root file.
fn declared_modules(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?.trim();
            Some(name.to_owned())
        })
        .collect()
}

fn rust_files(dir: &Path, skip: Option<&Path>, into: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if Some(path.as_path()) == skip {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, skip, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The dependency graph of a crate's top-level modules: module → (module it uses → where).
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// Reads the crate whose root is `root_file` (its modules are the other `.rs` files of the
/// root's directory and below, except `skip`).
fn module_graph(root_file: &Path, skip: Option<&Path>) -> Graph {
    let dir = root_file.parent().unwrap();
    let root_code = std::fs::read_to_string(root_file).unwrap();
    let modules = declared_modules(&strip_comments_and_literals(&root_code));
    assert!(
        !modules.is_empty(),
        "{} declares no modules",
        root_file.display()
    );
    let mut graph: Graph = BTreeMap::new();
    graph.insert(
        ROOT.to_owned(),
        modules
            .iter()
            .map(|m| (m.clone(), "declared by the crate root".to_owned()))
            .collect(),
    );
    let mut files = Vec::new();
    rust_files(dir, skip, &mut files);
    for file in files {
        let relative = file.strip_prefix(dir).unwrap();
        let mut module: Vec<String> = relative
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        if file == root_file {
            continue;
        }
        let Some(from) = module.first().cloned() else {
            continue;
        };
        assert!(
            modules.contains(&from),
            "{} is not under a module the crate root declares ({modules:?})",
            file.display()
        );
        let source = std::fs::read_to_string(&file).unwrap();
        let code = strip_test_items(&strip_comments_and_literals(&source));
        let edges = graph.entry(from.clone()).or_default();
        for reference in references(&code, &module) {
            for target in reference.targets {
                let to = match target.first() {
                    Some(first) if modules.contains(first) => first.clone(),
                    _ => ROOT.to_owned(),
                };
                if to != from {
                    edges
                        .entry(to)
                        .or_insert_with(|| format!("{}:{}", relative.display(), reference.line));
                }
            }
        }
    }
    graph
}

/// Every cycle found (each as a list of modules, first repeated last), one per strongly
/// connected group of modules.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    for start in graph.keys() {
        if done.contains(start) {
            continue;
        }
        // Depth-first search for a path back to `start`.
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        let mut seen: BTreeSet<String> = BTreeSet::new();
        while let Some((node, path)) = stack.pop() {
            for next in graph.get(&node).into_iter().flat_map(|edges| edges.keys()) {
                if next == start {
                    let mut cycle = path.clone();
                    cycle.push(start.clone());
                    done.extend(cycle.iter().cloned());
                    found.push(cycle);
                    stack.clear();
                    break;
                }
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found
}

/// The modules bottom first (each after everything it uses); `None` when there is a cycle.
fn layers(graph: &Graph) -> Option<Vec<String>> {
    let mut order: Vec<String> = Vec::new();
    let mut left: BTreeSet<&String> = graph.keys().collect();
    while !left.is_empty() {
        let ready: Vec<&String> = left
            .iter()
            .copied()
            .filter(|m| {
                graph[*m]
                    .keys()
                    .all(|used| order.contains(used) || !graph.contains_key(used))
            })
            .collect();
        if ready.is_empty() {
            return None;
        }
        for module in ready {
            left.remove(module);
            order.push(module.clone());
        }
    }
    Some(order)
}

fn check(root_file: &Path, skip: Option<&Path>) {
    let graph = module_graph(root_file, skip);
    let found = cycles(&graph);
    let explain = |cycle: &[String]| {
        cycle
            .windows(2)
            .map(|pair| format!("{} -> {} ({})", pair[0], pair[1], graph[&pair[0]][&pair[1]]))
            .collect::<Vec<_>>()
            .join(", ")
    };
    assert!(
        found.is_empty(),
        "module import cycles in {}:\n{}",
        root_file.display(),
        found
            .iter()
            .map(|cycle| format!("  {}", explain(cycle)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let order = layers(&graph).expect("no cycle, so a layered order");
    println!("{}: {}", root_file.display(), order.join(" < "));
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn library_modules_are_layered() {
    let src = src();
    check(&src.join("lib.rs"), Some(&src.join("bin")));
}

#[test]
fn cli_modules_are_layered() {
    check(&src().join("bin/shardmq/main.rs"), None);
}

#[test]
fn the_scanner_sees_climbing_imports() {
    let code = strip_test_items(&strip_comments_and_literals(
        "//! see crate::ignored\nuse crate::{a::X, b};\nuse super::c::Y;\n\
         fn f() { let s = \"crate::d\"; let c = '\"'; crate::e::g(); }\n\
         mod inner { use super::super::h; }\n\
         #[cfg(test)]\nmod tests { use crate::i; }\n",
    ));
    let module = ["m".to_owned()];
    let firsts: Vec<(usize, String)> = references(&code, &module)
        .into_iter()
        .flat_map(|r| {
            r.targets
                .into_iter()
                .map(move |t| (r.line, t.first().cloned().unwrap_or_default()))
        })
        .collect();
    let expected: Vec<(usize, String)> = [(2, "a"), (2, "b"), (3, "c"), (4, "e"), (5, "h")]
        .into_iter()
        .map(|(line, m)| (line, m.to_owned()))
        .collect();
    assert_eq!(firsts, expected);
    let mut graph: Graph = BTreeMap::new();
    graph.insert("a".into(), [("b".to_owned(), String::new())].into());
    graph.insert("b".into(), [("a".to_owned(), String::new())].into());
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "a"]]);
    assert!(layers(&graph).is_none());
}
