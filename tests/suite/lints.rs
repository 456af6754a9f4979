//! Rules about the source itself that neither rustc nor clippy can state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `word` occurs in `code` as a whole word (`unsafe`, not `unsafe_code`).
fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        let before = code[..i].chars().next_back().is_some_and(ident);
        let after = code[i + word.len()..].chars().next().is_some_and(ident);
        !before && !after
    })
}

/// `unsafe_code` is denied crate-wide rather than forbidden only so that `src/main.rs` can export
/// the C `main` (its module doc says why). Anywhere else, `unsafe` or an `allow(unsafe_code)` is a
/// new exception that needs its own case: this fails until it is made here, on purpose.
#[test]
fn contract_unsafe_is_only_the_entry_point() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest
            .lines()
            .any(|l| l.trim() == r#"unsafe_code = "deny""#),
        "Cargo.toml must keep unsafe_code denied"
    );
    let mut files = vec![root.join("build.rs")];
    for dir in ["src", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    let this = root.join(file!());
    for f in files.iter().filter(|f| **f != this) {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            // Comments may talk about it; code may not use it.
            let code = line.split("//").next().unwrap_or("");
            if has_word(code, "unsafe") || code.contains("unsafe_code") {
                found.push(format!(
                    "{}:{}: {}",
                    f.strip_prefix(root).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert_eq!(
        found,
        [
            "src/main.rs:27: #[allow(unsafe_code)]",
            "src/main.rs:31: #[unsafe(no_mangle)]"
        ],
        "unsafe outside the entry point"
    );
    assert!(files.len() > 50, "found only {} source files", files.len());
}

/// The file-level import graph of `src/`: each file is a module (`backend/lvm/mod.rs` is
/// `backend::lvm`, `node/config.rs` is `node::config`, `lib.rs` the root), and it depends on the
/// files its code names through `crate::` or `super::` paths (`use` trees with their braces, and
/// paths written inline), each resolved to the longest module prefix that is a file. Left out:
/// comment lines and trailing ` //` comments, items under `#[cfg(test)]` (a `mod tests` block, a
/// `mod testing;`), the `tests`/`testing` files themselves, and `main.rs` (the binary: its `crate` is
/// not the library's). A child naming its parent's `mod.rs` is an edge like any other, so a
/// `mod.rs` that needs its child while the child needs it is a cycle too. `super::` is read as the file's parent: an inline module
/// outside the tests (only `protocol::options::keys` and `backend::lvm::options::key`, constants)
/// names nothing. Python prototype: the issue's `deps.py`.
mod imports {
    use std::collections::{BTreeMap, BTreeSet};

    /// `path` relative to `src/` (`a/b/mod.rs`) as a module path (`a::b`); `None` for files the
    /// graph leaves out.
    pub fn module_of(path: &str) -> Option<String> {
        let mut parts: Vec<&str> = path.strip_suffix(".rs")?.split('/').collect();
        if parts == ["main"] {
            return None;
        }
        // Test-only files (`tests.rs`, `testing.rs`, `<what>_tests.rs`: declared under
        // `#[cfg(test)]` by their parent).
        if parts
            .last()
            .is_some_and(|l| matches!(*l, "tests" | "testing") || l.ends_with("_tests"))
        {
            return None;
        }
        if matches!(parts.last(), Some(&("mod" | "lib"))) {
            parts.pop();
        }
        Some(parts.join("::"))
    }

    /// The code of a file without its comments and its `#[cfg(test)]` items.
    pub fn code_of(text: &str) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let mut out = String::new();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            let t = line.trim_start();
            if t.starts_with("#[cfg(test)]") {
                // Skip the attributes and doc lines that follow, then the item: one line when it
                // ends with `;`, else up to its closing brace at the item's own indentation.
                i += 1;
                while i < lines.len() && {
                    let n = lines[i].trim_start();
                    n.starts_with("#[") || n.starts_with("//") || n.is_empty()
                } {
                    i += 1;
                }
                if i < lines.len() && !lines[i].trim_end().ends_with(';') {
                    let indent = lines[i].len() - lines[i].trim_start().len();
                    let close = format!("{}}}", &lines[i][..indent]);
                    while i < lines.len() && lines[i].trim_end() != close {
                        i += 1;
                    }
                }
                i += 1;
                continue;
            }
            if !t.starts_with("//") {
                out.push_str(line.split(" //").next().unwrap_or(""));
                out.push('\n');
            }
            i += 1;
        }
        out
    }

    /// The paths a use tree starting at `s` names (`a::{b, c::{d, self}}` gives `a::b`, `a::c::d`
    /// and `a::c`), and how many bytes of `s` it spans.
    fn use_tree(s: &str) -> (Vec<String>, usize) {
        let b = s.as_bytes();
        let mut i = 0;
        let mut prefix = String::new();
        loop {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            prefix.push_str(&s[start..i]);
            if s[i..].starts_with("::") {
                i += 2;
                if s[i..].starts_with('{') {
                    i += 1;
                    let mut paths = Vec::new();
                    loop {
                        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                            i += 1;
                        }
                        if i >= b.len() || b[i] == b'}' {
                            return (paths, (i + 1).min(b.len()));
                        }
                        let (sub, used) = use_tree(&s[i..]);
                        i += used.max(1);
                        for p in sub {
                            paths.push(match p.as_str() {
                                "self" => prefix.clone(),
                                _ => format!("{prefix}::{p}"),
                            });
                        }
                        // `x as y`: skip the rename.
                        while i < b.len() && !matches!(b[i], b',' | b'}') {
                            i += 1;
                        }
                    }
                }
                prefix.push_str("::");
            } else {
                return (vec![prefix], i);
            }
        }
    }

    /// The longest prefix of `path` (segments) that is a module in `mods`.
    fn resolve(path: &str, mods: &BTreeSet<String>) -> Option<String> {
        let segs: Vec<&str> = path.split("::").collect();
        (1..=segs.len())
            .rev()
            .map(|n| segs[..n].join("::"))
            .find(|c| mods.contains(c))
    }

    /// Whether an edge from `a` to `b` is left out: a file naming itself, or the root (`""`,
    /// `crate::` alone). A child naming its parent `mod.rs` counts (and so does a parent naming
    /// its child by a `crate::` path): a cycle through a `mod.rs` is a cycle.
    fn related(a: &str, b: &str) -> bool {
        a == b || b.is_empty()
    }

    /// The import graph of `files` (path relative to `src/`, text): module -> modules it names.
    pub fn graph(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
        let code: BTreeMap<String, String> = files
            .iter()
            .filter_map(|(p, t)| Some((module_of(p)?, code_of(t))))
            .collect();
        let mods: BTreeSet<String> = code.keys().cloned().collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, src) in &code {
            let mut named = Vec::new();
            for (at, _) in src.match_indices("crate::") {
                let ident_before = src[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_');
                if !ident_before {
                    named.extend(use_tree(&src[at + "crate::".len()..]).0);
                }
            }
            for (at, _) in src.match_indices("super::") {
                let ident_before = src[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
                if ident_before {
                    continue; // the second `super::` of `super::super::`, counted below
                }
                let mut base: Vec<&str> = m.split("::").filter(|s| !s.is_empty()).collect();
                let mut rest = &src[at..];
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                let base = base.join("::");
                for p in use_tree(rest).0 {
                    named.push(if base.is_empty() {
                        p
                    } else {
                        format!("{base}::{p}")
                    });
                }
            }
            for t in named.iter().filter_map(|p| resolve(p, &mods)) {
                if !related(m, &t) {
                    edges.entry(m.clone()).or_default().insert(t);
                }
            }
        }
        edges
    }

    /// Every import cycle of `edges`, one per strongly connected component of more than one
    /// module: a shortest path round it (`a -> b -> a`), and all the component's modules.
    pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<(Vec<String>, Vec<String>)> {
        let reach = |from: &str| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.to_owned()];
            while let Some(v) = todo.pop() {
                for w in edges.get(&v).into_iter().flatten() {
                    if seen.insert(w.clone()) {
                        todo.push(w.clone());
                    }
                }
            }
            seen
        };
        let mut done = BTreeSet::new();
        let mut out = Vec::new();
        for v in edges.keys() {
            if done.contains(v) || !reach(v).contains(v) {
                continue;
            }
            // The component: what v reaches that reaches v.
            let comp: BTreeSet<String> = reach(v)
                .into_iter()
                .filter(|w| reach(w).contains(v))
                .collect();
            done.extend(comp.iter().cloned());
            // A shortest way round from v, within the component (breadth first).
            let mut prev: BTreeMap<String, String> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([v.clone()]);
            'search: while let Some(x) = queue.pop_front() {
                for w in edges.get(&x).into_iter().flatten() {
                    if !comp.contains(w) || prev.contains_key(w) {
                        continue;
                    }
                    prev.insert(w.clone(), x.clone());
                    if w == v {
                        break 'search;
                    }
                    queue.push_back(w.clone());
                }
            }
            let mut back = Vec::new();
            let mut at = prev[v].clone();
            while at != *v {
                back.push(at.clone());
                at = prev[&at].clone();
            }
            back.reverse();
            let mut path = vec![v.clone()];
            path.extend(back);
            path.push(v.clone());
            out.push((path, comp.into_iter().collect()));
        }
        out
    }
}

