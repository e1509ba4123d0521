//! Lambda payloads → work items.
//!
//! The ingest function is reached three ways: an S3 notification invoking it directly, S3
//! notifications inside SQS messages (optionally wrapped by SNS), and EventBridge "Object Created"
//! events (directly or through SQS). All of them become [`ObjectRef`]s; an SQS message keeps its id so
//! a failure can be reported for that message alone.

use aws_lambda_events::event::sqs::SqsEvent;
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};

/// One object to ingest, as named by the notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// Bucket name.
    pub bucket: String,
    /// Object key, already URL-decoded.
    pub key: String,
    /// Size in bytes if the event says.
    pub size: Option<i64>,
    /// ETag if the event says (quotes removed).
    pub etag: Option<String>,
    /// Version id on versioned buckets.
    pub version_id: Option<String>,
    /// When S3 emitted the event.
    pub event_time: Option<DateTime<Utc>>,
}

impl ObjectRef {
    /// An object named by bucket and key only (the rest is read from the object itself).
    pub fn new(bucket: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            key: key.into(),
            size: None,
            etag: None,
            version_id: None,
            event_time: None,
        }
    }

    /// `s3://bucket/key`.
    pub fn uri(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }
}

/// What one delivery unit (the whole event, or one SQS message) asks for.
#[derive(Debug)]
pub struct Delivery {
    /// The SQS message id, when the event came through SQS.
    pub message_id: Option<String>,
    /// The objects named, or why the message could not be understood.
    pub objects: Result<Vec<ObjectRef>>,
}

/// Splits a Lambda payload into deliveries. Unknown payload shapes are an error naming the shape.
pub fn parse_payload(payload: &Value) -> Result<Vec<Delivery>> {
    if let Some(records) = payload.get("Records").and_then(Value::as_array) {
        let source = records
            .first()
            .and_then(|r| r.get("eventSource").or_else(|| r.get("EventSource")))
            .and_then(Value::as_str)
            .unwrap_or("");
        if source == "aws:sqs" {
            let event: SqsEvent = serde_json::from_value(payload.clone())
                .map_err(|e| Error::new(ErrorKind::Event, "malformed SQS event").with_source(e))?;
            return Ok(event
                .records
                .into_iter()
                .map(|m| Delivery {
                    objects: match &m.body {
                        Some(body) => parse_body(body),
                        None => Err(Error::new(ErrorKind::Event, "SQS message without a body")),
                    },
                    message_id: m.message_id,
                })
                .collect());
        }
    }
    Ok(vec![Delivery {
        message_id: None,
        objects: parse_value(payload),
    }])
}

/// Parses an SQS message body: an S3 event, an SNS envelope, an EventBridge event or `s3:TestEvent`.
pub(crate) fn parse_body(body: &str) -> Result<Vec<ObjectRef>> {
    parse_value(&json_body(body)?)
}

/// Parses a message body as a dead-letter queue keeps it: every shape an SQS message delivers
/// to the ingest function ([`parse_body`]'s), and also a whole Lambda payload parked as one
/// message (an SQS event, whose messages' objects come in order; a Distributed Map batch; a
/// direct S3 event). A body naming no object (`s3:TestEvent`, removal events) gives an empty list.
pub fn parse_message(body: &str) -> Result<Vec<ObjectRef>> {
    let mut out = Vec::new();
    for delivery in parse_payload(&json_body(body)?)? {
        out.extend(delivery.objects?);
    }
    Ok(out)
}

fn json_body(body: &str) -> Result<Value> {
    serde_json::from_str(body).map_err(|e| {
        Error::new(
            ErrorKind::Event,
            format!("message body is not JSON: {}", truncate(body, 200)),
        )
        .with_source(e)
    })
}

