//! The crates' module graphs have no import circles: a module that names
//! another (`use crate::a::b`, `crate::a::b::f()`, `super::b`) depends on
//! it, and no two modules may depend on each other through any chain,
//! unless one contains the other (a parent and its children share their
//! items freely).
//!
//! The graph is read from the sources: each file is a module (`lib.rs` and
//! `main.rs` the root, `a/mod.rs` and `a.rs` the module `a`, `a/b.rs`
//! `a::b`), a path names the deepest module it reaches, and comments, what
//! follows a file's first `#[cfg(test)]` and files marked `#![cfg(test)]`
//! are left out (tests may reach anywhere).
//! Circles found are compared with [`KNOWN_CIRCLES`], the ones not broken
//! yet: a new circle fails the test, and so does a listed one that is gone
//! (take it off the list).
//!
//! It also checks that docs/architecture.md's module table names every
//! top-level module of the store, and none that is gone.
//!
//! Run: `cargo test --release -p integration-tests --test integration module_graph::`

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use integration_tests::binary::workspace_root;

/// Circles not broken yet, per crate: each the sorted modules of one
/// strongly connected component, joined by `, `.
const KNOWN_CIRCLES: &[(&str, &str)] = &[];

/// The crates whose sources are checked.
const CRATES: &[&str] = &[
    "store",
    "gateway",
    "bench",
    "proto",
    "bolt",
    "batched-writes",
];

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file under `src` is (`""` for the crate root; binaries
/// under `src/bin` are roots of their own and left out).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    Some(parts.join("::"))
}

