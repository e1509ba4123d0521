//! Change records: a Debezium envelope (one JSON line) flattened to the row it describes.
//!
//! `{"before": {…}, "after": {…}, "op": "c|u|d|r", "ts_ms": …, "source": {…}}`, optionally
//! wrapped as `{"schema": {…}, "payload": {…}}` (Kafka Connect's JSON converter with schemas
//! enabled), becomes the object of `after` (`before` for a delete) plus `_op` (the op letter)
//! and `_cdc_ts` (`ts_ms` as RFC 3339; `source.ts_ms` when the envelope has none). Everything
//! else that is not such an envelope is a malformed record, rejected with a reason that names
//! what is wrong (never the whole value: a reason stays short).
//!
//! The row is spliced from the envelope's own text (the image's members as they came, then
//! `_op` and `_cdc_ts`), never re-serialised from parsed values: a number keeps every digit
//! (a `decimal(38,18)` amount, an integer above `u64`), as on a plain JSON-lines route.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::schema::{CDC_OP, CDC_TS};

/// Prefix of every reason a malformed envelope is rejected with.
const WHAT: &str = "malformed Debezium envelope";

/// The kind of a JSON value (its raw text), for reasons.
fn kind(v: &RawValue) -> &'static str {
    match v.get().trim_start().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

fn malformed(why: impl std::fmt::Display) -> String {
    format!("{WHAT}: {why}")
}

/// A member present in the envelope, `null` included (as its raw text); `None` when absent.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The members of an envelope floe reads, as their raw text; the rest is skipped.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    op: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    before: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    after: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    ts_ms: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    source: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
}

/// `source.ts_ms`, the fallback change time.
#[derive(Deserialize)]
struct Source<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    ts_ms: Option<&'a RawValue>,
}

/// An object's members in order, each value as its raw text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A `ts_ms` as an integer (none for a fraction, an exponent or beyond `i64`).
fn millis(v: &RawValue) -> Option<i64> {
    serde_json::from_str::<i64>(v.get()).ok()
}

/// The envelope members of an object's raw text.
fn parse(v: &RawValue) -> Result<Envelope<'_>, String> {
    serde_json::from_str(v.get()).map_err(malformed)
}

/// The row an envelope line describes, as one JSON object line (no newline), or why the line
/// is not an envelope.
pub(super) fn flatten(line: &[u8]) -> Result<Vec<u8>, String> {
    let whole: &RawValue = serde_json::from_slice(line)
        .map_err(|e| malformed(format_args!("not one JSON value ({e})")))?;
    match kind(whole) {
        "an object" => {}
        "null" => return Err(malformed("a tombstone (null) carries no change")),
        other => return Err(malformed(format_args!("{other}, not an object"))),
    }
    let mut envelope = parse(whole)?;
    // The converter's wrapper: the envelope is the payload.
    if envelope.op.is_none() {
        if let Some(payload) = envelope.payload {
            envelope = match kind(payload) {
                "an object" => parse(payload)?,
                "null" => return Err(malformed("a tombstone (`payload` null) carries no change")),
                other => {
                    return Err(malformed(format_args!(
                        "`payload` is {other}, not an object"
                    )))
                }
            };
        }
    }
    let op = match envelope.op {
        Some(op) if kind(op) == "a string" => {
            serde_json::from_str::<String>(op.get()).map_err(malformed)?
        }
        Some(other) => return Err(malformed(format_args!("`op` is {}", kind(other)))),
        None => return Err(malformed("no `op`")),
    };
    let (image, row) = match op.as_str() {
        "c" | "u" | "r" => ("after", envelope.after),
        "d" => ("before", envelope.before),
        other => {
            let shown: String = other.chars().take(8).collect();
            return Err(malformed(format_args!(
                "`op` is \"{shown}\", not c, u, d or r (a truncate or message carries no row)"
            )));
        }
    };
    let ts_ms = match envelope.ts_ms {
        Some(n) if kind(n) == "a number" => millis(n),
        Some(other) => return Err(malformed(format_args!("`ts_ms` is {}", kind(other)))),
        None => envelope
            .source
            .and_then(|s| serde_json::from_str::<Source>(s.get()).ok())
            .and_then(|s| s.ts_ms)
            .and_then(millis),
    }
    .ok_or_else(|| malformed("no integer `ts_ms` (nor `source.ts_ms`)"))?;
    let ts = chrono::DateTime::from_timestamp_millis(ts_ms)
        .ok_or_else(|| malformed(format_args!("`ts_ms` {ts_ms} is not a time")))?;
    let row = match row {
        Some(row) if kind(row) == "an object" => row,
        Some(row) if kind(row) != "null" => {
            return Err(malformed(format_args!(
                "`{image}` is {}, not an object",
                kind(row)
            )))
        }
        _ => {
            return Err(malformed(format_args!(
                "`op` \"{op}\" needs its row in `{image}`, found none"
            )))
        }
    };
    let Members(members) = serde_json::from_str(row.get()).map_err(malformed)?;
    let ts = ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut out = Vec::with_capacity(row.get().len() + op.len() + ts.len() + 32);
    out.push(b'{');
    // The image's members as they came (an `_op`/`_cdc_ts` of its own gives way to the
    // envelope's), then the op and the change time.
    for (key, value) in members.iter().filter(|(k, _)| k != CDC_OP && k != CDC_TS) {
        serde_json::to_writer(&mut out, key).map_err(malformed)?;
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
        out.push(b',');
    }
    for (i, (key, value)) in [(CDC_OP, op.as_str()), (CDC_TS, ts.as_str())]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).map_err(malformed)?;
        out.push(b':');
        serde_json::to_writer(&mut out, value).map_err(malformed)?;
    }
    out.push(b'}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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
    fn the_row_is_the_image_as_it_came() {
        let row = flatten(
            br#"{"op":"c","ts_ms":1,"after":{"amount":1.123456789012345678,"big":123456789012345678901234,"k\"q":"\u00e9","_op":"x","n":[1.50]}}"#,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(row).unwrap(),
            r#"{"amount":1.123456789012345678,"big":123456789012345678901234,"k\"q":"\u00e9","n":[1.50],"_op":"c","_cdc_ts":"1970-01-01T00:00:00.001Z"}"#
        );
        let empty = flatten(br#"{"op":"r","ts_ms":1,"after":{}}"#).unwrap();
        assert_eq!(
            String::from_utf8(empty).unwrap(),
            r#"{"_op":"r","_cdc_ts":"1970-01-01T00:00:00.001Z"}"#
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
