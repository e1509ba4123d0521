//! The process function's engine: a pipeline's new source rows → its SQL → its sink table,
//! exactly once.
//!
//! A run reads the sink's checkpoint (the last source snapshot consumed, in the sink's snapshot
//! summary), plans the source's delta after it ([`crate::process::plan`]), runs the SQL
//! ([`crate::transform`]) and commits the output **together with the new checkpoint** in one sink
//! snapshot. The commit re-reads the checkpoint on the version it commits onto: if another run
//! advanced it meanwhile, this run's output is dropped and the run re-plans from there. So
//! duplicate, late or concurrent triggers cannot duplicate or lose output, and a crash before the
//! commit leaves only orphan files (removed by orphan cleanup); the next run redoes the work.
//!
//! * `append` mode appends the SQL's rows over the new source rows (processed in bounded chunks
//!   of files: the SQL must be row-wise — filter, project, enrich).
//! * `aggregate` mode finds the event-time windows the new rows touch (late rows included),
//!   recomputes those windows from the whole source table and replaces them in the sink with an
//!   `overwrite` snapshot, so the sink always equals the same SQL over the whole table.
//!
//! [`Processor::refresh`] runs the same SQL over the whole table (batch / backfill) and replaces
//! the sink; [`Processor::reconcile`] compares that batch result with the incrementally
//! maintained sink.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use iceberg::arrow::{
    arrow_schema_to_schema_auto_assign_ids, arrow_type_to_type, schema_to_arrow_schema,
};
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{DataFile, Datum, PrimitiveLiteral, PrimitiveType, Type};
use iceberg::table::Table;
use iceberg::{TableCreation, TableIdent};
use serde::Serialize;
use serde_json::Value;

use crate::catalog;
use crate::commit::{CommitLimits, Committer, Outcome, Plan, Skipped};
use crate::config::{Config, PipelineConfig, PipelineMode, RowChange};
use crate::error::{Error, ErrorKind, Result};
use crate::lambda::Trigger;
use crate::maintain::{live_files, scan_tasks, LiveFile};
use crate::process::{self, Checkpoint, RowChangePolicy};
use crate::snapshot::Change;
use crate::transform::{self, WINDOW_START};

/// Snapshot-summary key naming the pipeline that wrote a sink snapshot.
pub const SUMMARY_PIPELINE: &str = "floe.pipeline";
/// Rows per chunk of an append pipeline (bounds memory whatever the delta's size).
const CHUNK_ROWS: u64 = 256 * 1024;
/// Runs that lost the race to another run re-plan at most this often.
const MAX_ROUNDS: u32 = 8;

/// What one pipeline run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    /// Pipeline name.
    pub pipeline: String,
    /// The checkpoint the run started after (None: from the beginning).
    pub from_snapshot: Option<i64>,
    /// The source snapshot the run processed up to (the new checkpoint).
    pub to_snapshot: Option<i64>,
    /// Source append snapshots processed (the processor lag before the run, in snapshots).
    pub source_snapshots: usize,
    /// Source data files read as new.
    pub files: usize,
    /// New source rows.
    pub rows_in: u64,
    /// Source rows read to recompute windows (aggregate mode).
    pub rows_recomputed: u64,
    /// Rows the run wrote to the sink.
    pub rows_out: u64,
    /// Windows recomputed and replaced (aggregate mode).
    pub windows: usize,
    /// Sink files replaced (aggregate mode, refresh).
    pub files_replaced: usize,
    /// Alerts sent.
    pub alerts: usize,
    /// The sink snapshot committed (None: nothing new).
    pub sink_snapshot: Option<i64>,
    /// Times the run lost to a concurrent run and re-planned.
    pub replans: u32,
    /// Source commit → sink commit, for the newest source snapshot processed (ms).
    pub latency_ms: Option<i64>,
    /// Processor lag before the run: now − the oldest unprocessed source commit (s).
    pub lag_seconds: f64,
    /// Wall time of the run.
    pub seconds: f64,
    /// A full refresh (batch over the whole table).
    pub refresh: bool,
}

impl RunReport {
    /// Emits the run's metrics (CloudWatch EMF) and a log line.
    pub fn emit(&self) {
        use crate::metrics::{emit, Metric};
        let mut m = vec![
            Metric::count("RowsIn", self.rows_in as f64),
            Metric::count("RowsOut", self.rows_out as f64),
            Metric::count("ProcessorLagSnapshots", self.source_snapshots as f64),
            Metric::seconds("ProcessorLagSeconds", self.lag_seconds),
            Metric::count("WindowsRecomputed", self.windows as f64),
            Metric::count("AlertsSent", self.alerts as f64),
        ];
        if let Some(ms) = self.latency_ms {
            m.push(Metric::seconds("CommitToOutputSeconds", ms as f64 / 1e3));
        }
        emit(&[("Pipeline", &self.pipeline)], &m);
        tracing::info!(pipeline = %self.pipeline, from = ?self.from_snapshot, to = ?self.to_snapshot,
            snapshots = self.source_snapshots, rows_in = self.rows_in, rows_out = self.rows_out,
            windows = self.windows, sink_snapshot = ?self.sink_snapshot, replans = self.replans,
            latency_ms = ?self.latency_ms, "pipeline run");
    }
}

/// The result of comparing a batch run with the incrementally maintained sink.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reconciliation {
    /// Pipeline name.
    pub pipeline: String,
    /// The source snapshot both sides stand at (the sink's checkpoint).
    pub at_snapshot: Option<i64>,
    /// Rows the batch run produces.
    pub batch_rows: usize,
    /// Rows in the sink.
    pub sink_rows: usize,
    /// Keys compared.
    pub keys: usize,
    /// Keys whose rows differ, are missing from the sink, or are only in the sink (examples).
    pub differences: Vec<String>,
    /// Number of differing keys.
    pub differing: usize,
    /// Per numeric column: (column, batch total, sink total).
    pub totals: Vec<(String, f64, f64)>,
}