fn parse_value(value: &Value) -> Result<Vec<ObjectRef>> {
    // S3's test message sent when a notification is configured.
    if value.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
        return Ok(Vec::new());
    }
    // SNS envelope: the S3 event is a JSON string in `Message`.
    if value.get("Type").and_then(Value::as_str) == Some("Notification") {
        let msg = value
            .get("Message")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::new(ErrorKind::Event, "SNS notification without a Message"))?;
        return parse_body(msg);
    }
    if value.get("detail-type").is_some() {
        return parse_eventbridge(value);
    }
    if let Some(records) = value.get("Records").and_then(Value::as_array) {
        return records
            .iter()
            .filter_map(|r| parse_s3_record(r).transpose())
            .collect();
    }
    if let Some(items) = value.get("Items").and_then(Value::as_array) {
        return parse_map_batch(items, value.get("BatchInput"));
    }
    Err(Error::new(
        ErrorKind::Event,
        format!(
            "unrecognised event shape: {}",
            truncate(&value.to_string(), 200)
        ),
    ))
}

/// One S3 notification record. Parsed leniently from JSON (emulators omit fields such as
/// `userIdentity` that the typed `aws_lambda_events` record requires); non-create events are skipped.
fn parse_s3_record(r: &Value) -> Result<Option<ObjectRef>> {
    let name = r.get("eventName").and_then(Value::as_str).unwrap_or("");
    if !name.starts_with("ObjectCreated") {
        tracing::info!(event_name = %name, "skipping non-create S3 event");
        return Ok(None);
    }
    let bucket = r
        .pointer("/s3/bucket/name")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::new(ErrorKind::Event, "S3 record without s3.bucket.name"))?;
    let raw_key = r
        .pointer("/s3/object/key")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Event,
                format!("S3 record in bucket {bucket} without s3.object.key"),
            )
        })?;
    let s = |p: &str| r.pointer(p).and_then(Value::as_str).map(str::to_string);
    Ok(Some(ObjectRef {
        bucket: bucket.to_string(),
        key: decode_key(raw_key)?,
        size: r.pointer("/s3/object/size").and_then(Value::as_i64),
        etag: s("/s3/object/eTag")
            .map(|e| e.trim_matches('"').to_string())
            .filter(|e| !e.is_empty()),
        version_id: s("/s3/object/versionId").filter(|v| !v.is_empty() && v != "null"),
        event_time: s("/eventTime")
            .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
            .map(|t| t.with_timezone(&Utc)),
    }))
}

/// A Step Functions Distributed Map batch (`ItemBatcher`): `{"Items": [...], "BatchInput":
/// {"Bucket": ...}}`. Items are what the `s3:listObjectsV2` item reader gives (`Key`, `Etag` in
/// quotes, `Size`, `LastModified`) or rows of an S3 Inventory manifest (`Bucket`, `Key`
/// URL-encoded, `VersionId`); an item's own `Bucket` wins over the batch's. Set
/// `"KeysUrlEncoded": true` in `BatchInput` for inventory keys.
fn parse_map_batch(items: &[Value], batch: Option<&Value>) -> Result<Vec<ObjectRef>> {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let batch_bucket = batch.and_then(|b| text(b, "Bucket"));
    let encoded = batch
        .and_then(|b| b.get("KeysUrlEncoded"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let bucket = text(item, "Bucket")
            .or_else(|| batch_bucket.clone())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Event,
                    format!("map item {i} names no bucket (set BatchInput.Bucket)"),
                )
            })?;
        let raw_key = text(item, "Key").ok_or_else(|| {
            Error::new(
                ErrorKind::Event,
                format!("map item {i} in {bucket} without Key"),
            )
        })?;
        // Folder placeholders of a listing are not objects.
        if raw_key.ends_with('/') {
            continue;
        }
        let key = if encoded {
            decode_key(&raw_key)?
        } else {
            raw_key
        };
        let size = item.get("Size").and_then(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        });
        out.push(ObjectRef {
            bucket,
            key,
            size,
            etag: text(item, "Etag")
                .or_else(|| text(item, "ETag"))
                .map(|e| e.trim_matches('"').to_string())
                .filter(|e| !e.is_empty()),
            version_id: text(item, "VersionId").filter(|v| !v.is_empty() && v != "null"),
            event_time: None,
        });
    }
    Ok(out)
}

