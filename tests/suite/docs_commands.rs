//! The commands the docs show are commands the binary accepts.
//!
//! The rule: in README.md, docs/*.md and drivers/*/README.md, every line of a fenced block opened
//! with ```` ```sh ````, ```` ```bash ```` or ```` ```console ```` that begins (after indentation
//! and an optional `$ `) with `flexvol ` is a documented command; a line ending in `\` continues
//! on the next one, and a `#` comment outside quotes is dropped. Each must parse with the
//! binary's own parser (`flexvol::cli::check_args`: clap, and for verbs by hand a verb the
//! grammar knows). Those that can run for real without touching the host (`--help`, `--version`,
//! `init` by hand, `doctor`, and `status` without `--capacity`) are run against the built binary
//! with a temporary config, plugin directory and kubelet root substituted, and must exit 0.
//!
//! A block preceded by `<!-- not-run: reason -->` is parsed but never run. `./install.sh` lines
//! are not covered (install.sh is a shell script; its own tests are the `install_*` ones).

use crate::util::binary;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One documented command.
#[derive(Debug, Clone)]
struct DocCommand {
    file: String,
    line: usize,
    argv: Vec<String>,
    not_run: bool,
}

/// Splits a shell line into words: single and double quotes, backslash escapes outside single
/// quotes, `#` at the start of a word begins a comment.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    cur.push(d);
                }
            }
            '"' => {
                in_word = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                cur.push(e);
                            }
                        }
                        _ => cur.push(d),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(e) = chars.next() {
                    cur.push(e);
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// The documented commands of one Markdown text.
fn extract(file: &str, text: &str) -> Vec<DocCommand> {
    let mut out = Vec::new();
    let (mut in_block, mut shell, mut not_run, mut marker) = (false, false, false, false);
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim();
        if t.starts_with("```") {
            if in_block {
                in_block = false;
            } else {
                in_block = true;
                let lang = t.trim_start_matches('`').trim();
                shell = matches!(lang, "sh" | "bash" | "console" | "shell");
                not_run = marker;
            }
            marker = false;
            continue;
        }
        if !in_block {
            if t.starts_with("<!-- not-run:") {
                marker = true;
            } else if !t.is_empty() {
                marker = false;
            }
            continue;
        }
        if !shell {
            continue;
        }
        let t = t.strip_prefix("$ ").unwrap_or(t);
        let (start, mut acc) = match pending.take() {
            Some((l, acc)) => (l, acc),
            None if t.starts_with("flexvol ") || t == "flexvol" => (i + 1, String::new()),
            None => continue,
        };
        match t.strip_suffix('\\') {
            Some(head) => {
                acc.push_str(head);
                acc.push(' ');
                pending = Some((start, acc));
            }
            None => {
                acc.push_str(t);
                out.push(DocCommand {
                    file: file.to_owned(),
                    line: start,
                    argv: words(&acc),
                    not_run,
                });
            }
        }
    }
    out
}

fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v = vec![root.join("README.md")];
    for dir in ["docs", "drivers"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .flat_map(|p| {
                if p.is_dir() {
                    vec![p.join("README.md")]
                } else {
                    vec![p]
                }
            })
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        v.extend(found);
    }
    v
}

/// Whether a command can run for real here without changing the host, and its argv with the
/// temporary places substituted.
fn runnable(argv: &[String], plugin_dir: &Path, kubelet_root: &Path) -> Option<Vec<String>> {
    let rest: Vec<&str> = argv[1..]
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--pretty")
        .collect();
    if rest
        .iter()
        .any(|a| matches!(*a, "--help" | "-h" | "--version" | "-V"))
    {
        return Some(argv.to_vec());
    }
    match rest.as_slice() {
        [driver, "init"] if matches!(*driver, "hostpath" | "nfs" | "lvm") => Some(argv.to_vec()),
        ["doctor", ..] => {
            let mut v = Vec::new();
            let mut it = argv.iter();
            while let Some(a) = it.next() {
                if a == "--plugin-dir" {
                    it.next();
                } else {
                    v.push(a.clone());
                }
            }
            v.push("--plugin-dir".into());
            v.push(plugin_dir.display().to_string());
            Some(v)
        }
        ["status", tail @ ..] if !tail.contains(&"--capacity") => {
            let mut v = argv.to_vec();
            v.push("--kubelet-root".into());
            v.push(kubelet_root.display().to_string());
            Some(v)
        }
        _ => None,
    }
}