impl Reconciliation {
    /// True when the sink equals the batch result.
    pub fn matches(&self) -> bool {
        self.differing == 0 && self.batch_rows == self.sink_rows
    }
}

/// Sends alert messages (at least once; each carries a deterministic id for dedup).
#[derive(Debug, Clone, Default)]
struct Alerts {
    eventbridge: Option<aws_sdk_eventbridge::Client>,
    sqs: Option<aws_sdk_sqs::Client>,
}

/// Runs the configured pipelines.
pub struct Processor {
    config: Arc<Config>,
    committer: Committer,
    alerts: Alerts,
    /// Source schema id each pipeline's SQL was last checked against.
    checked: std::sync::Mutex<HashMap<String, i32>>,
}

/// One run's starting point.
struct Position {
    source: Table,
    source_uuid: String,
    sink: Table,
    checkpoint: Option<Checkpoint>,
    hash: String,
}

impl Processor {
    /// Connects to the configured catalog (and alert services, when a pipeline has alerts).
    pub async fn new(config: Config) -> Result<Self> {
        let catalog = catalog::connect(&config).await?;
        // Sources may not exist yet when a poll comes before the first ingest.
        catalog::ensure_tables(catalog.as_ref(), &config).await?;
        let swap = crate::swap::from_config(&config).await?;
        let mut me = Self::with_parts(config, Committer::new(catalog, swap));
        for p in &me.config.pipelines {
            let Some(a) = &p.alert else { continue };
            let sdk = crate::store::sdk_config(&me.config.storage, a.endpoint.as_deref()).await;
            if a.eventbridge_bus.is_some() && me.alerts.eventbridge.is_none() {
                me.alerts.eventbridge = Some(aws_sdk_eventbridge::Client::new(&sdk));
            }
            if a.sqs_queue_url.is_some() && me.alerts.sqs.is_none() {
                me.alerts.sqs = Some(aws_sdk_sqs::Client::new(&sdk));
            }
        }
        Ok(me)
    }

    /// From explicit parts (no alert clients: alerts fail until [`Processor::new`] builds them).
    pub fn with_parts(config: Config, committer: Committer) -> Self {
        Self {
            config: Arc::new(config),
            committer,
            alerts: Alerts::default(),
            checked: Default::default(),
        }
    }

