//! The workspace's layout rules, checked from the sources: no import cycle
//! between files in any crate (a file's imports are resolved to the files
//! that define what it names, through `pub use` re-exports), and in the
//! proxy no file imports from a protocol folder other than its own, but the
//! crate root and `proxy.rs`, the layer that dispatches to both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's source files by module path (`[]` is the root).
struct Crate {
    src: PathBuf,
    root: String,
    files: BTreeMap<Vec<String>, String>,
    /// Modules compiled for tests only.
    test_only: Vec<Vec<String>>,
}

impl Crate {
    fn load(src: PathBuf, root: &str) -> Crate {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let module = module_of(&src, &path, root);
                    files.insert(module, std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        // Modules compiled for tests only (`#[cfg(test)] mod x;`) are not
        // part of the layout.
        let test_only: Vec<Vec<String>> = files
            .iter()
            .flat_map(|(module, text)| {
                text.split("#[cfg(test)]").skip(1).filter_map(move |after| {
                    let decl = after.trim_start().lines().next()?;
                    let name =
                        decl.strip_prefix("pub(crate) ").unwrap_or(decl).strip_prefix("mod ")?.strip_suffix(';')?;
                    Some([module.clone(), vec![name.to_owned()]].concat())
                })
            })
            .collect();
        files.retain(|m, _| !test_only.contains(m));
        let files = files.into_iter().map(|(m, text)| (m, strip(&text))).collect();
        Crate { src, root: root.to_owned(), files, test_only }
    }

    fn name(&self, module: &[String]) -> String {
        if module.is_empty() {
            return self.root.clone();
        }
        let joined = module.join("/");
        if self.src.join(format!("{joined}.rs")).exists() {
            format!("{joined}.rs")
        } else {
            format!("{joined}/mod.rs")
        }
    }

    /// The file a path names from `module`: the deepest module it walks
    /// through, or the file a re-export there leads to.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        let (mut at, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "super" => {
                let mut m = module.to_vec();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop()?;
                    rest = &rest[1..];
                }
                (m, rest)
            }
            "self" => (module.to_vec(), &path[1..]),
            // A path relative to the module: a child module's name.
            first if self.files.contains_key(&[module, &[first.to_owned()]].concat()) => (module.to_vec(), path),
            _ => return None,
        };
        let mut i = 0;
        while i < rest.len() {
            let mut child = at.clone();
            child.push(rest[i].clone());
            if self.test_only.contains(&child) {
                return None;
            }
            if self.files.contains_key(&child) {
                at = child;
                i += 1;
            } else {
                break;
            }
        }
        if i < rest.len() && depth < 8 {
            // An item of `at`: follow `at`'s re-export of it, if any.
            let item = &rest[i];
            for reexport in uses(&self.files[&at]).into_iter().filter(|u| u.public) {
                if reexport.path.last() == Some(item) || reexport.alias.as_ref() == Some(item) {
                    if let Some(target) = self.resolve(&at, &reexport.path, depth + 1) {
                        return Some(target);
                    }
                }
            }
        }
        Some(at)
    }

    /// File-level import edges.
    fn edges(&self) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let mut graph = BTreeMap::new();
        for (module, text) in &self.files {
            let mut targets = BTreeSet::new();
            let mut paths: Vec<Vec<String>> = uses(text).into_iter().map(|u| u.path).collect();
            paths.extend(inline_paths(text));
            for p in paths {
                if let Some(t) = self.resolve(module, &p, 0) {
                    if t != *module {
                        targets.insert(t);
                    }
                }
            }
            graph.insert(module.clone(), targets);
        }
        graph
    }
}

fn module_of(src: &Path, file: &Path, root: &str) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().to_string_lossy().into_owned();
    if rel == root {
        return Vec::new();
    }
    let rel = rel.strip_suffix("/mod.rs").or_else(|| rel.strip_suffix(".rs")).unwrap();
    rel.split('/').map(str::to_owned).collect()
}