/// Every `.rs` file under `src/`, as (path relative to `src/`, text).
fn src_files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read_to_string(f).unwrap())
        })
        .collect()
}

/// Dependencies point one way (src/lib.rs): no file of `src/` reaches itself through the
/// `crate::`/`super::` paths of its code. A failure names each cycle as a path round it.
#[test]
fn contract_no_import_cycle_between_source_files() {
    let files = src_files();
    let edges = imports::graph(&files);
    assert!(
        edges.len() > 30,
        "found the imports of only {} files",
        edges.len()
    );
    let cycles: Vec<String> = imports::cycles(&edges)
        .iter()
        .map(|(path, all)| format!("{} (all in it: {})", path.join(" -> "), all.join(", ")))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles in src/ (a file must not import, directly or through others, a file that imports it):\n{}",
        cycles.join("\n")
    );
}

/// The rooms of `src/` (lib.rs's layer map) and what each may import: dependencies point one way,
/// the Kubernetes layer (`k8s`) and the shared vocabulary (`vocab`) import no daemon, the daemons
/// do not import each other's internals, and the driver's rooms reach no daemon. The one
/// exception, by name: the scheduler extender computes a claim's needs with the provisioner's own
/// pure claim planning and class parsers (`provision::storage`), so both decide alike.
const ROOMS: &[(&str, &[&str])] = &[
    ("protocol", &[]),
    ("version", &[]),
    ("vocab", &[]),
    ("sys", &["protocol"]),
    ("node", &["backend", "protocol", "sys"]),
    ("error", &["node", "protocol", "sys"]),
    ("backend", &["error", "node", "protocol", "sys"]),
    ("driver", &["backend", "node", "protocol", "sys"]),
    // csi's inline ephemeral volumes make, record and delete their directories (with project
    // quotas) through the marked-directory library the provisioners use: one library for every
    // directory flexvol makes below a root. provision never imports csi. Its /healthz is the
    // daemons' one HTTP server (k8s::http); k8s never imports csi.
    (
        "csi",
        &[
            "backend",
            "error",
            "k8s",
            "node",
            "protocol",
            "provision::storage",
            "sys",
            "version",
        ],
    ),
    ("k8s", &["node", "version"]),
    (
        "provision",
        &[
            "backend", "error", "k8s", "node", "protocol", "sys", "version", "vocab",
        ],
    ),
    (
        "controller",
        &["k8s", "protocol", "vocab", "provision::storage"],
    ),
    (
        "ops",
        &[
            "backend",
            "error",
            "k8s",
            "node",
            "protocol",
            "provision",
            "sys",
            "version",
            "vocab",
        ],
    ),
];

