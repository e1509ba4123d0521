//! The processor: one pipeline run from its checkpoint to a sink commit carrying the new one.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use iceberg::arrow::arrow_schema_to_schema_auto_assign_ids;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::{TableCreation, TableIdent};
use serde::Serialize;
use serde_json::Value;

use super::alerts::Alerts;
use super::joins::Joined;
use super::latest::{self, Latest};
use super::merge::{self, Merge};
use super::output::Output;
use super::plan::{self, RowChangePolicy};
use super::transform::{self, WINDOW_START};
use super::{input, windows};
use crate::catalog;
use crate::commit::{metered, CommitLimits, Committer, Outcome, Plan, Skipped};
use crate::config::{Config, PipelineConfig, PipelineMode, RowChange};
use crate::error::{Error, ErrorKind, Result};
use crate::requests::{Meter, Requests};
use crate::scan::LiveFile;
use crate::snapshot::Change;
use crate::summary::{self, Checkpoint, Usage, FUNCTION_PROCESS};

/// Runs that lost the race to another run re-plan at most this often.
pub(super) const MAX_ROUNDS: u32 = 8;

/// One plan-and-commit of a run.
enum Attempt {
    /// Committed, or nothing to do.
    Done(Box<RunReport>),
    /// Another writer committed to the sink first; this attempt had planned up to `planned_to`
    /// (a source snapshot).
    Lost {
        planned_to: i64,
        /// Where the attempt started (its checkpoint) and the lag it found.
        from: Option<i64>,
        lag_seconds: f64,
    },
}

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
    /// Windows recomputed (or merged) and replaced (aggregate mode).
    pub windows: usize,
    /// Aggregate mode: the windows were maintained by merging the delta's partial aggregates
    /// into the sink rows (a decomposable SQL, see `merge.rs`), not recomputed from the source.
    pub merged: bool,
    /// Sink files replaced (aggregate mode, refresh).
    pub files_replaced: usize,
    /// Bytes of the sink files replaced (aggregate mode: read, and rewritten without the
    /// touched windows).
    pub sink_bytes_replaced: u64,
    /// New source files read to find the touched windows (aggregate mode, recomputed: their
    /// time column only, a file within one window is not read; merged: the whole rows).
    pub delta_files_read: usize,
    /// Bytes read from them.
    pub delta_bytes_read: u64,
    /// Source data files opened to recompute the touched windows (aggregate mode), or to
    /// rebuild the buckets a source row change affects (latest mode).
    pub recompute_files_read: usize,
    /// Bytes read from them.
    pub recompute_bytes_read: u64,
    /// Alerts sent.
    pub alerts: usize,
    /// Distinct keys in the delta (latest mode).
    pub keys_touched: u64,
    /// Key buckets the delta touches, whose sink files are read and rewritten (latest mode).
    pub buckets: usize,
    /// Source `overwrite`/`delete` snapshots in the delta, retracted (latest mode).
    pub row_changes: usize,
    /// Key buckets rebuilt from the source because a row change removed rows in them (latest
    /// mode; also counted in `buckets`).
    pub buckets_rebuilt: usize,
    /// Sink and tombstone files read to merge the touched buckets (latest mode), or the
    /// touched windows (aggregate mode, merged).
    pub sink_files_read: usize,
    /// Bytes read from them.
    pub sink_bytes_read: u64,
    /// Bytes of the files written (latest mode: the rewritten buckets and tombstones).
    pub bytes_written: u64,
    /// Tombstones the run added (latest mode with `delete_when`).
    pub tombstones: u64,
    /// Sink rows the run deleted by position (latest mode: rows replaced by a newer version,
    /// or deleted).
    pub rows_deleted: u64,
    /// Position delete files the run wrote (latest mode: sink and tombstone table).
    pub delete_files: usize,
    /// Of those, the tombstone table's.
    pub tombstone_delete_files: usize,
    /// The sink snapshot committed (None: nothing new).
    pub sink_snapshot: Option<i64>,
    /// Times the run lost to a concurrent run and re-planned.
    pub replans: u32,
    /// The run lost to a concurrent run whose commit covers everything this run had planned
    /// (the source snapshot it set out to reach): nothing was left for it to do.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub covered: bool,
    /// Source commit → sink commit, for the newest source snapshot processed (ms).
    pub latency_ms: Option<i64>,
    /// Processor lag before the run: now − the oldest unprocessed source commit (s).
    pub lag_seconds: f64,
    /// Wall time of the run.
    pub seconds: f64,
    /// A full refresh (batch over the whole table).
    pub refresh: bool,
    /// A refresh's chunks: what this call committed, what remains for the next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_progress: Option<super::refresh::RefreshProgress>,
    /// What the run used (compute time, memory, S3 requests), as its sink commit records it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
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
        if let Some(u) = &self.usage {
            crate::metrics::emit_usage(&[("Pipeline", &self.pipeline)], u);
        }
        tracing::info!(pipeline = %self.pipeline, from = ?self.from_snapshot, to = ?self.to_snapshot,
            snapshots = self.source_snapshots, rows_in = self.rows_in, rows_out = self.rows_out,
            windows = self.windows, sink_snapshot = ?self.sink_snapshot, replans = self.replans,
            latency_ms = ?self.latency_ms, "pipeline run");
    }
}

/// What one process invocation did.
#[derive(Debug, Default)]
pub struct ProcessResult {
    /// The runs that finished.
    pub reports: Vec<RunReport>,
    /// The runs that failed, retryable or not.
    pub errors: Vec<Error>,
    /// The payload was an SQS batch: answer with its failed messages, not with an error.
    pub is_sqs: bool,
    /// The messages of the batch that woke a pipeline whose run failed retryably.
    pub failed_message_ids: Vec<String>,
}

