//! Table maintenance, safe beside live writers and consumers: compaction, snapshot expiration,
//! orphan-file cleanup and manifest rewrite.
//!
//! Every change goes through [`crate::commit::Committer`]: compaction commits a `replace` per
//! group whose removed files must still be live at commit time (concurrent appends land; a group
//! whose files were replaced meanwhile is dropped), expiration removes snapshots from the metadata
//! only after deciding which ones consumers and the ingest dedup window still need, and files are
//! deleted only when nothing retained references them. Each run watches a deadline (the Lambda's
//! remaining time) and stops cleanly between units of work.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataFile, ManifestContentType, TableMetadata};
use iceberg::table::Table;
use iceberg::TableIdent;
use serde::Serialize;

use crate::commit::{CommitLimits, Committer, Outcome, Plan, Skipped};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::{self, Change};

/// Summary key of a consumer's checkpoint on a source table: `floe.checkpoint.<source uuid>` =
/// the last source snapshot id the consumer has processed. Expiration keeps that snapshot and
/// everything after it.
pub const CHECKPOINT_PREFIX: &str = "floe.checkpoint.";

/// What to do and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Run compaction.
    pub compact: bool,
    /// Run snapshot expiration.
    pub expire: bool,
    /// Run orphan-file cleanup.
    pub orphans: bool,
    /// Run manifest rewrite (when the count passes `manifest_threshold`).
    pub rewrite_manifests: bool,
    /// Report what would be done, change nothing.
    pub dry_run: bool,
    /// Compaction target file size (default: `write.target-file-size-bytes`, else 512 MiB).
    pub target_file_bytes: Option<u64>,
    /// Files smaller than this fraction of the target are compacted (default 0.75).
    pub small_file_fraction: f64,
    /// Fewest input files worth a compaction group (default 5, as Spark).
    pub min_input_files: usize,
    /// Expire snapshots older than this (default: `history.expire.max-snapshot-age-ms`, else 5 days).
    pub expire_older_than: Option<Duration>,
    /// Always keep this many of main's latest snapshots (default: `history.expire.min-snapshots-to-keep`, else 1).
    pub retain_last: Option<usize>,
    /// Keep snapshots younger than this for the ingest duplicate check (default: 4 days, the SQS
    /// message retention floe's template uses; a redelivered event must still find its commit).
    pub dedup_window: Duration,
    /// Orphan files must be older than this (default 3 days; anything under 1 hour is refused).
    pub orphan_older_than: Duration,
    /// "Now" for age decisions (tests run "as of" a later time).
    pub now: DateTime<Utc>,
    /// Rewrite manifests when the current snapshot has more data manifests than this.
    pub manifest_threshold: usize,
    /// Stop starting new work after this instant.
    pub deadline: Instant,
    /// Most rows (Arrow bytes) a sorted compaction holds before writing a sorted run.
    pub sort_memory_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            compact: true,
            expire: true,
            orphans: true,
            rewrite_manifests: true,
            dry_run: false,
            target_file_bytes: None,
            small_file_fraction: 0.75,
            min_input_files: 5,
            expire_older_than: None,
            retain_last: None,
            dedup_window: Duration::from_secs(4 * 86_400),
            orphan_older_than: Duration::from_secs(3 * 86_400),
            now: Utc::now(),
            manifest_threshold: 50,
            deadline: Instant::now() + Duration::from_secs(600),
            sort_memory_bytes: 256 << 20,
        }
    }
}

impl Options {
    /// Defaults from the config's `[maintain]` section; `deadline` bounds the run.
    pub fn from_config(cfg: &Config, deadline: Instant) -> Self {
        let m = &cfg.maintain;
        let hours = |h: f64| Duration::from_secs_f64(h.max(0.0) * 3600.0);
        Self {
            target_file_bytes: m.target_file_size_mb.map(|mb| mb << 20),
            min_input_files: m.min_input_files,
            expire_older_than: m.expire_older_than_hours.map(hours),
            retain_last: m.retain_last,
            dedup_window: hours(m.dedup_window_hours),
            orphan_older_than: hours(m.orphan_older_than_hours),
            manifest_threshold: m.manifest_threshold,
            sort_memory_bytes: m.sort_memory_mb << 20,
            deadline,
            ..Self::default()
        }
    }
}

