//! What this build is: the version (`Cargo.toml`), the commit it was built from (`build.rs`:
//! `git rev-parse`, or the release script's `FLEXVOL_COMMIT`; `unknown` outside a checkout) and
//! the target it was built for. `flexvol --version` prints [`line`]; the daemons' metrics carry the
//! same values in `flexvol_build_info`.

/// The crate's version (semantic versioning; `CHANGELOG.md`).
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit this binary was built from (12 hex digits, `-dirty` when tracked files differed).
pub const COMMIT: &str = env!("FLEXVOL_COMMIT");
/// The target triple this binary was built for (`build.rs`, from cargo's `TARGET`).
pub(crate) const TARGET: &str = env!("FLEXVOL_TARGET");

/// `0.1.0 (commit 0123456789ab, x86_64-unknown-linux-gnu)`: what `--version` says after the name.
pub(crate) const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("FLEXVOL_COMMIT"),
    ", ",
    env!("FLEXVOL_TARGET"),
    ")"
);

/// `flexvol 0.1.0 (commit 0123456789ab, x86_64-unknown-linux-gnu)`.
pub fn line() -> String {
    format!("flexvol {LONG}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_line_names_version_commit_and_target() {
        let l = super::line();
        assert!(
            l.starts_with(&format!("flexvol {} (commit ", env!("CARGO_PKG_VERSION"))),
            "{l}"
        );
        assert!(!super::COMMIT.is_empty());
        assert!(l.ends_with(&format!(", {})", super::TARGET)), "{l}");
        assert_eq!(
            l,
            format!(
                "flexvol {} (commit {}, {})",
                super::VERSION,
                super::COMMIT,
                super::TARGET
            )
        );
    }
}