/// The deepest known module that `path` (segments after `crate::`)
/// reaches.
fn deepest(modules: &BTreeSet<String>, segments: &[&str]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// The module paths a source names: `crate::...` and `super::...` (made
/// absolute from `module`), each as its segments; a `use` group
/// (`crate::{a, b::c}`) names each of its paths.
fn named_paths(module: &str, source: &str) -> Vec<Vec<String>> {
    if source.lines().any(|line| line.trim() == "#![cfg(test)]") {
        return Vec::new(); // a file of tests
    }
    let code: String = source
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .map(|line| match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let code = code.as_str();
    let mut found = Vec::new();
    for (start, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if code[..start].ends_with(|c: char| is_ident(c) || c == ':' || c == '$') {
            continue; // `$crate::`, `a::super::`, part of a longer path
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &code[start..];
        if let Some(after) = rest.strip_prefix("crate::") {
            rest = after;
        } else {
            base = module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
        }
        expand(base, rest, &mut found);
    }
    found
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Adds to `found` the paths `text` names after `base` (a path, or a
/// `{...}` group of paths).
fn expand(mut base: Vec<String>, text: &str, found: &mut Vec<Vec<String>>) {
    let mut rest = text;
    loop {
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            break;
        }
        base.push(name.clone());
        rest = &rest[name.len()..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0usize;
        let mut item = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    expand(base.clone(), group[item..i].trim_start(), found);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(base.clone(), group[item..i].trim_start(), found);
                    item = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    found.push(base);
}

fn related(a: &str, b: &str) -> bool {
    let inside = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}::"));
    inside(a, b) || inside(b, a)
}

/// The crate's dependency edges between unrelated modules.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let sources: Vec<(String, String)> = files
        .iter()
        .filter_map(|f| Some((module_of(src, f)?, std::fs::read_to_string(f).ok()?)))
        .collect();
    let modules: BTreeSet<String> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, source) in &sources {
        for path in named_paths(module, source) {
            let segments: Vec<&str> = path.iter().map(String::as_str).collect();
            let Some(target) = deepest(&modules, &segments) else {
                continue;
            };
            if !related(module, &target) {
                graph.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's
/// algorithm), each sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: BTreeSet<String>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.insert(component.join(", "));
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: BTreeSet::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn no_new_import_circles_between_modules() {
    let mut report = Vec::new();
    for krate in CRATES {
        let src = workspace_root().join(krate).join("src");
        assert!(src.is_dir(), "{} is not a directory", src.display());
        let found = circles(&edges(&src));
        let known: BTreeSet<String> = KNOWN_CIRCLES
            .iter()
            .filter(|(k, _)| k == krate)
            .map(|(_, c)| c.to_string())
            .collect();
        for new in found.difference(&known) {
            report.push(format!("{krate}: new import circle: {new}"));
        }
        for gone in known.difference(&found) {
            report.push(format!(
                "{krate}: circle gone, take it off KNOWN_CIRCLES: {gone}"
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

#[test]
fn the_reader_finds_a_circle_and_resolves_super() {
    let paths = named_paths(
        "server::v3rpc::lock",
        "use super::concurrency::{a, b::{c, d}};\nuse crate::{kv, auth::X};\n\
         let x = crate::kv::range::f(); $crate::no::y();\n#[cfg(test)]\nuse crate::tests::z;",
    );
    let text: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        text,
        [
            "kv",
            "auth::X",
            "kv::range::f",
            "server::v3rpc::concurrency::a",
            "server::v3rpc::concurrency::b::c",
            "server::v3rpc::concurrency::b::d",
        ]
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(circles(&graph), BTreeSet::from(["a, b, c".to_string()]));
    assert!(related("server", "server::core") && related("", "kv"));
    assert!(!related("server::core", "server::duties::corruption"));
}

/// docs/architecture.md's table of the store's modules names each of its
/// top-level modules, and no module that is gone.
#[test]
fn the_architecture_names_every_store_module() {
    let root = workspace_root();
    let mut modules = modules_in(&root.join("store/src"));
    for root_or_binaries in ["lib", "main", "bin"] {
        modules.remove(root_or_binaries);
    }
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let table = doc
        .split("| module | responsibility |")
        .nth(1)
        .expect("the module table");
    let mut named = BTreeSet::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap_or("");
        named.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
    }
    let missing: Vec<_> = modules.difference(&named).collect();
    let gone: Vec<_> = named.difference(&modules).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/architecture.md's module table: missing {missing:?}, not modules {gone:?}"
    );
}

/// The module names a folder holds: its `.rs` files (without `mod.rs`)
/// and its sub-folders.
fn modules_in(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() {
            names.insert(name);
        } else if let Some(module) = name.strip_suffix(".rs") {
            if module != "mod" {
                names.insert(module.to_string());
            }
        }
    }
    names
}

/// docs/architecture.md's module graph names each room of the store's
/// `server` (`├─ <room>/{...}`) with every module in it, and no room
/// that is gone.
#[test]
fn the_architecture_names_every_server_room_and_its_modules() {
    let root = workspace_root();
    let server = root.join("store/src/server");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let graph = doc
        .split("  └─ server ")
        .nth(1)
        .and_then(|rest| rest.split("\n  └─ ").next())
        .expect("the server's part of the module graph");
    let mut rooms_named = BTreeSet::new();
    for line in graph.lines() {
        // A room's line; a line under one starts with `│`.
        let Some(entry) = line
            .trim_start()
            .strip_prefix('├')
            .or_else(|| line.trim_start().strip_prefix('└'))
        else {
            continue;
        };
        let entry = entry.trim_start_matches('─').trim();
        if let Some((room, _)) = entry.split_once("/{") {
            rooms_named.insert(room.to_string());
        }
    }
    let rooms: BTreeSet<String> = modules_in(&server);
    assert_eq!(
        rooms_named, rooms,
        "docs/architecture.md: the server's rooms"
    );
    let listed: BTreeSet<String> = graph
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect();
    for room in &rooms {
        let missing: Vec<String> = modules_in(&server.join(room))
            .difference(&listed)
            .cloned()
            .collect();
        assert!(
            missing.is_empty(),
            "docs/architecture.md: server::{room} has modules the graph does not name: {missing:?}"
        );
    }
}
