//! Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings escaped as serde_json escapes them. Every config, manifest and index infer-build
//! hashes is written through [`to_vec`], so the same value always gives the same bytes whatever
//! map type produced it (oci-spec keeps annotations in `HashMap`s: never serialize those
//! directly).

use infer_spec::engine::write_canonical;
use serde::Serialize;
use serde_json::Value;

/// Serialize `value` canonically.
pub(crate) fn to_vec<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let v = serde_json::to_value(value)?;
    let mut out = Vec::with_capacity(512);
    write_canonical(&v, &mut out);
    Ok(out)
}

/// Write an already-built JSON value canonically.
pub(crate) fn value_to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    write_canonical(v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn check(v: Value, expected: &str) {
        assert_eq!(String::from_utf8(value_to_vec(&v)).unwrap(), expected);
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        check(
            serde_json::json!({"b": 1, "a": [true, null, "x\ny"], "B": {"z": {}, "y": []}}),
            r#"{"B":{"y":[],"z":{}},"a":[true,null,"x\ny"],"b":1}"#,
        );
        check(serde_json::json!("é\u{1}"), "\"é\\u0001\"");
    }

    #[test]
    fn hashmap_order_does_not_leak() {
        let mut m = HashMap::new();
        for i in 0..64 {
            m.insert(format!("k{i}"), i);
        }
        let a = to_vec(&m).unwrap();
        let m2: HashMap<String, i32> = m.clone().into_iter().collect();
        assert_eq!(a, to_vec(&m2).unwrap());
        assert!(String::from_utf8(a)
            .unwrap()
            .starts_with(r#"{"k0":0,"k1":1,"k10":10,"#));
    }
}
