//! File names for arbitrary keys: the one rule by which state records and lock files are named
//! after the volume (a path) they belong to.

/// A file name for an arbitrary key (a path): readable, reversible for short keys (bytes outside
/// `[A-Za-z0-9._-]` become `%XX`), and a hash plus a readable tail for keys too long for a name.
pub fn file_key(key: &str) -> String {
    let mut s = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if s.len() <= 200 {
        return s;
    }
    // FNV-1a: stable across versions and platforms; collisions are caught by the target check.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    let tail: String = s
        .chars()
        .rev()
        .take(100)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{h:016x}-{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_keys_are_safe_names() {
        assert_eq!(file_key("/a b/c~d"), "%2Fa%20b%2Fc%7Ed");
        let long = format!("/{}", "x".repeat(400));
        let k = file_key(&long);
        assert!(k.len() < 255 && !k.contains('/'), "{k}");
        assert_ne!(file_key(&format!("{long}1")), file_key(&format!("{long}2")));
    }
}
