//! The measured baseline before a cutover: freshness, throughput, small files, query planning,
//! recovery and cost of every table and pipeline, from the tables' own history.
//!
//! Everything comes from the retained snapshots and their summaries (what [`crate::summary`]
//! defines): ingest commits record their objects' LastModified and event-time range, and every
//! floe commit records the compute time, memory and S3 requests of its work ([`Usage`]). Nothing
//! is sampled or estimated, except where a figure says so: storage over the window assumes the
//! current size, Lambda requests count one invocation per commit, and work that committed
//! nothing (duplicates, refused objects, expiration and orphan cleanup after a run's last
//! snapshot) is not in the history — it is in the `GBSeconds` metrics the functions emit.
//!
//! Definitions (per table unless said otherwise; "in the window" = committed at or after
//! `--since`, else every retained snapshot):
//! * freshness: per landing object, ingest commit time − the object's LastModified; per ingest
//!   commit, commit time − the newest event time it added. p50/p95/p99 over the window.
//! * throughput: rows and data-file bytes added by ingest and pipeline commits, over the span
//!   from the first to the last of them, and per hour.
//! * small files: live data files under `small_file_fraction` (25 %) of the target file size.
//! * planning: a representative query planned by DataFusion over the table ([`planning`]).
//! * recovery: the stretches in which the lag was above the objective ([`stats::recovery`]); for
//!   a table its objects against the freshness objective, for a pipeline its source snapshots
//!   against the lag objective (done = the first sink commit whose checkpoint covers them).
//! * cost: usage summed per function, priced with `[cost]` ([`cost`]); storage = live bytes +
//!   bytes of files that only retained snapshots still reference.

pub mod cost;
pub mod planning;
pub mod stats;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use iceberg::spec::{Operation, Snapshot, TableMetadata};
use iceberg::table::Table;
use iceberg::Catalog;
use serde::Serialize;

use crate::config::{Config, CostConfig, PipelineConfig};
use crate::error::Result;
use crate::summary::{self, Usage};
pub use cost::{Cost, FunctionUsage, UsageSummary};
pub use planning::Planning;
pub use stats::{Incident, Percentiles, Recovery, Throughput};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only snapshots committed at or after this (None: every retained snapshot).
    pub since: Option<DateTime<Utc>>,
    /// "Now": the end of the window.
    pub now: DateTime<Utc>,
    /// Runs of the representative query's planning per table (0: not measured).
    pub planning_runs: usize,
    /// The representative query (`{table}` stands for the table); default
    /// [`planning::default_query`].
    pub query: Option<String>,
    /// Live files under this share of the target file size count as small.
    pub small_file_fraction: f64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            since: None,
            now: Utc::now(),
            planning_runs: 5,
            query: None,
            small_file_fraction: 0.25,
        }
    }
}

/// The baseline of every configured table and pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// When it was measured.
    pub generated_at: String,
    /// The window's start when `--since` was given.
    pub since: Option<String>,
    /// The prices used (the `[cost]` block).
    pub prices: CostConfig,
    /// Per table (ingest tables, then sinks).
    pub tables: Vec<TableBaseline>,
    /// Per pipeline.
    pub pipelines: Vec<PipelineBaseline>,
    /// The tables' costs summed (pipelines' are part of their sinks').
    pub total: Cost,
}

/// The window a figure covers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Window {
    /// Start (RFC 3339): the later of `--since` and the oldest retained snapshot.
    pub start: Option<String>,
    /// End: now.
    pub end: String,
    /// Its length (s).
    pub seconds: f64,
}

/// Freshness of a table.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Freshness {
    /// The table's freshness objective (s).
    pub objective_seconds: u64,
    /// Ingest commit time − object LastModified, per object.
    pub object_to_commit: Option<Percentiles>,
    /// Ingest commit time − newest event time, per commit.
    pub event_to_commit: Option<Percentiles>,
}

