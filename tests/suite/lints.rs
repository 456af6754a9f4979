//! Rules about the source itself that neither rustc nor clippy can state.

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