/// Runs the configured pipelines.
pub struct Processor {
    pub(super) config: Arc<Config>,
    pub(super) committer: Committer,
    pub(super) alerts: Alerts,
    /// Where sink commits are announced (`floe.commit`, as ingest's), so that a pipeline whose
    /// source is this sink runs next; None without `events.bus`.
    pub(super) notifier: Option<crate::notify::Notifier>,
    /// Source schema id each pipeline's SQL was last checked against, and how an aggregate
    /// pipeline maintains its windows over it (Some: by merging, see `merge.rs`).
    checked: std::sync::Mutex<HashMap<String, Checked>>,
    /// Each pipeline's latest aggregate refresh plan, refined by counting (see `refresh.rs`).
    pub(super) refresh_plans: std::sync::Mutex<HashMap<String, super::refresh::CachedPlan>>,
}

/// A pipeline's SQL as last checked: the source schema id, and the merge of a decomposable
/// aggregate (None: recomputed, or not an aggregate).
type Checked = (i32, Option<Arc<Merge>>);

/// One run's starting point.
pub(super) struct Position {
    pub(super) source: Table,
    pub(super) source_uuid: String,
    pub(super) sink: Table,
    pub(super) checkpoint: Option<Checkpoint>,
    pub(super) hash: String,
    /// A `latest` pipeline's tombstone table (with `delete_when`).
    pub(super) tombstones: Option<Table>,
}