/// Live data files against the target size.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Files {
    /// Live data files.
    pub live_files: usize,
    /// Of them, under `small_below_bytes`.
    pub small_files: usize,
    /// small / live.
    pub small_file_share: Option<f64>,
    /// The table's target file size.
    pub target_file_bytes: u64,
    /// The small-file threshold (a share of the target).
    pub small_below_bytes: u64,
}

/// Bytes the table keeps in storage.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Storage {
    /// Live data files (the current snapshot's `total-files-size`).
    pub live_bytes: u64,
    /// Data files no longer live that retained snapshots still reference (freed by expiration).
    pub retained_only_bytes: u64,
}

/// One table's baseline.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableBaseline {
    /// Configured name.
    pub table: String,
    /// Whether the table exists yet.
    pub exists: bool,
    /// The window.
    pub window: Window,
    /// Snapshots in the window.
    pub snapshots: usize,
    /// Of them, per function that made them (`other`: another engine's).
    pub commits: BTreeMap<String, usize>,
    /// Freshness.
    pub freshness: Freshness,
    /// Throughput.
    pub throughput: Throughput,
    /// Small files.
    pub files: Files,
    /// Planning time of the representative query (None when not measured or empty).
    pub planning: Option<Planning>,
    /// Recovery from backlogs (objects against the freshness objective).
    pub recovery: Recovery,
    /// Storage.
    pub storage: Storage,
    /// Compute and requests of the commits in the window.
    pub usage: UsageSummary,
    /// Their price.
    pub cost: Cost,
    /// What each UTC day of the window cost: its commits' compute and requests, plus a day of
    /// storage at the current size.
    pub daily: Vec<DayCost>,
}

/// One day's cost of a table.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DayCost {
    /// The day (UTC), `YYYY-MM-DD`.
    pub day: String,
    /// Commits that day.
    pub commits: usize,
    /// Their GB-seconds.
    pub gb_seconds: f64,
    /// Their S3 requests (all kinds).
    pub s3_requests: u64,
    /// Compute + requests + a day of storage (USD).
    pub usd: f64,
}

/// One pipeline's baseline.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PipelineBaseline {
    /// Name.
    pub pipeline: String,
    /// Source table.
    pub source: String,
    /// Sink table.
    pub sink: String,
    /// Sink commits of the pipeline in the window.
    pub runs: usize,
    /// Source rows the runs read.
    pub rows_in: u64,
    /// Source commit → sink commit covering it, per source snapshot.
    pub commit_to_output: Option<Percentiles>,
    /// Landing object LastModified → sink commit covering it, per object.
    pub object_to_output: Option<Percentiles>,
    /// Recovery from backlogs (source snapshots against the lag objective).
    pub recovery: Recovery,
    /// Compute and requests of its runs.
    pub usage: UsageSummary,
    /// Their price (no storage: that is the sink table's).
    pub cost: Cost,
}

/// Measures the baseline of every configured table and pipeline through `catalog`.
pub async fn collect(catalog: &dyn Catalog, config: &Config, opts: &Options) -> Result<Baseline> {
    let mut loaded = BTreeMap::new();
    for name in config.all_tables() {
        let ident = crate::catalog::table_ident(config, &name)?;
        let exists = catalog.table_exists(&ident).await.map_err(|e| {
            crate::Error::iceberg(format!("checking {ident}"), e).with_retryable(true)
        })?;
        if exists {
            let t = catalog
                .load_table(&ident)
                .await
                .map_err(|e| crate::Error::iceberg(format!("loading {ident}"), e))?;
            loaded.insert(name, t);
        }
    }
    let mut tables = Vec::new();
    for name in config.all_tables() {
        tables.push(match loaded.get(&name) {
            Some(t) => table_baseline(config, &name, t, opts).await?,
            None => TableBaseline {
                table: name.clone(),
                ..Default::default()
            },
        });
    }
    let pipelines = config
        .pipelines
        .iter()
        .map(|p| pipeline_baseline(config, p, loaded.get(&p.source), loaded.get(&p.sink), opts))
        .collect();
    let total = tables
        .iter()
        .fold(Cost::default(), |acc, t| acc.plus(&t.cost));
    Ok(Baseline {
        generated_at: opts.now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        since: opts
            .since
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        prices: config.cost.clone(),
        tables,
        pipelines,
        total,
    })
}