/// The edges of `edges` that leave their room for one [`ROOMS`] does not allow (`cli` and the
/// crate root may import anything; a room missing from the table is an error).
fn room_violations(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let room = |m: &str| m.split("::").next().unwrap_or("").to_owned();
    let mut bad = Vec::new();
    for (from, tos) in edges {
        let r = room(from);
        if r.is_empty() || r == "cli" {
            continue;
        }
        let Some((_, allowed)) = ROOMS.iter().find(|(n, _)| *n == r) else {
            bad.push(format!(
                "{from}: room {r} is not in ROOMS (say what it may import)"
            ));
            continue;
        };
        for to in tos {
            if room(to) == r {
                continue;
            }
            let ok = allowed
                .iter()
                .any(|a| to == a || to.starts_with(&format!("{a}::")));
            if !ok {
                bad.push(format!("{from} -> {to}"));
            }
        }
    }
    bad
}

/// Every file of `src/` imports only what its room may ([`ROOMS`]).
#[test]
fn contract_rooms_import_only_what_they_may() {
    let edges = imports::graph(&src_files());
    let bad = room_violations(&edges);
    assert!(
        bad.is_empty(),
        "imports across rooms that ROOMS does not allow (tests/suite/lints.rs):\n{}",
        bad.join("\n")
    );
}