fn parse_eventbridge(value: &Value) -> Result<Vec<ObjectRef>> {
    let detail_type = value
        .get("detail-type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if detail_type != "Object Created" {
        tracing::info!(
            detail_type,
            "skipping EventBridge event that is not Object Created"
        );
        return Ok(Vec::new());
    }
    let detail = value
        .get("detail")
        .ok_or_else(|| Error::new(ErrorKind::Event, "EventBridge event without detail"))?;
    let bucket = detail
        .pointer("/bucket/name")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Event,
                "Object Created event without detail.bucket.name",
            )
        })?;
    let key = detail
        .pointer("/object/key")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Event,
                "Object Created event without detail.object.key",
            )
        })?;
    let event_time = value
        .get("time")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    Ok(vec![ObjectRef {
        bucket: bucket.to_string(),
        // EventBridge keys are URL-encoded like notification keys.
        key: decode_key(key)?,
        size: detail.pointer("/object/size").and_then(Value::as_i64),
        etag: detail
            .pointer("/object/etag")
            .and_then(Value::as_str)
            .map(|e| e.trim_matches('"').to_string()),
        version_id: detail
            .pointer("/object/version-id")
            .and_then(Value::as_str)
            .map(str::to_string),
        event_time,
    }])
}

/// Form-URL-decodes an S3 event key: `+` is a space, `%XX` a byte.
pub(crate) fn decode_key(raw: &str) -> Result<String> {
    let plus = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|e| {
            Error::new(
                ErrorKind::Event,
                format!("key `{raw}` is not valid UTF-8 after decoding"),
            )
            .with_source(e)
        })
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// EventBridge `source` of the events floe publishes.
pub const EVENT_SOURCE: &str = "floe";
/// EventBridge `detail-type` of a commit event (published after each ingest commit).
pub const COMMIT_DETAIL_TYPE: &str = "floe.commit";
/// EventBridge `detail-type` of a pipeline alert.
pub const ALERT_DETAIL_TYPE: &str = "floe.alert";

/// What woke a process or maintain function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// A floe commit event (EventBridge `detail-type` "floe.commit").
    FloeCommit,
    /// A Glue Data Catalog table state change.
    GlueTableChange,
    /// An S3 event (e.g. a new metadata.json).
    S3,
    /// An EventBridge schedule.
    Schedule,
    /// Anything else (manual invocation).
    Other,
}

/// Classifies a process/maintain payload.
pub fn classify_trigger(payload: &Value) -> Trigger {
    let detail_type = payload
        .get("detail-type")
        .and_then(Value::as_str)
        .unwrap_or("");
    match detail_type {
        COMMIT_DETAIL_TYPE => Trigger::FloeCommit,
        "Glue Data Catalog Table State Change" => Trigger::GlueTableChange,
        "Scheduled Event" => Trigger::Schedule,
        "Object Created" => Trigger::S3,
        _ if payload.get("Records").is_some() => Trigger::S3,
        _ => Trigger::Other,
    }
}

/// One message of an SQS batch as the process function reads it: its id and its body parsed
/// (an EventBridge event as a rule delivered it: a `floe.commit` event, a Glue table change;
/// `Null` when the body is not JSON, which [`trigger_tables`] treats as a manual call).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SqsMessage {
    /// The SQS message id (empty when the record has none: Lambda then retries the whole batch
    /// if it is reported).
    pub(crate) id: String,
    pub(crate) body: Value,
}

/// The messages of an SQS batch payload (`Records`, every one with `eventSource` `aws:sqs`),
/// or `None` for any other payload.
pub(crate) fn sqs_messages(payload: &Value) -> Option<Vec<SqsMessage>> {
    let records = payload.get("Records")?.as_array()?;
    let sqs = !records.is_empty()
        && records
            .iter()
            .all(|r| r.get("eventSource").and_then(Value::as_str) == Some("aws:sqs"));
    if !sqs {
        return None;
    }
    Some(
        records
            .iter()
            .map(|r| SqsMessage {
                id: r
                    .get("messageId")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                body: r
                    .get("body")
                    .and_then(Value::as_str)
                    .and_then(|b| serde_json::from_str(b).ok())
                    .unwrap_or(Value::Null),
            })
            .collect(),
    )
}

