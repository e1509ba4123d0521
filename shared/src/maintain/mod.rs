//! Table maintenance, safe beside live writers and consumers: compaction, snapshot expiration,
//! orphan-file cleanup and manifest rewrite.
//!
//! Every change goes through [`crate::commit::Committer`]: compaction commits a `replace` per
//! group whose removed files must still be live at commit time (concurrent appends land; a group
//! whose files were replaced meanwhile is dropped), expiration removes snapshots from the metadata
//! only after deciding which ones consumers and the ingest dedup window still need, and files are
//! deleted only when nothing retained references them. Each run watches a deadline (the Lambda's
//! remaining time) and stops cleanly between units of work.
//!
//! One file per operation: `compact`, `expire`, `orphans`, `manifests`.

mod compact;
mod expire;
mod manifests;
mod orphans;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use serde::Serialize;

use crate::commit::{CommitLimits, Committer, Outcome, Plan, Skipped};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::requests::{Meter, Requests};
use crate::scan::{live_files, scan_tasks, LiveFile};
use crate::snapshot::{self, Change};
use crate::summary::{self, Usage, FUNCTION_MAINTAIN};

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
    /// A partition whose position deletes delete at least this fraction of its rows has every
    /// file they apply to rewritten with them applied, whatever its size (default 0.1: a
    /// merge-on-read `latest` sink is compacted as its deletes pile up).
    pub delete_ratio: f64,
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
            delete_ratio: 0.1,
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

/// The operations a maintain payload's `operations` may name.
pub const OPERATIONS: [&str; 4] = ["compact", "rewrite_manifests", "expire", "orphans"];

impl Options {
    /// Runs only the operations `ops` names (a JSON array of [`OPERATIONS`]; the short-history
    /// schedule sends `["expire"]`). An unknown name refuses the whole payload.
    pub fn select(&mut self, ops: &serde_json::Value) -> Result<()> {
        let bad = || {
            Error::new(
                ErrorKind::Event,
                format!(
                    "maintain: `operations` must be a list of {}, got {ops}",
                    OPERATIONS.join(", ")
                ),
            )
        };
        let names: Vec<&str> = ops
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|v| {
                v.as_str()
                    .filter(|n| OPERATIONS.contains(n))
                    .ok_or_else(bad)
            })
            .collect::<Result<_>>()?;
        self.compact = names.contains(&"compact");
        self.rewrite_manifests = names.contains(&"rewrite_manifests");
        self.expire = names.contains(&"expire");
        self.orphans = names.contains(&"orphans");
        Ok(())
    }
}

/// The payload of the short-history schedule (template.yaml's `ExpireShortHistory`, `floe
/// local`'s pass): expiration alone, of the tables `[maintain] history_minutes` names; `None`
/// when it names none.
pub fn short_history_payload(config: &Config) -> Option<serde_json::Value> {
    let tables = &config.maintain.history_minutes;
    (!tables.is_empty()).then(|| {
        serde_json::json!({
            "tables": tables.keys().collect::<Vec<_>>(),
            "operations": ["expire"],
        })
    })
}

/// The smallest orphan age floe accepts: younger files may belong to a write still in flight.
pub(crate) const MIN_ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// What one maintenance run did to one table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Table.
    pub table: String,
    /// Why compaction did not run, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_skipped: Option<String>,
    /// Why compaction failed, when it did (the table's other operations still ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_failed: Option<String>,
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
    /// Position delete files compaction removed (they applied to no live file any more).
    pub delete_files_removed: usize,
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
    /// Branches and tags the catalog dropped with the expired snapshots: created by another
    /// writer between the expiry's plan and its commit on a snapshot it removed (a REST server
    /// applies the removal on the version current then and drops every ref naming a removed
    /// snapshot). This run deletes none of their snapshots' files and skips orphan cleanup;
    /// the next orphan cleanup deletes them once they are older than its window, so the ref
    /// must be re-created (from the version named in the log) before then.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refs_dropped: Vec<String>,
    /// The expiry was applied on another version than planned, or found its snapshots gone,
    /// and what the catalog dropped with it is unknown: this run's orphan cleanup is skipped.
    #[serde(skip)]
    pub(crate) expiry_unsettled: bool,
    /// Orphan files found (older than the window, unreferenced).
    pub orphans_found: Vec<String>,
    /// Orphan files deleted.
    pub orphans_deleted: usize,
    /// Manifests (data, and delete manifests with live files) before a manifest rewrite.
    pub manifests_before: usize,
    /// Manifests (likewise) after.
    pub manifests_after: usize,
    /// Wall time, seconds.
    pub seconds: f64,
    /// What the whole run used (its snapshots record it in shares, since the run's previous
    /// commit; expiration and orphan cleanup come after the last snapshot of a run and are only
    /// here and in the metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Meters one maintenance run: each snapshot it commits records the run's id and its usage
