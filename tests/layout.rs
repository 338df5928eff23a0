//! The workspace's layout rules, checked on the source itself:
//!
//! * within a crate, files import downwards only: no circle of `crate::`
//!   and `super::` paths between its files (re-exports, `pub use`, are
//!   doors and not uses; the core's handles and their factory, `Locker`,
//!   are the one pair allowed by name);
//! * CONTRIBUTING.md's file tables name every source file of every crate,
//!   and no file that is not there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Edges allowed to close a circle: (crate folder, from, to). A handle
/// (`Election`, `Semaphore`, `ReadWriteLock`) is made by the `Locker` and
/// acquires through it, as tokio's `Semaphore` and its permits do.
const ALLOWED: &[(&str, &str, &str)] = &[
    ("lock-core", "src/election.rs", "src/locker.rs"),
    ("lock-core", "src/permits.rs", "src/locker.rs"),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The folders of the workspace's crates: the members, and the root package.
fn crate_dirs() -> Vec<String> {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").expect("a members list");
    let end = start + manifest[start..].find(']').unwrap();
    let mut dirs: Vec<String> = manifest[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    dirs.push(".".to_owned());
    dirs
}

/// Every `.rs` file under `dir`, as paths relative to the crate folder.
fn rust_files(crate_dir: &Path, under: &str, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(crate_dir.join(under)) else {
        return;
    };
    for entry in entries {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = format!("{under}/{name}");
        if entry.file_type().unwrap().is_dir() {
            rust_files(crate_dir, &rel, out);
        } else if name.ends_with(".rs") {
            out.push(rel);
        }
    }
}

/// The module path a file defines (`src/a/b.rs` and `src/a/b/mod.rs`:
/// `["a", "b"]`; a crate root: `[]`).
fn module_of(file: &str) -> Vec<String> {
    let inner = file
        .strip_prefix("src/")
        .unwrap()
        .strip_suffix(".rs")
        .unwrap();
    let mut parts: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

/// The source without comments, string literals and `#[cfg(test)]`
/// modules: what is left names only what the code uses.
fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |n| n + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].bytes().take_while(|&b| b == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body
                + rest[body..]
                    .find(&close)
                    .map_or(rest.len() - body, |n| n + close.len());
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() && rest.as_bytes()[j] != b'"' {
                j += if rest.as_bytes()[j] == b'\\' { 2 } else { 1 };
            }
            i += j + 1;
            out.push_str("\"\"");
        } else if rest.starts_with("'") && rest.len() > 2 && rest.as_bytes()[2] == b'\'' {
            // A char literal such as '{' must not count as a brace.
            i += 3;
        } else if let Some(escaped) = rest.strip_prefix("'\\") {
            i += escaped.find('\'').map_or(rest.len(), |n| n + 3);
        } else if let Some(after) = test_only(rest) {
            // Skip the item that follows when it is a module with a body.
            let item = after.trim_start();
            let body_first = match (item.find('{'), item.find(';')) {
                (Some(open), Some(semi)) => open < semi,
                (open, _) => open.is_some(),
            };
            if item.starts_with("mod ") && body_first {
                let open = rest.len() - item.len() + item.find('{').unwrap();
                let mut depth = 0;
                let mut j = open;
                for (k, b) in rest.bytes().enumerate().skip(open) {
                    match b {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                j = k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                i += j;
            } else {
                i += rest.len() - after.len();
            }
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// What follows an attribute that compiles its item for tests only
/// (`#[cfg(test)]`, `#[cfg(all(test, …))]`), if `text` starts with one.
fn test_only(text: &str) -> Option<&str> {
    for start in ["#[cfg(test)]", "#[cfg(all(test,"] {
        if text.starts_with(start) {
            let end = text.find(")]")?;
            return Some(&text[end + 2..]);
        }
    }
    None
}

/// The child modules a file declares (`mod x;`, `pub mod x;`, after any
/// attribute on the same line); test modules are gone from `code` already.
fn children_of(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let decl = line.strip_suffix(';')?;
            let at = decl.rfind("mod ")?;
            let before = &decl[..at];
            // `mod` as a word of its own: `pub mod x;`, `] mod x;`, not `foo_mod x;`.
            let ok = before.is_empty() || before.ends_with(' ');
            let name = decl[at + 4..].trim();
            (ok && !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
                .then(|| name.to_owned())
        })
        .collect()
}

/// Whether the statement that the text before a path ends in is a
/// re-export (`pub use …`, `pub(crate) use …`).
fn in_reexport(before: &str) -> bool {
    let statement = before.rsplit([';', '{', '}']).next().unwrap_or("");
    let statement = statement.trim_start();
    statement.starts_with("pub use") || statement.starts_with("pub(crate) use")
}

/// Where in `code` a path that starts with `start` goes on, for each such
/// path that begins there (not the tail of a longer path or a name) and
/// is not re-exported: a re-export (`pub use crate::x::Y;`) is a door,
/// not a use, as the module that opens it does not depend on what it shows.
fn path_starts<'a>(code: &'a str, start: &'a str) -> impl Iterator<Item = usize> + 'a {
    code.match_indices(start).filter_map(move |(at, _)| {
        let before = code[..at].chars().next_back();
        let inside =
            before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':');
        (!inside && !in_reexport(&code[..at])).then_some(at + start.len())
    })
}

/// The module paths `code` names through `crate::` and `super::`, each
/// resolved from the module `here`.
fn paths_named(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        for from in path_starts(code, start) {
            let mut base: Vec<String> = if start == "crate::" {
                Vec::new()
            } else {
                here[..here.len().saturating_sub(1)].to_vec()
            };
            let mut rest = &code[from..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            parse_tree(rest, base, &mut found);
        }
    }
    found
}

/// The module paths `code` names through its own child modules
/// (`run::run(args)` in a `main.rs` that declares `mod run;`), resolved
/// from the module `here`; re-exports left out, as above.
fn child_paths_named(code: &str, here: &[String], children: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for child in children {
        for from in path_starts(code, &format!("{child}::")) {
            let mut base = here.to_vec();
            base.push(child.clone());
            parse_tree(&code[from..], base, &mut found);
        }
    }
    found
}

/// The names a module file re-exports from its own files (`pub use
/// child::{A, B};`, `pub use crate::x::A;`), each with the module path it
/// names, resolved from the module `here`.
fn reexports_of(code: &str, here: &[String], children: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for statement in code.split(';') {
        let statement = statement.trim_start();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let path = path.trim_start();
        let (base, rest) = if let Some(rest) = path.strip_prefix("crate::") {
            (Vec::new(), rest)
        } else if let Some(rest) = path.strip_prefix("self::") {
            (here.to_vec(), rest)
        } else if children.iter().any(|c| path.starts_with(&format!("{c}::"))) {
            (here.to_vec(), path)
        } else {
            continue;
        };
        parse_tree(rest, base, &mut found);
    }
    found
}

/// Reads one use-tree (`a::b::C`, `a::{b::C, d}`) from the start of
/// `text`, adding each full path to `out`; returns how much it read.
fn parse_tree(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix;
    let mut i = 0;
    loop {
        let rest = &text[i..];
        let skipped = rest.len() - rest.trim_start().len();
        i += skipped;
        let rest = &text[i..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut j = 1;
            loop {
                let inner = &text[i + j..];
                let ws = inner.len() - inner.trim_start().len();
                j += ws;
                if text[i + j..].starts_with('}') {
                    j += 1;
                    break;
                }
                if i + j >= text.len() {
                    break;
                }
                j += parse_tree(&text[i + j..], path.clone(), out);
                let inner = &text[i + j..];
                j += inner.len() - inner.trim_start().len();
                if text[i + j..].starts_with(',') {
                    j += 1;
                }
            }
            let _ = group;
            return i + j;
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            out.push(path);
            return i;
        }
        i += ident.len();
        if ident != "self" {
            path.push(ident);
        }
        if text[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(path);
            return i;
        }
    }
}

/// A crate's modules: each module path's file, and the names each module
/// re-exports with the path they stand for.
struct Modules {
    files: BTreeMap<Vec<String>, String>,
    reexports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

impl Modules {
    /// The file that defines the longest module prefix of `path`; a name
    /// that module re-exports leads on to the file it comes from.
    fn file_of(&self, path: &[String]) -> Option<String> {
        let n = (0..=path.len())
            .rev()
            .find(|n| self.files.contains_key(&path[..*n]))?;
        let module = &path[..n];
        if let Some(target) = path
            .get(n)
            .and_then(|name| self.reexports.get(module)?.get(name))
        {
            if target.as_slice() != path {
                if let Some(file) = self.file_of(target) {
                    return Some(file);
                }
            }
        }
        self.files.get(module).cloned()
    }
}

/// Each file's `crate::`/`super::` edges to other files of its crate.
fn edges_of(crate_dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let dir = root().join(crate_dir);
    let mut files = Vec::new();
    rust_files(&dir, "src", &mut files);
    // Every file's code, module path and declared children, read once.
    let read: BTreeMap<String, (String, Vec<String>, Vec<String>)> = files
        .iter()
        .filter(|f| !f.starts_with("src/bin/"))
        .map(|f| {
            let code = code_of(&fs::read_to_string(dir.join(f)).unwrap());
            let children = children_of(&code);
            (f.clone(), (code, module_of(f), children))
        })
        .collect();
    // A package with a library and a binary has two roots; the library's
    // modules are the ones its lib.rs declares.
    let lib_mods: BTreeSet<String> = read
        .get("src/lib.rs")
        .map(|(_, _, children)| children.iter().cloned().collect())
        .unwrap_or_default();
    let has_main = read.contains_key("src/main.rs");
    let in_lib_of = |file: &str, module: &[String]| {
        module.first().is_some_and(|m| lib_mods.contains(m)) || file == "src/lib.rs" || !has_main
    };
    let mut edges = BTreeMap::new();
    for (file, (code, here, children)) in &read {
        let in_lib = in_lib_of(file, here);
        let mut modules = Modules {
            files: BTreeMap::new(),
            reexports: BTreeMap::new(),
        };
        for (f, (c, m, kids)) in &read {
            let mine = if m.is_empty() {
                f == if in_lib { "src/lib.rs" } else { "src/main.rs" }
            } else {
                in_lib_of(f, m) == in_lib
            };
            if mine {
                modules.files.insert(m.clone(), f.clone());
                let names = reexports_of(c, m, kids)
                    .into_iter()
                    .filter_map(|p| Some((p.last()?.clone(), p)))
                    .collect();
                modules.reexports.insert(m.clone(), names);
            }
        }
        let mut named = paths_named(code, here);
        named.extend(child_paths_named(code, here, children));
        let to: BTreeSet<String> = named
            .iter()
            .filter_map(|p| modules.file_of(p))
            .filter(|f| f != file)
            .collect();
        edges.insert(file.clone(), to);
    }
    edges
}

/// The circles of a graph: its strongly connected parts of two or more
/// files (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut part = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    part.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn files_import_downwards_only() {
    let mut report = Vec::new();
    for dir in crate_dirs() {
        let mut edges = edges_of(&dir);
        for (krate, from, to) in ALLOWED {
            if *krate == dir {
                if let Some(set) = edges.get_mut(*from) {
                    set.remove(*to);
                }
            }
        }
        for circle in circles(&edges) {
            let ties: Vec<String> = circle
                .iter()
                .flat_map(|f| {
                    edges[f]
                        .iter()
                        .filter(|t| circle.contains(t))
                        .map(move |t| format!("{f} -> {t}"))
                })
                .collect();
            report.push(format!("{dir}: {}", ties.join(", ")));
        }
    }
    assert!(
        report.is_empty(),
        "files that import each other in a circle (CONTRIBUTING: files import downwards \
         only):\n{}",
        report.join("\n")
    );
}

/// The parser sees what the test relies on: grouped paths, `super::`,
/// and nothing inside strings, comments or test modules.
#[test]
fn the_import_reader_reads_paths() {
    let here = vec!["a".to_owned(), "b".to_owned()];
    let code = code_of(
        "use crate::{x::Y, z::{W, V}};\nuse super::c::D; // crate::no\nlet s = \"crate::no\";\n\
         #[cfg(test)]\nmod tests { use crate::no; }\nfn f() { super::super::e::f(); }",
    );
    let mut got: Vec<String> = paths_named(&code, &here)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    got.sort();
    assert_eq!(got, ["a::c::D", "e::f", "x::Y", "z::V", "z::W"]);
    let root_code = code_of("fn main() { run::run(a); }\npub use demo::Shown;\nuse x::y;");
    let kids = ["run".to_owned(), "demo".to_owned()];
    let got: Vec<String> = child_paths_named(&root_code, &[], &kids)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(got, ["run::run"]);
    let decls = "mod a;\npub mod b;\n#[cfg(feature = \"x\")] mod c;\npub(crate) mod d;\nfoo_mod e;";
    assert_eq!(children_of(&code_of(decls)), ["a", "b", "c", "d"]);
    let to = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let modules = Modules {
        files: BTreeMap::from([
            (to(&[]), "lib.rs".to_owned()),
            (to(&["x"]), "x.rs".to_owned()),
        ]),
        reexports: BTreeMap::from([(to(&[]), BTreeMap::from([("Y".to_owned(), to(&["x", "Y"]))]))]),
    };
    assert_eq!(modules.file_of(&to(&["Y"])).as_deref(), Some("x.rs"));
    assert_eq!(modules.file_of(&to(&["Z"])).as_deref(), Some("lib.rs"));
    let reexported = reexports_of(
        &code_of("pub use x::{Y, Z};\npub use other_crate::W;"),
        &[],
        &to(&["x"]),
    );
    assert_eq!(reexported, [to(&["x", "Y"]), to(&["x", "Z"])]);
    let mut edges = BTreeMap::new();
    edges.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    edges.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    edges.insert("c".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(circles(&edges), [vec!["a".to_owned(), "b".to_owned()]]);
}

/// The file tables in CONTRIBUTING.md: under a heading naming a crate's
/// folder (`` ### `backend-etcd/` ``), each row's first cell is a file
/// of its `src/`.
fn contributing_tables() -> BTreeMap<String, BTreeSet<String>> {
    let text = fs::read_to_string(root().join("CONTRIBUTING.md")).unwrap();
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### `") {
            current = h
                .split('`')
                .next()
                .map(|d| d.trim_end_matches('/').to_owned());
            if let Some(c) = &current {
                tables.entry(c.clone()).or_default();
            }
        } else if line.starts_with("## ") {
            current = None;
        } else if let (Some(c), Some(row)) = (&current, line.strip_prefix("| `")) {
            for name in row.split('|').next().unwrap_or("").split('`').step_by(2) {
                let name = name.trim().trim_matches(',').trim();
                if name.ends_with(".rs") {
                    tables.get_mut(c).unwrap().insert(name.to_owned());
                }
            }
        }
    }
    tables
}

#[test]
fn contributing_lists_every_file() {
    let tables = contributing_tables();
    let mut wrong = Vec::new();
    for dir in crate_dirs() {
        let mut files = Vec::new();
        rust_files(&root().join(&dir), "src", &mut files);
        let files: BTreeSet<String> = files
            .iter()
            .map(|f| f.strip_prefix("src/").unwrap().to_owned())
            .collect();
        let shown = if dir == "." { "src" } else { &dir };
        let Some(listed) = tables.get(shown) else {
            wrong.push(format!("no table for `{shown}/`"));
            continue;
        };
        for f in files.difference(listed) {
            wrong.push(format!("{shown}/src/{f} is in no table"));
        }
        for f in listed.difference(&files) {
            wrong.push(format!(
                "`{shown}/`'s table lists {f}, which does not exist"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "CONTRIBUTING.md's file tables and the tree disagree:\n{}",
        wrong.join("\n")
    );
}