/// The smallest orphan age floe accepts: younger files may belong to a write still in flight.
pub const MIN_ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// What one maintenance run did to one table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Table.
    pub table: String,
    /// Why compaction did not run, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_skipped: Option<String>,
    /// Whether nothing was changed on purpose.
    pub dry_run: bool,
    /// Live data files before.
    pub files_before: usize,
    /// Live data files after.
    pub files_after: usize,
    /// Bytes of live data files before.
    pub bytes_before: u64,
    /// Bytes of live data files after.
    pub bytes_after: u64,
    /// Compaction groups committed.
    pub groups_compacted: usize,
    /// Groups dropped because their files changed meanwhile.
    pub groups_obsolete: usize,
    /// Groups left for the next run (deadline).
    pub groups_deferred: usize,
    /// Bytes read by compaction.
    pub compaction_bytes_read: u64,
    /// Snapshots expired.
    pub snapshots_expired: usize,
    /// Files deleted after expiration (data files, manifests, manifest lists).
    pub expired_files_deleted: usize,
    /// Orphan files found (older than the window, unreferenced).
    pub orphans_found: Vec<String>,
    /// Orphan files deleted.
    pub orphans_deleted: usize,
    /// Data manifests before and after a manifest rewrite.
    pub manifests_before: usize,
    /// Data manifests after.
    pub manifests_after: usize,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// A live data file and the spec it was written with.
#[derive(Debug, Clone)]
pub struct LiveFile {
    /// The file.
    pub file: DataFile,
    /// Its partition spec id.
    pub spec_id: i32,
}

/// Live data files and bytes of the current snapshot, from its summary totals.
fn totals(table: &Table) -> (usize, u64) {
    let md = table.metadata();
    (
        snapshot::summary_total(md, "total-data-files") as usize,
        snapshot::summary_total(md, "total-files-size"),
    )
}

/// Live data files of the current snapshot.
pub async fn live_files(table: &Table) -> Result<Vec<LiveFile>> {
    Ok(live_files_added_by(table)
        .await?
        .into_iter()
        .map(|(f, _)| f)
        .collect())
}

/// Live data files of the current snapshot, each with the snapshot that added it.
pub async fn live_files_added_by(table: &Table) -> Result<Vec<(LiveFile, i64)>> {
    let mut out = Vec::new();
    for mf in snapshot::current_manifests(table).await? {
        if mf.content != ManifestContentType::Data {
            continue;
        }
        let m = mf
            .load_manifest(table.file_io())
            .await
            .map_err(|e| Error::iceberg("reading a manifest", e))?;
        for e in m.entries().iter().filter(|e| e.is_alive()) {
            out.push((
                LiveFile {
                    file: e.data_file().clone(),
                    spec_id: mf.partition_spec_id,
                },
                e.snapshot_id().unwrap_or(mf.added_snapshot_id),
            ));
        }
    }
    Ok(out)
}

/// Scan tasks reading `files` with `table`'s current schema (older files: new columns null).
pub fn scan_tasks(table: &Table, files: &[LiveFile]) -> Vec<FileScanTask> {
    let md = table.metadata();
    let schema = md.current_schema().clone();
    // Files added without field ids (Spark/PyIceberg `add_files`, migrations) are read by the
    // table's name mapping, as iceberg's own scan does; without it they would be read by position.
    let name_mapping = md
        .properties()
        .get(iceberg::spec::DEFAULT_SCHEMA_NAME_MAPPING)
        .and_then(|raw| {
            serde_json::from_str::<iceberg::spec::NameMapping>(raw)
                .map_err(|e| tracing::warn!(table = %table.identifier(), error = %e, "unreadable name mapping"))
                .ok()
        })
        .map(Arc::new);
    let field_ids: Vec<i32> = schema.as_struct().fields().iter().map(|f| f.id).collect();
    files
        .iter()
        .map(|f| {
            FileScanTask::builder()
                .with_file_size_in_bytes(f.file.file_size_in_bytes())
                .with_start(0)
                .with_length(f.file.file_size_in_bytes())
                .with_record_count(Some(f.file.record_count()))
                .with_data_file_path(f.file.file_path().to_string())
                .with_data_file_format(f.file.file_format())
                .with_schema(schema.clone())
                .with_project_field_ids(field_ids.clone())
                .with_partition(Some(f.file.partition().clone()))
                .with_partition_spec(md.partition_spec_by_id(f.spec_id).cloned())
                .with_name_mapping(name_mapping.clone())
                .with_case_sensitive(true)
                .build()
        })
        .collect()
}