/// since the run's previous commit (or its start), so the run's commits add up to the run.
#[derive(Debug, Clone)]
pub struct RunMeter {
    since_commit: Meter,
    total: Meter,
    id: String,
}

impl RunMeter {
    fn start(function: &'static str, memory_mb: u64, requests: Option<&Requests>) -> Self {
        Self {
            since_commit: Meter::start(function, memory_mb, requests),
            total: Meter::start(function, memory_mb, requests),
            id: uuid::Uuid::now_v7().to_string(),
        }
    }

    /// `plan` recording this run's id and usage since its previous commit.
    fn plan<F>(&self, plan: F) -> impl FnMut(&Table) -> Result<Plan> + Send
    where
        F: FnMut(&Table) -> Result<Plan> + Send,
    {
        let id = self.id.clone();
        let mut plan = crate::commit::metered(self.since_commit.clone(), plan);
        move |t: &Table| {
            let mut p = plan(t)?;
            if let Plan::Apply(change) = &mut p {
                change
                    .properties
                    .insert(summary::RUN_ID.to_string(), id.clone());
            }
            Ok(p)
        }
    }

    /// A commit of the run landed: the next records only what came after.
    fn committed(&self) {
        self.since_commit.mark();
    }
}

/// Live data files and bytes of the current snapshot, from its summary totals.
fn totals(table: &Table) -> (usize, u64) {
    let md = table.metadata();
    (
        summary::total(md, "total-data-files") as usize,
        summary::total(md, "total-files-size"),
    )
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
        let requests = Requests::new();
        let catalog = crate::catalog::connect_counted(&config, Some(&requests)).await?;
        let swap = crate::catalog::pointer_swap(&config).await?;
        let committer = Committer::new(catalog, swap).with_requests(requests);
        Ok(Self::with_parts(config, committer))
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

    /// The limits of one maintenance commit: the run's deadline, and no longer than a commit
    /// window (`commit_timeout_seconds`), so a slow rewrite losing races to a steady stream of
    /// appends gives up and leaves the run's time to the other tables.
    fn limits(&self, opts: &Options) -> CommitLimits {
        let window = Duration::from_secs(self.config.ingest.commit_timeout_seconds);
        CommitLimits {
            max_attempts: self.config.ingest.max_commit_attempts,
            deadline: opts.deadline.min(Instant::now() + window),
            skew: Duration::from_secs(self.config.ingest.dedup_skew_seconds),
        }
    }

    /// Runs the selected operations on `table` (a configured table name).
    pub async fn run(&self, table: &str, opts: &Options) -> Result<Report> {
        let started = Instant::now();
        let run = RunMeter::start(
            FUNCTION_MAINTAIN,
            self.config.cost.memory_mb(FUNCTION_MAINTAIN),
            self.committer.requests(),
        );
        let ident = crate::catalog::table_ident(&self.config, table)?;
        let mut report = Report {
            table: ident.to_string(),
            dry_run: opts.dry_run,
            ..Default::default()
        };
        let t = self.committer.load(&ident).await?;
        (report.files_before, report.bytes_before) = totals(&t);
        if opts.compact {
            // A group that fails (another engine's ORC file, a record count that does not
            // match, races lost past the attempts) leaves the table as it was: the rest of the
            // table's maintenance still runs, and the report and metrics say compaction failed.
            if let Err(e) = self.compact(&ident, opts, &mut report, &run).await {
                if e.kind() == ErrorKind::Config {
                    return Err(e);
                }
                tracing::error!(table = %ident, error = %e, "compaction failed; the other operations go on");
                report.compaction_failed = Some(e.to_string());
            }
        }
        if opts.rewrite_manifests && Instant::now() < opts.deadline {
            self.rewrite_manifests(&ident, opts, &mut report, &run)
                .await?;
        }
        if opts.expire && Instant::now() < opts.deadline {
            self.expire(&ident, opts, &mut report).await?;
        }
        if opts.orphans && (!report.refs_dropped.is_empty() || report.expiry_unsettled) {
            tracing::warn!(table = %ident, refs = ?report.refs_dropped, "orphan cleanup skipped: the expiry landed on another version than planned, or found its snapshots gone (refs may have been dropped with them)");
        } else if opts.orphans && Instant::now() < opts.deadline {
            self.remove_orphans(&ident, opts, &mut report).await?;
        }
        let t = self.committer.load(&ident).await?;
        (report.files_after, report.bytes_after) = totals(&t);
        report.seconds = started.elapsed().as_secs_f64();
        report.usage = Some(run.total.usage());
        Ok(report)
    }
}

