//! `tests/perf/hot-symbols.txt` is the linker's order for the code a driver verb runs (build.rs,
//! lld `--symbol-ordering-file`). A name the linker does not find is skipped without a word, so a
//! stale list costs every verb page faults (a hostPath mount+unmount pair went from 1.30x to
//! 1.33x of the raw-syscall floor when a refactor renamed what the list named) and nothing fails.
//! These lints make staleness fail:
//! - the list names the `Cargo.lock` it was made for (its first line): every crate's symbols carry
//!   their crate's disambiguator, which a dependency change moves;
//! - every flexvol function or static it names by path (v0 mangling, `.cargo/config.toml`) still
//!   exists at that path, so a moved or renamed hot function fails here, not in a benchmark weeks
//!   later.
//!
//! Regenerate with `tests/perf/hot-symbols` (as root, with perf; a few minutes).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn list() -> String {
    std::fs::read_to_string(root().join("tests/perf/hot-symbols.txt")).unwrap()
}

/// The header line `tests/perf/hot-symbols` writes: `# Cargo.lock sha256 <hex>`.
fn lock_header() -> String {
    let lock = std::fs::read(root().join("Cargo.lock")).unwrap();
    let d = ring::digest::digest(&ring::digest::SHA256, &lock);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("# Cargo.lock sha256 {hex}")
}

#[test]
fn contract_hot_symbols_were_made_for_this_cargo_lock() {
    let text = list();
    let first = text.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        lock_header(),
        "tests/perf/hot-symbols.txt was made for another Cargo.lock: every symbol of a changed crate is renamed and the list silently stops ordering the verbs' code; run tests/perf/hot-symbols (root, perf) and commit the list"
    );
}

/// One decoded v0 path of the flexvol crate: the module segments (type namespace) and the
/// function (value namespace) under them.
#[derive(Debug, PartialEq)]
struct FnPath {
    modules: Vec<String>,
    function: String,
}

/// Decodes `_R` symbols of the simple shape `N{v,t}... C<crate> <ident>...` (a free function in a
/// module, or a closure or nested function inside one). Generic instances, impl methods and
/// back-references are not paths this check can follow: `None`.
fn decode(sym: &str) -> Option<(String, FnPath)> {
    let mut s = sym.strip_prefix("_R")?.as_bytes();
    let mut tags = Vec::new();
    while let [b'N', ns, rest @ ..] = s {
        tags.push(*ns);
        s = rest;
    }
    let rest = s.strip_prefix(b"C")?;
    let (krate, mut s) = ident(rest)?;
    let mut segs = Vec::new();
    for ns in tags.iter().rev() {
        let (name, rest) = ident(s)?;
        segs.push((*ns, name));
        s = rest;
    }
    // Anything left is an instantiating crate suffix or the like: not the simple shape.
    if !s.is_empty() && !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Modules are the leading `t` segments; the function is the first `v` after them (a closure
    // (`C`) or a nested function inside it belongs to it).
    let mut modules = Vec::new();
    let mut function = None;
    for (ns, name) in segs {
        match (ns, &function) {
            (b't', None) => modules.push(name),
            (b'v', None) => function = Some(name),
            (_, Some(_)) => break,
            _ => return None,
        }
    }
    Some((
        krate,
        FnPath {
            modules,
            function: function?,
        },
    ))
}

/// `[s<base62>_] [u] <decimal> [_] <bytes>`
fn ident(s: &[u8]) -> Option<(String, &[u8])> {
    let mut s = s;
    if let [b's', rest @ ..] = s {
        let end = rest.iter().position(|&b| b == b'_')?;
        s = &rest[end + 1..];
    }
    if let [b'u', rest @ ..] = s {
        s = rest; // punycode: never in our names; decoded as bytes, then not found
    }
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    let len: usize = std::str::from_utf8(&s[..digits]).ok()?.parse().ok()?;
    let mut s = &s[digits..];
    if let [b'_', rest @ ..] = s {
        s = rest;
    }
    if s.len() < len {
        return None;
    }
    Some((String::from_utf8(s[..len].to_vec()).ok()?, &s[len..]))
}

/// The source file of a module path: `src/a/b.rs` or `src/a/b/mod.rs`; the deepest one that
/// exists (segments past it are inline modules or types inside it).
fn module_file(modules: &[String]) -> PathBuf {
    let src = root().join("src");
    let mut best = src.join("lib.rs");
    let mut dir = src.clone();
    for m in modules {
        dir = dir.join(m);
        let file = dir.with_extension("rs");
        let mod_rs = dir.join("mod.rs");
        if file.is_file() {
            best = file;
        } else if mod_rs.is_file() {
            best = mod_rs;
        } else {
            break;
        }
    }
    best
}

/// Whether `file` defines a function or a static named `name` (the list names the verbs' hot
/// statics too, for the data segment's order).
fn defines_item(file: &Path, name: &str) -> bool {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    ["fn", "static", "static mut"].iter().any(|kind| {
        let needle = format!("{kind} {name}");
        text.match_indices(&needle).any(|(i, _)| {
            let next = text[i + needle.len()..].chars().next();
            !matches!(next, Some(c) if c.is_alphanumeric() || c == '_')
        })
    })
}

fn missing(symbols: &str) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut gone = Vec::new();
    for sym in symbols.lines().filter(|l| !l.starts_with('#')) {
        let Some((krate, path)) = decode(sym) else {
            continue;
        };
        if krate != "flexvol" {
            continue;
        }
        checked += 1;
        let file = if path.modules.is_empty() && path.function == "main" {
            root().join("src/main.rs")
        } else {
            module_file(&path.modules)
        };
        if !defines_item(&file, &path.function)
            && !defines_item(&root().join("src/main.rs"), &path.function)
        {
            gone.push(format!(
                "{}::{} (looked in {})",
                path.modules.join("::"),
                path.function,
                file.strip_prefix(root()).unwrap_or(&file).display()
            ));
        }
    }
    (checked, gone)
}

#[test]
fn contract_hot_symbols_name_functions_that_still_exist() {
    let (checked, gone) = missing(&list());
    assert!(
        checked >= 20,
        "tests/perf/hot-symbols.txt names only {checked} flexvol functions by path: is it v0-mangled (.cargo/config.toml) and regenerated?"
    );
    assert!(
        gone.is_empty(),
        "tests/perf/hot-symbols.txt names flexvol functions that moved or are gone, so the linker no longer puts them with the verbs' hot code: {gone:#?}; run tests/perf/hot-symbols (root, perf) and commit the list"
    );
}

#[test]
fn contract_hot_symbols_lint_finds_a_moved_function() {
    let (checked, gone) = missing(
        "_RNvNtCs1a2b3_7flexvol6driver3run\n\
         _RNvNtCs1a2b3_7flexvol6driver13no_such_thing\n\
         _RNvNtNtCs1a2b3_7flexvol4node7calllog7PENDING\n\
         _RNCNvNtNtCs1a2b3_7flexvol7backend8hostpath10no_closure0\n\
         _RINvNtCs1a2b3_5alloc3vec4pushE\n\
         _RNvNtCs9z_4core3ptr4read\n",
    );
    assert_eq!(checked, 4);
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert!(gone[0].starts_with("driver::no_such_thing"), "{gone:?}");
    assert!(
        gone[1].starts_with("backend::hostpath::no_closure"),
        "{gone:?}"
    );
    assert_eq!(
        decode("_RNvNtNtCsabc_7flexvol7backend8hostpath5mount"),
        Some((
            "flexvol".into(),
            FnPath {
                modules: vec!["backend".into(), "hostpath".into()],
                function: "mount".into(),
            }
        ))
    );
}