/// Snapshots committed in the window, oldest first.
fn in_window<'a>(md: &'a TableMetadata, opts: &Options) -> Vec<&'a Snapshot> {
    let from = opts.since.map(|t| t.timestamp_millis()).unwrap_or(i64::MIN);
    let mut snaps: Vec<&Snapshot> = md
        .snapshots()
        .map(|s| s.as_ref())
        .filter(|s| s.timestamp_ms() >= from)
        .collect();
    snaps.sort_by_key(|s| (s.timestamp_ms(), s.sequence_number()));
    snaps
}

/// The window: from the later of `--since` and the oldest retained snapshot, to now. A
/// `--since` before the history would stretch the per-day rate and the storage over days the
/// table did not exist (or the history does not reach).
fn window(md: &TableMetadata, opts: &Options) -> Window {
    let oldest = md.snapshots().map(|s| s.timestamp_ms()).min();
    let since = opts.since.map(|t| t.timestamp_millis());
    let start = match (since, oldest) {
        (Some(since), Some(oldest)) => Some(since.max(oldest)),
        (since, oldest) => since.or(oldest),
    };
    let now = opts.now.timestamp_millis();
    Window {
        start: start.map(stats::rfc3339),
        end: stats::rfc3339(now),
        seconds: start
            .map(|s| (now - s).max(0) as f64 / 1000.0)
            .unwrap_or(0.0),
    }
}

