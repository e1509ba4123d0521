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

use crate::error::{Error, ErrorKind, Result};

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
/// A latest pipeline's tombstone table: the source sequence number of the last commit that
/// rebuilt tombstones from the source (a retraction's buckets, a refresh) rather than merging
/// into them; a run standing at an earlier source snapshot re-plans (carried on like
/// [`TOMBSTONES_SOURCE`]).
pub const TOMBSTONES_REBUILT: &str = "floe.tombstones-rebuilt-at-sequence";
/// Key buckets a latest-state pipeline run rebuilt from the source (a source row change).
pub const BUCKETS_REBUILT: &str = "floe.buckets-rebuilt";
/// Source `overwrite`/`delete` snapshots a latest-state pipeline run retracted.
pub const ROW_CHANGES: &str = "floe.source-row-changes";
/// Checkpoint key prefix: `floe.checkpoint.<source uuid>` = last source snapshot processed.
pub const CHECKPOINT_PREFIX: &str = "floe.checkpoint.";
/// Transform key prefix: `floe.transform.<source uuid>` = transform version of the checkpoint.
pub const TRANSFORM_PREFIX: &str = "floe.transform.";
/// Joined-table key prefix: `floe.join.<table>.snapshot-id` = the snapshot of a joined table
/// (`joins`) a pipeline run read (`none`: the table had no snapshot yet).
pub const JOIN_PREFIX: &str = "floe.join.";
/// Suffix of a [`JOIN_PREFIX`] key.
const JOIN_SUFFIX: &str = ".snapshot-id";
/// The value of a [`JOIN_PREFIX`] key for a joined table that had no snapshot.
const NO_SNAPSHOT: &str = "none";
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
        // `get` always (it marks that requests were counted); another kind only when some were
        // made, as [`Usage::read`] takes a missing one for none: a hot table's metadata.json
        // holds every retained snapshot's summary, and every commit reads and writes it whole.
        if let Some(s3) = &self.s3 {
            for (kind, n) in s3.kinds() {
                if kind == "get" || n > 0 {
                    out.push((format!("{S3_PREFIX}{kind}"), n.to_string()));
                }
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

/// Carries the parent's checkpoint properties (and the joined tables' snapshots recorded with
/// them) into `props` unless `props` sets its own: a snapshot that records no position of its
/// own (compaction, a manifest rewrite) must not make the newest snapshot lose a consumer's
/// position, nor the snapshots its output was joined with.
///
/// A refresh in progress ([`RefreshPosition`]) is carried the same way, unless `props` sets a
/// position of its own (the refresh's next chunk) or a checkpoint (the refresh's last chunk,
/// which ends the refresh: its position is cleared by not being carried).
pub(crate) fn carry_checkpoint(props: &mut HashMap<String, String>, parent: Option<&Summary>) {
    for key in [TOMBSTONES_SOURCE, TOMBSTONES_REBUILT] {
        if let Some(v) = parent.and_then(|p| p.additional_properties.get(key)) {
            props.entry(key.to_string()).or_insert_with(|| v.clone());
        }
    }
    let own = props.keys().any(|k| k.starts_with(CHECKPOINT_PREFIX));
    let own_refresh = own || props.keys().any(|k| k.starts_with(REFRESH_PREFIX));
    // A refresh's chunk records the joined snapshots it read without a checkpoint of its own.
    let own_joins = props.keys().any(|k| k.starts_with(JOIN_PREFIX));
    let Some(parent) = parent.filter(|_| !own) else {
        return;
    };
    for (k, v) in &parent.additional_properties {
        if k.starts_with(CHECKPOINT_PREFIX)
            || k.starts_with(TRANSFORM_PREFIX)
            || (!own_joins && k.starts_with(JOIN_PREFIX))
            || (!own_refresh && k.starts_with(REFRESH_PREFIX))
        {
            props.insert(k.clone(), v.clone());
        }
    }
}

/// The snapshot of joined table `table` that the sink's newest snapshot recording joins names
/// (what reconcile will read: expiration keeps it). Only that snapshot counts: a table it does
/// not name was not joined by the last run, whatever older runs recorded.
pub(crate) fn joined_snapshot(sink: &TableMetadata, table: &str) -> Option<i64> {
    let mut cur = sink.current_snapshot();
    while let Some(s) = cur {
        let joins = read_joins(s.summary());
        if !joins.is_empty() {
            return joins.get(table).copied().flatten();
        }
        cur = s.parent_snapshot_id().and_then(|p| sink.snapshot_by_id(p));
    }
    None
}

/// Prefix of a refresh's position keys (`floe.refresh.*`).
pub const REFRESH_PREFIX: &str = "floe.refresh.";
/// The refresh in progress (an id, the same on each of its chunk commits).
pub const REFRESH_ID: &str = "floe.refresh.id";
/// The uuid of the source table the refresh reads.
pub const REFRESH_SOURCE: &str = "floe.refresh.source";
/// The source snapshot the refresh recomputes the sink at (its checkpoint once it finishes).
pub const REFRESH_TARGET: &str = "floe.refresh.target";
/// The transform version the refresh writes.
pub const REFRESH_TRANSFORM: &str = "floe.refresh.transform";
/// Where the next chunk starts: the first window start (µs) not yet replaced (aggregate mode),
/// or the index of the first source data file, in path order, not yet read (append mode).
pub const REFRESH_NEXT: &str = "floe.refresh.next";
/// Chunks of the refresh committed so far (this one included). The last chunk records this
/// and [`REFRESH_ID`] but no [`REFRESH_TARGET`]: the refresh is over.
pub const REFRESH_CHUNKS: &str = "floe.refresh.chunks";

/// A refresh that has committed some of its chunks and not yet its last: recorded in the sink's
/// snapshot summary with each chunk, carried like the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefreshPosition {
    /// The refresh's id.
    pub id: String,
    /// The source table's uuid.
    pub source: String,
    /// The source snapshot it recomputes at.
    pub target: i64,
    /// The transform version it writes.
    pub transform: String,
    /// Where its next chunk starts (see [`REFRESH_NEXT`]).
    pub next: i64,
    /// Chunks committed so far.
    pub chunks: u64,
}

impl RefreshPosition {
    /// The snapshot-summary properties recording this position.
    pub fn properties(&self) -> Vec<(String, String)> {
        vec![
            (REFRESH_ID.to_string(), self.id.clone()),
            (REFRESH_SOURCE.to_string(), self.source.clone()),
            (REFRESH_TARGET.to_string(), self.target.to_string()),
            (REFRESH_TRANSFORM.to_string(), self.transform.clone()),
            (REFRESH_NEXT.to_string(), self.next.to_string()),
            (REFRESH_CHUNKS.to_string(), self.chunks.to_string()),
        ]
    }

    /// The properties of a refresh's last chunk (beside the checkpoint it writes): its id and
    /// chunk count, no position — so the position it replaces is not carried.
    pub fn finished_properties(id: &str, chunks: u64) -> Vec<(String, String)> {
        vec![
            (REFRESH_ID.to_string(), id.to_string()),
            (REFRESH_CHUNKS.to_string(), chunks.to_string()),
        ]
    }

    /// The position a snapshot summary records: None when it records none (no
    /// `floe.refresh.*` key, or a finished refresh's id and chunk count only). A `Stale` error
    /// when its keys are present but incomplete or unparsable: such a position can be neither
    /// continued nor ignored (ignoring it would run incrementally over a half-replaced sink,
    /// or start over without removing what its chunks wrote).
    fn read(summary: &Summary) -> Result<Option<Self>> {
        let p = &summary.additional_properties;
        if !p.keys().any(|k| k.starts_with(REFRESH_PREFIX)) {
            return Ok(None);
        }
        let malformed = |key: &str| {
            Error::new(
                ErrorKind::Stale,
                match p.get(key) {
                    Some(v) => format!("refresh position key `{key}` = {v:?} is unreadable"),
                    None => format!("refresh position key `{key}` is missing"),
                },
            )
        };
        let text = |key: &str| p.get(key).cloned().ok_or_else(|| malformed(key));
        let parse = |key: &str| -> Result<i64> {
            p.get(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| malformed(key))
        };
        let position = [
            REFRESH_SOURCE,
            REFRESH_TARGET,
            REFRESH_TRANSFORM,
            REFRESH_NEXT,
        ];
        if !position.iter().any(|k| p.contains_key(*k)) {
            // A finished refresh's last chunk: its id and chunk count, no position.
            text(REFRESH_ID)?;
            return Ok(None);
        }
        let chunks = p
            .get(REFRESH_CHUNKS)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| malformed(REFRESH_CHUNKS))?;
        Ok(Some(Self {
            id: text(REFRESH_ID)?,
            source: text(REFRESH_SOURCE)?,
            target: parse(REFRESH_TARGET)?,
            transform: text(REFRESH_TRANSFORM)?,
            next: parse(REFRESH_NEXT)?,
            chunks,
        }))
    }
}