/// One spelling per stored object, for comparing locations written by different engines:
/// `s3a://` and `s3n://` are `s3://`, `file:/x` and `file:///x` are `/x`, and empty path
/// segments are dropped (`a//b` is `a/b`), as the storage layer (opendal) drops them on every
/// write, read, list and delete: a file recorded as `…/region=eu//f.parquet` (iceberg's own
/// location generator wrote partition values raw) is listed as `…/region=eu/f.parquet`.
/// Spellings compared equal only ever keep a file.
pub(crate) fn same_object_key(path: &str) -> String {
    let (scheme, rest) = if let Some(rest) = ["s3a://", "s3n://", "s3://"]
        .iter()
        .find_map(|s| path.strip_prefix(s))
    {
        ("s3://", rest)
    } else if let Some(rest) = path.strip_prefix("file://") {
        ("", rest)
    } else if let Some(rest) = path.strip_prefix("file:") {
        ("", rest)
    } else if let Some((scheme, rest)) = path.split_once("://") {
        return format!("{scheme}://{}", collapse_slashes(rest));
    } else {
        ("", path)
    };
    format!("{scheme}{}", collapse_slashes(rest))
}

/// `path` with every run of `/` as one `/`.
fn collapse_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if c == '/' && out.ends_with('/') {
            continue;
        }
        out.push(c);
    }
    out
}

/// A branch or tag, with a branch's own retention settings.
#[derive(Debug, Clone, Default)]
struct Ref {
    name: String,
    snapshot_id: i64,
    branch: bool,
    min_snapshots_to_keep: Option<usize>,
    max_snapshot_age_ms: Option<i64>,
}