impl Processor {
    /// Connects to the configured catalog (and alert services, when a pipeline has alerts).
    pub async fn new(config: Config) -> Result<Self> {
        // Sources are not created here: the process role only reads them (a pipeline whose
        // source does not exist yet is skipped, see `handle_payload`).
        let requests = Requests::new();
        let catalog = catalog::connect_counted(&config, Some(&requests)).await?;
        let swap = crate::catalog::pointer_swap(&config).await?;
        let committer = Committer::new(catalog, swap).with_requests(requests);
        let mut me = Self::with_parts(config, committer);
        me.notifier = crate::notify::Notifier::from_config(&me.config).await;
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

    /// From explicit parts (no alert clients: alerts fail until [`Processor::new`] builds them;
    /// no commit events).
    pub fn with_parts(config: Config, committer: Committer) -> Self {
        Self {
            config: Arc::new(config),
            committer,
            alerts: Alerts::default(),
            notifier: None,
            checked: Default::default(),
            refresh_plans: Default::default(),
        }
    }

    /// The committer in use.
    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    pub(super) fn pipeline(&self, name: &str) -> Result<&PipelineConfig> {
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

    /// A meter for a pipeline run starting now.
    pub(super) fn meter(&self) -> Meter {
        Meter::start(
            FUNCTION_PROCESS,
            self.config.cost.memory_mb(FUNCTION_PROCESS),
            self.committer.requests(),
        )
    }

    pub(super) fn limits(&self, deadline: Instant) -> CommitLimits {
        CommitLimits {
            max_attempts: self.config.ingest.max_commit_attempts,
            deadline,
            skew: Duration::from_secs(self.config.ingest.dedup_skew_seconds),
        }
    }

    /// Handles a process-function payload: runs every pipeline it concerns, each once. Errors of
    /// single pipelines are collected so one broken pipeline does not starve the others.
    pub async fn handle_payload(
        &self,
        payload: &Value,
        deadline: Instant,
    ) -> (Vec<RunReport>, Vec<Error>) {
        let r = self.handle_event(payload, deadline).await;
        (r.reports, r.errors)
    }

    /// Like [`Processor::handle_payload`], and for an SQS batch the messages to receive again
    /// (what the Lambda answers as partial batch failures): each pipeline the batch wakes runs
    /// once, and a message is failed when a pipeline it woke failed retryably (the messages
    /// coalesced into a run share its outcome). A pipeline failing for good (its SQL, its
    /// config) fails no message: receiving it again cannot help; its error is logged and counted
    /// (`PipelineErrors`), and the poll keeps trying.
    pub async fn handle_event(&self, payload: &Value, deadline: Instant) -> ProcessResult {
        let meter = self.meter();
        let out = Box::pin(self.handle_event_unmetered(payload, deadline)).await;
        // The whole invocation's usage (each run's is in its own line, per pipeline).
        crate::metrics::emit_usage(&[], &meter.usage());
        if !out.errors.is_empty() {
            use crate::metrics::{emit, Metric};
            emit(
                &[],
                &[Metric::count("PipelineErrors", out.errors.len() as f64)],
            );
        }
        out
    }

    async fn handle_event_unmetered(&self, payload: &Value, deadline: Instant) -> ProcessResult {
        let messages = self.messages_for(payload);
        let names = match &messages {
            Some(m) => super::trigger::union(m),
            None => self.pipelines_for(payload),
        };
        let mut out = ProcessResult {
            is_sqs: messages.is_some(),
            ..Default::default()
        };
        let mut failed = BTreeSet::new();
        let width = self.config.process.concurrent_pipelines.max(1);
        let outcomes = self.run_side_by_side(names, width, deadline).await;
        for (name, outcome) in outcomes {
            match outcome {
                None => {}
                Some(Ok(r)) => {
                    r.emit();
                    out.reports.push(r)
                }
                Some(Err(e)) => {
                    tracing::error!(pipeline = %name, error = %e, retryable = e.is_retryable(), "pipeline run failed");
                    if e.is_retryable() {
                        failed.insert(name);
                    }
                    out.errors.push(e)
                }
            }
        }
        if let Some(m) = &messages {
            out.failed_message_ids = super::trigger::failed_messages(m, &failed);
        }
        out
    }

    /// Runs the pipelines `names` (their outcomes in that order; `None`: no source yet), up to
    /// `width` at once: a round takes as long as its slowest pipeline, not their sum, so a
    /// commit event waits less for the round in progress. A pipeline reading another's sink
    /// (its source or a joined table) runs after it, in a later wave, so it sees that run's
    /// output in the same round as it did when they ran one after the other. Runs side by
    /// side record their own requests only ([`Meter::scoped_carrying`]; reads iceberg's scan
    /// planning spawns on its runtime are not in a scope).
    async fn run_side_by_side(
        &self,
        names: Vec<String>,
        width: usize,
        deadline: Instant,
    ) -> Vec<(String, Option<Result<RunReport>>)> {
        let configs: Vec<_> = names.iter().map(|n| self.pipeline(n).ok()).collect();
        self.load_sources(&configs).await;
        let waves = waves(&configs);
        // Rounds of `width` runs each wave needs: a rebuild leaves time for those after it.
        let rounds: Vec<usize> = waves.iter().map(|w| w.len().div_ceil(width)).collect();
        let mut outcomes = Vec::with_capacity(names.len());
        for (level, wave) in waves.iter().enumerate() {
            let later: usize = rounds[level + 1..].iter().sum();
            let k = wave.len();
            let scoped = k > 1 && width > 1;
            // The runs as futures first, then a stream of them: a closure inside the stream
            // would make the handler's future not `Send` for every lifetime.
            let runs: Vec<_> = wave
                .iter()
                .enumerate()
                .map(|(j, &i)| {
                    let name = names[i].clone();
                    async move {
                        // A latest rebuild stops in time for the pipelines that queue after
                        // it in its slot and in the waves after (retract.rs).
                        let after_it = (k - j - 1) / width + later;
                        let rebuild_by = rebuild_by(Instant::now(), deadline, after_it);
                        let outcome = match self.source_exists(&name).await {
                            Ok(true) => Some(
                                Box::pin(self.run_within(&name, deadline, rebuild_by, scoped))
                                    .await,
                            ),
                            Ok(false) => {
                                tracing::info!(pipeline = %name, "source table not created yet: nothing to process");
                                None
                            }
                            Err(e) => Some(Err(e)),
                        };
                        (i, name, outcome)
                    }
                })
                .collect();
            // Unordered: a long run holds one slot, not the start of every run after it.
            let done: Vec<_> = futures::stream::iter(runs)
                .buffer_unordered(width)
                .collect()
                .await;
            outcomes.extend(done);
        }
        outcomes.sort_by_key(|(i, _, _)| *i);
        outcomes.into_iter().map(|(_, n, o)| (n, o)).collect()
    }

    /// Loads each source the batch's pipelines read once, side by side: the runs then find it
    /// in the committer's cache (one pointer read each) instead of each fetching and parsing the
    /// same new metadata.json. Best effort: a run loads what it still needs, and reports.
    async fn load_sources(&self, configs: &[Option<&PipelineConfig>]) {
        let sources: BTreeSet<&str> = configs
            .iter()
            .flatten()
            .map(|p| p.source.as_str())
            .collect();
        let loads = sources.into_iter().map(|name| async move {
            if let Ok(ident) = catalog::table_ident(&self.config, name) {
                let _ = self.committer.load(&ident).await;
            }
        });
        futures::future::join_all(loads).await;
    }

    /// Whether the pipeline's source table (and every table it joins) exists (a poll may come
    /// before the first ingest).
    pub async fn source_exists(&self, name: &str) -> Result<bool> {
        let p = self.pipeline(name)?;
        for table in std::iter::once(&p.source).chain(&p.joins) {
            let ident = catalog::table_ident(&self.config, table)?;
            let exists = self
                .committer
                .catalog()
                .table_exists(&ident)
                .await
                .map_err(|e| {
                    Error::iceberg(format!("checking input {ident}"), e).with_retryable(true)
                })?;
            if !exists {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Processes everything the pipeline has not seen yet, committing output and checkpoint in
    /// one sink snapshot. Safe to call concurrently and repeatedly.
    pub async fn run(&self, name: &str, deadline: Instant) -> Result<RunReport> {
        self.run_within(name, deadline, deadline, false).await
    }

    /// [`Self::run`], a latest run's rebuild (retract.rs) stopping at `rebuild_by`.
    /// `scoped`: the run's meter counts its own requests only (runs side by side).
    async fn run_within(
        &self,
        name: &str,
        deadline: Instant,
        rebuild_by: Instant,
        scoped: bool,
    ) -> Result<RunReport> {
        let meter = if scoped {
            self.meter().scoped_carrying(Usage::default())
        } else {
            self.meter()
        };
        // Boxed: the run's future is large, and the scope would move it by value.
        meter
            .run(Box::pin(
                self.run_metered(name, deadline, rebuild_by, &meter),
            ))
            .await
    }

    async fn run_metered(
        &self,
        name: &str,
        deadline: Instant,
        rebuild_by: Instant,
        meter: &Meter,
    ) -> Result<RunReport> {
        let p = self.pipeline(name)?;
        let started = Instant::now();
        // The whole run, re-plans included: what its sink commit records.
        let mut replans = 0;
        // The first lost attempt's plan: the source snapshot it set out to reach (what the run
        // was started for), its start and the lag it found (what a covered run reports).
        let mut first: Option<(i64, Option<i64>, f64)> = None;
        loop {
            let lost = match self.run_once(p, deadline, rebuild_by, meter).await? {
                Attempt::Done(report) => {
                    let mut report = *report;
                    report.replans = replans;
                    report.seconds = started.elapsed().as_secs_f64();
                    report.usage = Some(meter.usage());
                    self.announce(p, &report).await;
                    return Ok(report);
                }
                Attempt::Lost {
                    planned_to,
                    from,
                    lag_seconds,
                } => (planned_to, from, lag_seconds),
            };
            // Runs side by side (two invocations on one queue, a poll beside an event) on a
            // source that keeps committing: each commit of one makes the other re-plan onto a
            // new delta, and lose again to the next. Once another run's checkpoint covers what
            // this one set out to reach, the work it was started for is done.
            let (target, from_snapshot, lag_seconds) = *first.get_or_insert(lost);
            if let Some(reached) = self.covered(p, target).await? {
                tracing::info!(pipeline = %p.name, target, reached, "another run's commit covers this run's plan; done");
                return Ok(RunReport {
                    pipeline: p.name.clone(),
                    from_snapshot,
                    to_snapshot: Some(reached),
                    lag_seconds,
                    replans,
                    covered: true,
                    seconds: started.elapsed().as_secs_f64(),
                    usage: Some(meter.usage()),
                    ..Default::default()
                });
            }
            if replans + 1 >= MAX_ROUNDS || Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!(
                        "pipeline `{name}`: other runs kept committing first; {replans} re-plans"
                    ),
                )
                .with_retryable(true));
            }
            replans += 1;
        }
    }

    /// The sink's checkpoint, if it covers `target` (a snapshot of the source): written by this
    /// transform version, no refresh of the sink in progress (its chunks carry the old
    /// checkpoint while they replace the output: the run continues it instead), and on the
    /// source's main history at or after `target` (a rolled-back source makes the next plan
    /// fail as `Stale`, as before).
    async fn covered(&self, p: &PipelineConfig, target: i64) -> Result<Option<i64>> {
        let pos = self.position(p).await?;
        let Some(cp) = &pos.checkpoint else {
            return Ok(None);
        };
        if cp.transform.as_deref() != Some(pos.hash.as_str())
            || super::refresh::read_position(p, &pos)?.is_some()
        {
            return Ok(None);
        }
        let md = pos.source.metadata();
        let Some(wanted) = md.snapshot_by_id(target) else {
            return Ok(None);
        };
        let Some(current) = md.current_snapshot_id() else {
            return Ok(None);
        };
        // Main's history back to `target`: the checkpoint must be met on the way (or be it).
        let mut met = false;
        let source = pos.source.metadata_ref();
        let main = iceberg::util::snapshot::ancestors_of(&source, current)
            .take_while(|s| s.sequence_number() >= wanted.sequence_number());
        for s in main {
            met |= s.snapshot_id() == cp.snapshot_id;
            if s.snapshot_id() == target {
                return Ok(met.then_some(cp.snapshot_id));
            }
        }
        Ok(None)
    }

    pub(super) async fn position(&self, p: &PipelineConfig) -> Result<Position> {
        let source_ident = catalog::table_ident(&self.config, &p.source)?;
        let source = self.committer.load(&source_ident).await?;
        let source_uuid = source.metadata().uuid().to_string();
        let time_column = p.time_column(&self.config).to_string();
        let hash = transform::transform_hash(p, &time_column);
        let sink = self.ensure_sink(p, &source).await?;
        let checkpoint = summary::read_checkpoint(sink.metadata(), &source_uuid);
        let tombstones = match p.tombstone_table() {
            Some(name) => {
                let ident = catalog::table_ident(&self.config, &name)?;
                Some(self.committer.load(&ident).await?)
            }
            None => None,
        };
        Ok(Position {
            source,
            source_uuid,
            sink,
            checkpoint,
            hash,
            tombstones,
        })
    }

    /// Plans the SQL against the source's current schema (once per schema id), so a change that
    /// breaks it stops the pipeline at once, naming the field, even before new data arrives.
    /// Returns how an aggregate pipeline's windows are maintained: Some, by merging the delta's
    /// partial aggregates (a decomposable SQL); None, by recomputing them.
    async fn check_sql(&self, p: &PipelineConfig, source: &Table) -> Result<Option<Arc<Merge>>> {
        let id = source.metadata().current_schema_id();
        let seen = self
            .checked
            .lock()
            .ok()
            .and_then(|c| c.get(&p.name).cloned());
        if let Some((seen, merge)) = seen {
            if seen == id {
                return Ok(merge);
            }
        }
        let (schema, _) = self.batch_input(p, source, None, true).await?;
        let joined = self.joined(p, false).await?;
        let context = format!("pipeline `{}` over `{}` (schema id {id})", p.name, p.source);
        let (out, _) = transform::run_sql_joined(
            &p.sql,
            schema.clone(),
            Vec::new(),
            &joined.relations,
            &context,
        )
        .await?;
        if p.mode == PipelineMode::Latest {
            Latest::new(p, &out)?;
        }
        if matches!(p.mode, PipelineMode::Append | PipelineMode::Latest) {
            let (plan, _) =
                transform::logical_plan(&p.sql, schema.clone(), &joined.relations, &context)
                    .await?;
            if let Err(why) = super::row_wise::check(&plan) {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "{context}: a `{}` pipeline's SQL must be row-wise over `source` (filter, project, enrich: each output row from one source row), so that runs over deltas and the batch over the whole source agree; {why}",
                        if p.mode == PipelineMode::Latest { "mode = \"latest\"" } else { "mode = \"append\"" }
                    ),
                ));
            }
        }
        let merge = match p.mode {
            PipelineMode::Aggregate if !p.merge => {
                tracing::info!(pipeline = %p.name, strategy = "recompute", reason = "merge = false", "aggregate windows are recomputed from the source");
                None
            }
            PipelineMode::Aggregate => {
                let verdict = match merge::settings_forbid(p) {
                    Some(why) => Err(why),
                    None => merge::analyze(&p.sql, schema, &joined.relations, &context).await?,
                };
                match verdict {
                    Ok(m) => {
                        tracing::info!(pipeline = %p.name, strategy = "merge", "aggregate windows are merged with the delta's partial aggregates");
                        Some(Arc::new(m))
                    }
                    Err(why) => {
                        tracing::info!(pipeline = %p.name, strategy = "recompute", reason = %why, "aggregate windows are recomputed from the source");
                        None
                    }
                }
            }
            _ => None,
        };
        if let Ok(mut c) = self.checked.lock() {
            c.insert(p.name.clone(), (id, merge.clone()));
        }
        Ok(merge)
    }

    /// One attempt; `None` when another run committed from the same checkpoint first.
    ///
    /// Reads the position, plans the source's delta after the checkpoint, runs the SQL over it,
    /// and commits the output with the new checkpoint.
    async fn run_once(
        &self,
        p: &PipelineConfig,
        deadline: Instant,
        rebuild_by: Instant,
        meter: &Meter,
    ) -> Result<Attempt> {
        let t0 = Instant::now();
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let pos = self.position(p).await?;
        let position_ms = ms(t0);
        if let Some(r) = self.continue_refresh(p, &pos, deadline, meter).await? {
            return Ok(Attempt::Done(Box::new(r)));
        }
        let t1 = Instant::now();
        let merge = Box::pin(self.check_sql(p, &pos.source)).await?;
        let check_ms = ms(t1);
        let t1 = Instant::now();
        let after = self.start_point(p, &pos)?;
        // A latest sink follows row changes (their removed rows are retracted); `skip` opts out.
        let policy = match (p.on_row_change, p.mode) {
            (RowChange::Skip, _) => RowChangePolicy::Skip,
            (RowChange::Fail, PipelineMode::Latest) => RowChangePolicy::Retract,
            (RowChange::Fail, _) => RowChangePolicy::Fail,
        };
        let delta = plan::plan(&pos.source, after, policy, &p.name).await?;
        let plan_ms = ms(t1);
        let t1 = Instant::now();
        let mut report = RunReport {
            pipeline: p.name.clone(),
            from_snapshot: after,
            to_snapshot: delta.to,
            source_snapshots: delta.appends.len(),
            files: delta.files.len(),
            rows_in: delta.records(),
            row_changes: delta.row_changes.len(),
            lag_seconds: oldest_unprocessed_age(&pos.source, &delta.appends),
            ..Default::default()
        };
        // Nothing new — except for a first run (`start = "latest"` starts at the current
        // snapshot): it commits its starting position, or every later run would start over.
        let to = match delta.to {
            Some(to) if delta.to != after || pos.checkpoint.is_none() => to,
            _ => return Ok(Attempt::Done(Box::new(report))),
        };
        let files: Vec<LiveFile> = delta
            .files
            .iter()
            .map(|f| LiveFile {
                file: f.file.clone(),
                spec_id: f.spec_id,
                deletes: f.deletes.clone(),
            })
            .collect();
        // The joined tables at their current snapshots, recorded with the output.
        let joined = self.joined(p, true).await?;
        let writer_id = format!("process-{}", uuid::Uuid::now_v7());
        let mut out = Output::new(&pos.sink, &writer_id)?.refusing_renames_of(&pos.source);
        let mut added_deletes = Vec::new();
        let mut delete_specs = HashMap::new();
        let (added, removed, schema) = match p.mode {
            PipelineMode::Append => {
                self.append_rows(p, &pos, &files, &joined, &mut out).await?;
                let (added, schema) = out.close().await?;
                (added, Vec::new(), schema)
            }
            PipelineMode::Aggregate => {
                // Boxed: the run's future stays small (a deep stack of them overflows).
                let removed = match &merge {
                    Some(m) => {
                        Box::pin(self.merge_windows(
                            p,
                            &pos,
                            &files,
                            m,
                            &joined,
                            &mut out,
                            &mut report,
                        ))
                        .await?
                    }
                    None => {
                        Box::pin(self.replace_windows(
                            p,
                            &pos,
                            &files,
                            to,
                            &joined,
                            &mut out,
                            &mut report,
                        ))
                        .await?
                    }
                };
                let (added, schema) = out.close().await?;
                (added, removed, schema)
            }
            PipelineMode::Latest => {
                let retraction = super::retract::Retraction::of(&delta, rebuild_by);
                match Box::pin(self.upsert_latest(
                    p,
                    &pos,
                    &files,
                    retraction,
                    to,
                    &mut report,
                    deadline,
                ))
                .await?
                {
                    Some(f) => {
                        added_deletes = f.added_deletes;
                        delete_specs = f.delete_specs;
                        (f.added, f.removed, f.schema)
                    }
                    None => {
                        return Ok(Attempt::Lost {
                            planned_to: to,
                            from: after,
                            lag_seconds: report.lag_seconds,
                        })
                    }
                }
            }
        };
        report.rows_out = added.iter().map(|f| f.record_count()).sum::<u64>();
        if let Some(alert) = &p.alert {
            report.alerts = self.send_alerts(p, alert, &pos.sink, &added).await?;
        }
        let mut change = sink_change(p, &pos, to, &report, added, removed, schema);
        if !added_deletes.is_empty() {
            // Merge-on-read: the deletes name rows of the sink as planned; a compaction or
            // another writer's deletes since make the commit `Stale` (the run re-plans). Only
            // deletes (every touched key deleted): a `delete`, as Java's row delta says, which
            // Spark's streaming reads can skip (`streaming-skip-delete-snapshots`).
            change.operation = crate::snapshot::row_delta_operation(&change.added, &change.removed);
            change.added_deletes = added_deletes;
            change.spec_ids.extend(delete_specs);
            change.planned_on = Some(pos.sink.metadata().current_snapshot_id());
        }
        // Data files were written with the sink version the run loaded; each delete file with
        // the spec of the data file it deletes from (named above).
        let mut change = change.written_with(pos.sink.metadata().default_partition_spec_id());
        change.properties.extend(joined.properties());
        let work_ms = ms(t1);
        let t1 = Instant::now();
        let lag_seconds = report.lag_seconds;
        let committed = self
            .commit_with_checkpoint(p, &pos, to, change, report, deadline, meter)
            .await;
        tracing::debug!(pipeline = %p.name, position_ms, check_ms, plan_ms, work_ms, commit_ms = ms(t1), "pipeline run phases");
        Ok(match committed? {
            Some(report) => Attempt::Done(Box::new(report)),
            None => Attempt::Lost {
                planned_to: to,
                from: after,
                lag_seconds,
            },
        })
    }

    /// Where this run starts: after the checkpoint (refusing output of another transform
    /// version), or, for a sink without one, after the pipeline's start strategy.
    fn start_point(&self, p: &PipelineConfig, pos: &Position) -> Result<Option<i64>> {
        if let Some(cp) = &pos.checkpoint {
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
            return Ok(Some(cp.snapshot_id));
        }
        // A sink with rows but no checkpoint lost its position (e.g. another engine's
        // snapshots and expiration): starting over would duplicate or skip output.
        if summary::total(pos.sink.metadata(), "total-records") > 0 {
            return Err(Error::new(
                ErrorKind::Stale,
                format!(
                    "pipeline `{}`: sink `{}` has rows but no checkpoint on `{}`; nothing was processed. \
                     Rebuild it with `floe process refresh --pipeline {}`",
                    p.name, p.sink, p.source, p.name
                ),
            ));
        }
        plan::start_after(
            pos.source.metadata(),
            p.start_strategy()
                .map_err(|r| Error::new(ErrorKind::Config, r))?,
        )
    }

    /// Append mode: the SQL over the new rows, one bounded chunk of files at a time.
    async fn append_rows(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        files: &[LiveFile],
        joined: &Joined,
        out: &mut Output,
    ) -> Result<()> {
        let context = format!("pipeline `{}` over `{}`", p.name, p.source);
        for chunk in input::chunks(files) {
            let (schema, rows) = input::read_rows(&pos.source, chunk).await?;
            let (_, batches) =
                transform::run_sql_joined(&p.sql, schema, rows, &joined.relations, &context)
                    .await?;
            out.write(batches).await?;
        }
        Ok(())
    }

    /// Aggregate mode: finds the windows the new rows touch, recomputes them from the source at
    /// `to`, and writes them with the sink's other rows of the files they replace. Returns the
    /// sink files to remove.
    #[allow(clippy::too_many_arguments)]
    async fn replace_windows(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        files: &[LiveFile],
        to: i64,
        joined: &Joined,
        out: &mut Output,
        report: &mut RunReport,
    ) -> Result<Vec<String>> {
        let window = p.window_micros().unwrap_or(60_000_000);
        let time_column = p.time_column(&self.config);
        let (touched, cost) = windows::touched(&pos.source, files, time_column, window).await?;
        report.windows = touched.len();
        (report.delta_files_read, report.delta_bytes_read) = (cost.files, cost.bytes);
        if touched.is_empty() {
            return Ok(Vec::new());
        }
        let (schema, recomputed, cost) =
            windows::read_windows(&pos.source, to, time_column, window, &touched).await?;
        report.rows_recomputed = recomputed.iter().map(|b| b.num_rows() as u64).sum();
        (report.recompute_files_read, report.recompute_bytes_read) = (cost.files, cost.bytes);
        let context = format!("pipeline `{}` over `{}`", p.name, p.source);
        let (output, batches) =
            transform::run_sql_joined(&p.sql, schema, recomputed, &joined.relations, &context)
                .await?;
        windows::require_window_column(&batches, p)?;
        let sink = windows::sink_rows_outside(&pos.sink, &touched).await?;
        report.files_replaced = sink.paths.len();
        report.sink_bytes_replaced = sink.bytes;
        // The SQL's columns first (a widened source column): kept rows are in the old schema.
        out.settle(&output).await?;
        out.write(sink.kept).await?;
        out.write(batches).await?;
        Ok(sink.paths)
    }

    /// Aggregate mode, a decomposable SQL: the SQL over the new rows alone (one bounded chunk of
    /// files at a time) gives the delta's partial aggregates per group; the sink rows of the
    /// windows they touch are read from the sink files that hold them, merged with them (see
    /// `merge.rs`), and written with those files' other rows. Returns the sink files to remove:
    /// exactly the files the merged rows were read from, so a commit onto a sink whose files
    /// changed meanwhile is `Stale` (re-planned), and one whose checkpoint moved is skipped —
    /// a merge is not idempotent, and it is applied once. Reads the delta and the touched
    /// periods' sink files, whatever the windows hold in the source.
    #[allow(clippy::too_many_arguments)]
    async fn merge_windows(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        files: &[LiveFile],
        merge: &Merge,
        joined: &Joined,
        out: &mut Output,
        report: &mut RunReport,
    ) -> Result<Vec<String>> {
        report.merged = true;
        let window = p.window_micros().unwrap_or(60_000_000);
        let time_column = p.time_column(&self.config);
        let context = format!("pipeline `{}` over `{}`", p.name, p.source);
        let mut output = None;
        let mut partials = Vec::new();
        let mut cost = input::ReadCost::default();
        for chunk in input::chunks(files) {
            let (schema, rows, c) = input::read_rows_costed(&pos.source, chunk).await?;
            cost += c;
            let schema = transform::with_window_start(
                &arrow::array::RecordBatch::new_empty(schema),
                time_column,
                window,
            )?
            .schema();
            // Rows without a time belong to no window (as a recompute reads them: never).
            let mut timed = Vec::with_capacity(rows.len());
            for b in rows {
                timed.push(windows::with_window(&b, time_column, window)?);
            }
            let (o, batches) =
                transform::run_sql_joined(&p.sql, schema, timed, &joined.relations, &context)
                    .await?;
            windows::require_window_column(&batches, p)?;
            output = Some(o);
            partials.extend(batches);
        }
        (report.delta_files_read, report.delta_bytes_read) = (cost.files, cost.bytes);
        let touched = merge::partial_windows(&partials, &context)?;
        report.windows = touched.len();
        let Some(output) = output.filter(|_| !touched.is_empty()) else {
            return Ok(Vec::new());
        };
        let sink = windows::sink_rows_split(&pos.sink, &touched).await?;
        report.files_replaced = sink.paths.len();
        report.sink_bytes_replaced = sink.bytes;
        (report.sink_files_read, report.sink_bytes_read) = (sink.read.files, sink.read.bytes);
        let merged = merge
            .merge(&output, sink.inside, partials, &context)
            .await?;
        // The SQL's columns first (a widened source column): kept rows are in the old schema.
        out.settle(&output).await?;
        out.write(sink.kept).await?;
        out.write(merged).await?;
        Ok(sink.paths)
    }

    /// Commits `change` unless the checkpoint moved since `pos` was read (another run processed
    /// this delta: `None`, and this run's files are removed).
    #[allow(clippy::too_many_arguments)]
    async fn commit_with_checkpoint(
        &self,
        p: &PipelineConfig,
        pos: &Position,
        to: i64,
        change: Change,
        mut report: RunReport,
        deadline: Instant,
        meter: &Meter,
    ) -> Result<Option<RunReport>> {
        let mut added = change.added.clone();
        added.extend(change.added_deletes.iter().cloned());
        let expected = pos.checkpoint.as_ref().map(|c| c.snapshot_id);
        let source_uuid = pos.source_uuid.clone();
        let sink_ident = pos.sink.identifier().clone();
        // A latest run's position deletes are guarded by the change itself
        // ([`Change::planned_on`]): a compaction or another writer's deletes since → `Stale`.
        let (pipeline, sink) = (p.name.clone(), p.sink.clone());
        let result = self
            .committer
            .commit_from(&sink_ident, Some(pos.sink.clone()), &self.limits(deadline), metered(meter.clone(), move |t: &Table| {
                let now = summary::read_checkpoint(t.metadata(), &source_uuid).map(|c| c.snapshot_id);
                let refresh = summary::read_refresh(t.metadata(), &source_uuid).map_err(|e| {
                    super::refresh::malformed_position(&pipeline, &sink, e.message())
                })?;
                Ok(if refresh.is_some() {
                    Plan::Skip(Skipped::Obsolete("a refresh of the sink is in progress".into()))
                } else if now != expected {
                    Plan::Skip(Skipped::Obsolete(format!(
                        "the checkpoint moved from {expected:?} to {now:?}: another run processed this delta"
                    )))
                } else {
                    Plan::Apply(change.clone())
                })
            }))
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
                crate::write::delete_uncommitted(&pos.sink, &added).await;
                Ok(None)
            }
            Err(e) if e.kind() == ErrorKind::Stale => {
                // Sink files to replace were compacted meanwhile: redo on the new layout.
                tracing::info!(pipeline = %p.name, error = %e, "sink changed underneath; re-planning");
                crate::write::delete_uncommitted(&pos.sink, &added).await;
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
            let joined = self.joined(p, false).await?;
            let context = format!("pipeline `{}` over `{}`", p.name, p.source);
            let (out, _) =
                transform::run_sql_joined(&p.sql, schema, Vec::new(), &joined.relations, &context)
                    .await?;
            if p.mode == PipelineMode::Aggregate && out.column_with_name(WINDOW_START).is_none() {
                return Err(windows::window_missing(p));
            }
            let latest = match p.mode {
                PipelineMode::Latest => Some(Latest::new(p, &out)?),
                _ => None,
            };
            let schema = arrow_schema_to_schema_auto_assign_ids(&out)
                .map_err(|e| Error::iceberg(format!("sink schema of `{}`", p.name), e))?;
            // An aggregate sink is partitioned by the period of `window_start`, so a run
            // rewrites the files of the periods it touches, not the whole sink.
            let spec = match p.mode {
                PipelineMode::Aggregate => {
                    windows::sink_partition(&schema, p.window_micros().unwrap_or(60_000_000))?
                }
                // A latest sink is partitioned by the key bucket, so a run rewrites the
                // buckets of the keys it touches, not the whole sink.
                PipelineMode::Latest => Some(latest::partition_spec(
                    &schema,
                    &p.keys[0],
                    p.key_buckets(),
                )?),
                PipelineMode::Append => None,
            };
            let creation = TableCreation::builder()
                .name(p.sink.clone())
                .schema(schema)
                .partition_spec_opt(spec)
                .properties(sink_properties(&self.config, p))
                .build();
            catalog::create_if_missing(self.committer.catalog().as_ref(), &ident, creation).await?;
            if let (Some(latest), Some(name)) = (&latest, p.tombstone_table()) {
                self.ensure_tombstones(p, latest, &name).await?;
            }
        } else if let Some(name) = p.tombstone_table() {
            let tt = catalog::table_ident(&self.config, &name)?;
            let exists = self
                .committer
                .catalog()
                .table_exists(&tt)
                .await
                .map_err(|e| {
                    Error::iceberg(format!("checking tombstones {tt}"), e).with_retryable(true)
                })?;
            if !exists {
                let (_, latest) = self.latest_terms(p, source).await?;
                self.ensure_tombstones(p, &latest, &name).await?;
            }
        }
        self.committer.load(&ident).await
    }

    /// Creates a `latest` pipeline's tombstone table: the output's columns and the source
    /// sequence number, bucketed like the sink.
    async fn ensure_tombstones(
        &self,
        p: &PipelineConfig,
        latest: &Latest,
        name: &str,
    ) -> Result<()> {
        let ident = catalog::table_ident(&self.config, name)?;
        let schema = arrow_schema_to_schema_auto_assign_ids(&latest.tombstone_schema())
            .map_err(|e| Error::iceberg(format!("tombstone schema of `{}`", p.name), e))?;
        let spec = latest::partition_spec(&schema, &p.keys[0], p.key_buckets())?;
        let creation = TableCreation::builder()
            .name(name.to_string())
            .schema(schema)
            .partition_spec(spec)
            .properties(sink_properties(&self.config, p))
            .build();
        catalog::create_if_missing(self.committer.catalog().as_ref(), &ident, creation).await
    }
}

