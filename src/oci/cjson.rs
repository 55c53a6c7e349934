//! Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings escaped as serde_json escapes them. Every config, manifest and index infer-build
//! hashes is written through [`to_vec`], so the same value always gives the same bytes whatever
//! map type produced it (oci-spec keeps annotations in `HashMap`s: never serialize those
//! directly).

use serde::Serialize;
use serde_json::Value;

/// Serialize `value` canonically.
pub fn to_vec<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let v = serde_json::to_value(value)?;
    let mut out = Vec::with_capacity(512);
    write(&v, &mut out);
    Ok(out)
}

/// Write an already-built JSON value canonically.
pub fn value_to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out);
            }
            out.push(b']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(k, out);
                out.push(b':');
                write(&m[k], out);
            }
            out.push(b'}');
        }
    }
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is fixed (`\"`, `\\`, `\n`… and `\u00XX` for other control
    // characters, everything else verbatim UTF-8); writing a `&str` cannot fail.
    let escaped = serde_json::to_string(s).unwrap_or_default();
    out.extend_from_slice(escaped.as_bytes());
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