/// A summary count.
fn count(s: &Snapshot, key: &str) -> u64 {
    s.summary()
        .additional_properties
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The newest event time an ingest commit added (epoch ms).
fn event_time_max_ms(s: &Snapshot) -> Option<i64> {
    let v = s
        .summary()
        .additional_properties
        .get(summary::EVENT_TIME_MAX)?;
    DateTime::parse_from_rfc3339(v)
        .ok()
        .map(|t| t.timestamp_millis())
}

fn is_ingest(s: &Snapshot) -> bool {
    summary::function_of(s.summary()) == Some(summary::FUNCTION_INGEST)
}

/// Rows a data commit (ingest or pipeline, not maintenance) added.
fn rows_added(s: &Snapshot) -> u64 {
    let p = &s.summary().additional_properties;
    p.get(summary::RECORDS_COMMITTED)
        .or_else(|| p.get("added-records"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn table_baseline(
    config: &Config,
    name: &str,
    table: &Table,
    opts: &Options,
) -> Result<TableBaseline> {
    let md = table.metadata();
    let snaps = in_window(md, opts);
    let window = window(md, opts);
    let now_ms = opts.now.timestamp_millis();
    let tcfg = config.table(name);

    let mut commits: BTreeMap<String, usize> = BTreeMap::new();
    for s in &snaps {
        let f = summary::function_of(s.summary()).unwrap_or("other");
        *commits.entry(f.to_string()).or_default() += 1;
    }

    // Freshness and recovery: every landing object of the window's ingest commits.
    let mut object_lag = Vec::new();
    let mut event_lag = Vec::new();
    let mut items = Vec::new();
    for s in snaps.iter().filter(|s| is_ingest(s)) {
        for m in summary::source_modified(s.summary()) {
            object_lag.push((s.timestamp_ms() - m) as f64 / 1000.0);
            items.push(stats::Item {
                arrived_ms: m,
                done_ms: Some(s.timestamp_ms()),
            });
        }
        if let Some(et) = event_time_max_ms(s) {
            event_lag.push((s.timestamp_ms() - et) as f64 / 1000.0);
        }
    }
    let objective = tcfg.map(|t| t.freshness_objective_seconds).unwrap_or(0);
    let freshness = Freshness {
        objective_seconds: objective,
        object_to_commit: stats::percentiles(object_lag),
        event_to_commit: stats::percentiles(event_lag),
    };
    let recovery = stats::recovery(&items, objective as i64 * 1000, now_ms);

    // Throughput: the data commits (ingest and pipeline runs), not maintenance.
    let data: Vec<(i64, u64, u64)> = snaps
        .iter()
        .filter(|s| {
            matches!(
                summary::function_of(s.summary()),
                Some(summary::FUNCTION_INGEST | summary::FUNCTION_PROCESS)
            )
        })
        .map(|s| {
            (
                s.timestamp_ms(),
                rows_added(s),
                count(s, "added-files-size"),
            )
        })
        .filter(|c| c.1 > 0)
        .collect();
    let throughput = stats::throughput(&data);

    // Small files: the live files against the target size.
    let live = crate::scan::live_files(table).await?;
    let target = md
        .properties()
        .get("write.target-file-size-bytes")
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| tcfg.map(|t| t.target_file_size_mb << 20))
        .unwrap_or(128 << 20);
    let small_below = (target as f64 * opts.small_file_fraction) as u64;
    let small = live
        .iter()
        .filter(|f| f.file.file_size_in_bytes() < small_below)
        .count();
    let files = Files {
        live_files: live.len(),
        small_files: small,
        small_file_share: (!live.is_empty()).then(|| small as f64 / live.len() as f64),
        target_file_bytes: target,
        small_below_bytes: small_below,
    };

    let planning = if opts.planning_runs > 0 && md.current_snapshot().is_some() {
        let time_column = md
            .properties()
            .get(summary::EVENT_TIME_COLUMN)
            .cloned()
            .or_else(|| tcfg.map(|t| t.event_time.clone()))
            .filter(|c| md.current_schema().field_by_name(c).is_some());
        let query = opts
            .query
            .clone()
            .unwrap_or_else(|| planning::default_query(time_column.as_deref()));
        Some(planning::measure(table, &query, opts.planning_runs).await?)
    } else {
        None
    };

    let (storage, usage, cost) = priced(config, md, &snaps, &window);
    let stored = storage.live_bytes + storage.retained_only_bytes;
    let mut days: BTreeMap<String, Vec<&Snapshot>> = BTreeMap::new();
    for s in &snaps {
        let day = stats::rfc3339(s.timestamp_ms());
        days.entry(day.get(..10).unwrap_or_default().to_string())
            .or_default()
            .push(s);
    }
    let daily = days
        .into_iter()
        .map(|(day, snaps)| {
            let u = UsageSummary::of(
                snaps
                    .iter()
                    .map(|s| (Usage::read(s.summary()), summary::run_id(s.summary()))),
            )
            .total();
            DayCost {
                day,
                commits: snaps.len(),
                gb_seconds: u.gb_seconds,
                s3_requests: u.s3.total(),
                usd: Cost::of(&u, stored, 86_400.0, &config.cost).total_usd,
            }
        })
        .collect();
    Ok(TableBaseline {
        table: name.to_string(),
        exists: true,
        window,
        snapshots: snaps.len(),
        commits,
        freshness,
        throughput,
        files,
        planning,
        recovery,
        storage,
        usage,
        cost,
        daily,
    })
}

/// The storage, the usage of the window's commits, and their price: from the metadata alone
/// (summaries and totals; no manifest is read).
fn priced(
    config: &Config,
    md: &TableMetadata,
    snaps: &[&Snapshot],
    window: &Window,
) -> (Storage, UsageSummary, Cost) {
    let storage = storage(md);
    let usage = UsageSummary::of(
        snaps
            .iter()
            .map(|s| (Usage::read(s.summary()), summary::run_id(s.summary()))),
    );
    let stored = storage.live_bytes + storage.retained_only_bytes;
    let cost = Cost::of(&usage.total(), stored, window.seconds, &config.cost);
    (storage, usage, cost)
}

/// The cost of one loaded table over the window of `opts` (its [`TableBaseline::cost`]), from
/// its metadata alone: what `floe status` shows for a table it has loaded already.
pub fn table_cost(config: &Config, md: &TableMetadata, opts: &Options) -> Cost {
    let snaps = in_window(md, opts);
    priced(config, md, &snaps, &window(md, opts)).2
}

/// Live bytes, and bytes only retained snapshots still hold: a data file a retained snapshot
/// removed is referenced by its parent as long as that parent is retained.
fn storage(md: &TableMetadata) -> Storage {
    let live_bytes = summary::total(md, "total-files-size");
    let retained_only_bytes = md
        .snapshots()
        .filter(|s| {
            s.parent_snapshot_id()
                .is_some_and(|p| md.snapshot_by_id(p).is_some())
        })
        .map(|s| count(s, "removed-files-size"))
        .sum();
    Storage {
        live_bytes,
        retained_only_bytes,
    }
}

fn pipeline_baseline(
    config: &Config,
    p: &PipelineConfig,
    source: Option<&Table>,
    sink: Option<&Table>,
    opts: &Options,
) -> PipelineBaseline {
    let mut out = PipelineBaseline {
        pipeline: p.name.clone(),
        source: p.source.clone(),
        sink: p.sink.clone(),
        ..Default::default()
    };
    out.recovery.objective_seconds = p.lag_objective_seconds;
    let Some(sink) = sink else {
        return out;
    };
    let smd = sink.metadata();
    let runs: Vec<&Snapshot> = in_window(smd, opts)
        .into_iter()
        .filter(|s| s.summary().additional_properties.get(summary::PIPELINE) == Some(&p.name))
        .collect();
    let window = window(smd, opts);
    out.runs = runs.len();
    out.rows_in = runs.iter().map(|s| count(s, summary::ROWS_IN)).sum();
    out.usage = UsageSummary::of(
        runs.iter()
            .map(|s| (Usage::read(s.summary()), None::<&str>)),
    );
    out.cost = Cost::of(&out.usage.total(), 0, window.seconds, &config.cost);

    // Which source snapshot each run processed up to: its checkpoint on the source.
    let Some(source) = source else {
        return out;
    };
    let md = source.metadata();
    let key = format!("{}{}", summary::CHECKPOINT_PREFIX, md.uuid());
    // (sink commit time, source sequence number covered, whether the run read anything)
    let covered: Vec<(i64, i64, bool)> = in_window(smd, opts)
        .into_iter()
        .filter_map(|s| {
            let props = &s.summary().additional_properties;
            if props.get(summary::PIPELINE) != Some(&p.name) {
                return None;
            }
            let to: i64 = props.get(&key)?.parse().ok()?;
            let seq = md.snapshot_by_id(to)?.sequence_number();
            let read = count(s, summary::SOURCE_SNAPSHOTS) > 0;
            Some((s.timestamp_ms(), seq, read))
        })
        .collect();
    let now_ms = opts.now.timestamp_millis();
    let mut commit_lag = Vec::new();
    let mut object_lag = Vec::new();
    let mut items = Vec::new();
    for s in in_window(md, opts)
        .into_iter()
        .filter(|s| s.summary().operation == Operation::Append)
    {
        let first = covered
            .iter()
            .filter(|c| c.1 >= s.sequence_number() && c.0 >= s.timestamp_ms())
            .min_by_key(|c| c.0);
        // A run that read nothing but moved the checkpoint (a first run starting at `latest`)
        // skipped the snapshots before it: the pipeline never worked on them.
        if matches!(first, Some((_, _, false))) {
            continue;
        }
        let done = first.map(|c| c.0);
        if let Some(done) = done {
            commit_lag.push((done - s.timestamp_ms()) as f64 / 1000.0);
            for m in summary::source_modified(s.summary()) {
                object_lag.push((done - m) as f64 / 1000.0);
            }
        }
        items.push(stats::Item {
            arrived_ms: s.timestamp_ms(),
            done_ms: done,
        });
    }
    out.commit_to_output = stats::percentiles(commit_lag);
    out.object_to_output = stats::percentiles(object_lag);
    out.recovery = stats::recovery(&items, p.lag_objective_seconds as i64 * 1000, now_ms);
    out
}