/// A new sink's table properties: zstd, the `[defaults]` standards, and the pipeline and
/// source it belongs to.
fn sink_properties(config: &Config, p: &PipelineConfig) -> HashMap<String, String> {
    let mut props = HashMap::from([(
        "write.parquet.compression-codec".to_string(),
        "zstd".to_string(),
    )]);
    props.extend(config.sink_properties());
    props.insert(summary::PIPELINE.to_string(), p.name.clone());
    props.insert(summary::SOURCE_TABLE.to_string(), p.source.clone());
    props
}

/// The sink change of a run: its output files (replacing `removed`, in aggregate mode) with the
/// new checkpoint and the run's counts in the snapshot summary.
fn sink_change(
    p: &PipelineConfig,
    pos: &Position,
    to: i64,
    report: &RunReport,
    added: Vec<DataFile>,
    removed: Vec<String>,
    schema: Option<iceberg::spec::Schema>,
) -> Change {
    let mut props: HashMap<String, String> =
        summary::checkpoint_properties(&pos.source_uuid, to, &pos.hash)
            .into_iter()
            .collect();
    props.insert(summary::PIPELINE.into(), p.name.clone());
    props.insert(summary::ROWS_IN.into(), report.rows_in.to_string());
    props.insert(
        summary::SOURCE_SNAPSHOTS.into(),
        report.source_snapshots.to_string(),
    );
    if p.mode == PipelineMode::Aggregate {
        props.insert(summary::WINDOWS_REPLACED.into(), report.windows.to_string());
    }
    if p.mode == PipelineMode::Latest {
        props.insert(
            summary::KEYS_TOUCHED.into(),
            report.keys_touched.to_string(),
        );
        props.insert(summary::BUCKETS_REPLACED.into(), report.buckets.to_string());
        if report.row_changes > 0 {
            props.insert(summary::ROW_CHANGES.into(), report.row_changes.to_string());
            props.insert(
                summary::BUCKETS_REBUILT.into(),
                report.buckets_rebuilt.to_string(),
            );
        }
    }
    if removed.is_empty() {
        Change {
            schema,
            ..Change::append(added, props)
        }
    } else {
        Change::overwrite(added, removed, props, schema)
    }
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

/// The pipelines of a batch (`None`: not in the config) in waves of indices: a pipeline whose
/// source or joined table is the sink of another of them comes in a later wave than that one.
/// (Config validation refuses cycles; were there one, its members would stop moving after n
/// passes and still run.)
fn waves(configs: &[Option<&PipelineConfig>]) -> Vec<Vec<usize>> {
    let n = configs.len();
    let mut level = vec![0usize; n];
    // The longest chain within the batch: at most n passes settle it.
    for _ in 0..n {
        let mut moved = false;
        for (i, p) in configs.iter().enumerate() {
            let Some(p) = p else { continue };
            let reads = |t: &String| *t == p.source || p.joins.contains(t);
            let after = configs
                .iter()
                .enumerate()
                .filter(|(j, u)| *j != i && u.is_some_and(|u| reads(&u.sink)))
                .map(|(j, _)| level[j] + 1)
                .max()
                .unwrap_or(0)
                .min(n);
            if after > level[i] {
                level[i] = after;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let mut waves: Vec<Vec<usize>> = vec![Vec::new(); level.iter().max().map_or(0, |m| m + 1)];
    for (i, l) in level.into_iter().enumerate() {
        waves[l].push(i);
    }
    waves.retain(|w| !w.is_empty());
    waves
}

/// The time a batch keeps for each pipeline after the running one.
const RESERVE_PER_PIPELINE: Duration = Duration::from_secs(20);

/// When a run's rebuild must stop (`deadline` being the batch's) so that the `later` pipelines
/// of its batch still run: [`RESERVE_PER_PIPELINE`] each, at most half of the time left.
fn rebuild_by(now: Instant, deadline: Instant, later: usize) -> Instant {
    let left = deadline.saturating_duration_since(now);
    let reserve = RESERVE_PER_PIPELINE
        .saturating_mul(u32::try_from(later).unwrap_or(u32::MAX))
        .min(left / 2);
    now + (left - reserve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_reading_another_sink_runs_in_a_later_wave() {
        let cfg = Config::parse(
            r#"
[catalog]
kind = "sqlite"
warehouse = "/tmp/w"
[[tables]]
name = "orders"
columns = [{ name = "id", type = "string" }, { name = "t", type = "timestamptz" }]
event_time = "t"
[[tables]]
name = "customers"
columns = [{ name = "id", type = "string" }, { name = "t", type = "timestamptz" }]
event_time = "t"
[[pipelines]]
name = "c"
mode = "append"
source = "b_out"
sink = "c_out"
sql = "SELECT * FROM source"
[[pipelines]]
name = "a"
mode = "append"
source = "orders"
sink = "a_out"
sql = "SELECT * FROM source"
[[pipelines]]
name = "b"
mode = "append"
source = "orders"
sink = "b_out"
joins = ["a_out"]
sql = "SELECT * FROM source"
[[pipelines]]
name = "d"
mode = "append"
source = "customers"
sink = "d_out"
sql = "SELECT * FROM source"
"#,
            "f.toml",
        )
        .expect("config");
        let of = |names: &[&str]| -> Vec<Vec<usize>> {
            let ps: Vec<_> = names.iter().map(|n| cfg.pipeline(n)).collect();
            waves(&ps)
        };
        // c reads b's sink, b joins a's: three waves; d reads neither, beside a.
        assert_eq!(
            of(&["c", "a", "b", "d"]),
            vec![vec![1, 3], vec![2], vec![0]]
        );
        // Only what is in the batch orders it: without a, b and c come first.
        assert_eq!(of(&["c", "b", "d"]), vec![vec![1, 2], vec![0]]);
        // Unknown names run (and fail) in the first wave.
        assert_eq!(of(&["x", "d"]), vec![vec![0, 1]]);
        let ps = vec![cfg.pipeline("a"), None, cfg.pipeline("c")];
        assert_eq!(waves(&ps), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn a_rebuild_leaves_time_for_the_pipelines_after_it() {
        let now = Instant::now();
        let at = |secs| now + Duration::from_secs(secs);
        assert_eq!(
            rebuild_by(now, at(300), 0),
            at(300),
            "the last one: all of it"
        );
        assert_eq!(
            rebuild_by(now, at(300), 2),
            at(260),
            "20 s for each later one"
        );
        assert_eq!(rebuild_by(now, at(300), 40), at(150), "at most half");
        assert_eq!(rebuild_by(now, now, 3), now, "past: none");
    }
}