/// The rooms lint on made-up files: the Kubernetes layer naming a daemon, and a daemon naming
/// another's internals, are found; the allowed exception is not.
#[test]
fn contract_rooms_lint_finds_a_made_up_import() {
    let f = |p: &str, t: &str| (p.to_owned(), t.to_owned());
    let files = vec![
        f(
            "lib.rs",
            "pub mod k8s;\npub mod provision;\npub mod controller;\n",
        ),
        f("k8s/mod.rs", "pub mod lease;\n"),
        f(
            "k8s/lease.rs",
            "use crate::provision::telemetry::Metrics;\n",
        ),
        f("provision/mod.rs", "pub mod telemetry;\npub mod storage;\n"),
        f("provision/telemetry.rs", "use crate::k8s::lease::X;\n"),
        f("provision/storage.rs", "pub fn plan_claim() {}\n"),
        f(
            "controller/mod.rs",
            "use crate::provision::storage::plan_claim;\nuse crate::provision::telemetry::Y;\n",
        ),
    ];
    let bad = room_violations(&imports::graph(&files));
    assert_eq!(
        bad,
        [
            "controller -> provision::telemetry",
            "k8s::lease -> provision::telemetry"
        ],
        "{bad:?}"
    );
}

/// The cycle lint on made-up files: it finds a cycle through a `use` tree, an inline path and
/// `super::super::`, and ignores comments, `#[cfg(test)]` items and a module's own children.
#[test]
fn contract_import_cycle_lint_finds_a_made_up_cycle() {
    let f = |p: &str, t: &str| (p.to_owned(), t.to_owned());
    let mut files = vec![
        f("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        f(
            "a.rs",
            "use crate::b::{self as bee, x::{Y, Z}};\n// use crate::c::Q;\n",
        ),
        f("b/mod.rs", "pub mod x;\nuse crate::b::x::Y; // crate::c\n"),
        f("b/x.rs", "pub fn y() -> u8 {\n    crate::c::d::D\n}\n"),
        f(
            "c/mod.rs",
            "pub mod d;\n#[cfg(test)]\nmod tests {\n    use crate::b::x::Y;\n}\n",
        ),
        f("c/d.rs", "use super::super::a::A;\n"),
    ];
    let edges = imports::graph(&files);
    let names = |m: &str| -> Vec<&str> {
        edges
            .get(m)
            .map(|s| s.iter().map(String::as_str).collect())
            .unwrap_or_default()
    };
    assert_eq!(names("a"), ["b", "b::x"]);
    assert_eq!(
        names("b"),
        ["b::x"],
        "its child by a crate path; not a comment"
    );
    assert_eq!(names("b::x"), ["c::d"]);
    assert_eq!(names("c"), Vec::<&str>::new(), "a test module");
    assert_eq!(names("c::d"), ["a"]);
    assert_eq!(
        imports::cycles(&edges),
        [(
            ["a", "b::x", "c::d", "a"].map(String::from).to_vec(),
            ["a", "b", "b::x", "c::d"].map(String::from).to_vec()
        )],
        "{edges:?}"
    );
    // Without b::x's path to c::d, no cycle.
    files[3] = f("b/x.rs", "pub fn y() -> u8 {\n    7\n}\n");
    assert!(imports::cycles(&imports::graph(&files)).is_empty());
    // A child that needs its parent's mod.rs, which needs the child: a cycle.
    files[3] = f("b/x.rs", "use super::B;\n");
    let found = imports::cycles(&imports::graph(&files));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, ["b", "b::x"]);
}

