//! "Already committed?" for one source object, durable beyond snapshot expiration.
//!
//! The fast answer is the bounded walk over snapshot summaries (`floe.source-objects`), newest
//! first, stopping at the first snapshot older than the object itself. Expiration removes
//! summaries, though, and a DLQ redrive can come back later than the retained history. When the
//! walk meets the edge of the retained history (a snapshot whose parent was expired) before it can
//! prove absence, the answer comes from the table's own rows instead: every row carries its source
//! identity in `_source` (`s3://bucket/key#version`), and a scan filtered on it prunes by the data
//! files' `_source` bounds to the few candidate files and reads only that column of those.

use std::collections::HashSet;

use futures::TryStreamExt;
use iceberg::expr::Reference;
use iceberg::spec::{Datum, TableMetadata};
use iceberg::table::Table;

use crate::commit::{Found, Plan, Skipped, SourceObject};
use crate::error::{Error, ErrorKind, Result};
use crate::schema::SOURCE;
use crate::snapshot::Change;
use crate::summary::{SOURCE_OBJECTS as SUMMARY_SOURCE_OBJECTS, WRITER_ID as SUMMARY_WRITER_ID};

/// What the summary walk proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Walk {
    /// A retained snapshot names the object.
    Found(Found),
    /// No commit of the object can exist: the walk reached a snapshot older than the object, the
    /// start of the table's history, or a version already proven not to hold it.
    Absent,
    /// The walk reached expired history before it could prove absence: ask the data.
    Unknown,
}

/// Walks main's ancestry newest first for `object_id`, stopping at the first snapshot older than
/// `not_before_ms`, or at `proven` (a snapshot id whose version was already shown not to hold the
/// object, by this walk or by [`in_data`]): reaching it, or a snapshot whose parent it is, proves
/// absence for everything older.
pub(crate) fn walk(
    metadata: &TableMetadata,
    object_id: &str,
    not_before_ms: i64,
    proven: Option<i64>,
) -> Walk {
    let mut current = metadata.current_snapshot();
    while let Some(snap) = current {
        if Some(snap.snapshot_id()) == proven || snap.timestamp_ms() < not_before_ms {
            return Walk::Absent;
        }
        let props = &snap.summary().additional_properties;
        if let Some(list) = props.get(SUMMARY_SOURCE_OBJECTS) {
            let ids: Vec<String> = serde_json::from_str(list).unwrap_or_default();
            if ids.iter().any(|id| id == object_id) {
                return Walk::Found(Found {
                    snapshot_id: snap.snapshot_id(),
                    writer_id: props.get(SUMMARY_WRITER_ID).cloned(),
                });
            }
        }
        match snap.parent_snapshot_id() {
            // The first snapshot of the table: the whole history was seen.
            None if is_first_commit(metadata, snap) => return Walk::Absent,
            // A snapshot without a parent that is not the table's first: its ancestors were
            // expired by a writer that clears the parent of what it keeps (PyIceberg, and
            // REST catalogs built on it), or another engine replaced the table.
            None => return Walk::Unknown,
            Some(p) if Some(p) == proven => return Walk::Absent,
            Some(p) => match metadata.snapshot_by_id(p) {
                Some(parent) => current = Some(parent),
                // Expired: a commit of the object may have been in there.
                None => return Walk::Unknown,
            },
        }
    }
    Walk::Absent
}

/// Whether `snap`, a snapshot of main without a parent, is the table's first commit, so that
/// nothing older was ever committed. Iceberg Java and iceberg-rust keep a snapshot's parent id
/// when they expire the parent (the walk then meets a missing snapshot: expired history), but
/// PyIceberg clears the parent id of every snapshot it keeps, which made a table's oldest
/// retained snapshot read as its first and a redelivered object committed long ago as never
/// seen. In format v2 and later the first commit has sequence number 1; a v1 table carries no
/// sequence numbers, so there a snapshot without a parent proves nothing.
fn is_first_commit(metadata: &TableMetadata, snap: &iceberg::spec::Snapshot) -> bool {
    metadata.format_version() != iceberg::spec::FormatVersion::V1 && snap.sequence_number() == 1
}