    /// The committer in use.
    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    fn pipeline(&self, name: &str) -> Result<&PipelineConfig> {
        self.config.pipeline(name).ok_or_else(|| {
            let known: Vec<&str> = self
                .config
                .pipelines
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            Error::new(
                ErrorKind::Config,
                format!(
                    "no pipeline named `{name}` (configured: {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn limits(&self, deadline: Instant) -> CommitLimits {
        CommitLimits {
            max_attempts: self.config.ingest.max_commit_attempts,
            deadline,
            skew: Duration::from_secs(self.config.ingest.dedup_skew_seconds),
        }
    }

    /// The pipelines a trigger concerns: those reading the tables it names; all for a schedule
    /// or a manual call. Notifications only wake pipelines: the work comes from the checkpoints.
    pub fn pipelines_for(&self, payload: &Value) -> Vec<String> {
        let all = || {
            self.config
                .pipelines
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        let tables: Vec<String> = match crate::lambda::classify_trigger(payload) {
            Trigger::FloeCommit => payload["detail"]["table"]
                .as_str()
                .map(|t| vec![t.to_string()])
                .unwrap_or_default(),
            Trigger::GlueTableChange => {
                let db = payload["detail"]["databaseName"].as_str().unwrap_or("");
                if db != self.config.catalog.namespace {
                    return Vec::new();
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
            Trigger::Schedule | Trigger::Other => return all(),
        };
        self.config
            .pipelines
            .iter()
            .filter(|p| tables.iter().any(|t| t == &p.source))
            .map(|p| p.name.clone())
            .collect()
    }

    /// Handles a process-function payload: runs every pipeline it concerns, each once. Errors of
    /// single pipelines are collected so one broken pipeline does not starve the others.
    pub async fn handle_payload(
        &self,
        payload: &Value,
        deadline: Instant,
    ) -> (Vec<RunReport>, Vec<Error>) {
        let mut reports = Vec::new();
        let mut errors = Vec::new();
        for name in self.pipelines_for(payload) {
            match self.run(&name, deadline).await {
                Ok(r) => {
                    r.emit();
                    reports.push(r)
                }
                Err(e) => {
                    tracing::error!(pipeline = %name, error = %e, retryable = e.is_retryable(), "pipeline run failed");
                    errors.push(e)
                }
            }
        }
        (reports, errors)
    }

    /// Processes everything the pipeline has not seen yet, committing output and checkpoint in
    /// one sink snapshot. Safe to call concurrently and repeatedly.
    pub async fn run(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        let started = Instant::now();
        let mut replans = 0;
        loop {
            match self.run_once(p, deadline).await? {
                Some(mut report) => {
                    report.replans = replans;
                    report.seconds = started.elapsed().as_secs_f64();
                    return Ok(report);
                }
                None if replans + 1 < MAX_ROUNDS && Instant::now() < deadline => replans += 1,
                None => {
                    return Err(Error::new(
                        ErrorKind::DeadlineExceeded,
                        format!(
                        "pipeline `{name}`: other runs kept committing first; {replans} re-plans"
                    ),
                    )
                    .with_retryable(true))
                }
            }
        }
    }

    async fn position(&self, p: &PipelineConfig) -> Result<Position> {
        let source_ident = catalog::table_ident(&self.config, &p.source)?;
        let source = self.committer.load(&source_ident).await?;
        let source_uuid = source.metadata().uuid().to_string();
        let time_column = p.time_column(&self.config).to_string();
        let hash = transform::transform_hash(p, &time_column);
        let sink = self.ensure_sink(p, &source).await?;
        let checkpoint = process::read_checkpoint(sink.metadata(), &source_uuid);
        Ok(Position {
            source,
            source_uuid,
            sink,
            checkpoint,
            hash,
        })
    }

    /// Plans the SQL against the source's current schema (once per schema id), so a change that
    /// breaks it stops the pipeline at once, naming the field, even before new data arrives.
    async fn check_sql(&self, p: &PipelineConfig, source: &Table) -> Result<()> {
        let id = source.metadata().current_schema_id();
        let seen = self
            .checked
            .lock()
            .ok()
            .and_then(|c| c.get(&p.name).copied());
        if seen == Some(id) {
            return Ok(());
        }
        let (schema, _) = self.batch_input(p, source, None, true).await?;
        let context = format!("pipeline `{}` over `{}` (schema id {id})", p.name, p.source);
        transform::run_sql(&p.sql, schema, Vec::new(), &context).await?;
        if let Ok(mut c) = self.checked.lock() {
            c.insert(p.name.clone(), id);
        }
        Ok(())
    }

    /// One attempt; `None` when another run committed from the same checkpoint first.
    async fn run_once(&self, p: &PipelineConfig, deadline: Instant) -> Result<Option<RunReport>> {
        let pos = self.position(p).await?;
        self.check_sql(p, &pos.source).await?;
        let after = match &pos.checkpoint {
            Some(cp) => {
                if cp.transform.as_deref() != Some(pos.hash.as_str()) {
                    return Err(Error::new(
                        ErrorKind::Transform,
                        format!(
                            "pipeline `{}`: the transform changed (sink `{}` was built by version {}, the config is version {}); \
                             old and new output are never mixed: run `floe process refresh --pipeline {}`",
                            p.name,
                            p.sink,
                            cp.transform.as_deref().unwrap_or("?"),
                            pos.hash,
                            p.name
                        ),
                    ));
                }
                Some(cp.snapshot_id)
            }
            None => {
                // A sink with rows but no checkpoint lost its position (e.g. another engine's
                // snapshots and expiration): starting over would duplicate or skip output.
                if crate::snapshot::summary_total(pos.sink.metadata(), "total-records") > 0 {
                    return Err(Error::new(
                        ErrorKind::Stale,
                        format!(
                            "pipeline `{}`: sink `{}` has rows but no checkpoint on `{}`; nothing was processed. \
                             Rebuild it with `floe process refresh --pipeline {}`",
                            p.name, p.sink, p.source, p.name
                        ),
                    ));
                }
                let start = p
                    .start_strategy()
                    .map_err(|r| Error::new(ErrorKind::Config, r))?;
                process::start_after(pos.source.metadata(), start)?
            }
        };
        let policy = match p.on_row_change {
            RowChange::Fail => RowChangePolicy::Fail,
            RowChange::Skip => RowChangePolicy::Skip,
        };
        let delta = process::plan(&pos.source, after, policy, &p.name).await?;
        let mut report = RunReport {
            pipeline: p.name.clone(),
            from_snapshot: after,
            to_snapshot: delta.to,
            source_snapshots: delta.appends.len(),
            files: delta.files.len(),
            rows_in: delta.records(),
            lag_seconds: oldest_unprocessed_age(&pos.source, &delta.appends),
            ..Default::default()
        };
        // Nothing new — except for a first run (`start = "latest"` starts at the current
        // snapshot): it commits its starting position, or every later run would start over.
        if (delta.to == after && pos.checkpoint.is_some()) || delta.to.is_none() {
            return Ok(Some(report));
        }
        let to = delta.to.unwrap_or_default();
        let files: Vec<LiveFile> = delta
            .files
            .iter()
            .map(|f| LiveFile {
                file: f.file.clone(),
                spec_id: f.spec_id,
            })
            .collect();
        let context = format!("pipeline `{}` over `{}`", p.name, p.source);
        let writer_id = format!("process-{}", uuid::Uuid::now_v7());
        let mut out = Output::new(&pos.sink, &writer_id)?;
        let mut removed: Vec<String> = Vec::new();
        match p.mode {
            PipelineMode::Append => {
                for chunk in chunks(&files) {
                    let (schema, rows) = read_rows(&pos.source, chunk).await?;
                    let (_, batches) = transform::run_sql(&p.sql, schema, rows, &context).await?;
                    out.write(batches).await?;
                }
            }
            PipelineMode::Aggregate => {
                let window = p.window_micros().unwrap_or(60_000_000);
                let time_column = p.time_column(&self.config);
                // The touched windows, one chunk of the delta at a time: memory is bounded by a
                // chunk, not by the delta.
                let mut touched = BTreeSet::new();
                for chunk in chunks(&files) {
                    let (_, rows) = read_rows(&pos.source, chunk).await?;
                    for b in &rows {
                        let b = transform::with_window_start(b, time_column, window)?;
                        touched.extend(transform::window_starts(&b));
                    }
                }
                report.windows = touched.len();
                if !touched.is_empty() {
                    let (schema, recomputed) =
                        read_windows(&pos.source, to, time_column, window, &touched).await?;
                    report.rows_recomputed = recomputed.iter().map(|b| b.num_rows() as u64).sum();
                    let (_, batches) =
                        transform::run_sql(&p.sql, schema, recomputed, &context).await?;
                    require_window_column(&batches, p)?;
                    let (files, kept) = sink_rows_outside(&pos.sink, &touched).await?;
                    removed = files;
                    report.files_replaced = removed.len();
                    out.write(kept).await?;
                    out.write(batches).await?;
                }
            }
        }
        let (added, schema) = out.close().await?;
        report.rows_out = added.iter().map(|f| f.record_count()).sum::<u64>();
        if let Some(alert) = &p.alert {
            report.alerts = self.send_alerts(p, alert, &pos.sink, &added).await?;
        }
        let mut props: HashMap<String, String> =
            process::checkpoint_properties(&pos.source_uuid, to, &pos.hash)
                .into_iter()
                .collect();
        props.insert(SUMMARY_PIPELINE.into(), p.name.clone());
        props.insert("floe.rows-in".into(), report.rows_in.to_string());
        props.insert(
            "floe.source-snapshots".into(),
            delta.appends.len().to_string(),
        );
        if p.mode == PipelineMode::Aggregate {
            props.insert("floe.windows-replaced".into(), report.windows.to_string());
        }
        let change = if removed.is_empty() {
            Change {
                schema,
                ..Change::append(added.clone(), props)
            }
        } else {
            Change::overwrite(added.clone(), removed, props, schema)
        };
        let expected = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
        let source_uuid = pos.source_uuid.clone();
        let sink_ident = pos.sink.identifier().clone();
        let result = self
            .committer
            .commit_from(&sink_ident, Some(pos.sink.clone()), &self.limits(deadline), move |t: &Table| {
                let now = process::read_checkpoint(t.metadata(), &source_uuid).map(|c| c.snapshot_id);
                Ok(if now != expected {
                    Plan::Skip(Skipped::Obsolete(format!(
                        "the checkpoint moved from {expected:?} to {now:?}: another run processed this delta"
                    )))
                } else {
                    Plan::Apply(change.clone())
                })
            })
            .await;
        match result {
            Ok(Outcome::Committed { snapshot_id, .. }) => {
                report.sink_snapshot = snapshot_id;
                report.latency_ms =
                    commit_latency(&self.committer, &sink_ident, snapshot_id, &pos.source, to)
                        .await;
                Ok(Some(report))
            }
            Ok(Outcome::Skipped(why)) => {
                tracing::info!(pipeline = %p.name, ?why, "lost the race; re-planning");
                delete_files(&pos.sink, &added).await;
                Ok(None)
            }
            Err(e) if e.kind() == ErrorKind::Stale => {
                // Sink files to replace were compacted meanwhile: redo on the new layout.
                tracing::info!(pipeline = %p.name, error = %e, "sink changed underneath; re-planning");
                delete_files(&pos.sink, &added).await;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Creates the sink from the SQL's output schema if it does not exist; returns it.
    async fn ensure_sink(&self, p: &PipelineConfig, source: &Table) -> Result<Table> {
        let ident = catalog::table_ident(&self.config, &p.sink)?;
        let exists = self
            .committer
            .catalog()
            .table_exists(&ident)
            .await
            .map_err(|e| {
                Error::iceberg(format!("checking sink {ident}"), e).with_retryable(true)
            })?;
        if !exists {
            let (schema, _) = self.batch_input(p, source, None, true).await?;
            let context = format!("pipeline `{}` over `{}`", p.name, p.source);
            let (out, _) = transform::run_sql(&p.sql, schema, Vec::new(), &context).await?;
            if p.mode == PipelineMode::Aggregate && out.column_with_name(WINDOW_START).is_none() {
                return Err(window_missing(p));
            }
            let schema = arrow_schema_to_schema_auto_assign_ids(&out)
                .map_err(|e| Error::iceberg(format!("sink schema of `{}`", p.name), e))?;
            let creation = TableCreation::builder()
                .name(p.sink.clone())
                .schema(schema)
                .properties(HashMap::from([
                    (
                        "write.parquet.compression-codec".to_string(),
                        "zstd".to_string(),
                    ),
                    (SUMMARY_PIPELINE.to_string(), p.name.clone()),
                    ("floe.source-table".to_string(), p.source.clone()),
                ]))
                .build();
            catalog::create_if_missing(self.committer.catalog().as_ref(), &ident, creation).await?;
        }
        self.committer.load(&ident).await
    }

    /// Rows of the whole source (at `snapshot`, default current) as the SQL sees them.
    /// `empty`: only the schema.
    async fn batch_input(
        &self,
        p: &PipelineConfig,
        source: &Table,
        snapshot: Option<i64>,
        empty: bool,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let schema = transform::table_schema(source)?;
        let mut rows = Vec::new();
        if !empty && source.metadata().current_snapshot_id().is_some() {
            rows = scan_rows(source, snapshot, None, &schema).await?;
        }
        if p.mode != PipelineMode::Aggregate {
            return Ok((schema, rows));
        }
        let window = p.window_micros().unwrap_or(60_000_000);
        let time_column = p.time_column(&self.config);
        let empty_batch = RecordBatch::new_empty(schema.clone());
        let with_w = transform::with_window_start(&empty_batch, time_column, window)?;
        let mut out = Vec::with_capacity(rows.len());
        for b in rows {
            out.push(transform::with_window_start(&b, time_column, window)?);
        }
        Ok((with_w.schema(), out))
    }

    /// The batch result: the pipeline's SQL over the whole source at `snapshot`.
    async fn batch_output(
        &self,
        p: &PipelineConfig,
        source: &Table,
        snapshot: Option<i64>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let context = format!("pipeline `{}` over `{}` (batch)", p.name, p.source);
        if snapshot.is_none() && source.metadata().current_snapshot_id().is_none() {
            let (schema, _) = self.batch_input(p, source, None, true).await?;
            return transform::run_sql(&p.sql, schema, Vec::new(), &context).await;
        }
        let (schema, rows) = self.batch_input(p, source, snapshot, false).await?;
        transform::run_sql(&p.sql, schema, rows, &context).await
    }

    /// Batch / backfill: runs the SQL over the whole source table and replaces the sink's content
    /// with the result, checkpointed at the source's current snapshot with the current transform
    /// version (the way out of a changed transform, an expired checkpoint or a row change).
    pub async fn refresh(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        let started = Instant::now();
        let mut replans = 0;
        loop {
            let pos = self.position(p).await?;
            let to = pos.source.metadata().current_snapshot_id();
            let (_, batches) = self.batch_output(p, &pos.source, to).await?;
            if p.mode == PipelineMode::Aggregate {
                require_window_column(&batches, p)?;
            }
            let writer_id = format!("refresh-{}", uuid::Uuid::now_v7());
            let mut out = Output::new(&pos.sink, &writer_id)?;
            out.write(batches).await?;
            let (added, schema) = out.close().await?;
            let removed: Vec<String> = live_files(&pos.sink)
                .await?
                .into_iter()
                .map(|f| f.file.file_path().to_string())
                .collect();
            let mut props: HashMap<String, String> = HashMap::new();
            if let Some(to) = to {
                props.extend(process::checkpoint_properties(
                    &pos.source_uuid,
                    to,
                    &pos.hash,
                ));
            }
            props.insert(SUMMARY_PIPELINE.into(), p.name.clone());
            props.insert("floe.operation".into(), "refresh".into());
            let report = RunReport {
                pipeline: p.name.clone(),
                from_snapshot: pos.checkpoint.as_ref().map(|c| c.snapshot_id),
                to_snapshot: to,
                rows_out: added.iter().map(|f| f.record_count()).sum(),
                files_replaced: removed.len(),
                refresh: true,
                replans,
                ..Default::default()
            };
            let change = Change::overwrite(added.clone(), removed, props, schema);
            let base_snapshot = pos.sink.metadata().current_snapshot_id();
            let ident = pos.sink.identifier().clone();
            let result = self
                .committer
                .commit_from(
                    &ident,
                    Some(pos.sink.clone()),
                    &self.limits(deadline),
                    move |t: &Table| {
                        Ok(if t.metadata().current_snapshot_id() != base_snapshot {
                            Plan::Skip(Skipped::Obsolete(
                                "the sink changed during the refresh".into(),
                            ))
                        } else {
                            Plan::Apply(change.clone())
                        })
                    },
                )
                .await;
            match result {
                Ok(Outcome::Committed { snapshot_id, .. }) => {
                    return Ok(RunReport {
                        sink_snapshot: snapshot_id,
                        seconds: started.elapsed().as_secs_f64(),
                        ..report
                    })
                }
                Ok(Outcome::Skipped(_)) => {}
                Err(e) if e.kind() == ErrorKind::Stale => {}
                Err(e) => return Err(e),
            }
            delete_files(&pos.sink, &added).await;
            replans += 1;
            if replans >= MAX_ROUNDS || Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!("refresh of `{name}`: the sink kept changing; {replans} attempts"),
                )
                .with_retryable(true));
            }
        }
    }

    /// Runs the batch result at the sink's checkpoint and compares it with the sink: row counts,
    /// rows per key (`keys`, else whole rows) and per-column totals.
    pub async fn reconcile(&self, name: &str) -> Result<Reconciliation> {
        let p = self.pipeline(name)?;
        let pos = self.position(p).await?;
        let at = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
        let (schema, batch) = match at {
            Some(id) => self.batch_output(p, &pos.source, Some(id)).await?,
            None => {
                let (s, _) = self.batch_input(p, &pos.source, None, true).await?;
                let context = format!("pipeline `{}`", p.name);
                transform::run_sql(&p.sql, s, Vec::new(), &context).await?
            }
        };
        let sink_rows = scan_table(&pos.sink).await?;
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let key_idx: Vec<usize> = if p.keys.is_empty() {
            (0..columns.len()).collect()
        } else {
            p.keys
                .iter()
                .map(|k| {
                    columns.iter().position(|c| c == k).ok_or_else(|| {
                        Error::new(
                            ErrorKind::Config,
                            format!(
                                "pipeline `{}`: key `{k}` is not an output column ({})",
                                p.name,
                                columns.join(", ")
                            ),
                        )
                    })
                })
                .collect::<Result<_>>()?
        };
        let left = transform::canonical_rows(&batch, &columns)?;
        let right = transform::canonical_rows(&sink_rows, &columns)?;
        let group = |rows: &[Vec<String>]| {
            let mut m: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
            for r in rows {
                let key = key_idx.iter().map(|&i| r[i].clone()).collect();
                m.entry(key).or_default().push(r.clone());
            }
            for v in m.values_mut() {
                v.sort();
            }
            m
        };
        let (lm, rm) = (group(&left), group(&right));
        let mut rec = Reconciliation {
            pipeline: p.name.clone(),
            at_snapshot: at,
            batch_rows: left.len(),
            sink_rows: right.len(),
            ..Default::default()
        };
        let keys: BTreeSet<&Vec<String>> = lm.keys().chain(rm.keys()).collect();
        rec.keys = keys.len();
        for k in keys {
            let (a, b) = (lm.get(k), rm.get(k));
            if a != b {
                rec.differing += 1;
                if rec.differences.len() < 20 {
                    let show = |v: Option<&Vec<Vec<String>>>| match v {
                        None => "missing".to_string(),
                        Some(rows) => rows
                            .iter()
                            .map(|r| r.join("|"))
                            .collect::<Vec<_>>()
                            .join("; "),
                    };
                    rec.differences.push(format!(
                        "key {}: batch {} · sink {}",
                        k.join("|"),
                        show(a),
                        show(b)
                    ));
                }
            }
        }
        for (i, f) in schema.fields().iter().enumerate() {
            if f.data_type().is_numeric() {
                let total = |rows: &[Vec<String>]| {
                    rows.iter()
                        .filter_map(|r| r[i].parse::<f64>().ok())
                        .sum::<f64>()
                };
                rec.totals
                    .push((f.name().clone(), total(&left), total(&right)));
            }
        }
        Ok(rec)
    }

    async fn send_alerts(
        &self,
        p: &PipelineConfig,
        alert: &crate::config::AlertConfig,
        sink: &Table,
        files: &[DataFile],
    ) -> Result<usize> {
        let live: Vec<LiveFile> = files
            .iter()
            .map(|f| LiveFile {
                file: f.clone(),
                spec_id: sink.metadata().default_partition_spec_id(),
            })
            .collect();
        let (_, batches) = read_rows(sink, &live).await?;
        let messages = alert_messages(&p.name, &batches)?;
        let n = messages.len();
        if let Some(bus) = &alert.eventbridge_bus {
            let client = self
                .alerts
                .eventbridge
                .as_ref()
                .ok_or_else(|| no_client(p))?;
            for chunk in messages.chunks(10) {
                let entries: Vec<_> = chunk
                    .iter()
                    .map(|(_, body)| {
                        aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                            .event_bus_name(bus)
                            .source(crate::notify::EVENT_SOURCE)
                            .detail_type("floe.alert")
                            .detail(body.to_string())
                            .build()
                    })
                    .collect();
                let out = client
                    .put_events()
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| {
                        alert_error(p, aws_sdk_eventbridge::error::DisplayErrorContext(e))
                    })?;
                if out.failed_entry_count() > 0 {
                    return Err(alert_error(
                        p,
                        format!("{} alerts refused", out.failed_entry_count()),
                    ));
                }
            }
        }
        if let Some(url) = &alert.sqs_queue_url {
            let client = self.alerts.sqs.as_ref().ok_or_else(|| no_client(p))?;
            let fifo = url.ends_with(".fifo");
            for chunk in messages.chunks(10) {
                let entries: Vec<_> = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, (id, body))| {
                        let mut b = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                            .id(format!("m{i}"))
                            .message_body(body.to_string())
                            .message_attributes(
                                "floe-alert-id",
                                aws_sdk_sqs::types::MessageAttributeValue::builder()
                                    .data_type("String")
                                    .string_value(id)
                                    .build()
                                    .map_err(|e| alert_error(p, e))?,
                            );
                        if fifo {
                            b = b.message_deduplication_id(id).message_group_id(&p.name);
                        }
                        b.build().map_err(|e| alert_error(p, e))
                    })
                    .collect::<Result<_>>()?;
                let out = client
                    .send_message_batch()
                    .queue_url(url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(|e| alert_error(p, aws_sdk_sqs::error::DisplayErrorContext(e)))?;
                if !out.failed().is_empty() {
                    return Err(alert_error(
                        p,
                        format!("{} alerts refused", out.failed().len()),
                    ));
                }
            }
        }
        Ok(n)
    }
}

fn no_client(p: &PipelineConfig) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "pipeline `{}` has alerts but the processor was built without alert clients",
            p.name
        ),
    )
}

fn alert_error(p: &PipelineConfig, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Storage,
        format!(
            "pipeline `{}`: sending alerts: {e} (nothing committed; the run is retried)",
            p.name
        ),
    )
    .with_retryable(true)
}

/// Alert messages for output rows: `(id, body)`. The id is a hash of the pipeline and the row
/// (plus its occurrence number among identical rows), so a re-sent alert has the same id.
pub fn alert_messages(pipeline: &str, batches: &[RecordBatch]) -> Result<Vec<(String, Value)>> {
    use sha2::{Digest, Sha256};
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for b in batches {
        let mut buf = Vec::new();
        {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
            w.write(b)
                .and_then(|_| w.finish())
                .map_err(|e| Error::new(ErrorKind::Internal, format!("alert rows as JSON: {e}")))?;
        }
        for line in buf.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            let row: Value = serde_json::from_slice(line)
                .map_err(|e| Error::new(ErrorKind::Internal, format!("alert row: {e}")))?;
            let text = String::from_utf8_lossy(line).to_string();
            let n = seen.entry(text.clone()).or_default();
            *n += 1;
            let mut h = Sha256::new();
            h.update(pipeline.as_bytes());
            h.update([0]);
            h.update(text.as_bytes());
            h.update(n.to_le_bytes());
            let id = hex::encode(&h.finalize()[..16]);
            out.push((
                id.clone(),
                serde_json::json!({ "id": id, "pipeline": pipeline, "row": row }),
            ));
        }
    }
    Ok(out)
}