/// The table's branches and tags (iceberg 0.10.1 has no public accessor for all refs).
fn refs(md: &TableMetadata) -> Vec<Ref> {
    serde_json::to_value(md)
        .ok()
        .and_then(|v| v.get("refs").and_then(|r| r.as_object()).cloned())
        .map(|refs| {
            refs.iter()
                .filter_map(|(name, r)| {
                    Some(Ref {
                        name: name.clone(),
                        snapshot_id: r.get("snapshot-id")?.as_i64()?,
                        branch: r.get("type").and_then(|t| t.as_str()) == Some("branch"),
                        min_snapshots_to_keep: r
                            .get("min-snapshots-to-keep")
                            .and_then(|v| v.as_u64())
                            .map(|n| n as usize),
                        max_snapshot_age_ms: r.get("max-snapshot-age-ms").and_then(|v| v.as_i64()),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Snapshot ids named by branches and tags.
fn ref_snapshot_ids(md: &TableMetadata) -> Vec<i64> {
    refs(md).into_iter().map(|r| r.snapshot_id).collect()
}

async fn delete_paths(table: &Table, paths: impl Iterator<Item = String>) {
    for p in paths {
        if let Err(e) = table.file_io().delete(&p).await {
            tracing::warn!(file = %p, error = %e, "could not delete file");
        }
    }
}

impl Maintainer {
    /// The maintain function's entry: tables from `tables` in the payload (or `detail.tables` of
    /// an EventBridge event), else every configured table; `dry_run` and `operations` (a subset
    /// of [`OPERATIONS`], default all) likewise. One EMF line per table.
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
        let mut opts = Options {
            dry_run: pick("dry_run").and_then(|v| v.as_bool()).unwrap_or(false),
            ..Options::from_config(&self.config, deadline)
        };
        if let Some(ops) = pick("operations") {
            opts.select(ops)?;
        }
        // The whole invocation's usage (each table's run is in its own line).
        let meter = Meter::start(
            FUNCTION_MAINTAIN,
            self.config.cost.memory_mb(FUNCTION_MAINTAIN),
            self.committer.requests(),
        );
        let reports = Box::pin(self.maintain_tables(tables, &opts)).await;
        crate::metrics::emit_usage(&[], &meter.usage());
        reports
    }

    async fn maintain_tables(&self, tables: Vec<String>, opts: &Options) -> Result<Vec<Report>> {
        let mut reports = Vec::new();
        let mut failed: Option<Error> = None;
        for table in tables {
            if !self.config.all_tables().contains(&table) {
                return Err(Error::new(
                    ErrorKind::Event,
                    format!("maintain: no configured table `{table}`"),
                ));
            }
            // A configured table not created yet (a pipeline's sink before its first run) has
            // nothing to maintain; it must not stop the tables after it.
            let ident = crate::catalog::table_ident(&self.config, &table)?;
            let exists = self
                .committer
                .catalog()
                .table_exists(&ident)
                .await
                .map_err(|e| Error::iceberg(format!("checking {ident}"), e).with_retryable(true))?;
            if !exists {
                tracing::info!(table = %ident, "not created yet; nothing to maintain");
                continue;
            }
            // One table's failure must not leave the tables after it unmaintained: each is
            // run, and the invocation fails at the end (the function's error alarm sees it).
            match self.run(&table, opts).await {
                Ok(r) => {
                    r.emit();
                    reports.push(r);
                }
                Err(e) => {
                    tracing::error!(table = %ident, error = %e, "maintenance failed; the next tables go on");
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(r) = reports.iter().find(|r| r.compaction_failed.is_some()) {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "compaction of {} failed ({}); every table's other operations ran",
                    r.table,
                    r.compaction_failed.as_deref().unwrap_or_default()
                ),
            ));
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
                Metric::count(
                    "CompactionFailures",
                    f64::from(u8::from(self.compaction_failed.is_some())),
                ),
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
        if let Some(u) = &self.usage {
            crate::metrics::emit_usage(&[("Table", self.table.as_str())], u);
        }
        tracing::info!(table = %self.table, files_before = self.files_before, files_after = self.files_after,
            groups = self.groups_compacted, expired = self.snapshots_expired, orphans = self.orphans_deleted,
            dry_run = self.dry_run, "maintained table");
    }
}

#[cfg(test)]
mod tests {
    use super::same_object_key;

    #[test]
    fn one_object_spelled_several_ways_compares_equal() {
        let key = same_object_key("s3://b/t/data/region=eu/f.parquet");
        for other in [
            "s3a://b/t/data/region=eu/f.parquet",
            "s3n://b/t/data/region=eu/f.parquet",
            // iceberg's generator wrote `eu/` raw; the storage layer stored `…/eu/f.parquet`.
            "s3://b/t/data/region=eu//f.parquet",
            "s3://b//t///data/region=eu/f.parquet",
        ] {
            assert_eq!(same_object_key(other), key, "{other}");
        }
        assert_ne!(same_object_key("s3://b/t/data/f.parquet"), key);
        assert_eq!(same_object_key("file:///tmp/w//f"), "/tmp/w/f");
        assert_eq!(same_object_key("file:/tmp/w/f"), "/tmp/w/f");
        assert_eq!(same_object_key("gs://b//x"), "gs://b/x");
    }
}
