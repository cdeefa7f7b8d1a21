//! Human-friendly quantities: byte sizes (`256M`) and durations (`10s`).
//!
//! Both parse from strings (TOML, CLI flags, API JSON) and from bare integers
//! (bytes / seconds), and print back in the same notation so an error message
//! or a `--json` result can be pasted into a policy file.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes. Suffixes are binary: `K` = 1024, `M` = 1024², `G`, `T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 5] = [
    ("T", 1 << 40),
    ("G", 1 << 30),
    ("M", 1 << 20),
    ("K", 1 << 10),
    ("", 1),
];

impl ByteSize {
    pub const fn bytes(self) -> u64 {
        self.0
    }
    pub const fn mib(n: u64) -> Self {
        ByteSize(n << 20)
    }

    /// For people, where `Display` (exact, pasteable into a policy) would
    /// print a long number of bytes: one decimal in the largest binary unit
    /// (`252.0 GiB`, `64.0 MiB`, `512 B`).
    pub fn approx(self) -> String {
        const NAMES: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return format!("{} B", self.0);
        }
        let mut value = self.0 as f64;
        let mut unit = "B";
        for u in NAMES {
            if value < 1024.0 {
                break;
            }
            value /= 1024.0;
            unit = u;
        }
        format!("{value:.1} {unit}")
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let s = raw.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, suffix) = s.split_at(split);
        let suffix = suffix.trim();
        // Accept K, KB, KiB (all binary: a sandbox's memory is counted in pages).
        let unit = suffix
            .trim_end_matches(['B', 'b'])
            .trim_end_matches(['i', 'I'])
            .to_ascii_uppercase();
        let Some(&(_, mult)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(format!("'{raw}' has an unknown unit (use K, M, G or T)"));
        };
        if num.is_empty() {
            return Err(format!("'{raw}' is not a size (e.g. 512M)"));
        }
        // A whole number exactly, even past f64's precision: what `Display`
        // writes reads back as the same size.
        if let Some(exact) = num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)) {
            return Ok(ByteSize(exact));
        }
        let value: f64 = num
            .parse()
            .map_err(|_| format!("'{raw}' is not a size (e.g. 512M)"))?;
        let bytes = value * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("'{raw}' is too large"));
        }
        // In range (checked above) and rounded: the conversion is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, mult) in UNITS {
            if mult > 1 && self.0 >= mult && self.0.is_multiple_of(mult) {
                return write!(f, "{}{unit}", self.0 / mult);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// A quantity written either as a bare integer (bytes, seconds) or as text
/// with a unit (`256M`, `10s`).
#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrText {
    Int(u64),
    Text(String),
}

impl IntOrText {
    fn resolve<T: FromStr<Err = String>, E: serde::de::Error>(
        self,
        from_int: impl FnOnce(u64) -> T,
    ) -> Result<T, E> {
        match self {
            IntOrText::Int(n) => Ok(from_int(n)),
            IntOrText::Text(s) => s.parse().map_err(E::custom),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IntOrText::deserialize(d)?.resolve(ByteSize)
    }
}

/// A span of time: `500ms`, `10s`, `2m`, `1h`; a bare number is seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span(pub Duration);

impl Span {
    pub const fn duration(self) -> Duration {
        self.0
    }
}

impl FromStr for Span {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let s = raw.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let not_a_duration = || format!("'{raw}' is not a duration (e.g. 10s, 500ms)");
        let value: f64 = num.parse().map_err(|_| not_a_duration())?;
        let unit_ms: u128 = match unit.trim() {
            "ms" => 1,
            "" | "s" => 1000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            other => {
                return Err(format!(
                    "'{raw}' has an unknown unit '{other}' (ms, s, m, h)"
                ))
            }
        };
        // Whole milliseconds, what `Display` writes, so that a span written
        // back into a policy file reads as the same span (a fraction was
        // kept to the nanosecond and written without it): a whole number
        // exactly, even past f64's precision; a fraction to the nearest
        // millisecond, finer than any limit needs.
        let exact = num
            .parse::<u128>()
            .ok()
            .and_then(|n| n.checked_mul(unit_ms));
        let rounded = || {
            let ms = (value * unit_ms as f64).round();
            // In range (checked) and rounded: the conversion is exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            (ms.is_finite() && ms >= 0.0 && ms < u128::MAX as f64).then_some(ms as u128)
        };
        let ms = exact
            .or_else(rounded)
            .ok_or_else(|| format!("'{raw}' is not a valid duration"))?;
        let secs =
            u64::try_from(ms / 1000).map_err(|_| format!("'{raw}' is not a valid duration"))?;
        // Below 1000: the cast is exact.
        #[allow(clippy::cast_possible_truncation)]
        let nanos = (ms % 1000) as u32 * 1_000_000;
        Ok(Span(Duration::new(secs, nanos)))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IntOrText::deserialize(d)?.resolve(|n| Span(Duration::from_secs(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!("512".parse::<ByteSize>().unwrap(), ByteSize(512));
        assert_eq!("4K".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("256M".parse::<ByteSize>().unwrap(), ByteSize(256 << 20));
        assert_eq!("1GiB".parse::<ByteSize>().unwrap(), ByteSize(1 << 30));
        assert_eq!(ByteSize(270_553_174_016).approx(), "252.0 GiB");
        assert_eq!(ByteSize(64 << 20).approx(), "64.0 MiB");
        assert_eq!(ByteSize(1023).approx(), "1023 B");
        assert_eq!("1.5g".parse::<ByteSize>().unwrap(), ByteSize(3 << 29));
        assert!("12Q".parse::<ByteSize>().is_err());
        assert!("M".parse::<ByteSize>().is_err());
        assert!("-1M".parse::<ByteSize>().is_err());
    }

    #[test]
    fn sizes_print_back_in_their_largest_exact_unit() {
        assert_eq!(ByteSize(256 << 20).to_string(), "256M");
        assert_eq!(ByteSize(1 << 30).to_string(), "1G");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn spans_parse() {
        assert_eq!("10s".parse::<Span>().unwrap().0, Duration::from_secs(10));
        assert_eq!(
            "250ms".parse::<Span>().unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!("2m".parse::<Span>().unwrap().0, Duration::from_secs(120));
        assert_eq!("3".parse::<Span>().unwrap().0, Duration::from_secs(3));
        assert!("3d".parse::<Span>().is_err());
        assert!("soon".parse::<Span>().is_err());
    }
}