/// One object [`walk_all`] looks for: its identity, its age bound and its proven snapshot (as
/// in [`walk`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sought<'a> {
    /// `s3://bucket/key#version`.
    pub(crate) id: &'a str,
    /// No commit of it can be older (its LastModified minus the tolerated skew).
    pub(crate) not_before_ms: i64,
    /// A snapshot whose version was already shown not to hold it.
    pub(crate) proven: Option<i64>,
}

/// [`walk`] for several objects in one pass over main's ancestry: each snapshot's summary list
/// is parsed once, however many objects are sought (a batch plan would otherwise parse every
/// list of the window once per member, on every commit attempt). The answers are [`walk`]'s,
/// in the order of `sought`.
pub(crate) fn walk_all(metadata: &TableMetadata, sought: &[Sought<'_>]) -> Vec<Walk> {
    let mut out: Vec<Option<Walk>> = vec![None; sought.len()];
    let mut pending = sought.len();
    let mut current = metadata.current_snapshot();
    while let Some(snap) = current {
        if pending == 0 {
            break;
        }
        let mut decide = |k: usize, w: Walk, out: &mut Vec<Option<Walk>>| {
            if out[k].is_none() {
                out[k] = Some(w);
                pending -= 1;
            }
        };
        for (k, s) in sought.iter().enumerate() {
            if out[k].is_none()
                && (Some(snap.snapshot_id()) == s.proven || snap.timestamp_ms() < s.not_before_ms)
            {
                decide(k, Walk::Absent, &mut out);
            }
        }
        let props = &snap.summary().additional_properties;
        if let Some(list) = props.get(SUMMARY_SOURCE_OBJECTS) {
            let ids: Vec<String> = serde_json::from_str(list).unwrap_or_default();
            let ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
            for (k, s) in sought.iter().enumerate() {
                if out[k].is_none() && ids.contains(s.id) {
                    let found = Found {
                        snapshot_id: snap.snapshot_id(),
                        writer_id: props.get(SUMMARY_WRITER_ID).cloned(),
                    };
                    decide(k, Walk::Found(found), &mut out);
                }
            }
        }
        current = match snap.parent_snapshot_id() {
            // The first snapshot of the table: the whole history was seen.
            None if is_first_commit(metadata, snap) => None,
            // Its ancestors expired, their parent links cleared (see `walk`).
            None => {
                for k in 0..sought.len() {
                    decide(k, Walk::Unknown, &mut out);
                }
                None
            }
            Some(p) => {
                for (k, s) in sought.iter().enumerate() {
                    if s.proven == Some(p) {
                        decide(k, Walk::Absent, &mut out);
                    }
                }
                match metadata.snapshot_by_id(p) {
                    Some(parent) => Some(parent),
                    // Expired: a commit of any object still sought may have been in there.
                    None => {
                        for k in 0..sought.len() {
                            decide(k, Walk::Unknown, &mut out);
                        }
                        None
                    }
                }
            }
        };
    }
    out.into_iter().map(|w| w.unwrap_or(Walk::Absent)).collect()
}

/// Whether any row of `table`'s current snapshot carries `object_id` in `_source`. The filter
/// prunes data files by their `_source` lower/upper bounds (ingest files hold one object each, so
/// bounds are exact) and row groups by their statistics; only `_source` is read.
pub(crate) async fn in_data(table: &Table, object_id: &str) -> Result<bool> {
    if table.metadata().current_snapshot().is_none()
        || table
            .metadata()
            .current_schema()
            .field_by_name(SOURCE)
            .is_none()
    {
        return Ok(false);
    }
    let what = || {
        format!(
            "looking for {object_id} in the rows of {}",
            table.identifier()
        )
    };
    let scan = table
        .scan()
        .select([SOURCE])
        .with_filter(Reference::new(SOURCE).equal_to(Datum::string(object_id)))
        .build()
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?;
    let mut batches = scan
        .to_arrow()
        .await
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?;
    while let Some(batch) = batches
        .try_next()
        .await
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?
    {
        let Some(col) = batch.column_by_name(SOURCE) else {
            continue;
        };
        let hit = match col.as_any().downcast_ref::<arrow::array::StringArray>() {
            Some(s) => s.iter().flatten().any(|v| v == object_id),
            None => match col
                .as_any()
                .downcast_ref::<arrow::array::LargeStringArray>()
            {
                Some(s) => s.iter().flatten().any(|v| v == object_id),
                None => batch.num_rows() > 0,
            },
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The early check before reading: the summary walk, then (only at the edge of expired history)
/// the rows. `Ok(Err(proven))` is "not committed", with the snapshot id the answer holds for
/// (hand it to [`append_once_plan`]).
pub(crate) async fn check(
    table: &Table,
    object: &SourceObject,
    skew_ms: i64,
) -> Result<std::result::Result<Found, Option<i64>>> {
    let id = object.id();
    let md = table.metadata();
    let current = md.current_snapshot_id();
    match walk(md, &id, object.modified_ms - skew_ms, None) {
        Walk::Found(found) => Ok(Ok(found)),
        Walk::Absent => Ok(Err(current)),
        Walk::Unknown => {
            tracing::info!(object = %id, table = %table.identifier(), "duplicate check reached expired history; checking the rows");
            if in_data(table, &id).await? {
                Ok(Ok(Found {
                    snapshot_id: current.unwrap_or_default(),
                    writer_id: None,
                }))
            } else {
                Ok(Err(current))
            }
        }
    }
}

/// The ingest plan: skip when `object` is already in the table, else append `change`.
///
/// It walks the summaries of the version it commits onto back to `proven` (the version the early
/// [`check`] showed not to hold the object) or to the object's age: together with the catalog's
/// compare-and-swap this keeps check and commit atomic. If expiration removed history between
/// `proven` and the new base (only possible when the ingest outlives the expiration's dedup
/// window), the plan cannot decide synchronously and reports `Stale`: the ingest starts over and
/// checks the rows again.
pub(crate) fn append_once_plan(
    object: &SourceObject,
    writer_id: &str,
    mut change: Change,
    skew: std::time::Duration,
    proven: Option<i64>,
) -> impl FnMut(&Table) -> Result<Plan> + Send + 'static {
    let id = object.id();
    change.properties.insert(
        SUMMARY_SOURCE_OBJECTS.into(),
        serde_json::to_string(&[&id]).unwrap_or_default(),
    );
    change
        .properties
        .insert(SUMMARY_WRITER_ID.into(), writer_id.to_string());
    change.properties.insert(
        crate::summary::SOURCE_MODIFIED_MS.into(),
        crate::summary::source_modified_value(&[object.modified_ms]),
    );
    let not_before = object.modified_ms - skew.as_millis() as i64;
    move |table: &Table| match walk(table.metadata(), &id, not_before, proven) {
        Walk::Found(found) => Ok(Plan::Skip(Skipped::AlreadyCommitted(found))),
        Walk::Absent => Ok(Plan::Apply(change.clone())),
        Walk::Unknown => Err(Error::new(
            ErrorKind::Stale,
            format!(
                "history of {} was expired while {id} was being ingested; checking again",
                table.identifier()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(snaps: &[(i64, Option<i64>, i64, &str)]) -> TableMetadata {
        // (id, parent, timestamp, source object)
        let snapshots: Vec<serde_json::Value> = snaps
            .iter()
            .map(|(id, parent, ts, obj)| {
                let mut s = serde_json::json!({
                    "snapshot-id": id, "timestamp-ms": ts, "sequence-number": id,
                    "manifest-list": format!("s3://b/t/metadata/snap-{id}.avro"),
                    "summary": {"operation": "append",
                        SUMMARY_SOURCE_OBJECTS: serde_json::to_string(&[obj]).unwrap()},
                    "schema-id": 0
                });
                if let Some(p) = parent {
                    s["parent-snapshot-id"] = serde_json::json!(p);
                }
                s
            })
            .collect();
        let current = snaps.last().map(|s| s.0).unwrap_or(-1);
        let last_sequence = snaps.iter().map(|s| s.0).max().unwrap_or(0);
        serde_json::from_value(serde_json::json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "s3://b/t", "last-sequence-number": last_sequence, "last-updated-ms": 1,
            "last-column-id": 1, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "x", "required": false, "type": "string"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {}, "current-snapshot-id": current, "snapshots": snapshots,
            "snapshot-log": [], "metadata-log": [],
            "refs": {"main": {"snapshot-id": current, "type": "branch"}}
        }))
        .unwrap()
    }

    #[test]
    fn the_walk_tells_proven_absence_from_expired_history() {
        // Full history: 1 ← 2 ← 3.
        let full = metadata(&[
            (1, None, 100, "a"),
            (2, Some(1), 200, "b"),
            (3, Some(2), 300, "c"),
        ]);
        assert!(matches!(walk(&full, "a", 50, None), Walk::Found(f) if f.snapshot_id == 1));
        assert_eq!(walk(&full, "z", 50, None), Walk::Absent);
        assert_eq!(
            walk(&full, "a", 150, None),
            Walk::Absent,
            "older than the object"
        );
        assert_eq!(walk(&full, "a", 50, Some(2)), Walk::Absent, "proven at 2");
        // 1 expired: 2's parent is gone.
        let expired = metadata(&[(2, Some(1), 200, "b"), (3, Some(2), 300, "c")]);
        assert_eq!(walk(&expired, "a", 50, None), Walk::Unknown);
        assert_eq!(walk(&expired, "a", 250, None), Walk::Absent);
        assert_eq!(
            walk(&expired, "a", 50, Some(1)),
            Walk::Absent,
            "parent proven"
        );
        assert!(matches!(walk(&expired, "b", 50, None), Walk::Found(f) if f.snapshot_id == 2));
        // 1 expired by PyIceberg, which clears the parent of what it keeps: 2 has none, yet it
        // is not the table's first commit (sequence number 2).
        let cleared = metadata(&[(2, None, 200, "b"), (3, Some(2), 300, "c")]);
        assert_eq!(walk(&cleared, "a", 50, None), Walk::Unknown);
        assert_eq!(walk(&cleared, "a", 250, None), Walk::Absent);
        assert_eq!(walk(&cleared, "a", 50, Some(2)), Walk::Absent, "proven");
        assert!(matches!(walk(&cleared, "b", 50, None), Walk::Found(f) if f.snapshot_id == 2));
    }

    #[test]
    fn walking_for_several_objects_at_once_answers_as_walking_for_each() {
        let full = metadata(&[
            (1, None, 100, "a"),
            (2, Some(1), 200, "b"),
            (3, Some(2), 300, "c"),
        ]);
        let expired = metadata(&[(2, Some(1), 200, "b"), (3, Some(2), 300, "c")]);
        let cleared = metadata(&[(2, None, 200, "b"), (3, Some(2), 300, "c")]);
        let mut sought = Vec::new();
        for id in ["a", "b", "c", "z"] {
            for not_before_ms in [50, 150, 250, 350] {
                for proven in [None, Some(1), Some(2), Some(3)] {
                    sought.push(Sought {
                        id,
                        not_before_ms,
                        proven,
                    });
                }
            }
        }
        for md in [&full, &expired, &cleared] {
            let each: Vec<Walk> = sought
                .iter()
                .map(|s| walk(md, s.id, s.not_before_ms, s.proven))
                .collect();
            assert_eq!(walk_all(md, &sought), each);
        }
        assert!(walk_all(&full, &[]).is_empty());
    }
}
