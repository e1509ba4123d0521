//! Every `floe.*` key floe writes into snapshot summaries and table properties, and the one place
//! a consumer's checkpoint is written and read.
//!
//! A checkpoint is a pair of summary properties on a sink snapshot,
//! `floe.checkpoint.<source uuid>` (the last source snapshot processed) and
//! `floe.transform.<source uuid>` (the transform version that processed it), committed in the
//! same snapshot as the output they describe. Snapshots that do not set their own (compaction,
//! manifest rewrites) carry the previous ones forward ([`carry_checkpoint`]), so the newest
//! snapshot always holds every consumer's position.

use std::collections::HashMap;

use iceberg::spec::{Summary, TableMetadata};
use serde::Serialize;

/// Records read from the input object (= committed + quarantined).
pub const RECORDS_IN: &str = "records-in";
/// Records committed by the snapshot.
pub const RECORDS_COMMITTED: &str = "records-committed";
/// Records quarantined with a reason.
pub const RECORDS_QUARANTINED: &str = "records-quarantined";
/// The object versions (`s3://bucket/key#version`) whose rows a snapshot added (JSON list).
pub const SOURCE_OBJECTS: &str = "floe.source-objects";
/// The writer (ingest attempt) that made the snapshot.
pub const WRITER_ID: &str = "floe.writer-id";
/// Records later than the table's allowed lateness.
pub const LATE_RECORDS: &str = "floe.late-records";
/// The largest lateness seen, in seconds.
pub const MAX_LATENESS_SECONDS: &str = "floe.max-lateness-seconds";
/// Smallest event time in the snapshot's rows.
pub const EVENT_TIME_MIN: &str = "floe.event-time-min";
/// Largest event time in the snapshot's rows.
pub const EVENT_TIME_MAX: &str = "floe.event-time-max";
/// Input fields not in the schema (ignored).
pub const UNKNOWN_FIELDS: &str = "floe.unknown-fields";
/// Where the object's quarantined records were written.
pub const QUARANTINE: &str = "floe.quarantine";
/// What schema change the snapshot installed.
pub const SCHEMA_CHANGE: &str = "floe.schema-change";
/// Deprecated columns the committed object still carried values for (comma-separated).
pub const DEPRECATED_PRODUCED: &str = "floe.deprecated-produced";
/// A maintenance or batch operation (`compaction`, `rewrite-manifests`, `refresh`).
pub const OPERATION: &str = "floe.operation";
/// How many files a compaction rewrote.
pub const REWRITTEN_FILES: &str = "floe.rewritten-files";
/// The pipeline that made a sink snapshot.
pub const PIPELINE: &str = "floe.pipeline";
/// The source table of a sink.
pub const SOURCE_TABLE: &str = "floe.source-table";
/// Source rows a pipeline run read.
pub const ROWS_IN: &str = "floe.rows-in";
/// The source snapshots a pipeline run processed.
pub const SOURCE_SNAPSHOTS: &str = "floe.source-snapshots";
/// Aggregate windows a pipeline run recomputed.
pub const WINDOWS_REPLACED: &str = "floe.windows-replaced";
/// Checkpoint key prefix: `floe.checkpoint.<source uuid>` = last source snapshot processed.
pub const CHECKPOINT_PREFIX: &str = "floe.checkpoint.";
/// Transform key prefix: `floe.transform.<source uuid>` = transform version of the checkpoint.
pub const TRANSFORM_PREFIX: &str = "floe.transform.";
/// The version (a stable hash) of the data-quality contract the snapshot's rows were checked
/// against (`none` without checks).
pub const CONTRACT_VERSION: &str = "floe.contract-version";
/// Data-quality count prefix: `floe.quality.<check>.<action>` = records that failed the check.
pub const QUALITY_PREFIX: &str = "floe.quality.";

/// The summary key counting the records that failed `check` (whose action is `action`).
pub fn quality_key(check: &str, action: &str) -> String {
    format!("{QUALITY_PREFIX}{check}.{action}")
}

