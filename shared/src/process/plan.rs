//! Incremental planning for the process function: which data files a consumer has not seen yet.
//!
//! The role Flink's Iceberg streaming source plays. A consumer's checkpoint (the last source
//! snapshot it processed, per source table) lives in its sink table's snapshot summary,
//! `floe.checkpoint.<source uuid>`, committed atomically with its output. The plan walks main's
//! ancestry from the source's current snapshot back to the checkpoint (exclusive), so its cost
//! grows with the new snapshots, not with the table's history; each `append` contributes the
//! data files it ADDED (read from its own manifest list, so later manifest merges do not hide
//! them), `replace` snapshots (compaction) change no data and are skipped, and `overwrite`/`delete`
//! follow an explicit policy that fails loudly by default. A `latest` pipeline retracts them
//! ([`RowChangePolicy::Retract`]): their added data files join the delta like an append's, and
//! the data files they removed are listed ([`Delta::removed`]), and so are the rows their
//! position delete files delete (another engine's merge-on-read, [`Delta::deleted`]), for the
//! run to rebuild the key buckets those rows were in (`retract.rs`).
//!
//! The processor runs the pipeline's SQL over what this plans.

use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{DataFile, ManifestContentType, ManifestStatus, Operation, TableMetadata};
use iceberg::table::Table;

use crate::config::Start;
use crate::error::{Error, ErrorKind, Result};

/// What to do with `overwrite` and `delete` snapshots in the delta (they change existing rows,
/// which an append-only consumer cannot follow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowChangePolicy {
    /// Stop with an error naming the snapshot (the default).
    #[default]
    Fail,
    /// Skip them, logging each (for consumers that only care about new rows).
    Skip,
    /// Process them (`latest` pipelines): the data files they added are new files, the data
    /// files they removed are listed in [`Delta::removed`], and the rows their position delete
    /// files delete (another engine's merge-on-read) in [`Delta::deleted`]. Equality delete
    /// files and deletion vectors are refused: floe does not read them.
    Retract,
}

/// The exclusive lower bound a start strategy means on `source` (None: from the beginning).
pub fn start_after(source: &TableMetadata, start: Start) -> Result<Option<i64>> {
    Ok(match start {
        Start::Earliest => None,
        Start::Latest => source.current_snapshot_id(),
        Start::AfterSnapshot(id) => {
            if source.snapshot_by_id(id).is_none() {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("start snapshot {id} does not exist"),
                ));
            }
            Some(id)
        }
        Start::AfterTimestamp(ms) => {
            let mut best: Option<(i64, i64)> = None;
            let mut cur = source.current_snapshot();
            while let Some(s) = cur {
                if s.timestamp_ms() <= ms && best.map(|(t, _)| s.timestamp_ms() > t).unwrap_or(true)
                {
                    best = Some((s.timestamp_ms(), s.snapshot_id()));
                }
                cur = s
                    .parent_snapshot_id()
                    .and_then(|p| source.snapshot_by_id(p));
            }
            best.map(|(_, id)| id)
        }
    })
}

/// A new data file to process, with where it came from.
#[derive(Debug, Clone)]
pub struct NewFile {
    /// The file.
    pub file: DataFile,
    /// Its partition spec id.
    pub spec_id: i32,
    /// The snapshot that added it.
    pub snapshot_id: i64,
    /// The position delete files that apply to it (a delta read from the current state: the
    /// table's live deletes; a new file of an append: none).
    pub deletes: Vec<iceberg::scan::FileScanTaskDeleteFile>,
}

/// What a consumer has to process.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    /// The checkpoint the delta starts after (None: from the beginning).
    pub after: Option<i64>,
    /// The source snapshot the delta ends at (the next checkpoint); None for an empty table.
    pub to: Option<i64>,
    /// Append snapshots in the delta, oldest first.
    pub appends: Vec<i64>,
    /// Replace snapshots skipped (no data change).
    pub replaces_skipped: usize,
    /// Overwrite/delete snapshots skipped under [`RowChangePolicy::Skip`].
    pub row_changes_skipped: Vec<i64>,
    /// The files to process, oldest snapshot first.
    pub files: Vec<NewFile>,
    /// Overwrite/delete snapshots in the delta under [`RowChangePolicy::Retract`], oldest first.
    pub row_changes: Vec<i64>,
    /// The data files they removed (files of the delta's own appends that a later row change
    /// removed are here, not in `files`).
    pub removed: Vec<NewFile>,
    /// Rows their position delete files deleted: each data file named (live when the delete
    /// was committed) with the positions deleted in it, ascending.
    pub deleted: Vec<(NewFile, Vec<i64>)>,
    /// A row change whose removed files could not all be found in its manifests (their count
    /// is below its summary's `deleted-data-files`), or whose deleted rows are too many to
    /// list: the removed keys are unknown.
    pub removed_unknown: bool,
}