fn window_missing(p: &PipelineConfig) -> Error {
    Error::new(
        ErrorKind::Transform,
        format!(
            "pipeline `{}`: an aggregate SQL must output `{WINDOW_START}` (group by it) so windows can be replaced",
            p.name
        ),
    )
}

fn require_window_column(batches: &[RecordBatch], p: &PipelineConfig) -> Result<()> {
    if batches
        .iter()
        .any(|b| b.column_by_name(WINDOW_START).is_none())
    {
        return Err(window_missing(p));
    }
    Ok(())
}

/// The table a `…/<table>/metadata/<file>.metadata.json` key belongs to.
pub fn metadata_key_table(key: &str) -> Option<String> {
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

/// Seconds since the oldest of `appends` was committed (0 when none).
fn oldest_unprocessed_age(source: &Table, appends: &[i64]) -> f64 {
    appends
        .first()
        .and_then(|id| source.metadata().snapshot_by_id(*id))
        .map(|s| (chrono::Utc::now().timestamp_millis() - s.timestamp_ms()).max(0) as f64 / 1e3)
        .unwrap_or(0.0)
}

async fn commit_latency(
    committer: &Committer,
    sink: &TableIdent,
    snapshot: Option<i64>,
    source: &Table,
    to: i64,
) -> Option<i64> {
    let src = source.metadata().snapshot_by_id(to)?.timestamp_ms();
    let t = committer.load(sink).await.ok()?;
    let s = t.metadata().snapshot_by_id(snapshot?)?.timestamp_ms();
    Some(s - src)
}

/// Groups of files with at most [`CHUNK_ROWS`] rows (one file per group at least).
fn chunks(files: &[LiveFile]) -> Vec<&[LiveFile]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut rows = 0;
    for (i, f) in files.iter().enumerate() {
        if rows > 0 && rows + f.file.record_count() > CHUNK_ROWS {
            out.push(&files[start..i]);
            start = i;
            rows = 0;
        }
        rows += f.file.record_count();
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// Reads `files` of `table` into memory with the current schema (metadata-free Arrow schema).
pub async fn read_rows(table: &Table, files: &[LiveFile]) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let schema = transform::table_schema(table)?;
    if files.is_empty() {
        return Ok((schema, Vec::new()));
    }
    let stream = futures::stream::iter(scan_tasks(table, files).into_iter().map(Ok));
    let batches: Vec<RecordBatch> = table
        .reader_builder()
        .with_batch_size(8192)
        .build()
        .read(Box::pin(stream))
        .map_err(|e| Error::iceberg(format!("reading {}", table.identifier()), e))?
        .stream()
        .try_collect()
        .await
        .map_err(|e| {
            Error::iceberg(format!("reading {}", table.identifier()), e).with_retryable(true)
        })?;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        out.push(transform::conform(&b, &schema)?);
    }
    Ok((schema, out))
}

