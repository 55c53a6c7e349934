//! Dotted numeric versions (`10.16.1`, `575.57.08`) and compute capabilities (`8.9`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A dotted numeric version: the one type of the builder and the runtime (see
/// [`infer_spec::engine::Version`]). Missing trailing components compare as 0, so `580` <
/// `580.65.06` and `12.9` == `12.9.0`; it displays exactly as written.
pub use infer_spec::engine::Version;

/// A CUDA compute capability, `major.minor` (`8.9`). Engines bind to it: its target-id form
/// is `sm89`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cc {
    pub major: u32,
    pub minor: u32,
}

impl Cc {
    pub const fn new(major: u32, minor: u32) -> Cc {
        Cc { major, minor }
    }

    /// The SM name used in target ids: `sm89`, `sm100`.
    pub fn sm(&self) -> String {
        format!("sm{}{}", self.major, self.minor)
    }

    /// Parse an SM name as users write it: `sm_86`, `sm86`, `SM_100`, `sm_120`. The last digit
    /// is the minor version.
    pub fn parse_sm(s: &str) -> Option<Cc> {
        let lower = s.trim().to_ascii_lowercase();
        let digits = lower.strip_prefix("sm")?;
        let digits = digits.strip_prefix('_').unwrap_or(digits);
        if digits.len() < 2 || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        Some(Cc::new(major.parse().ok()?, minor.parse().ok()?))
    }
}

impl FromStr for Cc {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!("invalid compute capability \"{s}\": expected \"major.minor\", such as \"8.9\"")
        };
        let (a, b) = s.trim().split_once('.').ok_or_else(bad)?;
        Ok(Cc::new(
            a.parse().map_err(|_| bad())?,
            b.parse().map_err(|_| bad())?,
        ))
    }
}

impl fmt::Display for Cc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for Cc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn versions_order_numerically_and_pad_with_zeros() {
        assert!(v("10.16.1") > v("10.9.0"));
        assert!(v("580") < v("580.65.06"));
        assert_eq!(v("12.9"), v("12.9.0"));
        assert!(v("575.57.08") < v("580"));
        assert!(v("10").is_prefix_of(&v("10.16.1")));
        assert!(v("10.16").is_prefix_of(&v("10.16.1")));
        assert!(!v("10.1").is_prefix_of(&v("10.16.1")));
        assert_eq!(v("13.0.2").major_minor().to_string(), "13.0");
        assert!("10.x".parse::<Version>().is_err());
        assert!("".parse::<Version>().is_err());
    }

    #[test]
    fn sm_names_parse() {
        let check = |s: &str, want: Option<(u32, u32)>| {
            assert_eq!(Cc::parse_sm(s).map(|c| (c.major, c.minor)), want, "{s}");
        };
        check("sm_86", Some((8, 6)));
        check("sm86", Some((8, 6)));
        check("SM_100", Some((10, 0)));
        check("sm_120", Some((12, 0)));
        check("sm_8", None);
        check("sm_8x", None);
        check("L4", None);
        assert_eq!(Cc::new(10, 3).sm(), "sm103");
        assert_eq!("8.9".parse::<Cc>().unwrap(), Cc::new(8, 9));
    }
}
