//! Kubernetes resource quantities as sizes in bytes: a claim's request, a PV's capacity, the LVM
//! driver's `size` option. [`parse_size`] reads one (`512Mi`, `1Gi`, `10G`, `1.5Gi`, plain bytes),
//! [`format_size`] writes one (`128Mi`). Pure string work.

/// Parses a Kubernetes quantity (`512Mi`, `1Gi`, `10G`, `1.5Gi`, `1073741824`) into bytes, rounded
/// up to a whole byte. Zero, negative, milli-units, exponents and values past 2^64-1 are refused.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    const HINT: &str = "expected a size such as 512Mi, 1Gi, 10G, 1.5Gi or a plain number of bytes";
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return Err(HINT.into()),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || (num.contains('.') && frac.is_empty()) || frac.contains('.') {
        return Err(HINT.into());
    }
    if int.len() > 20 || frac.len() > 18 {
        return Err("is too large for a volume (more than 2^64-1 bytes)".into());
    }
    let int: u128 = int.parse().map_err(|_| HINT.to_owned())?;
    let frac_bytes = if frac.is_empty() {
        0
    } else {
        let f: u128 = frac.parse().map_err(|_| HINT.to_owned())?;
        // At most 18 digits (checked above), so the conversion cannot fail.
        let digits = u32::try_from(frac.len()).map_err(|_| HINT.to_owned())?;
        let scale = 10u128.pow(digits);
        (f * mult).div_ceil(scale)
    };
    let bytes = int
        .checked_mul(mult)
        .and_then(|b| b.checked_add(frac_bytes))
        .and_then(|b| u64::try_from(b).ok())
        .ok_or("is too large for a volume (more than 2^64-1 bytes)")?;
    if bytes == 0 {
        return Err("must be more than zero".into());
    }
    Ok(bytes)
}

/// `bytes` as a quantity string, in the largest binary unit that divides it (`128Mi`, `1Gi`);
/// plain bytes otherwise.
pub(crate) fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `bytes` for people, in the largest binary unit it reaches, to one decimal (truncated):
/// `512 B`, `1.5 KiB`, `64.0 MiB`, `30.0 GiB`. What every operator command prints for a size.
pub(crate) fn format_human(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1u64 << shift {
            let tenths = (u128::from(bytes) * 10) >> shift;
            return format!("{}.{} {unit}", tenths / 10, tenths % 10);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_people() {
        for (b, want) in [
            (0u64, "0 B"),
            (512, "512 B"),
            (1536, "1.5 KiB"),
            (64 << 20, "64.0 MiB"),
            ((30 << 30) + (1 << 29), "30.5 GiB"),
            (42_949_672_960 - 4096, "39.9 GiB"),
            (3 << 40, "3.0 TiB"),
            (u64::MAX, "16777215.9 TiB"),
        ] {
            assert_eq!(format_human(b), want, "{b}");
        }
    }

    #[test]
    fn sizes() {
        for (s, want) in [
            ("1", 1u64),
            ("1073741824", 1 << 30),
            ("512Mi", 512 << 20),
            ("1Gi", 1 << 30),
            ("10G", 10_000_000_000),
            ("1.5Gi", 3 << 29),
            ("0.5Ki", 512),
            ("1.0000000001Ki", 1025),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert_eq!(parse_size("15Ei"), Ok(15 << 60));
        assert!(parse_size("16Ei").is_err(), "2^64 is one past u64");
        for bad in [
            "",
            "0",
            "0Gi",
            "-1",
            "-1Gi",
            "1.",
            ".5",
            "1..5Gi",
            "1gi",
            "1 Gi",
            "1Gi ",
            "abc",
            "1e9",
            "100m",
            "1.5.5",
            "99999999999999999999999",
            "18446744073709551616",
            "Gi",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn sizes_are_written_in_the_largest_binary_unit() {
        assert_eq!(format_size(128 << 20), "128Mi");
        assert_eq!(format_size(2 << 30), "2Gi");
        assert_eq!(format_size(68 << 20), "68Mi");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(0), "0");
    }
}