/// All rows of `table`'s current snapshot.
async fn scan_table(table: &Table) -> Result<Vec<RecordBatch>> {
    let files = live_files(table).await?;
    Ok(read_rows(table, &files).await?.1)
}

/// Rows of `table` at `snapshot` (default: current) matching `filter`, conformed to `schema`.
async fn scan_rows(
    table: &Table,
    snapshot: Option<i64>,
    filter: Option<Predicate>,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let mut scan = table.scan().select_all();
    if let Some(id) = snapshot {
        scan = scan.snapshot_id(id);
    }
    if let Some(f) = filter {
        scan = scan.with_filter(f);
    }
    let failed = |e| Error::iceberg(format!("scanning {}", table.identifier()), e);
    let batches: Vec<RecordBatch> = scan
        .build()
        .map_err(failed)?
        .to_arrow()
        .await
        .map_err(failed)?
        .try_collect()
        .await
        .map_err(|e| failed(e).with_retryable(true))?;
    batches
        .iter()
        .map(|b| transform::conform(b, schema))
        .collect()
}

/// Source rows (with `window_start`) of the `touched` windows at snapshot `at`.
async fn read_windows(
    source: &Table,
    at: i64,
    time_column: &str,
    window: i64,
    touched: &BTreeSet<i64>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let schema = transform::table_schema(source)?;
    let tz = matches!(
        source
            .metadata()
            .current_schema()
            .field_by_name(time_column)
            .map(|f| f.field_type.as_ref()),
        Some(Type::Primitive(PrimitiveType::Timestamptz))
    );
    let datum = |us: i64| {
        if tz {
            Datum::timestamptz_micros(us)
        } else {
            Datum::timestamp_micros(us)
        }
    };
    // One range per run of adjacent windows: late rows far back do not pull in everything between.
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for &w in touched {
        match ranges.last_mut() {
            Some((_, hi)) if *hi == w => *hi = w + window,
            _ => ranges.push((w, w + window)),
        }
    }
    let predicate = ranges
        .iter()
        .map(|&(lo, hi)| {
            Reference::new(time_column)
                .greater_than_or_equal_to(datum(lo))
                .and(Reference::new(time_column).less_than(datum(hi)))
        })
        .reduce(Predicate::or)
        .unwrap_or(Predicate::AlwaysFalse);
    let batches = scan_rows(source, Some(at), Some(predicate), &schema).await?;
    let empty = RecordBatch::new_empty(schema.clone());
    let out_schema = transform::with_window_start(&empty, time_column, window)?.schema();
    let mut out = Vec::new();
    for b in batches {
        let b = transform::with_window_start(&b, time_column, window)?;
        let keep = in_windows(&b, touched);
        let b = arrow::compute::filter_record_batch(&b, &keep)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering windows: {e}")))?;
        if b.num_rows() > 0 {
            out.push(b);
        }
    }
    Ok((out_schema, out))
}