/// The refresh in progress on a sink reading `source_uuid`, if any: read from the newest sink
/// snapshot that records a checkpoint on that source or any `floe.refresh.*` key (another
/// engine's snapshots on top carry neither; a finished refresh's last chunk records its id but
/// no position). A refresh of another source (a re-created source table) is returned too: it
/// is in progress on this sink all the same. A position whose keys are incomplete or
/// unparsable is a `Stale` error naming the snapshot and the key (not "no refresh").
pub fn read_refresh(sink: &TableMetadata, source_uuid: &str) -> Result<Option<RefreshPosition>> {
    let key = format!("{CHECKPOINT_PREFIX}{source_uuid}");
    let mut cur = sink.current_snapshot();
    while let Some(s) = cur {
        let summary = s.summary();
        let props = &summary.additional_properties;
        if props.contains_key(&key) || props.keys().any(|k| k.starts_with(REFRESH_PREFIX)) {
            return RefreshPosition::read(summary).map_err(|e| {
                Error::new(
                    ErrorKind::Stale,
                    format!("sink snapshot {}: {}", s.snapshot_id(), e.message()),
                )
            });
        }
        cur = s.parent_snapshot_id().and_then(|p| sink.snapshot_by_id(p));
    }
    Ok(None)
}

/// The snapshot-summary properties recording the snapshot each joined table was read at
/// (commit them with the output and the checkpoint): `(table, snapshot)`, None for a table
/// without a snapshot.
pub(crate) fn join_properties(joined: &[(String, Option<i64>)]) -> Vec<(String, String)> {
    joined
        .iter()
        .map(|(table, snapshot)| {
            (
                format!("{JOIN_PREFIX}{table}{JOIN_SUFFIX}"),
                snapshot.map_or_else(|| NO_SNAPSHOT.to_string(), |id| id.to_string()),
            )
        })
        .collect()
}