/// Runs maintenance on configured tables.
pub struct Maintainer {
    config: Arc<Config>,
    committer: Committer,
}

fn prop<T: std::str::FromStr>(md: &TableMetadata, key: &str) -> Option<T> {
    md.properties().get(key).and_then(|v| v.parse().ok())
}

impl Maintainer {
    /// Connects to the configured catalog.
    pub async fn new(config: Config) -> Result<Self> {
        let catalog = crate::catalog::connect(&config).await?;
        let swap = crate::swap::from_config(&config).await?;
        Ok(Self::with_parts(config, Committer::new(catalog, swap)))
    }

    /// From explicit parts.
    pub fn with_parts(config: Config, committer: Committer) -> Self {
        Self {
            config: Arc::new(config),
            committer,
        }
    }

    /// The committer in use.
    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    fn limits(&self, opts: &Options) -> CommitLimits {
        CommitLimits {
            max_attempts: self.config.ingest.max_commit_attempts,
            deadline: opts.deadline,
            skew: Duration::from_secs(self.config.ingest.dedup_skew_seconds),
        }
    }

    /// Runs the selected operations on `table` (a configured table name).
    pub async fn run(&self, table: &str, opts: &Options) -> Result<Report> {
        let started = Instant::now();
        let ident = crate::catalog::table_ident(&self.config, table)?;
        let mut report = Report {
            table: ident.to_string(),
            dry_run: opts.dry_run,
            ..Default::default()
        };
        let t = self.committer.load(&ident).await?;
        (report.files_before, report.bytes_before) = totals(&t);
        if opts.compact {
            self.compact(&ident, opts, &mut report).await?;
        }
        if opts.rewrite_manifests && Instant::now() < opts.deadline {
            self.rewrite_manifests(&ident, opts, &mut report).await?;
        }
        if opts.expire && Instant::now() < opts.deadline {
            self.expire(&ident, opts, &mut report).await?;
        }
        if opts.orphans && Instant::now() < opts.deadline {
            self.remove_orphans(&ident, opts, &mut report).await?;
        }
        let t = self.committer.load(&ident).await?;
        (report.files_after, report.bytes_after) = totals(&t);
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Bin-packs small files per partition and rewrites each group as one `replace` commit.
    pub async fn compact(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        if snapshot::has_delete_files(&table).await? {
            // Rewriting data files without applying another engine's row-level deletes would
            // bring deleted rows back (and the deletes would no longer match the new files).
            tracing::warn!(table = %ident, "compaction skipped: the table has delete files (merge-on-read deletes by another engine)");
            report.compaction_skipped = Some("the table has delete files (merge-on-read row-level deletes); floe does not rewrite them".into());
            return Ok(());
        }
        let md = table.metadata();
        let target = opts
            .target_file_bytes
            .or_else(|| prop(md, "write.target-file-size-bytes"))
            .unwrap_or(512 << 20);
        let small = (target as f64 * opts.small_file_fraction) as u64;
        let mut by_partition: BTreeMap<(i32, String), Vec<LiveFile>> = BTreeMap::new();
        for f in live_files(&table).await? {
            if f.file.file_size_in_bytes() < small {
                by_partition
                    .entry((f.spec_id, format!("{:?}", f.file.partition())))
                    .or_default()
                    .push(f);
            }
        }
        let mut groups: Vec<Vec<LiveFile>> = Vec::new();
        for (_, mut files) in by_partition {
            files.sort_by_key(|f| f.file.file_size_in_bytes());
            let mut bin: Vec<LiveFile> = Vec::new();
            let mut bytes = 0u64;
            for f in files {
                if bytes + f.file.file_size_in_bytes() > target && !bin.is_empty() {
                    groups.push(std::mem::take(&mut bin));
                    bytes = 0;
                }
                bytes += f.file.file_size_in_bytes();
                bin.push(f);
            }
            groups.push(bin);
        }
        groups.retain(|g| g.len() >= opts.min_input_files);
        let total = groups.len();
        for (i, group) in groups.into_iter().enumerate() {
            if Instant::now() >= opts.deadline {
                report.groups_deferred = total - i;
                tracing::info!(table = %ident, deferred = total - i, "deadline reached; compaction continues next run");
                break;
            }
            if opts.dry_run {
                report.groups_compacted += 1;
                continue;
            }
            match self.compact_group(ident, &group, target, opts).await? {
                true => report.groups_compacted += 1,
                false => report.groups_obsolete += 1,
            }
            report.compaction_bytes_read += group
                .iter()
                .map(|f| f.file.file_size_in_bytes())
                .sum::<u64>();
        }
        Ok(())
    }

    /// Rewrites one group; false if its files were replaced meanwhile (nothing committed).
    async fn compact_group(
        &self,
        ident: &TableIdent,
        group: &[LiveFile],
        target: u64,
        opts: &Options,
    ) -> Result<bool> {
        let table = self.committer.load(ident).await?;
        let md = table.metadata();
        let schema = md.current_schema().clone();
        let tasks = scan_tasks(&table, group);
        let stream = futures::stream::iter(tasks.into_iter().map(Ok));
        let batches = table
            .reader_builder()
            .with_batch_size(8192)
            .build()
            .read(Box::pin(stream))
            .map_err(|e| Error::iceberg("reading files to compact", e))?
            .stream();
        let writer_id = format!("compact-{}", uuid::Uuid::now_v7());
        let mut sink = crate::write::build_sink(&table, target as usize, &writer_id)
            .map_err(|e| Error::iceberg("compaction writer", e))?;
        let sort = md.default_sort_order().clone();
        // Decode on one task, encode on this one: two cores, both busy.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<iceberg::Result<RecordBatch>>(4);
        let reader = tokio::spawn(async move {
            let mut batches = batches;
            loop {
                let item = match batches.try_next().await {
                    Ok(Some(b)) => Ok(b),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
        });
        // A sorted table's rows are held and sorted in runs of at most `sort_memory_bytes`; each
        // run is written to files of its own, so every output file is sorted and memory stays
        // bounded whatever the group's size.
        let mut held: Vec<RecordBatch> = Vec::new();
        let mut held_bytes = 0usize;
        let mut added = Vec::new();
        let mut runs = 0u32;
        while let Some(b) = rx.recv().await {
            let b = b.map_err(|e| Error::iceberg("reading files to compact", e))?;
            if sort.is_unsorted() {
                sink.write(b)
                    .await
                    .map_err(|e| Error::iceberg("writing compacted files", e))?;
                continue;
            }
            held_bytes += b.get_array_memory_size();
            held.push(b);
            if held_bytes >= opts.sort_memory_bytes {
                let sorted = sort_batches(&std::mem::take(&mut held), &sort, &schema)?;
                held_bytes = 0;
                sink.write(sorted)
                    .await
                    .map_err(|e| Error::iceberg("writing compacted files", e))?;
                // Each run's files get names of their own (a writer numbers its files from 0).
                runs += 1;
                let next = crate::write::build_sink(
                    &table,
                    target as usize,
                    &format!("{writer_id}-{runs}"),
                )
                .map_err(|e| Error::iceberg("compaction writer", e))?;
                let run = std::mem::replace(&mut sink, next);
                added.extend(
                    run.close()
                        .await
                        .map_err(|e| Error::iceberg("closing compacted files", e))?,
                );
            }
        }
        let _ = reader.await;
        if !held.is_empty() {
            let sorted = sort_batches(&held, &sort, &schema)?;
            sink.write(sorted)
                .await
                .map_err(|e| Error::iceberg("writing compacted files", e))?;
        }
        added.extend(
            sink.close()
                .await
                .map_err(|e| Error::iceberg("closing compacted files", e))?,
        );
        let removed: Vec<String> = group
            .iter()
            .map(|f| f.file.file_path().to_string())
            .collect();
        let rows_in: u64 = group.iter().map(|f| f.file.record_count()).sum();
        let rows_out: u64 = added.iter().map(|f| f.record_count()).sum();
        if rows_in != rows_out {
            delete_paths(&table, added.iter().map(|f| f.file_path().to_string())).await;
            return Err(Error::new(
                ErrorKind::Internal,
                format!("compaction of {ident} read {rows_in} rows but wrote {rows_out}"),
            ));
        }
        let props = HashMap::from([
            ("floe.operation".to_string(), "compaction".to_string()),
            (
                "floe.rewritten-files".to_string(),
                removed.len().to_string(),
            ),
        ]);
        let change = Change::replace(added.clone(), removed.clone(), props);
        let result = self
            .committer
            .commit(ident, &self.limits(opts), move |t: &Table| {
                // Deletes that arrived since planning would be lost by the rewrite.
                Ok(if snapshot::summary_counts_deletes(t.metadata()) {
                    Plan::Skip(Skipped::Obsolete("delete files arrived meanwhile".into()))
                } else {
                    Plan::Apply(change.clone())
                })
            })
            .await;
        match result {
            Ok(Outcome::Committed { .. }) => Ok(true),
            Ok(Outcome::Skipped(why)) => {
                tracing::info!(table = %ident, ?why, "compaction group obsolete; dropped");
                delete_paths(&table, added.iter().map(|f| f.file_path().to_string())).await;
                Ok(false)
            }
            Err(e) if e.kind() == ErrorKind::Stale => {
                tracing::info!(table = %ident, error = %e, "compaction group obsolete; dropped");
                delete_paths(&table, added.iter().map(|f| f.file_path().to_string())).await;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Folds the current snapshot's data manifests into one per spec when there are too many.
    pub async fn rewrite_manifests(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        let count = |ms: &[iceberg::spec::ManifestFile]| {
            ms.iter()
                .filter(|m| m.content == ManifestContentType::Data)
                .count()
        };
        let n = count(&snapshot::current_manifests(&table).await?);
        report.manifests_before = n;
        report.manifests_after = n;
        if n <= opts.manifest_threshold || opts.dry_run {
            return Ok(());
        }
        let props = HashMap::from([(
            "floe.operation".to_string(),
            "rewrite-manifests".to_string(),
        )]);
        let change = Change::rewrite_manifests(props);
        self.committer
            .commit(ident, &self.limits(opts), move |_t: &Table| {
                Ok(Plan::Apply(change.clone()))
            })
            .await?;
        let table = self.committer.load(ident).await?;
        report.manifests_after = count(&snapshot::current_manifests(&table).await?);
        Ok(())
    }

    /// Snapshot ids that consumers' checkpoints pin on `table` (see [`CHECKPOINT_PREFIX`]).
    pub async fn checkpoints(&self, table: &Table) -> Result<Vec<i64>> {
        let uuid = table.metadata().uuid().to_string();
        let mut out = Vec::new();
        for name in self.config.all_tables() {
            let ident = crate::catalog::table_ident(&self.config, &name)?;
            let consumer = match self.committer.catalog().load_table(&ident).await {
                Ok(t) => t,
                // A consumer that does not exist (yet) pins nothing.
                Err(_)
                    if !self
                        .committer
                        .catalog()
                        .table_exists(&ident)
                        .await
                        .unwrap_or(true) =>
                {
                    continue
                }
                // Not knowing a consumer's position is not "no position": expiring now could
                // remove the snapshots it still has to read. Stop; the next run tries again.
                Err(e) => {
                    return Err(Error::iceberg(
                        format!("reading the checkpoints {ident} holds (expiration stopped)"),
                        e,
                    )
                    .with_retryable(true))
                }
            };
            out.extend(
                crate::process::read_checkpoint(consumer.metadata(), &uuid).map(|c| c.snapshot_id),
            );
        }
        Ok(out)
    }

    /// Expires old snapshots, keeping what consumers and the dedup window need, then deletes
    /// files reachable only from expired snapshots.
    pub async fn expire(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        let md = table.metadata();
        let Some(current) = md.current_snapshot() else {
            return Ok(());
        };
        let older_than = opts
            .expire_older_than
            .or_else(|| {
                prop::<u64>(md, "history.expire.max-snapshot-age-ms").map(Duration::from_millis)
            })
            .unwrap_or(Duration::from_secs(5 * 86_400));
        let retain_last = opts
            .retain_last
            .or_else(|| prop(md, "history.expire.min-snapshots-to-keep"))
            .unwrap_or(1)
            .max(1);
        let keep_after =
            opts.now.timestamp_millis() - older_than.max(opts.dedup_window).as_millis() as i64;
        let mut keep: HashSet<i64> = HashSet::new();
        let ancestry: Vec<i64> = {
            let mut v = Vec::new();
            let mut cur = Some(current.clone());
            while let Some(s) = cur {
                v.push(s.snapshot_id());
                cur = s
                    .parent_snapshot_id()
                    .and_then(|p| md.snapshot_by_id(p))
                    .cloned();
            }
            v
        };
        keep.extend(ancestry.iter().take(retain_last));
        keep.extend(ref_snapshot_ids(md));
        for s in md.snapshots() {
            if s.timestamp_ms() >= keep_after {
                keep.insert(s.snapshot_id());
            }
        }
        // A consumer's own position: the newest snapshot carrying each `floe.checkpoint.*` and
        // everything after it (another engine's snapshots on top carry none; expiring the one
        // that does would reset the pipeline).
        let mut positions: HashSet<&str> = HashSet::new();
        for (i, id) in ancestry.iter().enumerate() {
            let Some(s) = md.snapshot_by_id(*id) else {
                continue;
            };
            for k in s.summary().additional_properties.keys() {
                if k.starts_with(CHECKPOINT_PREFIX) && positions.insert(k.as_str()) {
                    keep.extend(&ancestry[..=i]);
                }
            }
        }
        for cp in self.checkpoints(&table).await? {
            // The consumer will read everything after its checkpoint: keep it and its descendants.
            if let Some(pos) = ancestry.iter().position(|id| *id == cp) {
                keep.extend(&ancestry[..=pos]);
            }
        }
        let expired: Vec<i64> = md
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| !keep.contains(id))
            .collect();
        report.snapshots_expired = expired.len();
        if expired.is_empty() || opts.dry_run {
            return Ok(());
        }
        // Files of expired snapshots, minus everything retained snapshots reference.
        let (exp_lists, exp_manifests, exp_data) = referenced_files(&table, &expired).await?;
        let kept: Vec<i64> = md
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| keep.contains(id))
            .collect();
        let (keep_lists, keep_manifests, keep_data) = referenced_files(&table, &kept).await?;
        let plan_ids = expired.clone();
        self.committer
            .commit(ident, &self.limits(opts), move |t: &Table| {
                // A branch or tag created meanwhile keeps its snapshot (removing the snapshot
                // would silently drop the ref).
                let refs = ref_snapshot_ids(t.metadata());
                let present: Vec<i64> = plan_ids
                    .iter()
                    .copied()
                    .filter(|id| t.metadata().snapshot_by_id(*id).is_some() && !refs.contains(id))
                    .collect();
                Ok(if present.is_empty() {
                    Plan::Skip(Skipped::Obsolete("already expired".into()))
                } else {
                    Plan::Apply(Change::expire(present))
                })
            })
            .await?;
        // Files are deleted only for exactly the planned expiry: had anything kept a planned
        // snapshot (a ref created meanwhile), its files are left to orphan cleanup.
        let after = self.committer.load(ident).await?;
        if expired
            .iter()
            .any(|id| after.metadata().snapshot_by_id(*id).is_some())
        {
            tracing::warn!(table = %ident, "some planned snapshots were kept (refs created meanwhile); their files are left to orphan cleanup");
            return Ok(());
        }
        // Compared in one spelling: a file a kept snapshot names `s3a://` is not doomed because
        // an expired one named it `s3://`.
        let kept_files: HashSet<String> = keep_data
            .iter()
            .chain(&keep_manifests)
            .chain(&keep_lists)
            .map(|p| same_object_key(p))
            .collect();
        let doomed: Vec<String> = exp_data
            .iter()
            .chain(&exp_manifests)
            .chain(&exp_lists)
            .filter(|p| !kept_files.contains(&same_object_key(p)))
            .cloned()
            .collect();
        report.expired_files_deleted = doomed.len();
        delete_paths(&table, doomed.into_iter()).await;
        Ok(())
    }

    /// Deletes files under the table location that no retained metadata references and that are
    /// older than the safety window (a dry run only lists them).
    pub async fn remove_orphans(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
    ) -> Result<()> {
        if opts.orphan_older_than < MIN_ORPHAN_AGE {
            return Err(Error::new(
                ErrorKind::Config,
                format!("orphan window {:?} is under the 1 hour minimum: files of writes in flight could be deleted", opts.orphan_older_than),
            ));
        }
        let table = self.committer.load(ident).await?;
        let md = table.metadata();
        let all: Vec<i64> = md.snapshots().map(|s| s.snapshot_id()).collect();
        let (lists, manifests, data) = referenced_files(&table, &all).await?;
        let mut reachable: HashSet<String> =
            lists.into_iter().chain(manifests).chain(data).collect();
        if let Some(loc) = table.metadata_location() {
            reachable.insert(loc.to_string());
        }
        reachable.extend(md.metadata_log().iter().map(|l| l.metadata_file.clone()));
        reachable.extend(md.statistics_iter().map(|s| s.statistics_path.clone()));
        reachable.extend(
            md.partition_statistics_iter()
                .map(|s| s.statistics_path.clone()),
        );
        // Other engines write `s3a://`/`s3n://` (Hadoop) for the same objects the listing names
        // `s3://`: compare one spelling, or every file they wrote would look orphaned.
        let reachable: HashSet<String> = reachable.iter().map(|p| same_object_key(p)).collect();
        let cutoff =
            opts.now - chrono::Duration::from_std(opts.orphan_older_than).unwrap_or_default();
        let listed = list_location(&self.config, md.location()).await?;
        let mut orphans: Vec<String> = listed
            .into_iter()
            .filter(|(path, modified)| {
                *modified < cutoff && !reachable.contains(&same_object_key(path))
            })
            .map(|(path, _)| path)
            .collect();
        orphans.sort();
        if !opts.dry_run {
            delete_paths(&table, orphans.iter().cloned()).await;
            report.orphans_deleted = orphans.len();
        }
        report.orphans_found = orphans;
        Ok(())
    }
}

/// One spelling per stored object, for comparing locations written by different engines:
/// `s3a://` and `s3n://` are `s3://`, `file:/x` and `file:///x` are `/x`.
pub(crate) fn same_object_key(path: &str) -> String {
    for scheme in ["s3a://", "s3n://"] {
        if let Some(rest) = path.strip_prefix(scheme) {
            return format!("s3://{rest}");
        }
    }
    if let Some(rest) = path.strip_prefix("file://") {
        return rest.to_string();
    }
    if let Some(rest) = path.strip_prefix("file:") {
        return rest.to_string();
    }
    path.to_string()
}

/// Snapshot ids named by branches and tags (iceberg 0.10.1 has no public accessor for all refs).
fn ref_snapshot_ids(md: &TableMetadata) -> Vec<i64> {
    serde_json::to_value(md)
        .ok()
        .and_then(|v| v.get("refs").and_then(|r| r.as_object()).cloned())
        .map(|refs| {
            refs.values()
                .filter_map(|r| r.get("snapshot-id").and_then(|v| v.as_i64()))
                .collect()
        })
        .unwrap_or_default()
}

/// Manifest lists, manifests and live data files referenced by the given snapshots.
async fn referenced_files(
    table: &Table,
    snapshot_ids: &[i64],
) -> Result<(HashSet<String>, HashSet<String>, HashSet<String>)> {
    let md = table.metadata();
    let mut lists = HashSet::new();
    let mut manifests: HashMap<String, iceberg::spec::ManifestFile> = HashMap::new();
    for id in snapshot_ids {
        let Some(s) = md.snapshot_by_id(*id) else {
            continue;
        };
        lists.insert(s.manifest_list().to_string());
        let list = table
            .manifest_list_reader(s)
            .load()
            .await
            .map_err(|e| Error::iceberg("reading a manifest list", e))?;
        for mf in list.consume_entries() {
            manifests.entry(mf.manifest_path.clone()).or_insert(mf);
        }
    }
    let mut data = HashSet::new();
    for mf in manifests.values() {
        let m = mf
            .load_manifest(table.file_io())
            .await
            .map_err(|e| Error::iceberg("reading a manifest", e))?;
        // Only live entries: a DELETED entry is a tombstone; the file is reachable only through
        // a retained snapshot in which it is live.
        data.extend(
            m.entries()
                .iter()
                .filter(|e| e.is_alive())
                .map(|e| e.data_file().file_path().to_string()),
        );
    }
    Ok((lists, manifests.into_keys().collect(), data))
}

async fn delete_paths(table: &Table, paths: impl Iterator<Item = String>) {
    for p in paths {
        if let Err(e) = table.file_io().delete(&p).await {
            tracing::warn!(file = %p, error = %e, "could not delete file");
        }
    }
}

fn sort_batches(
    batches: &[RecordBatch],
    order: &iceberg::spec::SortOrder,
    schema: &iceberg::spec::Schema,
) -> Result<RecordBatch> {
    use arrow::compute::{
        concat_batches, lexsort_to_indices, take_record_batch, SortColumn, SortOptions,
    };
    let all = concat_batches(&batches[0].schema(), batches)
        .map_err(|e| Error::new(ErrorKind::Internal, "concatenating for sort").with_source(e))?;
    let mut cols = Vec::new();
    for f in &order.fields {
        let Some(field) = schema.field_by_id(f.source_id) else {
            continue;
        };
        let Ok(idx) = all.schema().index_of(&field.name) else {
            continue;
        };
        cols.push(SortColumn {
            values: all.column(idx).clone(),
            options: Some(SortOptions {
                descending: f.direction == iceberg::spec::SortDirection::Descending,
                nulls_first: f.null_order == iceberg::spec::NullOrder::First,
            }),
        });
    }
    let idx = lexsort_to_indices(&cols, None)
        .map_err(|e| Error::new(ErrorKind::Internal, "sorting").with_source(e))?;
    take_record_batch(&all, &idx)
        .map_err(|e| Error::new(ErrorKind::Internal, "sorting").with_source(e))
}

/// Every file under a table location with its last-modified time (S3 `ListObjectsV2`, paginated;
/// or a local directory walk).
pub async fn list_location(cfg: &Config, location: &str) -> Result<Vec<(String, DateTime<Utc>)>> {
    let location = location.trim_end_matches('/');
    if let Some(rest) = location
        .strip_prefix("s3://")
        .or_else(|| location.strip_prefix("s3a://"))
    {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let client = crate::store::s3_client(&cfg.storage).await;
        let mut out = Vec::new();
        let mut pages = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(format!("{prefix}/"))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| {
                Error::new(
                    ErrorKind::Storage,
                    format!(
                        "ListObjectsV2 s3://{bucket}/{prefix}: {}",
                        aws_sdk_s3::error::DisplayErrorContext(&e)
                    ),
                )
                .with_retryable(true)
            })?;
            for o in page.contents() {
                let (Some(key), Some(m)) = (o.key(), o.last_modified()) else {
                    continue;
                };
                let modified = DateTime::<Utc>::from_timestamp(m.secs(), m.subsec_nanos())
                    .unwrap_or_else(Utc::now);
                out.push((format!("s3://{bucket}/{key}"), modified));
            }
        }
        Ok(out)
    } else {
        let root = location
            .strip_prefix("file://")
            .unwrap_or(location)
            .to_string();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut stack = vec![std::path::PathBuf::from(&root)];
            while let Some(dir) = stack.pop() {
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if let Ok(md) = e.metadata() {
                        let modified = md
                            .modified()
                            .map(DateTime::<Utc>::from)
                            .unwrap_or_else(|_| Utc::now());
                        out.push((format!("file://{}", p.display()), modified));
                    }
                }
            }
            out
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Internal, format!("listing {location}: {e}")))
    }
}

