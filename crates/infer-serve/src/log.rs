//! Structured logs: one JSON object per line on stdout with `ts`, `level`, `msg` and the
//! event's fields (keys sorted, as serde_json writes maps).

use serde_json::{Map, Value};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes one log line. `fields` come after `ts`, `level` and `msg`, in the order given.
pub fn log(level: &str, msg: &str, fields: &[(&str, Value)]) {
    let mut m = Map::new();
    m.insert("ts".into(), Value::String(timestamp(SystemTime::now())));
    m.insert("level".into(), Value::String(level.into()));
    m.insert("msg".into(), Value::String(msg.into()));
    for (k, v) in fields {
        m.insert((*k).into(), v.clone());
    }
    let mut line = Value::Object(m).to_string();
    line.push('\n');
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

pub fn info(msg: &str, fields: &[(&str, Value)]) {
    log("info", msg, fields);
}

pub fn error(msg: &str, fields: &[(&str, Value)]) {
    log("error", msg, fields);
}

/// RFC 3339 UTC with microseconds.
pub fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps() {
        let check = |secs: u64, want: &str| {
            assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(secs)), want)
        };
        check(0, "1970-01-01T00:00:00.000000Z");
        check(951_782_400, "2000-02-29T00:00:00.000000Z");
        check(1_796_000_000, "2026-11-30T00:53:20.000000Z");
    }
}
