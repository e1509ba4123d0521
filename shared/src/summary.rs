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
/// Distinct keys a latest-state pipeline run merged.
pub const KEYS_TOUCHED: &str = "floe.keys-touched";
/// Key buckets a latest-state pipeline run rewrote.
pub const BUCKETS_REPLACED: &str = "floe.buckets-replaced";
/// A latest pipeline's tombstone table: the uuid of the source its tombstones were read from
/// (every tombstone commit sets it; carried on by snapshots that set none, like compaction's).
pub const TOMBSTONES_SOURCE: &str = "floe.tombstones-source";
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

/// The function whose work made the snapshot (`ingest`, `process`, `maintain`), with
/// [`COMPUTE_MS`] and [`MEMORY_MB`]: what the cost baseline reads.
pub const FUNCTION: &str = "floe.function";
/// Compute time (ms) of the work the snapshot commits: an ingest commit's objects from their
/// open until written, plus the commit, a pipeline run from start to its sink commit, a maintenance run's share since its
/// previous commit.
pub const COMPUTE_MS: &str = "floe.compute-ms";
/// The memory (MB) of the function that did the work (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`, or the
/// `[cost]` default where it ran outside Lambda).
pub const MEMORY_MB: &str = "floe.memory-mb";
/// Object-storage request count prefix: `floe.s3.<kind>` (get, put, list, head, delete) = the
/// requests the work of the snapshot made (table files and landing objects).
pub const S3_PREFIX: &str = "floe.s3.";
/// The landing objects' LastModified (epoch ms, comma-separated), in the order of
/// [`SOURCE_OBJECTS`]: freshness as commit time − LastModified.
pub const SOURCE_MODIFIED_MS: &str = "floe.source-modified-ms";
/// The maintenance run that made the snapshot (a run may commit several).
pub const RUN_ID: &str = "floe.run-id";

/// The function names [`FUNCTION`] records.
pub const FUNCTION_INGEST: &str = "ingest";
/// See [`FUNCTION_INGEST`].
pub const FUNCTION_PROCESS: &str = "process";
/// See [`FUNCTION_INGEST`].
pub const FUNCTION_MAINTAIN: &str = "maintain";

/// Object-storage requests by kind (the kinds S3 prices differently).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct S3Requests {
    /// GetObject (a ranged read of a file is one).
    pub get: u64,
    /// PutObject (a whole-object or streamed write; a multipart upload counts once).
    pub put: u64,
    /// ListObjectsV2 pages.
    pub list: u64,
    /// HeadObject (existence and size checks).
    pub head: u64,
    /// DeleteObject (free on S3; counted for the record).
    pub delete: u64,
}

impl S3Requests {
    /// The kinds with their counts, in a fixed order.
    pub fn kinds(&self) -> [(&'static str, u64); 5] {
        [
            ("get", self.get),
            ("put", self.put),
            ("list", self.list),
            ("head", self.head),
            ("delete", self.delete),
        ]
    }

    /// Kind-wise sum.
    pub fn plus(&self, o: &S3Requests) -> S3Requests {
        S3Requests {
            get: self.get + o.get,
            put: self.put + o.put,
            list: self.list + o.list,
            head: self.head + o.head,
            delete: self.delete + o.delete,
        }
    }

    /// Kind-wise difference (never below zero).
    pub fn minus(&self, o: &S3Requests) -> S3Requests {
        S3Requests {
            get: self.get.saturating_sub(o.get),
            put: self.put.saturating_sub(o.put),
            list: self.list.saturating_sub(o.list),
            head: self.head.saturating_sub(o.head),
            delete: self.delete.saturating_sub(o.delete),
        }
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.kinds().iter().map(|(_, n)| n).sum()
    }
}

/// What the work of one snapshot used: compute time, memory and object-storage requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    /// `ingest`, `process` or `maintain`.
    pub function: String,
    /// Compute time, ms.
    pub compute_ms: u64,
    /// Function memory, MB.
    pub memory_mb: u64,
    /// Requests counted (None: the work ran on a store that does not count them).
    pub s3: Option<S3Requests>,
}

impl Usage {
    /// Lambda GB-seconds: duration × memory (1 GB = 1024 MB, as Lambda bills).
    pub fn gb_seconds(&self) -> f64 {
        self.compute_ms as f64 / 1000.0 * self.memory_mb as f64 / 1024.0
    }

    /// This and `o` together (a batch commit: its members' work plus the commit's).
    pub fn plus(&self, o: &Usage) -> Usage {
        Usage {
            function: if self.function.is_empty() {
                o.function.clone()
            } else {
                self.function.clone()
            },
            compute_ms: self.compute_ms + o.compute_ms,
            memory_mb: self.memory_mb.max(o.memory_mb),
            s3: match (&self.s3, &o.s3) {
                (Some(a), Some(b)) => Some(a.plus(b)),
                (a, b) => a.or(*b),
            },
        }
    }