/// The joined tables' snapshots a sink snapshot records: table → snapshot (None: the table
/// had no snapshot). A table the summary does not name is absent (a run before it was joined).
pub(crate) fn read_joins(summary: &Summary) -> HashMap<String, Option<i64>> {
    summary
        .additional_properties
        .iter()
        .filter_map(|(k, v)| {
            let table = k.strip_prefix(JOIN_PREFIX)?.strip_suffix(JOIN_SUFFIX)?;
            let snapshot = match v.as_str() {
                NO_SNAPSHOT => None,
                id => Some(id.parse().ok()?),
            };
            Some((table.to_string(), snapshot))
        })
        .collect()
}

/// The newest refresh that finished on the sink in a snapshot whose sequence number is above
/// `after_seq` (the sink's at some earlier read; 0: the whole history): its id and chunk count,
/// from its last chunk (a snapshot recording [`REFRESH_ID`] but no [`REFRESH_TARGET`]) among
/// the current snapshot's ancestors.
pub fn finished_refresh(sink: &TableMetadata, after_seq: i64) -> Option<(String, u64)> {
    let mut cur = sink.current_snapshot();
    while let Some(s) = cur.filter(|s| s.sequence_number() > after_seq) {
        let p = &s.summary().additional_properties;
        if let (Some(id), None) = (p.get(REFRESH_ID), p.get(REFRESH_TARGET)) {
            let chunks = p
                .get(REFRESH_CHUNKS)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return Some((id.clone(), chunks));
        }
        cur = s.parent_snapshot_id().and_then(|p| sink.snapshot_by_id(p));
    }
    None
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
        // A kind with no request is left out (read back as 0); `get` marks counted requests.
        assert!(!s.additional_properties.contains_key("floe.s3.delete"));
        let none = Usage {
            s3: Some(S3Requests::default()),
            ..u.clone()
        };
        let s0 = summary(none.properties());
        assert_eq!(s0.additional_properties["floe.s3.get"], "0");
        assert_eq!(Usage::read(&s0), Some(none));
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

    /// Table metadata whose main branch is `summaries`, oldest first.
    fn history(summaries: Vec<Vec<(String, String)>>) -> TableMetadata {
        use iceberg::spec::{
            FormatVersion, NestedField, PrimitiveType, Schema, Snapshot, SnapshotReference,
            SnapshotRetention, SortOrder, TableMetadataBuilder, Type, UnboundPartitionSpec,
        };
        let schema = Schema::builder()
            .with_fields(vec![NestedField::optional(
                1,
                "x",
                Type::Primitive(PrimitiveType::Long),
            )
            .into()])
            .build()
            .unwrap();
        let mut b = TableMetadataBuilder::new(
            schema,
            UnboundPartitionSpec::builder().build(),
            SortOrder::unsorted_order(),
            "file:///t".into(),
            FormatVersion::V2,
            HashMap::new(),
        )
        .unwrap();
        for (i, props) in summaries.into_iter().enumerate() {
            let id = i as i64 + 1;
            let snapshot = Snapshot::builder()
                .with_snapshot_id(id)
                .with_parent_snapshot_id((id > 1).then_some(id - 1))
                .with_sequence_number(id)
                .with_timestamp_ms(1_000 * id)
                .with_manifest_list(format!("file:///t/{id}.avro"))
                .with_schema_id(0)
                .with_summary(summary(props))
                .build();
            b = b
                .add_snapshot(snapshot)
                .unwrap()
                .set_ref(
                    "main",
                    SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
                )
                .unwrap();
        }
        b.build().unwrap().metadata
    }

    #[test]
    fn the_joined_snapshot_is_the_newest_run_s_only() {
        let run = |joined: &[(&str, Option<i64>)]| {
            let joined: Vec<(String, Option<i64>)> =
                joined.iter().map(|(t, s)| (t.to_string(), *s)).collect();
            let mut props = join_properties(&joined);
            props.extend(checkpoint_properties("u", 7, "h"));
            props
        };
        // A run joining customers and fx, then runs joining customers only, then a snapshot
        // recording no run (another writer).
        let md = history(vec![
            run(&[("customers", Some(10)), ("fx", Some(20))]),
            run(&[("customers", Some(11))]),
            vec![],
        ]);
        assert_eq!(joined_snapshot(&md, "customers"), Some(11));
        assert_eq!(joined_snapshot(&md, "fx"), None, "no longer joined");
        let md = history(vec![run(&[("fx", None)])]);
        assert_eq!(joined_snapshot(&md, "fx"), None);
    }

    #[test]
    fn joined_snapshots_round_trip_and_are_carried_with_the_checkpoint() {
        let joined = vec![
            ("customers".to_string(), Some(42)),
            ("fx".to_string(), None),
        ];
        let mut props = join_properties(&joined);
        props.extend(checkpoint_properties("u", 7, "h"));
        let s = summary(props);
        let read = read_joins(&s);
        assert_eq!(read.get("customers"), Some(&Some(42)));
        assert_eq!(read.get("fx"), Some(&None));
        assert_eq!(read.len(), 2);
        // A compaction snapshot on top carries them with the checkpoint.
        let mut own = HashMap::new();
        carry_checkpoint(&mut own, Some(&s));
        assert_eq!(read_joins(&summary(own.into_iter().collect())), read);
    }

    #[test]
    fn a_refresh_position_is_carried_until_a_checkpoint_ends_it() {
        let pos = RefreshPosition {
            id: "r1".into(),
            source: "src".into(),
            target: 42,
            transform: "t2".into(),
            next: 600,
            chunks: 3,
        };
        let mut chunk: HashMap<String, String> = pos.properties().into_iter().collect();
        let parent = summary(checkpoint_properties("src", 7, "t1"));
        carry_checkpoint(&mut chunk, Some(&parent));
        // A chunk keeps the old checkpoint (carried) and records its own position.
        let chunk = summary(chunk.into_iter().collect());
        assert_eq!(RefreshPosition::read(&chunk).unwrap(), Some(pos.clone()));
        assert_eq!(
            chunk.additional_properties.get("floe.checkpoint.src"),
            Some(&"7".to_string())
        );
        // A compaction on top carries both.
        let mut compaction = HashMap::new();
        carry_checkpoint(&mut compaction, Some(&chunk));
        let compaction = summary(compaction.into_iter().collect());
        assert_eq!(
            RefreshPosition::read(&compaction).unwrap(),
            Some(pos.clone())
        );
        // The next chunk's own position replaces the carried one.
        let next = RefreshPosition {
            next: 900,
            chunks: 4,
            ..pos.clone()
        };
        let mut own: HashMap<String, String> = next.properties().into_iter().collect();
        carry_checkpoint(&mut own, Some(&compaction));
        assert_eq!(
            RefreshPosition::read(&summary(own.into_iter().collect())).unwrap(),
            Some(next)
        );
        // The last chunk sets the checkpoint: the position is not carried, the refresh is over.
        let mut last: HashMap<String, String> = checkpoint_properties("src", 42, "t2")
            .into_iter()
            .chain(RefreshPosition::finished_properties("r1", 5))
            .collect();
        carry_checkpoint(&mut last, Some(&compaction));
        assert!(!last.contains_key(REFRESH_TARGET), "{last:?}");
        let last = summary(last.into_iter().collect());
        assert_eq!(RefreshPosition::read(&last).unwrap(), None);
        // And a compaction after it carries no position back in.
        let mut after = HashMap::new();
        carry_checkpoint(&mut after, Some(&last));
        assert_eq!(
            RefreshPosition::read(&summary(after.into_iter().collect())).unwrap(),
            None
        );
    }

    #[test]
    fn a_malformed_refresh_position_is_an_error_not_no_refresh() {
        let pos = RefreshPosition {
            id: "r1".into(),
            source: "src".into(),
            target: 42,
            transform: "t2".into(),
            next: -600,
            chunks: 3,
        };
        // A negative window start is a position (windows before 1970).
        let good = summary(pos.properties());
        assert_eq!(RefreshPosition::read(&good).unwrap(), Some(pos.clone()));
        for (key, value) in [
            (REFRESH_TARGET, Some("forty-two")),
            (REFRESH_NEXT, Some("")),
            (REFRESH_NEXT, None),
            (REFRESH_CHUNKS, Some("-1")),
            (REFRESH_ID, None),
            (REFRESH_SOURCE, None),
        ] {
            let mut props: HashMap<String, String> = pos.properties().into_iter().collect();
            match value {
                Some(v) => props.insert(key.to_string(), v.to_string()),
                None => props.remove(key),
            };
            let e = RefreshPosition::read(&summary(props.into_iter().collect())).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Stale, "{key}: {e}");
            assert!(e.message().contains(key), "{key}: {e}");
        }
        // Position keys without an id, or a chunk count alone: malformed too.
        let e = RefreshPosition::read(&summary(vec![(REFRESH_CHUNKS.into(), "4".into())]));
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Stale);
        // A finished refresh's keys are no position.
        let done = summary(RefreshPosition::finished_properties("r1", 5));
        assert_eq!(RefreshPosition::read(&done).unwrap(), None);
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

    #[test]
    fn a_tombstone_rebuild_mark_is_carried_until_a_commit_sets_its_own() {
        let parent = summary(vec![
            (TOMBSTONES_SOURCE.into(), "u1".into()),
            (TOMBSTONES_REBUILT.into(), "7".into()),
        ]);
        // A merge's tombstone commit (or a compaction) sets none: both are carried.
        let mut props = HashMap::from([(OPERATION.to_string(), "tombstones".to_string())]);
        carry_checkpoint(&mut props, Some(&parent));
        assert_eq!(props.get(TOMBSTONES_REBUILT).map(String::as_str), Some("7"));
        assert_eq!(props.get(TOMBSTONES_SOURCE).map(String::as_str), Some("u1"));
        // A later rebuild records its own.
        let mut props = HashMap::from([(TOMBSTONES_REBUILT.to_string(), "9".to_string())]);
        carry_checkpoint(&mut props, Some(&parent));
        assert_eq!(props.get(TOMBSTONES_REBUILT).map(String::as_str), Some("9"));
    }
}
