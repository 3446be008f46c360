//! Fields of the published-runs file in the types people write them: a count as `8` or `"8"`, a
//! figure as `137` or `"137.5"`, peak memory as `82.4` (GiB) or `"82.4GB"`.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A JSON value that should hold a number: the number, or a string holding one (trimmed).
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
}

/// What a value is, for an error message.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 40 {
        format!("{}…", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

/// An optional number, `null` as `None`; `convert` accepts or refuses it, and `expected` says
/// what is expected when it refuses.
fn opt_number<'de, D: Deserializer<'de>, T>(
    d: D,
    convert: fn(f64) -> Option<T>,
    expected: &str,
) -> Result<Option<T>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match number(&v).and_then(convert) {
            Some(x) => Ok(Some(x)),
            None => Err(serde::de::Error::custom(format!(
                "must be {expected} (got {})",
                shown(&v)
            ))),
        },
    }
}

/// An optional whole number: `8`, `"8"` or `null`.
pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let whole = |x: f64| (x >= 0.0 && x.fract() == 0.0 && x <= u64::MAX as f64).then_some(x as u64);
    opt_number(d, whole, "a whole number of at least 0, as 8 or \"8\"")
}

/// An optional finite number: `137`, `"137.5"` or `null`.
pub fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let finite = |x: f64| x.is_finite().then_some(x);
    opt_number(d, finite, "a number, as 137 or \"137.5\"")
}

/// Peak memory as written: a string as the source prints it (`"47GB"`, `"OOM"`), or a number of
/// GiB (`82.4`, kept as `"82.4GiB"`).
pub fn opt_memory<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Number(n)) => Ok(Some(format!("{n}GiB"))),
        Some(v) => Err(serde::de::Error::custom(format!(
            "must be GiB as a number (82.4) or a string (\"82.4GB\") (got {})",
            shown(&v)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Row {
        #[serde(default, deserialize_with = "opt_u64")]
        tp: Option<u64>,
        #[serde(default, deserialize_with = "opt_f64")]
        t: Option<f64>,
        #[serde(default, deserialize_with = "opt_memory")]
        m: Option<String>,
    }

    fn row(text: &str) -> Result<Row, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn numbers_and_strings_are_both_read() {
        let r = row(r#"{"tp": "8", "t": 1.5, "m": 82.4}"#).unwrap();
        assert_eq!(
            (r.tp, r.t, r.m.as_deref()),
            (Some(8), Some(1.5), Some("82.4GiB"))
        );
        let r = row(r#"{"tp": 8, "t": "1.5", "m": "47GB"}"#).unwrap();
        assert_eq!(
            (r.tp, r.t, r.m.as_deref()),
            (Some(8), Some(1.5), Some("47GB"))
        );
        let r = row(r#"{"tp": null}"#).unwrap();
        assert_eq!((r.tp, r.t, r.m), (None, None, None));
    }

    #[test]
    fn wrong_values_say_what_is_expected() {
        assert!(row(r#"{"tp": 2.5}"#).unwrap_err().contains("whole number"));
        assert!(row(r#"{"tp": -1}"#).unwrap_err().contains("whole number"));
        assert!(row(r#"{"t": "fast"}"#)
            .unwrap_err()
            .contains("must be a number"));
        assert!(row(r#"{"m": [1]}"#).unwrap_err().contains("GiB"));
    }
}
