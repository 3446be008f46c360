//! JSON parsing with errors a user can act on: malformed JSON keeps serde's line and column;
//! a key that is unknown, missing, negative, fractional or of the wrong type is named by its
//! path (`hidden_size`, `layers[3].params`) with the fix, on one line.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use serde_path_to_error::Segment;

use crate::ModelError;

/// Parses `text` as a JSON object. Malformed JSON becomes [`ModelError::Json`] with serde's
/// line and column.
pub(crate) fn parse_object(text: &str, origin: &str) -> Result<Map<String, Value>, ModelError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ModelError::Json {
        origin: origin.to_string(),
        message: format!("malformed JSON: {e}; fix the syntax there"),
    })?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ModelError::Json {
            origin: origin.to_string(),
            message: format!(
                "expected a JSON object {{ ... }} at the top level, found {}",
                kind(&other)
            ),
        }),
    }
}

/// Deserializes `value` into `T`; every error names the key path at fault.
pub(crate) fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, ModelError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let mut path = Vec::new();
        for segment in err.path() {
            match segment {
                Segment::Map { key } => path.push(Step::Key(key.clone())),
                Segment::Seq { index } => path.push(Step::Index(*index)),
                Segment::Enum { .. } | Segment::Unknown => {}
            }
        }
        describe(value, path, &err.inner().to_string())
    })
}

/// One step of a key path.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// Renders a key path as `a.b[3].c`.
fn path_string(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The value at a key path, if it exists.
fn lookup<'a>(root: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(root, |v, step| match step {
        Step::Key(k) => v.get(k),
        Step::Index(i) => v.get(i),
    })
}

/// The backtick-quoted names in a serde message, in order.
fn quoted(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

/// Turns serde's message for the value at `path` into a [`ModelError::Invalid`].
fn describe(root: &Value, mut path: Vec<Step>, message: &str) -> ModelError {
    let names = quoted(message);
    if message.starts_with("unknown field") {
        let field = names.first().copied().unwrap_or("?");
        if !matches!(path.last(), Some(Step::Key(k)) if k == field) {
            path.push(Step::Key(field.to_string()));
        }
        let valid = names.get(1..).unwrap_or(&[]).join(", ");
        return ModelError::invalid(
            &path_string(&path),
            &format!("is not a known key: remove it or fix its spelling (valid keys: {valid})"),
        );
    }
    if message.starts_with("missing field") {
        let field = names.first().copied().unwrap_or("?");
        path.push(Step::Key(field.to_string()));
        return ModelError::invalid(&path_string(&path), "is required but missing: add it");
    }
    let key = if path.is_empty() {
        String::from("(top level)")
    } else {
        path_string(&path)
    };
    let found = lookup(root, &path);
    let shown = found.map(short).unwrap_or_default();
    if message.starts_with("unknown variant") {
        let valid = names.get(1..).unwrap_or(&[]).join(", ");
        return ModelError::invalid(&key, &format!("must be one of {valid} (got {shown})"));
    }
    if message.contains("expected u64") || message.contains(WHOLE_NUMBER) {
        let what = match found {
            Some(Value::Number(n)) if n.as_i64().is_some_and(|v| v < 0) => "is negative",
            Some(Value::Number(n)) if n.as_f64().is_some_and(|v| v < 0.0) => "is negative",
            Some(Value::Number(n)) if n.as_f64().is_some_and(|v| v >= 1.8e19) => "is too large",
            Some(Value::Number(_)) => "is not a whole number",
            Some(other) => kind(other),
            None => "has the wrong type",
        };
        let what = if what.starts_with("is ") {
            what.to_string()
        } else {
            format!("is {what}")
        };
        let wanted = if message.contains(WHOLE_NUMBER) {
            "a non-negative whole number"
        } else {
            "a positive whole number"
        };
        return ModelError::invalid(&key, &format!("must be {wanted}, but {what} ({shown})"));
    }
    if message.contains("expected a boolean") {
        return ModelError::invalid(&key, &format!("must be true or false (got {shown})"));
    }
    if message.contains("expected a string") {
        return ModelError::invalid(&key, &format!("must be a string (got {shown})"));
    }
    if message.contains("expected a sequence") {
        return ModelError::invalid(&key, &format!("must be a JSON array [ ... ] (got {shown})"));
    }
    ModelError::invalid(&key, message)
}

/// What kind of JSON value this is, for messages.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value shortened for a one-line message.
pub(crate) fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 40 {
        let cut: String = text.chars().take(37).collect();
        format!("{cut}...")
    } else {
        text
    }
}