/// The tables a process trigger (one event, not an SQS batch) names, or `None` when it
/// concerns every pipeline (a schedule, a manual call). Glue table changes count only for
/// `namespace` (floe's database).
pub(crate) fn trigger_tables(payload: &Value, namespace: &str) -> Option<Vec<String>> {
    Some(match classify_trigger(payload) {
        Trigger::FloeCommit => payload["detail"]["table"]
            .as_str()
            .map(|t| vec![t.to_string()])
            .unwrap_or_default(),
        Trigger::GlueTableChange => {
            if payload["detail"]["databaseName"].as_str() != Some(namespace) {
                return Some(Vec::new());
            }
            // Table State Change names one table; Database State Change lists several.
            let mut names: Vec<String> = payload["detail"]["changedTables"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            names.extend(payload["detail"]["tableName"].as_str().map(String::from));
            names
        }
        Trigger::S3 => {
            let mut keys: Vec<String> = Vec::new();
            if let Some(records) = payload["Records"].as_array() {
                for r in records {
                    if let Some(k) = r["s3"]["object"]["key"].as_str() {
                        keys.push(k.to_string());
                    }
                }
            }
            if let Some(k) = payload["detail"]["object"]["key"].as_str() {
                keys.push(k.to_string());
            }
            keys.iter().filter_map(|k| metadata_key_table(k)).collect()
        }
        Trigger::Schedule | Trigger::Other => return None,
    })
}

/// The table a `…/<table>/metadata/<file>.metadata.json` key belongs to.
pub(crate) fn metadata_key_table(key: &str) -> Option<String> {
    let key = percent_encoding::percent_decode_str(&key.replace('+', " "))
        .decode_utf8_lossy()
        .to_string();
    if !key.ends_with(".metadata.json") {
        return None;
    }
    let parts: Vec<&str> = key.split('/').collect();
    let i = parts.iter().rposition(|p| *p == "metadata")?;
    let table = parts.get(i.checked_sub(1)?)?;
    // Locations may carry a uuid suffix (`orders-<uuid>`); the name is what precedes it.
    Some(table.split('-').next().unwrap_or(table).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Glue table change as the GlueTableChangeRule puts it on the process queue, and the
    /// Lambda SQS event that delivers it: the body is the EventBridge event, untouched.
    #[test]
    fn glue_table_changes_arrive_through_sqs_and_name_their_table() {
        let glue = json!({"version": "0", "id": "6a1b", "detail-type": "Glue Data Catalog Table State Change",
            "source": "aws.glue", "account": "123456789012", "time": "2026-12-01T10:00:00Z",
            "region": "us-east-1", "resources": ["arn:aws:glue:us-east-1:123456789012:table/floe/orders"],
            "detail": {"databaseName": "floe", "changedPartitions": [], "typeOfChange": "UpdateTable",
                "tableName": "orders"}});
        let commit = json!({"detail-type": "floe.commit", "source": "floe",
            "detail": {"table": "orders", "snapshot_id": 7}});
        let payload = json!({"Records": [
            {"messageId": "g1", "receiptHandle": "r1", "body": glue.to_string(),
             "attributes": {"SentTimestamp": "1764583200000"}, "messageAttributes": {},
             "md5OfBody": "x", "eventSource": "aws:sqs",
             "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:ProcessQueue", "awsRegion": "us-east-1"},
            {"messageId": "c1", "body": commit.to_string(), "eventSource": "aws:sqs"},
            {"messageId": "x1", "body": "not json", "eventSource": "aws:sqs"},
        ]});
        let m = sqs_messages(&payload).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].id.as_str(), &m[0].body), ("g1", &glue));
        assert_eq!(classify_trigger(&m[0].body), Trigger::GlueTableChange);
        assert_eq!(
            trigger_tables(&m[0].body, "floe"),
            Some(vec!["orders".to_string()])
        );
        assert_eq!(trigger_tables(&m[0].body, "elsewhere"), Some(Vec::new()));
        assert_eq!(
            trigger_tables(&m[1].body, "floe"),
            Some(vec!["orders".to_string()])
        );
        // A body that is not JSON counts as a manual call (every pipeline).
        assert_eq!(
            (m[2].body.clone(), trigger_tables(&m[2].body, "floe")),
            (Value::Null, None)
        );
        // Not an SQS batch: a direct event, or S3 records.
        assert!(sqs_messages(&glue).is_none());
        assert!(sqs_messages(&json!({"Records": [{"eventSource": "aws:s3"}]})).is_none());
        assert!(sqs_messages(&json!({"Records": []})).is_none());
    }

    #[test]
    fn metadata_keys_name_their_table() {
        assert_eq!(
            metadata_key_table("wh/floe/orders/metadata/00003-abc.metadata.json").as_deref(),
            Some("orders")
        );
        assert_eq!(
            metadata_key_table("wh%2Ffloe%2Forders%2Fmetadata%2F1.metadata.json").as_deref(),
            Some("orders")
        );
        assert_eq!(metadata_key_table("wh/floe/orders/data/x.parquet"), None);
    }

    #[test]
    fn distributed_map_batches_name_their_objects() {
        // What the s3:listObjectsV2 item reader and ItemBatcher hand a child execution.
        let batch = json!({
            "Items": [
                {"Etag": "\"9b2cf535f27731c974343645a3985328\"", "Key": "landing/orders/a b.jsonl",
                 "LastModified": 1764547200.0, "Size": 1024, "StorageClass": "STANDARD"},
                {"Etag": "\"x\"", "Key": "landing/orders/", "Size": 0},
                {"Key": "landing/orders/c.jsonl", "Size": "77", "Bucket": "other"}
            ],
            "BatchInput": {"Bucket": "data"}
        });
        let d = parse_payload(&batch).unwrap();
        assert_eq!(d.len(), 1);
        assert!(d[0].message_id.is_none());
        let objs = d[0].objects.as_ref().unwrap();
        assert_eq!(objs.len(), 2, "the folder placeholder is skipped");
        assert_eq!(
            (objs[0].bucket.as_str(), objs[0].key.as_str()),
            ("data", "landing/orders/a b.jsonl"),
            "listing keys are not URL-encoded"
        );
        assert_eq!(
            objs[0].etag.as_deref(),
            Some("9b2cf535f27731c974343645a3985328")
        );
        assert_eq!(objs[0].size, Some(1024));
        assert_eq!((objs[1].bucket.as_str(), objs[1].size), ("other", Some(77)));
        // Inventory manifests: URL-encoded keys, version ids.
        let inv = json!({
            "Items": [{"Bucket": "data", "Key": "landing/a%20b.jsonl", "VersionId": "v1"}],
            "BatchInput": {"KeysUrlEncoded": true}
        });
        let d = parse_payload(&inv).unwrap();
        let o = &d[0].objects.as_ref().unwrap()[0];
        assert_eq!(
            (o.key.as_str(), o.version_id.as_deref()),
            ("landing/a b.jsonl", Some("v1"))
        );
        // No bucket anywhere: an error naming the item.
        let bad = json!({"Items": [{"Key": "k"}]});
        let err = parse_payload(&bad).unwrap()[0]
            .objects
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(err.contains("map item 0"), "{err}");
    }

    fn s3_event(key: &str) -> Value {
        json!({"Records": [{
            "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
            "eventTime": "2026-11-30T10:00:00.000Z", "eventName": "ObjectCreated:Put",
            "userIdentity": {"principalId": "x"}, "requestParameters": {"sourceIPAddress": "1.2.3.4"},
            "responseElements": {}, "s3": {"s3SchemaVersion": "1.0", "configurationId": "c",
              "bucket": {"name": "landing", "ownerIdentity": {"principalId": "x"}, "arn": "arn:aws:s3:::landing"},
              "object": {"key": key, "size": 10, "eTag": "\"abc\"", "sequencer": "01"}}}]})
    }

    #[test]
    fn direct_s3_event_decodes_key() {
        let d = parse_payload(&s3_event("orders/my+file%3A1.json")).unwrap();
        let objs = d[0].objects.as_ref().unwrap();
        assert_eq!(objs[0].key, "orders/my file:1.json");
        assert_eq!(objs[0].etag.as_deref(), Some("abc"));
        // moto encodes `/` as %2F
        let d = parse_payload(&s3_event("orders%2Fa.json")).unwrap();
        assert_eq!(d[0].objects.as_ref().unwrap()[0].key, "orders/a.json");
    }

    #[test]
    fn sqs_wrapping_sns_eventbridge_and_test_event() {
        let s3 = s3_event("a.json").to_string();
        let sns = json!({"Type": "Notification", "Message": s3}).to_string();
        let eb = json!({"detail-type": "Object Created", "source": "aws.s3", "time": "2026-11-30T10:00:00Z",
            "detail": {"bucket": {"name": "landing"}, "object": {"key": "b+c.json", "size": 5, "etag": "e1"}}}).to_string();
        let test = json!({"Event": "s3:TestEvent", "Bucket": "landing"}).to_string();
        let payload = json!({"Records": [
            {"messageId": "m1", "eventSource": "aws:sqs", "body": s3},
            {"messageId": "m2", "eventSource": "aws:sqs", "body": sns},
            {"messageId": "m3", "eventSource": "aws:sqs", "body": eb},
            {"messageId": "m4", "eventSource": "aws:sqs", "body": test},
            {"messageId": "m5", "eventSource": "aws:sqs", "body": "not json"},
        ]});
        let d = parse_payload(&payload).unwrap();
        assert_eq!(d.len(), 5);
        assert_eq!(d[0].objects.as_ref().unwrap()[0].key, "a.json");
        assert_eq!(d[1].objects.as_ref().unwrap()[0].key, "a.json");
        assert_eq!(d[2].objects.as_ref().unwrap()[0].key, "b c.json");
        assert!(d[3].objects.as_ref().unwrap().is_empty());
        assert!(d[4].objects.is_err());
        assert_eq!(d[4].message_id.as_deref(), Some("m5"));
    }

    #[test]
    fn dead_letter_bodies_of_every_shape_name_their_objects() {
        let s3 = s3_event("a+b.json").to_string();
        assert_eq!(parse_message(&s3).unwrap()[0].key, "a b.json");
        let sns = json!({"Type": "Notification", "Message": s3}).to_string();
        assert_eq!(parse_message(&sns).unwrap()[0].key, "a b.json");
        // A whole Lambda SQS event parked as one message: its messages' objects, in order.
        let sqs = json!({"Records": [
            {"messageId": "m1", "eventSource": "aws:sqs", "body": s3_event("x.json").to_string()},
            {"messageId": "m2", "eventSource": "aws:sqs", "body": sns},
        ]})
        .to_string();
        let keys: Vec<String> = parse_message(&sqs)
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, ["x.json", "a b.json"]);
        let map = json!({"Items": [{"Key": "k.jsonl"}], "BatchInput": {"Bucket": "b"}}).to_string();
        assert_eq!(parse_message(&map).unwrap()[0].bucket, "b");
        let test = json!({"Event": "s3:TestEvent"}).to_string();
        assert!(parse_message(&test).unwrap().is_empty());
        for bad in ["not json", "{\"hello\": 1}", ""] {
            let e = parse_message(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Event, "{bad}: {e}");
        }
        // One bad message inside a parked SQS event fails the whole body.
        let mixed = json!({"Records": [
            {"messageId": "m1", "eventSource": "aws:sqs", "body": s3_event("x.json").to_string()},
            {"messageId": "m2", "eventSource": "aws:sqs", "body": "garbage"},
        ]})
        .to_string();
        assert!(parse_message(&mixed).is_err());
    }

    #[test]
    fn emulator_records_without_user_identity_parse() {
        let mut e = s3_event("k.json");
        let rec = e["Records"][0].as_object_mut().unwrap();
        rec.remove("userIdentity");
        rec.remove("requestParameters");
        rec.remove("responseElements");
        let d = parse_payload(&e).unwrap();
        assert_eq!(d[0].objects.as_ref().unwrap()[0].key, "k.json");
    }

    #[test]
    fn removal_events_are_skipped_and_unknown_shapes_fail() {
        let mut e = s3_event("a.json");
        e["Records"][0]["eventName"] = json!("ObjectRemoved:Delete");
        assert!(parse_payload(&e).unwrap()[0]
            .objects
            .as_ref()
            .unwrap()
            .is_empty());
        assert!(parse_payload(&json!({"hello": 1})).unwrap()[0]
            .objects
            .is_err());
    }
}
