//! Dotted numeric versions (`10.16.1`, `575.57.08`) and compute capabilities (`8.9`).

/// A dotted numeric version: the one type of the builder and the runtime (see
/// [`infer_spec::engine::Version`]). Missing trailing components compare as 0, so `580` <
/// `580.65.06` and `12.9` == `12.9.0`; it displays exactly as written.
pub use infer_spec::engine::Version;

/// A CUDA compute capability (`8.9`): the one type of the builder and the runtime (see
/// [`infer_spec::engine::ComputeCapability`]). The matrix writes it dotted; `sm_89` parses too.
pub use infer_spec::engine::ComputeCapability;

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
}