#[test]
fn contract_docs_commands_parse_and_the_safe_ones_run() {
    let mut all = Vec::new();
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display()
            .to_string();
        all.extend(extract(&name, &text));
    }
    // The docs show at least these many (operations.md alone has more than a dozen): an
    // extractor that finds nothing must not pass.
    assert!(
        all.len() >= 15,
        "only {} documented commands found: {all:#?}",
        all.len()
    );

    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    for d in ["state", "run", "plugins/flexvol~hostpath", "kubelet"] {
        std::fs::create_dir_all(p.join(d)).unwrap();
    }
    std::fs::copy(binary(), p.join("plugins/flexvol~hostpath/hostpath")).unwrap();
    let config = p.join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"stateDir":"{0}/state","runDir":"{0}/run","logFile":""}}"#,
            p.display()
        ),
    )
    .unwrap();

    let (mut parsed, mut ran, mut failures) = (0, 0, Vec::new());
    for c in &all {
        let at = format!("{}:{}: {}", c.file, c.line, c.argv.join(" "));
        if let Err(e) = flexvol::cli::check_args(&c.argv) {
            failures.push(format!("{at}\n  does not parse: {e}"));
            continue;
        }
        parsed += 1;
        if c.not_run {
            continue;
        }
        let Some(argv) = runnable(&c.argv, &p.join("plugins"), &p.join("kubelet")) else {
            continue;
        };
        let out = Command::new(binary())
            .args(&argv[1..])
            .env("FLEXVOL_CONFIG", &config)
            .output()
            .unwrap();
        ran += 1;
        if out.status.code() != Some(0) {
            failures.push(format!(
                "{at}\n  ran as {argv:?}: exit {:?}\n{}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    eprintln!(
        "documented commands: {} found, {parsed} parse, {ran} run for real",
        all.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 5, "only {ran} documented commands were run");
}

/// The extractor and the parser catch a command that drifted from the binary.
#[test]
fn contract_docs_commands_catch_a_made_up_drift() {
    let md = "text\n\n```sh\nflexvol doctor --no-such-flag   # gone\nflexvol conformance --driver flexvol/hostpath \\\n  --options '{\"path\":\"/srv/flexvol/x\"}'\nflexvol hostpath frobnicate /x\necho flexvol doctor\n```\n\n<!-- not-run: needs a cluster -->\n```sh\nflexvol status --capacity NODE\n```\n\n```yaml\nflexvol doctor --bad\n```\n";
    let got = extract("x.md", md);
    let argvs: Vec<Vec<String>> = got.iter().map(|c| c.argv.clone()).collect();
    assert_eq!(argvs.len(), 4, "{argvs:?}");
    assert_eq!(argvs[0], ["flexvol", "doctor", "--no-such-flag"]);
    assert_eq!(
        argvs[1],
        [
            "flexvol",
            "conformance",
            "--driver",
            "flexvol/hostpath",
            "--options",
            r#"{"path":"/srv/flexvol/x"}"#
        ]
    );
    assert!(!got[0].not_run && got[3].not_run);
    assert!(flexvol::cli::check_args(&argvs[0]).is_err());
    assert!(flexvol::cli::check_args(&argvs[1]).is_ok());
    assert!(flexvol::cli::check_args(&argvs[2]).is_err(), "unknown verb");
    assert!(flexvol::cli::check_args(&argvs[3]).is_ok());
}
