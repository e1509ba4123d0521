//! Change records: a Debezium envelope (one JSON line) flattened to the row it describes.
//!
//! `{"before": {…}, "after": {…}, "op": "c|u|d|r", "ts_ms": …, "source": {…}}`, optionally
//! wrapped as `{"schema": {…}, "payload": {…}}` (Kafka Connect's JSON converter with schemas
//! enabled), becomes the object of `after` (`before` for a delete) plus `_op` (the op letter)
//! and `_cdc_ts` (`ts_ms` as RFC 3339; `source.ts_ms` when the envelope has none). Everything
//! else that is not such an envelope is a malformed record, rejected with a reason that names
//! what is wrong (never the whole value: a reason stays short).

use serde_json::{Map, Value};

use crate::schema::{CDC_OP, CDC_TS};

/// Prefix of every reason a malformed envelope is rejected with.
const WHAT: &str = "malformed Debezium envelope";

/// The kind of a JSON value, for reasons.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn malformed(why: impl std::fmt::Display) -> String {
    format!("{WHAT}: {why}")
}

/// The row an envelope line describes, as one JSON object line (no newline), or why the line
/// is not an envelope.
pub(super) fn flatten(line: &[u8]) -> Result<Vec<u8>, String> {
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| malformed(format_args!("not one JSON value ({e})")))?;
    let mut envelope = match value {
        Value::Object(m) => m,
        Value::Null => return Err(malformed("a tombstone (null) carries no change")),
        other => return Err(malformed(format_args!("{}, not an object", kind(&other)))),
    };
    // The converter's wrapper: the envelope is the payload.
    if !envelope.contains_key("op") && envelope.contains_key("payload") {
        envelope = match envelope.remove("payload") {
            Some(Value::Object(p)) => p,
            Some(Value::Null) => {
                return Err(malformed("a tombstone (`payload` null) carries no change"))
            }
            Some(other) => {
                return Err(malformed(format_args!(
                    "`payload` is {}, not an object",
                    kind(&other)
                )))
            }
            None => Map::new(),
        };
    }
    let op = match envelope.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(other) => return Err(malformed(format_args!("`op` is {}", kind(other)))),
        None => return Err(malformed("no `op`")),
    };
    let image = match op.as_str() {
        "c" | "u" | "r" => "after",
        "d" => "before",
        other => {
            let shown: String = other.chars().take(8).collect();
            return Err(malformed(format_args!(
                "`op` is \"{shown}\", not c, u, d or r (a truncate or message carries no row)"
            )));
        }
    };
    let ts_ms = match envelope.get("ts_ms") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(other) => return Err(malformed(format_args!("`ts_ms` is {}", kind(other)))),
        None => envelope
            .get("source")
            .and_then(|s| s.get("ts_ms"))
            .and_then(Value::as_i64),
    }
    .ok_or_else(|| malformed("no integer `ts_ms` (nor `source.ts_ms`)"))?;
    let ts = chrono::DateTime::from_timestamp_millis(ts_ms)
        .ok_or_else(|| malformed(format_args!("`ts_ms` {ts_ms} is not a time")))?;
    let mut row = match envelope.remove(image) {
        Some(Value::Object(row)) => row,
        Some(Value::Null) | None => {
            return Err(malformed(format_args!(
                "`op` \"{op}\" needs its row in `{image}`, found none"
            )))
        }
        Some(other) => {
            return Err(malformed(format_args!(
                "`{image}` is {}, not an object",
                kind(&other)
            )))
        }
    };
    row.insert(CDC_OP.to_string(), Value::String(op));
    row.insert(
        CDC_TS.to_string(),
        Value::String(ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    );
    serde_json::to_vec(&Value::Object(row)).map_err(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(line: &str) -> Result<Value, String> {
        flatten(line.as_bytes()).map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn each_op_takes_its_image_and_the_wrapper_is_unwrapped() {
        let after = r#"{"before":null,"after":{"id":1,"name":"a"},"op":"c","ts_ms":1700000000123,"source":{"db":"x"}}"#;
        let v = flat(after).unwrap();
        assert_eq!(v["id"], 1);
        assert_eq!(v["_op"], "c");
        assert_eq!(v["_cdc_ts"], "2023-11-14T22:13:20.123Z");
        assert!(v.get("source").is_none() && v.get("before").is_none());
        let delete = r#"{"before":{"id":1,"name":"a"},"after":null,"op":"d","ts_ms":5}"#;
        assert_eq!(flat(delete).unwrap()["name"], "a");
        let wrapped = format!(r#"{{"schema":{{"type":"struct"}},"payload":{after}}}"#);
        assert_eq!(flat(&wrapped).unwrap(), flat(after).unwrap());
        let source_time = r#"{"after":{"id":2},"op":"r","source":{"ts_ms":1000}}"#;
        assert_eq!(
            flat(source_time).unwrap()["_cdc_ts"],
            "1970-01-01T00:00:01.000Z"
        );
    }

    #[test]
    fn malformed_envelopes_are_named() {
        for (line, says) in [
            ("{not json", "not one JSON value"),
            ("null", "tombstone"),
            (r#"{"schema":{},"payload":null}"#, "tombstone"),
            ("[1,2]", "an array, not an object"),
            (r#"{"after":{"id":1},"ts_ms":1}"#, "no `op`"),
            (r#"{"after":{"id":1},"op":7,"ts_ms":1}"#, "`op` is a number"),
            (
                r#"{"after":{"id":1},"op":"t","ts_ms":1}"#,
                "not c, u, d or r",
            ),
            (
                r#"{"after":null,"op":"c","ts_ms":1}"#,
                "needs its row in `after`",
            ),
            (
                r#"{"before":null,"after":{"id":1},"op":"d","ts_ms":1}"#,
                "needs its row in `before`",
            ),
            (r#"{"after":[1],"op":"u","ts_ms":1}"#, "`after` is an array"),
            (r#"{"after":{"id":1},"op":"u"}"#, "no integer `ts_ms`"),
            (
                r#"{"after":{"id":1},"op":"u","ts_ms":"x"}"#,
                "`ts_ms` is a string",
            ),
            (
                r#"{"after":{"id":1},"op":"u","ts_ms":1e30}"#,
                "no integer `ts_ms`",
            ),
            (r#"{"payload":3}"#, "`payload` is a number"),
        ] {
            let e = flat(line).unwrap_err();
            assert!(e.starts_with(WHAT) && e.contains(says), "{line}: {e}");
        }
    }
}