/// Source without comments and string literals (what could look like a
/// path in them is not code), and without `#[cfg(test)]` modules.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x' or '\n'); lifetimes ('a) are left alone.
            let end = b[i + 1..].iter().position(|&c| c == b'\'').map_or(b.len(), |p| i + 2 + p);
            i = end;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    match out.find("#[cfg(test)]\nmod tests") {
        Some(at) => out[..at].to_owned(),
        None => out,
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// One imported path of a `use` declaration.
struct Use {
    path: Vec<String>,
    alias: Option<String>,
    public: bool,
}

/// Every path of every `use` declaration, brace groups expanded.
fn uses(text: &str) -> Vec<Use> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = find_word(rest, "use") {
        let before = rest[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let Some(end) = rest[at..].find(';') else { break };
        let tree = normalize(&rest[at + 3..at + end]);
        expand(&tree, &mut Vec::new(), &mut |path, alias| out.push(Use { path, alias, public }));
        rest = &rest[at + end + 1..];
    }
    out
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let before_ok = at == 0 || !is_ident(text[..at].chars().last().unwrap());
        let after_ok = text[at + word.len()..].starts_with(|c: char| c.is_whitespace());
        if before_ok && after_ok {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// A use tree with single spaces only where they matter (`a as b`).
fn normalize(tree: &str) -> String {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut out = words.join(" ");
    for sep in ["::", "{", "}", ","] {
        out = out.replace(&format!(" {sep}"), sep).replace(&format!("{sep} "), sep);
    }
    out
}

/// Expands a use tree (`a::b::{c, d::e as f, self}`).
fn expand(tree: &str, prefix: &mut Vec<String>, emit: &mut dyn FnMut(Vec<String>, Option<String>)) {
    let depth = prefix.len();
    match tree.find('{') {
        Some(open) if tree.ends_with('}') => {
            prefix.extend(tree[..open].split("::").filter(|s| !s.is_empty()).map(str::to_owned));
            for item in split_top(&tree[open + 1..tree.len() - 1]) {
                expand(item, prefix, emit);
            }
        }
        _ => {
            let (path, alias) = match tree.split_once(" as ") {
                Some((p, a)) => (p, Some(a.to_owned())),
                None => (tree, None),
            };
            for seg in path.split("::").filter(|s| !s.is_empty()) {
                // `self` in a group names the module the group is in.
                if seg != "self" || prefix.is_empty() {
                    prefix.push(seg.to_owned());
                }
            }
            if prefix.last().is_some_and(|s| s == "*") {
                prefix.pop();
            }
            if !prefix.is_empty() {
                emit(prefix.clone(), alias);
            }
        }
    }
    prefix.truncate(depth);
}

/// Splits on the commas outside braces.
fn split_top(items: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in items.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&items[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&items[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// Paths written in code: `crate::a::b`, `super::c`, `self::d::e`.
fn inline_paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && is_ident(text[..at].chars().last().unwrap()) {
                continue;
            }
            let mut path = Vec::new();
            let mut rest = &text[at..];
            loop {
                let len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
                if len == 0 {
                    break;
                }
                path.push(rest[..len].to_owned());
                rest = &rest[len..];
                if !rest.starts_with("::") {
                    break;
                }
                rest = &rest[2..];
            }
            // `crate::{..}` of a use declaration is read by `uses`.
            if path.len() > 1 {
                out.push(path);
            }
        }
    }
    out
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        n: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m) {
                Some(1) => {
                    let from = stack.iter().position(|s| s == m).unwrap();
                    let mut c = stack[from..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if !state.contains_key(n) {
            if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn crates() -> Vec<Crate> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![
        Crate::load(here.join("../chash/src"), "lib.rs"),
        Crate::load(here.join("src"), "lib.rs"),
        Crate::load(here.join("../chash-cli/src"), "main.rs"),
    ]
}

#[test]
fn no_import_cycle_between_files() {
    for krate in crates() {
        let graph = krate.edges();
        if let Some(c) = cycle(&graph) {
            let names: Vec<String> = c.iter().map(|m| krate.name(m)).collect();
            panic!("import cycle in {}: {}", krate.src.display(), names.join(" -> "));
        }
    }
}

#[test]
fn protocol_folders_import_only_their_own() {
    let krate = &crates()[1];
    let protocols = ["memcache", "redis"];
    for (module, targets) in krate.edges() {
        let own = module.first().filter(|m| protocols.contains(&m.as_str()));
        // The crate root re-exports, and protocols.rs picks a pool's
        // protocol: the one place that names them all.
        if module.is_empty() || module == ["protocols"] {
            continue;
        }
        for t in targets {
            let Some(theirs) = t.first().filter(|m| protocols.contains(&m.as_str())) else { continue };
            assert!(own == Some(theirs), "{} imports {}", krate.name(&module), krate.name(&t));
        }
    }
}

/// Outside the protocol folders (and the crate root and `protocols.rs`),
/// no file knows a protocol: no identifier naming one (a `redis` field
/// branched on, a session type) and no protocol bytes (a byte string that
/// ends a command line). They ask the pool's protocol descriptor.
#[test]
fn only_protocol_folders_know_protocols() {
    let krate = &crates()[1];
    let mut found = Vec::new();
    for (module, code) in &krate.files {
        if module.is_empty() || module == &["protocols"] || ["memcache", "redis"].contains(&module[0].as_str()) {
            continue;
        }
        let lower = code.to_ascii_lowercase();
        for word in ["redis", "memcache"] {
            if let Some(at) = lower.find(word) {
                let line = code[..at].lines().count();
                found.push(format!("{} names {word} (code line {line})", krate.name(module)));
            }
        }
        let raw = std::fs::read_to_string(krate.src.join(krate.name(module))).unwrap();
        for bytes in protocol_bytes(&strip_comments(&raw)) {
            found.push(format!("{} writes protocol bytes {bytes:?}", krate.name(module)));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Byte-string literals that end a command line (`b"PING\r\n"`), other
/// than blank lines (HTTP's `\r\n\r\n`), outside `#[cfg(test)]` modules.
fn protocol_bytes(text: &str) -> Vec<String> {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("b\"") {
        let body = &rest[at + 2..];
        let end = body.find('"').unwrap_or(body.len());
        let lit = &body[..end];
        if lit.ends_with("\\r\\n") && !lit.replace("\\r\\n", "").is_empty() {
            out.push(lit.to_owned());
        }
        rest = &body[end.min(body.len())..];
        rest = rest.get(1..).unwrap_or_default();
    }
    out
}

/// Source without comments (string literals kept).
fn strip_comments(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The CLI's etcd writer (`etcd/store.rs`: compare-and-swap writes of the
/// fleet's config) is not reachable from the proxy's runtime: no file of
/// the proxy imports it, directly or through another.
#[test]
fn the_proxy_never_reaches_the_cli_etcd_writer() {
    let krate = &crates()[1];
    let store = vec!["etcd".to_owned(), "store".to_owned()];
    assert!(krate.files.contains_key(&store), "etcd/store.rs moved: update this test");
    let graph = krate.edges();
    // Everything reachable from the crate root's runtime entry points.
    let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = graph
        .keys()
        .filter(|m| m.first().is_some_and(|f| f != "etcd") || m.as_slice() == ["etcd", "follow"])
        .cloned()
        .collect();
    while let Some(m) = todo.pop() {
        if m == store || !seen.insert(m.clone()) {
            continue;
        }
        for t in graph.get(&m).into_iter().flatten() {
            assert!(t != &store, "{} imports the CLI's etcd writer ({})", krate.name(&m), krate.name(t));
            todo.push(t.clone());
        }
    }
    assert!(seen.contains(&vec!["etcd".to_owned(), "follow".to_owned()]));
}

/// The checker itself finds what it should.
#[test]
fn the_checker_sees_uses_and_paths() {
    let text = strip("use super::{a::B, c as d, e::{self, F}};\npub use crate::x::Y;\n// use crate::gone;\nfn f() { crate::g::h(); let s = \"crate::no\"; }\n");
    let u: Vec<String> = uses(&text).iter().map(|u| u.path.join("::")).collect();
    assert_eq!(u, ["super::a::B", "super::c", "super::e", "super::e::F", "crate::x::Y"]);
    let p: Vec<String> = inline_paths(&text).iter().map(|p| p.join("::")).collect();
    assert!(
        p.contains(&"crate::g::h".to_owned()) && !p.iter().any(|p| p.contains("gone") || p.contains("no")),
        "{p:?}"
    );
    let mut g = BTreeMap::new();
    let (a, b) = (vec!["a".to_owned()], vec!["b".to_owned()]);
    g.insert(a.clone(), BTreeSet::from([b.clone()]));
    g.insert(b.clone(), BTreeSet::from([a.clone()]));
    assert!(cycle(&g).is_some());
}