    /// The snapshot-summary properties recording this usage.
    pub fn properties(&self) -> Vec<(String, String)> {
        let mut out = vec![
            (FUNCTION.to_string(), self.function.clone()),
            (COMPUTE_MS.to_string(), self.compute_ms.to_string()),
            (MEMORY_MB.to_string(), self.memory_mb.to_string()),
        ];
        if let Some(s3) = &self.s3 {
            for (kind, n) in s3.kinds() {
                out.push((format!("{S3_PREFIX}{kind}"), n.to_string()));
            }
        }
        out
    }

    /// The usage a snapshot summary records (None when it records none: work of another engine,
    /// or of floe before it recorded usage).
    pub fn read(summary: &Summary) -> Option<Usage> {
        let p = &summary.additional_properties;
        let num = |k: &str| p.get(k).and_then(|v| v.parse::<u64>().ok());
        let compute_ms = num(COMPUTE_MS)?;
        let kind = |k: &str| num(&format!("{S3_PREFIX}{k}"));
        let s3 = kind("get").map(|get| S3Requests {
            get,
            put: kind("put").unwrap_or(0),
            list: kind("list").unwrap_or(0),
            head: kind("head").unwrap_or(0),
            delete: kind("delete").unwrap_or(0),
        });
        Some(Usage {
            function: p.get(FUNCTION).cloned().unwrap_or_default(),
            compute_ms,
            memory_mb: num(MEMORY_MB).unwrap_or(0),
            s3,
        })
    }
}

/// The [`SOURCE_MODIFIED_MS`] value of objects last modified at `ms` (epoch ms).
pub(crate) fn source_modified_value(ms: &[i64]) -> String {
    ms.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// The landing objects' LastModified (epoch ms) a snapshot summary records (empty when none).
pub fn source_modified(summary: &Summary) -> Vec<i64> {
    summary
        .additional_properties
        .get(SOURCE_MODIFIED_MS)
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The maintenance run a snapshot summary names.
pub fn run_id(summary: &Summary) -> Option<&str> {
    summary
        .additional_properties
        .get(RUN_ID)
        .map(String::as_str)
}

/// The function a snapshot summary names as its maker, else the one its other keys imply: an
/// ingest commit lists source objects, a sink commit names its pipeline, a maintenance commit
/// its operation (`refresh` is a pipeline's).
pub fn function_of(summary: &Summary) -> Option<&str> {
    let p = &summary.additional_properties;
    if let Some(f) = p.get(FUNCTION) {
        return Some(f.as_str());
    }
    if p.contains_key(SOURCE_OBJECTS) {
        return Some(FUNCTION_INGEST);
    }
    if p.contains_key(PIPELINE) {
        return Some(FUNCTION_PROCESS);
    }
    p.contains_key(OPERATION).then_some(FUNCTION_MAINTAIN)
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
    if let Some(v) = parent.and_then(|p| p.additional_properties.get(TOMBSTONES_SOURCE)) {
        props
            .entry(TOMBSTONES_SOURCE.to_string())
            .or_insert_with(|| v.clone());
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::Operation;

    fn summary(props: Vec<(String, String)>) -> Summary {
        Summary {
            operation: Operation::Append,
            additional_properties: props.into_iter().collect(),
        }
    }

    #[test]
    fn usage_round_trips_through_a_summary() {
        let u = Usage {
            function: FUNCTION_PROCESS.into(),
            compute_ms: 2500,
            memory_mb: 2048,
            s3: Some(S3Requests {
                get: 7,
                put: 4,
                list: 1,
                head: 2,
                delete: 0,
            }),
        };
        let s = summary(u.properties());
        assert_eq!(Usage::read(&s), Some(u.clone()));
        assert_eq!(u.gb_seconds(), 5.0);
        assert_eq!(function_of(&s), Some(FUNCTION_PROCESS));
        // Without request counts; without usage at all.
        let mut time_only = u.clone();
        time_only.s3 = None;
        assert_eq!(
            Usage::read(&summary(time_only.properties())),
            Some(time_only)
        );
        assert_eq!(Usage::read(&summary(vec![])), None);
    }

    #[test]
    fn the_maker_of_a_snapshot_follows_from_its_keys() {
        let with = |k: &str| summary(vec![(k.to_string(), "x".to_string())]);
        assert_eq!(function_of(&with(SOURCE_OBJECTS)), Some(FUNCTION_INGEST));
        assert_eq!(function_of(&with(PIPELINE)), Some(FUNCTION_PROCESS));
        assert_eq!(function_of(&with(OPERATION)), Some(FUNCTION_MAINTAIN));
        assert_eq!(function_of(&with("spark.app.id")), None);
        let modified = summary(vec![(
            SOURCE_MODIFIED_MS.to_string(),
            source_modified_value(&[5, 7]),
        )]);
        assert_eq!(source_modified(&modified), vec![5, 7]);
    }
}