impl Delta {
    /// Rows in the delta.
    pub fn records(&self) -> u64 {
        self.files.iter().map(|f| f.file.record_count()).sum()
    }
}

/// Plans the delta of `source` after `after` (exclusive) up to its current snapshot.
///
/// A checkpoint that is no longer in main's ancestry (expired, or the branch was rolled back) is
/// an error of kind `Stale` naming the recovery: a full refresh of the consumer.
pub async fn plan(
    source: &Table,
    after: Option<i64>,
    policy: RowChangePolicy,
    consumer: &str,
) -> Result<Delta> {
    let md = source.metadata();
    let mut delta = Delta {
        after,
        to: md.current_snapshot_id(),
        ..Default::default()
    };
    if after.is_none() {
        // From the beginning = the table's current state. Replaying appends instead would miss
        // every file whose snapshot has been expired (and replay rows later rewritten), so a
        // consumer starting at `earliest` reads what a batch over the table reads.
        return current_state(source, delta).await;
    }
    // Walk back from the current snapshot to the checkpoint: O(new snapshots).
    let mut chain = Vec::new();
    let mut cur = md.current_snapshot();
    let mut reached = after.is_none();
    while let Some(s) = cur {
        if Some(s.snapshot_id()) == after {
            reached = true;
            break;
        }
        chain.push(s.clone());
        cur = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    if !reached {
        return Err(Error::new(
            ErrorKind::Stale,
            format!(
                "checkpoint snapshot {} of `{consumer}` is no longer in the history of {} (expired or rolled back); \
                 nothing was processed. Recover with a full refresh: `floe process refresh --pipeline {consumer}`",
                after.unwrap_or_default(),
                source.identifier()
            ),
        ));
    }
    chain.reverse();
    // The appends' manifest lists and new manifests are small GETs whose cost is their latency:
    // fetched several at once, used in the chain's order.
    let retract = policy == RowChangePolicy::Retract;
    // Positions of deleted rows the delta may list (all its snapshots together).
    let budget = std::sync::atomic::AtomicU64::new(0);
    let budget = &budget;
    let fetch = |s: iceberg::spec::SnapshotRef| async move {
        match s.summary().operation {
            Operation::Append => added_files(source, &s).await.map(Some),
            Operation::Overwrite | Operation::Delete if retract => {
                changed_files(source, &s, consumer, budget).await.map(Some)
            }
            _ => Ok(None),
        }
    };
    let added: Vec<Option<Changed>> = futures::stream::iter(chain.iter().cloned().map(fetch))
        .buffered(READ_CONCURRENCY)
        .try_collect()
        .await?;
    for (s, added) in chain.into_iter().zip(added) {
        match s.summary().operation {
            Operation::Append => {
                delta.appends.push(s.snapshot_id());
                delta.files.extend(added.unwrap_or_default().added);
            }
            Operation::Replace => delta.replaces_skipped += 1,
            Operation::Overwrite | Operation::Delete if retract => {
                let changed = added.unwrap_or_default();
                delta.row_changes.push(s.snapshot_id());
                delta.removed_unknown |= changed.incomplete;
                for r in changed.removed {
                    // A file this delta added and now removed: its rows are gone at `to`.
                    match delta
                        .files
                        .iter()
                        .position(|f| f.file.file_path() == r.file.file_path())
                    {
                        Some(i) => delta.removed.push(delta.files.remove(i)),
                        None => delta.removed.push(r),
                    }
                }
                delta.files.extend(changed.added);
                delta.deleted.extend(changed.deleted);
            }
            Operation::Overwrite | Operation::Delete => match policy {
                RowChangePolicy::Fail => {
                    return Err(Error::new(
                        ErrorKind::Stale,
                        format!(
                            "snapshot {} of {} is an {} (rows changed, not appended); `{consumer}` follows appends only. \
                             Set the pipeline's row-change policy to `skip`, or refresh it: `floe process refresh --pipeline {consumer}`",
                            s.snapshot_id(),
                            source.identifier(),
                            s.summary().operation.as_str()
                        ),
                    ))
                }
                RowChangePolicy::Skip | RowChangePolicy::Retract => {
                    tracing::warn!(snapshot = s.snapshot_id(), operation = s.summary().operation.as_str(), consumer, "skipping a row-changing snapshot");
                    delta.row_changes_skipped.push(s.snapshot_id());
                }
            },
        }
    }
    Ok(delta)
}

/// Manifest lists, manifests or data files a run fetches at once. S3 GETs are bound by their
/// latency, not the CPU (iceberg's reader defaults to one data file per core).
pub(super) const READ_CONCURRENCY: usize = 16;

/// The data files one snapshot added and removed, and the rows it deleted.
#[derive(Debug, Default)]
struct Changed {
    added: Vec<NewFile>,
    removed: Vec<NewFile>,
    deleted: Vec<(NewFile, Vec<i64>)>,
    /// Fewer removed files found than its summary counts, or too many deleted rows to list.
    incomplete: bool,
}

/// Most rows a run lists by position as deleted by other engines' position delete files
/// (summed over the delta's snapshots, read several at once); past it, every key bucket is
/// rebuilt instead (the positions are not held in memory).
const MAX_DELETED_POSITIONS: u64 = 2_000_000;

/// The data files `s` (an append) added, from its own manifest list.
async fn added_files(source: &Table, s: &iceberg::spec::SnapshotRef) -> Result<Changed> {
    let (changed, _) = snapshot_files(source, s, false).await?;
    Ok(changed)
}

/// The data files `s` (an overwrite or delete) added and removed, and the rows its position
/// delete files delete; `Stale` when it added equality delete files or deletion vectors (row-level
/// deletes by value, or in Puffin files), which floe does not read.
async fn changed_files(
    source: &Table,
    s: &iceberg::spec::SnapshotRef,
    consumer: &str,
    budget: &std::sync::atomic::AtomicU64,
) -> Result<Changed> {
    let (mut changed, deletes) = snapshot_files(source, s, true).await?;
    if !deletes.is_empty() {
        deleted_rows(source, s, &deletes, consumer, budget, &mut changed).await?;
    }
    let counted = s
        .summary()
        .additional_properties
        .get("deleted-data-files")
        .and_then(|v| v.parse::<usize>().ok());
    changed.incomplete |= counted.is_some_and(|n| n > changed.removed.len());
    Ok(changed)
}

/// The rows `s`'s position delete files `deletes` delete (another engine's merge-on-read
/// delete or update): each data file they name that is live at `s`, with its positions.
/// More positions than are left of the run's `budget`: `incomplete` (every bucket is rebuilt).
async fn deleted_rows(
    source: &Table,
    s: &iceberg::spec::SnapshotRef,
    deletes: &[crate::scan::LiveDelete],
    consumer: &str,
    budget: &std::sync::atomic::AtomicU64,
    changed: &mut Changed,
) -> Result<()> {
    use iceberg::spec::{DataContentType, DataFileFormat};
    if let Some(d) = deletes.iter().map(|d| &d.file).find(|d| {
        d.content_type() != DataContentType::PositionDeletes
            || d.file_format() != DataFileFormat::Parquet
    }) {
        return Err(Error::new(
            ErrorKind::Stale,
            format!(
                "snapshot {} of {} ({}) added {} ({}): row-level deletes floe does not read \
                 (it applies position delete files in Parquet only); nothing was processed. Have \
                 the writer use position deletes or copy-on-write (Spark: `write.delete.mode`, \
                 `write.update.mode` and `write.merge.mode` = `copy-on-write`), rewrite the \
                 table's data files with the deletes applied, then rebuild the pipeline: \
                 `floe process refresh --pipeline {consumer}`",
                s.snapshot_id(),
                source.identifier(),
                s.summary().operation.as_str(),
                match d.content_type() {
                    DataContentType::EqualityDeletes => "equality delete files",
                    _ => "a deletion vector",
                },
                d.file_path(),
            ),
        ));
    }
    let rows: u64 = deletes.iter().map(|d| d.file.record_count()).sum();
    // Taken from the run's budget before reading (the snapshots are read several at once).
    let taken = budget.fetch_add(rows, std::sync::atomic::Ordering::SeqCst);
    if taken.saturating_add(rows) > MAX_DELETED_POSITIONS {
        tracing::warn!(
            snapshot = s.snapshot_id(),
            rows,
            "too many deleted rows to list: every key bucket is rebuilt"
        );
        changed.incomplete = true;
        return Ok(());
    }
    let tasks: Vec<_> = deletes.iter().map(crate::scan::LiveDelete::task).collect();
    let mut positions = crate::write::read_position_deletes(source, &tasks).await?;
    // A position delete names files by path; those live at `s` are the ones it deletes from
    // (one naming a file that is not live applies to nothing).
    let live = crate::scan::live_files_at(source, s.snapshot_id())
        .await?
        .unwrap_or_default();
    for f in live {
        let Some(p) = positions.remove(f.file.file_path()) else {
            continue;
        };
        let mut p: Vec<i64> = p.into_iter().filter(|&i| i >= 0).collect();
        p.sort_unstable();
        changed.deleted.push((
            NewFile {
                file: f.file,
                spec_id: f.spec_id,
                snapshot_id: s.snapshot_id(),
                deletes: Vec::new(),
            },
            p,
        ));
    }
    Ok(())
}

/// What `s` wrote in its own manifests (those it added): the data files it added, those it
/// removed (with `removed`), and the delete files it added (with `removed`; else only whether
/// it added any).
async fn snapshot_files(
    source: &Table,
    s: &iceberg::spec::SnapshotRef,
    removed: bool,
) -> Result<(Changed, Vec<crate::scan::LiveDelete>)> {
    let list = source.manifest_list_reader(s).load().await.map_err(|e| {
        Error::iceberg(
            format!("reading the manifest list of snapshot {}", s.snapshot_id()),
            e,
        )
    })?;
    let mut out = Changed::default();
    let mut deletes = Vec::new();
    for mf in list.entries() {
        if mf.added_snapshot_id != s.snapshot_id() {
            continue;
        }
        if mf.content != ManifestContentType::Data {
            if removed && mf.has_added_files() {
                let m = mf
                    .load_manifest(source.file_io())
                    .await
                    .map_err(|e| Error::iceberg("reading a delete manifest", e))?;
                deletes.extend(
                    m.entries()
                        .iter()
                        .filter(|e| {
                            e.status() == ManifestStatus::Added
                                && e.snapshot_id().unwrap_or(s.snapshot_id()) == s.snapshot_id()
                        })
                        .map(|e| crate::scan::LiveDelete {
                            file: e.data_file().clone(),
                            spec_id: mf.partition_spec_id,
                            seq: e.sequence_number().unwrap_or(s.sequence_number()),
                        }),
                );
            }
            continue;
        }
        if !(mf.has_added_files() || (removed && mf.has_deleted_files())) {
            continue;
        }
        let m = mf
            .load_manifest(source.file_io())
            .await
            .map_err(|e| Error::iceberg("reading a manifest", e))?;
        for e in m.entries() {
            if e.snapshot_id().unwrap_or(s.snapshot_id()) != s.snapshot_id() {
                continue;
            }
            let file = || NewFile {
                file: e.data_file().clone(),
                spec_id: mf.partition_spec_id,
                snapshot_id: s.snapshot_id(),
                deletes: Vec::new(),
            };
            match e.status() {
                ManifestStatus::Added => out.added.push(file()),
                ManifestStatus::Deleted if removed => out.removed.push(file()),
                _ => {}
            }
        }
    }
    Ok((out, deletes))
}

/// Every live data file of the current snapshot, as the delta of a consumer starting from the
/// beginning (whatever history expiration kept).
async fn current_state(source: &Table, mut delta: Delta) -> Result<Delta> {
    let md = source.metadata();
    let Some(current) = md.current_snapshot() else {
        return Ok(delta);
    };
    // Its position deletes are applied by every read of its files (each file carries the
    // ones that apply to it); equality deletes are not.
    crate::scan::refuse_equality_deletes(source, "a pipeline starting from its current state")
        .await?;
    let mut cur = Some(current);
    while let Some(s) = cur {
        if s.summary().operation == Operation::Append {
            delta.appends.push(s.snapshot_id());
        }
        cur = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    delta.appends.reverse();
    delta.files = crate::scan::live_files_added_by(source)
        .await?
        .into_iter()
        .map(|(f, snapshot_id)| NewFile {
            file: f.file,
            spec_id: f.spec_id,
            snapshot_id,
            deletes: f.deletes,
        })
        .collect();
    // Oldest first (by the sequence number of the commit that added each), as for a delta.
    let order: std::collections::HashMap<i64, i64> = md
        .snapshots()
        .map(|s| (s.snapshot_id(), s.sequence_number()))
        .collect();
    delta
        .files
        .sort_by_key(|f| order.get(&f.snapshot_id).copied().unwrap_or(i64::MIN));
    Ok(delta)
}