/// Which rows of `batch` have a `window_start` in `touched`.
fn in_windows(batch: &RecordBatch, touched: &BTreeSet<i64>) -> BooleanArray {
    let starts = batch.column_by_name(WINDOW_START).and_then(|c| {
        arrow::compute::cast(
            c,
            &arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
        )
        .ok()
    });
    let Some(starts) = starts else {
        return BooleanArray::from(vec![false; batch.num_rows()]);
    };
    let Some(a) = starts
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
    else {
        return BooleanArray::from(vec![false; batch.num_rows()]);
    };
    a.iter()
        .map(|v| Some(v.map(|v| touched.contains(&v)).unwrap_or(false)))
        .collect()
}

/// Sink files that may hold rows of the `touched` windows, and their rows outside them (kept).
async fn sink_rows_outside(
    sink: &Table,
    touched: &BTreeSet<i64>,
) -> Result<(Vec<String>, Vec<RecordBatch>)> {
    let field = sink
        .metadata()
        .current_schema()
        .field_by_name(WINDOW_START)
        .map(|f| f.id);
    if touched.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let bound = |d: Option<&Datum>| match d.map(|d| d.literal()) {
        Some(PrimitiveLiteral::Long(v)) => Some(*v),
        _ => None,
    };
    let affected: Vec<LiveFile> = live_files(sink)
        .await?
        .into_iter()
        .filter(|f| {
            let Some(id) = field else { return true };
            let min = bound(f.file.lower_bounds().get(&id));
            let max = bound(f.file.upper_bounds().get(&id));
            match (min, max) {
                (Some(min), Some(max)) => touched.range(min..=max).next().is_some(),
                _ => true,
            }
        })
        .collect();
    let paths = affected
        .iter()
        .map(|f| f.file.file_path().to_string())
        .collect();
    let (_, rows) = read_rows(sink, &affected).await?;
    let mut kept = Vec::new();
    for b in rows {
        let drop = in_windows(&b, touched);
        let keep = arrow::compute::not(&drop)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering sink rows: {e}")))?;
        let b = arrow::compute::filter_record_batch(&b, &keep)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering sink rows: {e}")))?;
        if b.num_rows() > 0 {
            kept.push(b);
        }
    }
    Ok((paths, kept))
}