impl Maintainer {
    /// The maintain function's entry: tables from `tables` in the payload (or `detail.tables` of
    /// an EventBridge event), else every configured table; `dry_run` likewise. One EMF line per table.
    pub async fn handle_payload(
        &self,
        payload: &serde_json::Value,
        deadline: Instant,
    ) -> Result<Vec<Report>> {
        let pick = |k: &str| {
            payload
                .get(k)
                .or_else(|| payload.pointer(&format!("/detail/{k}")))
        };
        let tables: Vec<String> = match pick("tables").and_then(|v| v.as_array()) {
            Some(list) => list
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            None => self.config.all_tables(),
        };
        let opts = Options {
            dry_run: pick("dry_run").and_then(|v| v.as_bool()).unwrap_or(false),
            ..Options::from_config(&self.config, deadline)
        };
        let mut reports = Vec::new();
        for table in tables {
            if !self.config.all_tables().contains(&table) {
                return Err(Error::new(
                    ErrorKind::Event,
                    format!("maintain: no configured table `{table}`"),
                ));
            }
            let r = self.run(&table, &opts).await?;
            r.emit();
            reports.push(r);
        }
        Ok(reports)
    }
}

impl Report {
    /// Emits the report as EMF metrics and a log line.
    pub fn emit(&self) {
        use crate::metrics::Metric;
        crate::metrics::emit(
            &[("Table", self.table.as_str())],
            &[
                Metric::count("DataFilesBefore", self.files_before as f64),
                Metric::count("DataFilesAfter", self.files_after as f64),
                Metric::count("CompactionGroups", self.groups_compacted as f64),
                Metric {
                    name: "CompactionBytesRead",
                    value: self.compaction_bytes_read as f64,
                    unit: "Bytes",
                },
                Metric::count("SnapshotsExpired", self.snapshots_expired as f64),
                Metric::count(
                    "FilesDeleted",
                    (self.expired_files_deleted + self.orphans_deleted) as f64,
                ),
                Metric::seconds("MaintainSeconds", self.seconds),
            ],
        );
        tracing::info!(table = %self.table, files_before = self.files_before, files_after = self.files_after,
            groups = self.groups_compacted, expired = self.snapshots_expired, orphans = self.orphans_deleted,
            dry_run = self.dry_run, "maintained table");
    }
}