/// The marker [`whole_number`] puts in its error so that [`describe`] words it like a `u64`.
const WHOLE_NUMBER: &str = "expected a non-negative whole number";

/// Deserializes a count (FLOPs, bytes, parameters) written either as an integer or as a float in
/// exponent notation (`1.2e12`); it must be non-negative, finite, whole and below 2^63.
pub(crate) fn whole_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let value = Value::deserialize(deserializer)?;
    count_from_value(&value).map_err(serde::de::Error::custom)
}

/// [`whole_number`] for an optional key (`null` counts as absent).
pub(crate) fn opt_whole_number<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    let value = Value::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    count_from_value(&value)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// The count a JSON value holds, or serde's style of message.
fn count_from_value(value: &Value) -> Result<u64, String> {
    let bad = || format!("invalid value {}, {WHOLE_NUMBER}", short(value));
    match value {
        Value::Number(n) => {
            if let Some(v) = n.as_u64() {
                return Ok(v);
            }
            match n.as_f64() {
                Some(v) if v >= 0.0 && v.fract() == 0.0 && v < 9.2e18 => Ok(v as u64),
                _ => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        count: u64,
        #[serde(deserialize_with = "whole_number")]
        flops: u64,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        items: Vec<Inner>,
    }

    fn err(json: &str) -> String {
        let value: Value = serde_json::from_str(json).unwrap();
        from_value::<Outer>(&value).unwrap_err().to_string()
    }

    #[test]
    fn names_nested_paths() {
        let e = err(r#"{"name":"x","items":[{"count":1,"flops":2},{"count":-3,"flops":2}]}"#);
        assert_eq!(
            e,
            "model key 'items[1].count' must be a positive whole number, but is negative (-3)"
        );
        let e = err(r#"{"name":"x","items":[{"count":1,"flops":2.5}]}"#);
        assert_eq!(
            e,
            "model key 'items[0].flops' must be a non-negative whole number, but is not a whole number (2.5)"
        );
        let e = err(r#"{"name":"x","items":[{"count":1}]}"#);
        assert_eq!(
            e,
            "model key 'items[0].flops' is required but missing: add it"
        );
        let e = err(r#"{"name":"x","items":[{"count":1,"flops":1,"bogus":1}]}"#);
        assert_eq!(
            e,
            "model key 'items[0].bogus' is not a known key: remove it or fix its spelling (valid keys: count, flops)"
        );
        let e = err(r#"{"name":3,"items":[]}"#);
        assert_eq!(e, "model key 'name' must be a string (got 3)");
    }

    #[test]
    fn whole_number_accepts_exponent_notation() {
        let value: Value =
            serde_json::from_str(r#"{"name":"x","items":[{"count":1,"flops":1.5e12}]}"#).unwrap();
        let outer: Outer = from_value(&value).unwrap();
        assert_eq!(outer.items[0].flops, 1_500_000_000_000);
    }

    #[test]
    fn malformed_json_has_line_and_column() {
        let e = parse_object("{\n  \"a\": 1,\n  \"b\" 2\n}", "m.json").unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("m.json: malformed JSON: "), "{text}");
        assert!(text.contains("line 3 column"), "{text}");
        let e = parse_object("[1, 2]", "m.json").unwrap_err();
        assert_eq!(
            e.to_string(),
            "m.json: expected a JSON object { ... } at the top level, found an array"
        );
    }
}