/// The data-quality counts in a snapshot summary: (check, action, records).
pub fn quality_counts(summary: &Summary) -> Vec<(String, String, u64)> {
    let mut out: Vec<(String, String, u64)> = summary
        .additional_properties
        .iter()
        .filter_map(|(k, v)| {
            let (check, action) = k.strip_prefix(QUALITY_PREFIX)?.rsplit_once('.')?;
            Some((check.to_string(), action.to_string(), v.parse().ok()?))
        })
        .collect();
    out.sort();
    out
}

/// Table property: the event-time column.
pub const EVENT_TIME_COLUMN: &str = "floe.event-time-column";

/// A consumer's position on a source table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    /// Last source snapshot processed.
    pub snapshot_id: i64,
    /// Transform version (hash) that processed it, if recorded.
    pub transform: Option<String>,
    /// The sink snapshot that recorded it.
    pub sink_snapshot_id: i64,
}

/// Reads the consumer's checkpoint on `source_uuid` from the sink's newest snapshot carrying one.
pub fn read_checkpoint(sink: &TableMetadata, source_uuid: &str) -> Option<Checkpoint> {
    let key = format!("{CHECKPOINT_PREFIX}{source_uuid}");
    let tkey = format!("{TRANSFORM_PREFIX}{source_uuid}");
    let mut cur = sink.current_snapshot();
    while let Some(s) = cur {
        let props = &s.summary().additional_properties;
        if let Some(id) = props.get(&key).and_then(|v| v.parse().ok()) {
            return Some(Checkpoint {
                snapshot_id: id,
                transform: props.get(&tkey).cloned(),
                sink_snapshot_id: s.snapshot_id(),
            });
        }
        cur = s.parent_snapshot_id().and_then(|p| sink.snapshot_by_id(p));
    }
    None
}

/// The snapshot-summary properties that record a checkpoint (commit them with the output).
pub fn checkpoint_properties(
    source_uuid: &str,
    snapshot_id: i64,
    transform: &str,
) -> Vec<(String, String)> {
    vec![
        (
            format!("{CHECKPOINT_PREFIX}{source_uuid}"),
            snapshot_id.to_string(),
        ),
        (
            format!("{TRANSFORM_PREFIX}{source_uuid}"),
            transform.to_string(),
        ),
    ]
}

/// Carries the parent's checkpoint properties into `props` unless `props` sets its own: a
/// snapshot that records no position of its own (compaction, a manifest rewrite) must not make
/// the newest snapshot lose a consumer's position.
pub(crate) fn carry_checkpoint(props: &mut HashMap<String, String>, parent: Option<&Summary>) {
    let own = props.keys().any(|k| k.starts_with(CHECKPOINT_PREFIX));
    let Some(parent) = parent.filter(|_| !own) else {
        return;
    };
    for (k, v) in &parent.additional_properties {
        if k.starts_with(CHECKPOINT_PREFIX) || k.starts_with(TRANSFORM_PREFIX) {
            props.insert(k.clone(), v.clone());
        }
    }
}

/// A count from a snapshot summary (0 when there is none, or it is absent or unparsable).
pub(crate) fn value(summary: Option<&Summary>, key: &str) -> i64 {
    summary
        .and_then(|s| s.additional_properties.get(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A `total-*` count from the current snapshot's summary (0 when absent or unparsable).
pub fn total(md: &TableMetadata, key: &str) -> u64 {
    value(md.current_snapshot().map(|s| s.summary()), key).max(0) as u64
}

/// Whether the summary of the current snapshot counts delete files (the check a commit plan can
/// make without reading manifests; floe and Java write these totals).
pub(crate) fn counts_deletes(md: &TableMetadata) -> bool {
    [
        "total-delete-files",
        "total-position-deletes",
        "total-equality-deletes",
    ]
    .iter()
    .any(|k| total(md, k) > 0)
}