async fn delete_files(table: &Table, files: &[DataFile]) {
    for f in files {
        if let Err(e) = table.file_io().delete(f.file_path()).await {
            tracing::warn!(file = f.file_path(), error = %e, "could not delete an unused output file (orphan cleanup will)");
        }
    }
}

/// Output files being written to a sink, evolving its schema additively when the SQL's output
/// gains columns (new optional columns, committed with the data).
struct Output {
    sink: Table,
    writer_id: String,
    writer: Option<crate::write::Sink>,
    evolved: Option<iceberg::spec::Schema>,
    arrow: SchemaRef,
}

impl Output {
    fn new(sink: &Table, writer_id: &str) -> Result<Self> {
        let arrow = schema_to_arrow_schema(sink.metadata().current_schema())
            .map_err(|e| Error::iceberg(format!("schema of {}", sink.identifier()), e))?;
        Ok(Self {
            sink: sink.clone(),
            writer_id: writer_id.to_string(),
            writer: None,
            evolved: None,
            arrow: Arc::new(arrow),
        })
    }

    async fn write(&mut self, batches: Vec<RecordBatch>) -> Result<()> {
        for b in batches {
            if b.num_rows() == 0 {
                continue;
            }
            self.fit(&b).await?;
            let b = transform::conform(&b, &self.arrow)?;
            if self.writer.is_none() {
                let table = match &self.evolved {
                    Some(s) => crate::ingest::with_schema(&self.sink, s.clone())?,
                    None => self.sink.clone(),
                };
                let target = table
                    .metadata()
                    .properties()
                    .get("write.target-file-size-bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(128usize << 20);
                self.writer = Some(
                    crate::write::build_sink(&table, target, &self.writer_id).map_err(|e| {
                        Error::iceberg(format!("writer for {}", self.sink.identifier()), e)
                    })?,
                );
            }
            if let Some(w) = self.writer.as_mut() {
                w.write(b).await.map_err(|e| {
                    Error::iceberg(format!("writing {}", self.sink.identifier()), e)
                })?;
            }
        }
        Ok(())
    }

    /// Adds output columns the sink lacks (before the first file is opened); a changed type is
    /// an error asking for a refresh.
    async fn fit(&mut self, b: &RecordBatch) -> Result<()> {
        let current = self
            .evolved
            .clone()
            .unwrap_or_else(|| self.sink.metadata().current_schema().as_ref().clone());
        let mut unknown = BTreeMap::new();
        let mut widen = BTreeMap::new();
        for f in b.schema().fields() {
            let ty = arrow_type_to_type(f.data_type()).ok();
            match (current.field_by_name(f.name()), ty) {
                (Some(existing), Some(ty)) if *existing.field_type != ty => {
                    match (existing.field_type.as_ref(), &ty) {
                        // The source widened (e.g. int → long): widen the sink column too.
                        (Type::Primitive(a), Type::Primitive(b)) if crate::evolve::is_widening(a, b) => {
                            widen.insert(f.name().clone(), b.clone());
                        }
                        // Narrower output than the sink's column: cast up on write.
                        (Type::Primitive(a), Type::Primitive(b)) if crate::evolve::is_widening(b, a) => {}
                        _ => {
                            return Err(Error::new(
                                ErrorKind::Transform,
                                format!(
                                    "sink {}: output column `{}` is now {ty}, the sink has {}; drop the sink table, then `floe process refresh`",
                                    self.sink.identifier(),
                                    f.name(),
                                    existing.field_type
                                ),
                            ))
                        }
                    }
                }
                (None, Some(Type::Primitive(p))) => {
                    unknown.insert(f.name().clone(), Some(p));
                }
                _ => {}
            }
        }
        if unknown.is_empty() && widen.is_empty() {
            return Ok(());
        }
        if self.writer.is_some() {
            return Err(Error::new(
                ErrorKind::Transform,
                format!(
                    "sink {}: output columns changed within one run",
                    self.sink.identifier()
                ),
            ));
        }
        // Ids above the sink's last-column-id: a column dropped by another engine keeps its id.
        let evolved = crate::evolve::evolve_table_schema(self.sink.metadata(), &unknown, &widen)
            .map_err(|e| Error::iceberg("evolving the sink schema", e))?;
        if let Some((schema, what)) = evolved {
            tracing::info!(sink = %self.sink.identifier(), change = %what, "sink schema evolves");
            self.arrow = Arc::new(
                schema_to_arrow_schema(&schema).map_err(|e| Error::iceberg("sink schema", e))?,
            );
            self.evolved = Some(schema);
        }
        Ok(())
    }

    async fn close(self) -> Result<(Vec<DataFile>, Option<iceberg::spec::Schema>)> {
        let files = match self.writer {
            Some(w) => w.close().await.map_err(|e| {
                Error::iceberg(format!("closing files of {}", self.sink.identifier()), e)
            })?,
            None => Vec::new(),
        };
        Ok((files, self.evolved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn alert_ids_are_deterministic_and_distinct() {
        use arrow::array::StringArray;
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "order_id",
            arrow_schema::DataType::Utf8,
            true,
        )]));
        let b = RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from(vec!["a", "b", "a"]))],
        )
        .unwrap();
        let one = alert_messages("p", std::slice::from_ref(&b)).unwrap();
        let two = alert_messages("p", &[b]).unwrap();
        assert_eq!(one.len(), 3);
        assert_eq!(
            one.iter().map(|m| &m.0).collect::<Vec<_>>(),
            two.iter().map(|m| &m.0).collect::<Vec<_>>()
        );
        let ids: BTreeSet<&String> = one.iter().map(|m| &m.0).collect();
        assert_eq!(
            ids.len(),
            3,
            "identical rows get distinct ids by occurrence"
        );
        assert_eq!(one[0].1["row"]["order_id"], "a");
    }
}