/// The product part of a source file: what comes before its `#[cfg(test)] mod`.
fn product_part(text: &str) -> &str {
    let cut = text
        .match_indices("#[cfg(test)]")
        .find(|(i, m)| text[i + m.len()..].trim_start().starts_with("mod "))
        .map_or(text.len(), |(i, _)| i);
    &text[..cut]
}

/// Issue #32: root opens, reads and lists a name a tenant controls only through the one file layer
/// (`src/sys/dirfd.rs`: `O_PATH`, type and identity checked, non-blocking, bounded). The
/// provisioner's rooms work below volumes and roots, so none of them may open, read or list a file
/// by other means; the few that read root's own files (named here, each with its reason) are
/// allowed those files. A new `std::fs::read`, `File::open`, `read_dir`, `openat2`... in
/// `src/provision/` fails this until it goes through `dirfd` or is argued here.
#[test]
fn contract_tenant_files_only_through_the_one_file_layer() {
    const FORBIDDEN: [&str; 10] = [
        "File::open",
        "OpenOptions",
        "fs::read(",
        "fs::read_to_string(",
        "read_dir(",
        "openat2(",
        "fcntl::open(",
        "fcntl::openat(",
        "rustix::fs::open",
        "fs::File::create",
    ];
    // (file, pattern, why it never touches a tenant's name).
    const ALLOWED: [(&str, &str, &str); 3] = [
        (
            "k8s/client.rs",
            "fs::read_to_string(",
            "the ServiceAccount's namespace file kubelet projects into our own pod",
        ),
        (
            "provision/reconcile.rs",
            "read_dir(",
            "<stateDir>/legacy-grants: root's own directory (0700), never below a volume",
        ),
        (
            "provision/reconcile.rs",
            "fs::read(",
            "a legacy grant in <stateDir>/legacy-grants, root's own",
        ),
    ];
    let mut bad = Vec::new();
    for (rel, text) in src_files() {
        if !rel.starts_with("provision/") || rel.ends_with("tests.rs") || rel.contains("/tests/") {
            continue;
        }
        for (n, line) in product_part(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for f in FORBIDDEN {
                if code.contains(f) && !ALLOWED.iter().any(|(a, p, _)| *a == rel && *p == f) {
                    bad.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "open, read and list files below volumes and roots through crate::sys::dirfd only:\n{}",
        bad.join("\n")
    );
}

/// The lint above finds a made-up direct read, and ignores one in a comment or a test module.
#[test]
fn contract_tenant_file_lint_finds_a_made_up_read() {
    let t = "fn f() { let _ = std::fs::read(p); }\n#[cfg(test)]\nmod tests { fn g() { std::fs::read(q); } }\n";
    assert!(product_part(t).contains("fs::read("));
    assert!(!product_part(t).contains("fs::read(q)"));
}

/// The error types of `Result<T, E>`s written on `line` whose `E` is a bare `String`.
fn string_errors(line: &str) -> usize {
    let mut found = 0;
    for (i, _) in line.match_indices("Result<") {
        if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // ApiResult<..>, IoResult<..>: another type
        }
        let (mut depth, mut last_arg) = (0usize, None);
        let body = &line[i + "Result<".len()..];
        for (j, c) in body.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                ',' if depth == 0 => last_arg = Some(j + 1),
                '>' | ')' | ']' if depth == 0 => {
                    if last_arg.is_some_and(|a| body[a..j].trim() == "String") {
                        found += 1;
                    }
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                _ => {}
            }
        }
    }
    found
}

/// Issue #34, 4: the daemons' errors are typed (thiserror enums whose variants are the kinds a
/// caller branches on), never a bare `Result<_, String>`: in `src/k8s/`, `src/vocab/`, `src/controller/` and
/// all of the provisioner's (`src/provision/`, its storage room included). Test modules may keep
/// theirs.
#[test]
fn contract_daemon_errors_are_typed() {
    let mut bad = Vec::new();
    for (rel, text) in src_files() {
        let in_scope = rel.starts_with("k8s/")
            || rel.starts_with("vocab/")
            || rel.starts_with("controller/")
            || (rel.starts_with("provision/") && !rel.ends_with("tests.rs"));
        if !in_scope {
            continue;
        }
        for (n, line) in product_part(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if string_errors(code) > 0 {
                bad.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "type these errors (a thiserror enum, one variant per kind a caller branches on):\n{}",
        bad.join("\n")
    );
}

/// The lint above finds bare `String` errors however nested, and leaves other types alone.
#[test]
fn contract_string_error_lint_finds_made_up_ones() {
    assert_eq!(string_errors("fn f() -> Result<(), String> {"), 1);
    assert_eq!(
        string_errors("fn f() -> Result<BTreeMap<String, String>, String> {"),
        1
    );
    assert_eq!(
        string_errors("let p = |r: Result<Vec<(u8, u8)>, String>| r;"),
        1
    );
    assert_eq!(
        string_errors("fn f() -> Result<BTreeMap<String, String>, GraceError> {"),
        0
    );
    assert_eq!(string_errors("fn f() -> Result<String, EncodeError> {"), 0);
    assert_eq!(string_errors("fn f() -> ApiResult<String> {"), 0);
    assert_eq!(string_errors("fn f() -> io::Result<String> {"), 0);
}

/// The driver's exec path never reaches the gRPC stack (issue #35, item 6): no file that
/// `driver.rs` imports, directly or through others, is one of `csi`'s or names tonic, prost or
/// tokio. kubelet execs the driver for every call; the CSI plugin's runtime is for `flexvol csi`.
#[test]
fn contract_driver_never_reaches_the_grpc_stack() {
    use std::collections::BTreeSet;
    let files = src_files();
    let edges = imports::graph(&files);
    let mut reached = BTreeSet::from(["driver".to_owned()]);
    let mut todo = vec!["driver".to_owned()];
    while let Some(m) = todo.pop() {
        for t in edges.get(&m).into_iter().flatten() {
            if reached.insert(t.clone()) {
                todo.push(t.clone());
            }
        }
    }
    // The driver reaches the backends and everything under them (a graph that found nothing would
    // prove nothing).
    assert!(
        reached.contains("backend::hostpath") && reached.len() > 20,
        "{reached:?}"
    );
    let mut found = Vec::new();
    for (path, text) in &files {
        let Some(m) = imports::module_of(path) else {
            continue;
        };
        if !reached.contains(&m) {
            continue;
        }
        if m == "csi" || m.starts_with("csi::") {
            found.push(format!("{path}: is csi's"));
        }
        let code = imports::code_of(text);
        for word in ["tonic", "prost", "tokio"] {
            if has_word(&code, word) {
                found.push(format!("{path}: names {word}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the driver's exec path reaches the gRPC stack: {found:?}"
    );
}
