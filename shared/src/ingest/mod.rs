//! Ingest: one landed object → decoded, validated rows → Parquet data files → one exactly-once commit.
//!
//! Data path: the object is streamed (never held whole) through decompression and decoding on a
//! blocking thread; batches cross a small bounded channel to the writer, which adds `_ingested_at`
//! and `_source`, splits by partition and rolls Parquet files at the target size. Bad records are
//! spooled to a local file and uploaded as one quarantine object. Finally [`crate::commit`] adds
//! the files in one snapshot whose summary names the object, unless it was committed already
//! ([`dedup`]).

pub mod backfill;
mod batch;
mod consumer_gate;
pub(crate) mod dedup;
mod recent_keys;
pub mod replay;
mod report;
mod rows;

pub use report::{ObjectReport, QualityCount, Status};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use iceberg::spec::PrimitiveType;
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use serde_json::json;

use crate::catalog;
use crate::commit::{metered, CommitLimits, Committer, Outcome, Skipped, SourceObject};
use crate::config::{Config, RouteConfig, SchemaPolicy, TableConfig};
use crate::decode::{self};
use crate::error::{Error, ErrorKind, Result};
use crate::event::{self, ObjectRef};
use crate::requests::{Meter, Requests};
use crate::snapshot::Change;
use crate::store::{ObjectStore, Version};
use crate::summary::{Usage, FUNCTION_INGEST};
pub use crate::write::writer_properties;
use report::{commit_detail, commit_summary, report_written};
use rows::{write_object, WriteFailure, WriteParams, Written};

/// An object decoded, written and quarantined, ready for its commit.
struct Prepared {
    obj: ObjectRef,
    uri: String,
    ident: TableIdent,
    /// The table version the duplicate check and the write were based on.
    table: Table,
    source: SourceObject,
    writer_id: String,
    written: Written,
    evolved: Option<(iceberg::spec::Schema, String)>,
    /// The snapshot the early duplicate check proved absence for.
    proven: Option<i64>,
    report: ObjectReport,
    started: Instant,
    /// What preparing it used, from its open: its commit records it, plus the commit's own.
    prepared: Usage,
}

/// What [`Ingestor::prepare`] leaves.
#[allow(clippy::large_enum_variant)] // one short-lived value per object
enum Stage {
    /// Nothing to commit (refused, gone, duplicate, unreadable, all quarantined).
    Done(ObjectReport),
    /// Written: commit it.
    Ready(Box<Prepared>),
}

/// Per-table state kept across invocations: the loaded table's schema and writer settings.
struct TableCtx {
    pub(super) ident: TableIdent,
    pub(super) cfg: TableConfig,
}

/// The ingest service: built once per Lambda container (clients, config), used per event.
pub struct Ingestor {
    config: Arc<Config>,
    committer: Committer,
    store: Arc<dyn ObjectStore>,
    tables: HashMap<String, TableCtx>,
    notifier: Option<crate::notify::Notifier>,
    hash_key: Option<Vec<u8>>,
    /// Consumer plans, cached per evolved schema ([`consumer_gate`]).
    planner: crate::consumers::Planner,
}

/// Result of handling one Lambda payload.
#[derive(Debug, Default)]
pub struct PayloadResult {
    /// Whether the payload was an SQS batch (answer with partial failures).
    pub is_sqs: bool,
    /// SQS message ids to retry.
    pub failed_message_ids: Vec<String>,
    /// One report per object handled.
    pub reports: Vec<ObjectReport>,
    /// Errors, each with the object or message it concerns.
    pub errors: Vec<String>,
}

/// What became of one delivery (an SQS message, or the whole event).
#[derive(Debug)]
pub(crate) struct DeliveryOutcome {
    /// The SQS message id, when there is one.
    pub(crate) message_id: Option<String>,
    /// Why the delivery could not be understood (then it names no object).
    pub(crate) unparsed: Option<Error>,
    /// The objects it names, in order, each with its report or error.
    pub(crate) objects: Vec<(ObjectRef, Result<ObjectReport>)>,
}

impl Ingestor {
    /// Connects the catalog and store named by the config and creates missing tables.
    pub async fn new(config: Config) -> Result<Self> {
        // Every request counted, landing objects and table files alike: the cost baseline.
        let requests = Requests::new();
        let catalog = catalog::connect_counted(&config, Some(&requests)).await?;
        let swap = crate::catalog::pointer_swap(&config).await?;
        let store = crate::store::from_config_counted(&config.storage, Some(&requests)).await;
        let notifier = crate::notify::Notifier::from_config(&config).await;
        let committer = Committer::new(catalog, swap).with_requests(requests);
        let mut me = Self::with_parts(config, committer, store).await?;
        me.notifier = notifier;
        Ok(me)
    }

    /// Builds from explicit parts (tests, the CLI).
    pub async fn with_parts(
        config: Config,
        committer: Committer,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Self> {
        // Only the routed tables: the ones this function writes (and its role names).
        catalog::ensure_tables(committer.catalog().as_ref(), &config, |t| {
            config.routes.iter().any(|r| r.table == t.name)
        })
        .await?;
        let hash_key = crate::protect::load_key(&config).await?;
        let mut tables = HashMap::new();
        for t in &config.tables {
            tables.insert(
                t.name.clone(),
                TableCtx {
                    ident: catalog::table_ident(&config, &t.name)?,
                    cfg: t.clone(),
                },
            );
        }
        Ok(Self {
            config: Arc::new(config),
            committer,
            store,
            tables,
            notifier: None,
            hash_key,
            planner: Default::default(),
        })
    }

    /// The catalog in use.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        self.committer.catalog()
    }

    /// The object store in use.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A meter for ingest work starting now (this function's memory, its request counters).
    pub(super) fn meter(&self) -> Meter {
        Meter::start(
            FUNCTION_INGEST,
            self.config.cost.memory_mb(FUNCTION_INGEST),
            self.committer.requests(),
        )
    }

    /// A meter for a commit starting now, carrying `prepared` (what preparing its objects used),
    /// in a scope of its own: the commits of different tables run side by side, and each one's
    /// snapshot records its own requests only.
    pub(super) fn commit_meter(&self, prepared: Usage) -> Meter {
        self.meter().scoped_carrying(prepared)
    }

    /// Handles a whole Lambda payload (direct S3, SQS batch, EventBridge).
    pub async fn handle_payload(
        &self,
        payload: &serde_json::Value,
        deadline: Instant,
    ) -> PayloadResult {
        let meter = self.meter();
        let result = Box::pin(self.handle_payload_unmetered(payload, deadline)).await;
        emit_payload_usage(&meter, &result.reports);
        result
    }

    async fn handle_payload_unmetered(
        &self,
        payload: &serde_json::Value,
        deadline: Instant,
    ) -> PayloadResult {
        let mut result = PayloadResult::default();
        let deliveries = match event::parse_payload(payload) {
            Ok(d) => d,
            Err(e) => {
                result.errors.push(e.to_string());
                return result;
            }
        };
        result.is_sqs = deliveries.iter().any(|d| d.message_id.is_some());
        for delivery in Box::pin(self.ingest_deliveries(deliveries, deadline)).await {
            let label = delivery
                .message_id
                .clone()
                .unwrap_or_else(|| "event".into());
            let mut failed = false;
            if let Some(e) = &delivery.unparsed {
                tracing::error!(message = %label, error = %e, "cannot parse message; leaving it for retry and the DLQ");
                result.errors.push(format!("message {label}: {e}"));
                failed = true;
            }
            for (obj, outcome) in delivery.objects {
                match outcome {
                    Ok(report) => {
                        report.emit();
                        result.reports.push(report);
                    }
                    Err(e) => {
                        tracing::error!(object = %obj.uri(), error = %e, retryable = e.is_retryable(), "ingest failed");
                        result.errors.push(format!("{}: {e}", obj.uri()));
                        failed = true;
                    }
                }
            }
            if let (true, Some(id)) = (failed, delivery.message_id) {
                result.failed_message_ids.push(id);
            }
        }
        result
    }

    /// Ingests the objects of `deliveries` together (objects of one table commit together, each
    /// keeping its own report) and sends one commit event per new snapshot. Each delivery gets
    /// back its objects, in order, with their outcomes: the Lambda handler and the DLQ replay
    /// ([`replay`]) decide from these which messages are settled.
    pub(crate) async fn ingest_deliveries(
        &self,
        deliveries: Vec<event::Delivery>,
        deadline: Instant,
    ) -> Vec<DeliveryOutcome> {
        let mut objects = Vec::new();
        let mut owners = Vec::new();
        let mut out = Vec::with_capacity(deliveries.len());
        for (d, delivery) in deliveries.into_iter().enumerate() {
            let mut settled = DeliveryOutcome {
                message_id: delivery.message_id,
                unparsed: None,
                objects: Vec::new(),
            };
            match delivery.objects {
                Err(e) => settled.unparsed = Some(e),
                Ok(objs) => {
                    for obj in objs {
                        objects.push(obj);
                        owners.push(d);
                    }
                }
            }
            out.push(settled);
        }
        let outcomes = Box::pin(self.ingest_batch(&objects, deadline)).await;
        for ((obj, d), outcome) in objects.into_iter().zip(owners).zip(outcomes) {
            out[d].objects.push((obj, outcome));
        }
        if let Some(n) = &self.notifier {
            // One event per commit, however many objects it holds.
            let reports = out
                .iter()
                .flat_map(|d| d.objects.iter())
                .filter_map(|(_, r)| r.as_ref().ok());
            for detail in commit_details(reports) {
                n.commit(&detail).await;
            }
        }
        out
    }

    /// Ingests one object. Unreadable content is quarantined (Ok); failures that a retry can fix
    /// are errors marked retryable.
    pub async fn ingest(&self, obj: &ObjectRef, deadline: Instant) -> Result<ObjectReport> {
        // A schema that moved differently under a schema-changing object (another object took the
        // new column id) makes the written files unusable: write the object again on the new base.
        let mut tries = 0;
        loop {
            tries += 1;
            match Box::pin(self.ingest_once(obj, deadline)).await {
                Err(e)
                    if e.kind() == ErrorKind::Stale && tries < 3 && Instant::now() < deadline =>
                {
                    tracing::info!(object = %obj.uri(), error = %e, "rewriting the object on the new schema");
                }
                other => return other,
            }
        }
    }

    /// One attempt: everything up to the commit ([`Ingestor::prepare`]), then the commit.
    async fn ingest_once(&self, obj: &ObjectRef, deadline: Instant) -> Result<ObjectReport> {
        match Box::pin(self.prepare(obj)).await? {
            Stage::Done(r) => Ok(r),
            Stage::Ready(p) => Box::pin(self.commit_one(*p, deadline, None)).await,
        }
    }

    /// Route, open the named version, stop early on a duplicate, write the rows (evolving the
    /// schema when the policy allows), quarantine what does not fit: an object ready to commit,
    /// or its final report. Either way its report's compute share is the preparation's time.
    async fn prepare(&self, obj: &ObjectRef) -> Result<Stage> {
        let started = Instant::now();
        let mut stage = Box::pin(self.prepare_stage(obj)).await?;
        match &mut stage {
            Stage::Done(r) => r.compute_ms = started.elapsed().as_millis() as u64,
            Stage::Ready(p) => p.report.compute_ms = p.prepared.compute_ms,
        }
        Ok(stage)
    }

    async fn prepare_stage(&self, obj: &ObjectRef) -> Result<Stage> {
        let started = Instant::now();
        let meter = self.meter();
        let uri = obj.uri();
        let (route, tctx) = match self.route(obj)? {
            Ok(routed) => routed,
            Err(refused) => return Ok(Stage::Done(refused)),
        };
        // Exactly the version the event names (its version id, else its ETag as a precondition):
        // the identity recorded is always that of the content read.
        let opened = match self.open_named(obj, &route).await? {
            Ok(opened) => opened,
            Err(gone) => return Ok(Stage::Done(gone)),
        };
        let read = Version::of(&opened.meta);
        let source = source_object(obj, &opened.meta);
        let skew = Duration::from_secs(self.config.ingest.dedup_skew_seconds);

        let table = self.committer.load(&tctx.ident).await?;
        // Early exit for duplicates (the commit re-checks the versions landing meanwhile): the
        // summaries, or the rows' `_source` once the summaries that could hold it were expired.
        let proven = match dedup::check(&table, &source, skew.as_millis() as i64).await? {
            Ok(found) => {
                let mut r = ObjectReport::new(uri, &route.table, Status::Duplicate);
                r.snapshot_id = Some(found.snapshot_id);
                r.millis = started.elapsed().as_millis() as u64;
                return Ok(Stage::Done(r));
            }
            Err(proven) => proven,
        };

        let writer_id = uuid::Uuid::now_v7().to_string();
        let source_id = source.id();
        let params = WriteParams {
            uri: &uri,
            source_id: &source_id,
            writer_id: &writer_id,
            ingested_at: Utc::now(),
            chunk_records: self.config.ingest.chunk_records,
            late_after_seconds: self.config.ingest.late_after_seconds,
            allow_unknown: tctx.cfg.schema_policy != SchemaPolicy::Strict,
            hash_key: self.hash_key.as_deref(),
            limits: decode::Limits::from(&self.config.ingest),
            max_quarantine_bytes: self.config.ingest.max_quarantine_bytes,
            defer_quarantine_limit: tctx.cfg.schema_policy == SchemaPolicy::Additive,
            object_size: Some(opened.meta.size).filter(|s| *s > 0),
            reason_note: None,
            refused: None,
            max_unique_keys: self.config.ingest.max_unique_keys,
        };
        // A contract that flags needs `_quality`, and its checks the columns they read: a table
        // created before (or before the config declared them) gets them in this object's commit
        // (written with them, committed with the data like any evolution).
        let quality_column = crate::schema::with_contract_columns(
            table.metadata().current_schema(),
            table.metadata().last_column_id(),
            &tctx.cfg,
        )?;
        let write_table = match &quality_column {
            Some((schema, _)) => crate::write::with_schema(&table, schema.clone())?,
            None => table.clone(),
        };
        let (written, evolved) = self
            .write_evolving(obj, &write_table, tctx, &route, opened, &read, &params)
            .await?;
        let mut written = match written {
            Ok(w) => w,
            Err(WriteFailure::Unreadable(reason)) => {
                let mut r = self
                    .quarantine_whole(obj, &route, &source.version, reason)
                    .await?;
                r.millis = started.elapsed().as_millis() as u64;
                return Ok(Stage::Done(r));
            }
            Err(WriteFailure::Contract(reason, counts)) => {
                let mut r = self
                    .quarantine_whole(obj, &route, &source.version, reason)
                    .await?;
                r.status = Status::ContractFailed;
                r.quality = report::quality_counts(&counts);
                r.contract_version = Some(tctx.cfg.contract_version());
                r.millis = started.elapsed().as_millis() as u64;
                tracing::warn!(object = %r.object, reason = ?r.reason, "data-quality contract failed; object refused and quarantined whole");
                return Ok(Stage::Done(r));
            }
            Err(WriteFailure::Error(e)) => return Err(e),
        };

        let mut r = report_written(&uri, &route, tctx, &written, evolved.as_ref())?;
        // The schema committed: the input's evolution (built on the `_quality` one, if any),
        // else the `_quality` column alone.
        let evolved = match (evolved, quality_column) {
            (Some((schema, what)), Some((_, quality))) => {
                Some((schema, format!("{quality}; {what}")))
            }
            (evolved, quality) => evolved.or(quality),
        };
        r.schema_change = evolved.as_ref().map(|(_, what)| what.clone());
        if let Some(spool) = written.quarantine_spool.take() {
            let key = self.quarantine_key(&route, obj, &source.version, "jsonl");
            r.quarantine = Some(self.upload_quarantine(obj, &key, spool).await?);
        }
        if written.files.is_empty() {
            r.status = Status::AllQuarantined;
            r.millis = started.elapsed().as_millis() as u64;
            return Ok(Stage::Done(r));
        }
        Ok(Stage::Ready(Box::new(Prepared {
            obj: obj.clone(),
            uri,
            ident: tctx.ident.clone(),
            table,
            source,
            writer_id,
            written,
            evolved,
            proven,
            report: r,
            started,
            prepared: meter.usage(),
        })))
    }

    /// Commits one prepared object in its own snapshot (its schema change included), from
    /// `base` when given (a version newer than the one it was prepared on), else from that one.
    /// The snapshot records the object's preparation and this commit, nothing else.
    async fn commit_one(
        &self,
        p: Prepared,
        deadline: Instant,
        base: Option<Table>,
    ) -> Result<ObjectReport> {
        let Prepared {
            uri,
            ident,
            table,
            source,
            writer_id,
            written,
            evolved,
            proven,
            report: mut r,
            started,
            prepared,
            ..
        } = p;
        let mut change = Change::append(
            written.files.clone(),
            commit_summary(&r, evolved.as_ref(), &uri),
        )
        .written_with(table.metadata().default_partition_spec_id());
        change.schema = evolved.as_ref().map(|(s, _)| s.clone());
        let limits = self.commit_limits(deadline);
        let meter = self.commit_meter(prepared);
        let plan = metered(
            meter.clone(),
            dedup::append_once_plan(&source, &writer_id, change, limits.skew, proven),
        );
        let base = base.unwrap_or_else(|| table.clone());
        let commit_started = Instant::now();
        let outcome = meter
            .run(
                self.committer
                    .commit_from(&ident, Some(base), &limits, plan),
            )
            .await;
        settle_commit(&mut r, outcome, &table, &written, &writer_id).await?;
        r.millis = started.elapsed().as_millis() as u64;
        // Its preparation's share (set by `prepare`) plus the whole commit: its own.
        r.compute_ms += commit_started.elapsed().as_millis() as u64;
        Ok(r)
    }

    /// Opens the object again for a second pass, pinned to the version read first: an overwrite
    /// in between must not put other content under this identity. A mismatch is retryable: the
    /// redelivery starts over.
    pub(super) async fn reopen_pinned(
        &self,
        obj: &ObjectRef,
        read: &Version,
    ) -> Result<crate::store::OpenedObject> {
        self.store
            .open(&obj.bucket, &obj.key, read)
            .await
            .map_err(|e| {
                if e.kind() == ErrorKind::Superseded {
                    Error::new(
                        ErrorKind::Superseded,
                        format!("{} changed between its two reads; not committed", obj.uri()),
                    )
                    .with_retryable(true)
                    .with_source(e)
                } else {
                    e
                }
            })
    }

    /// The limits of an ingest commit. The commit window starts now, whatever decoding and
    /// writing took (bounded by the Lambda's own deadline): a large object must not reach its
    /// commit with no time left.
    fn commit_limits(&self, deadline: Instant) -> CommitLimits {
        CommitLimits {
            max_attempts: self.config.ingest.max_commit_attempts,
            deadline: deadline.min(
                Instant::now() + Duration::from_secs(self.config.ingest.commit_timeout_seconds),
            ),
            skew: Duration::from_secs(self.config.ingest.dedup_skew_seconds),
        }
    }

    /// The route and table of `obj`; `Err` holds the report of an object outside every route.
    #[allow(clippy::type_complexity)]
    fn route(
        &self,
        obj: &ObjectRef,
    ) -> Result<std::result::Result<(RouteConfig, &TableCtx), ObjectReport>> {
        let Some(route) = self.config.route(&obj.bucket, &obj.key).cloned() else {
            let mut r = ObjectReport::new(obj.uri(), "", Status::Unrouted);
            r.reason = Some(format!(
                "no route covers bucket `{}` key `{}`",
                obj.bucket, obj.key
            ));
            tracing::warn!(object = %r.object, "refusing object outside every route");
            return Ok(Err(r));
        };
        let tctx = self.tables.get(&route.table).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("route to unknown table `{}`", route.table),
            )
        })?;
        Ok(Ok((route, tctx)))
    }

    /// Opens the version `obj`'s event names; `Err` holds the report of an object that is gone
    /// (deleted, or overwritten since: the newer content has its own event).
    async fn open_named(
        &self,
        obj: &ObjectRef,
        route: &RouteConfig,
    ) -> Result<std::result::Result<crate::store::OpenedObject, ObjectReport>> {
        match self
            .store
            .open(&obj.bucket, &obj.key, &Version::named_by(obj))
            .await
        {
            Ok(o) => Ok(Ok(o)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let mut r = ObjectReport::new(obj.uri(), &route.table, Status::Missing);
                r.reason = Some(e.to_string());
                Ok(Err(r))
            }
            Err(e) if e.kind() == ErrorKind::Superseded => {
                let mut r = ObjectReport::new(obj.uri(), &route.table, Status::Superseded);
                r.reason = Some(e.to_string());
                tracing::info!(object = %r.object, reason = ?r.reason, "object overwritten since its event; the newer content has its own");
                Ok(Err(r))
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the object's rows; under the additive policy, new fields (and widenings) evolve
    /// the schema in the same commit as the data that brought them: the object is written again
    /// with the evolved schema (rare: only objects that change the schema pay for a second read,
    /// pinned to the version read first).
    #[allow(clippy::too_many_arguments)]
    async fn write_evolving(
        &self,
        obj: &ObjectRef,
        table: &Table,
        tctx: &TableCtx,
        route: &RouteConfig,
        opened: crate::store::OpenedObject,
        read: &Version,
        params: &WriteParams<'_>,
    ) -> Result<(
        std::result::Result<Written, WriteFailure>,
        Option<(iceberg::spec::Schema, String)>,
    )> {
        let uri = params.uri;
        let written = write_object(table, tctx, route, opened.body, params).await;
        // New fields no column may be made of (a limit, a name): their records are quarantined.
        let mut refused = BTreeMap::new();
        let evolved = match &written {
            Ok(w) if tctx.cfg.schema_policy == SchemaPolicy::Additive => {
                let ingest = &self.config.ingest;
                refused = crate::evolve::refuse_new_columns(
                    table.metadata(),
                    &w.unknown,
                    ingest.max_new_columns,
                    ingest.max_columns,
                );
                let admitted: BTreeMap<String, Option<PrimitiveType>> = w
                    .unknown
                    .iter()
                    .filter(|(name, _)| !refused.contains_key(*name))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let bound = crate::evolve::partition_bound_widenings(table.metadata(), &w.widen);
                if !bound.is_empty() {
                    // Their values that need the wider type are quarantined as out of range.
                    tracing::warn!(object = %uri, table = %tctx.ident, refused = ?bound.values().collect::<Vec<_>>(), "widening refused");
                }
                crate::evolve::evolve_ingest_schema(table.metadata(), &admitted, &w.widen).map_err(
                    |e| Error::iceberg(format!("evolving the schema of {}", tctx.ident), e),
                )?
            }
            _ => None,
        };
        let first = match &written {
            Ok(first) if evolved.is_some() || !refused.is_empty() => first,
            _ => {
                // No second pass: a deferred quarantine limit applies now.
                if let Ok(w) = &written {
                    if w.quarantine_over_limit {
                        crate::write::delete_uncommitted(table, &w.files).await;
                        return Err(rows::quarantine_limit(uri, params.max_quarantine_bytes));
                    }
                }
                return Ok((written, evolved));
            }
        };
        if !refused.is_empty() {
            tracing::warn!(object = %uri, table = %tctx.ident, refused = ?refused.keys().collect::<Vec<_>>(), "new fields not added as columns; their records are quarantined");
        }
        crate::write::delete_uncommitted(table, &first.files).await;
        let target = match &evolved {
            Some((schema, what)) => {
                tracing::info!(object = %uri, table = %tctx.ident, change = %what, "input evolves the table schema");
                // A change that would break a pipeline reading the table follows
                // `on_consumer_break`.
                if let Some(refusal) = self.consumer_refusal(tctx, table, schema, what).await? {
                    let proposed = consumer_gate::Proposed {
                        unknown: first
                            .unknown
                            .iter()
                            .filter(|(name, _)| !refused.contains_key(*name))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                        widen: first.widen.clone(),
                    };
                    drop(written);
                    return self
                        .without_change(
                            obj, table, tctx, route, read, params, refusal, &proposed, refused,
                        )
                        .await;
                }
                crate::write::with_schema(table, schema.clone())?
            }
            None => table.clone(),
        };
        // Pinned to the version read first: an overwrite in between must not put other
        // content under this identity. A mismatch is retryable: the redelivery starts over.
        let reopened = self.reopen_pinned(obj, read).await?;
        // The second pass is final: the quarantine limit applies as it goes.
        let second = WriteParams {
            defer_quarantine_limit: false,
            refused: Some(&refused).filter(|r| !r.is_empty()),
            ..*params
        };
        drop(written);
        let mut written = write_object(&target, tctx, route, reopened.body, &second).await;
        if let Ok(w) = &mut written {
            // Refused, not ignored: their values' records are quarantined, not reported dropped.
            w.unknown.retain(|name, _| !refused.contains_key(name));
        }
        Ok((written, evolved))
    }

    /// Quarantines an object that cannot be read at all (acknowledged: it would fail forever).
    async fn quarantine_whole(
        &self,
        obj: &ObjectRef,
        route: &RouteConfig,
        version: &str,
        reason: String,
    ) -> Result<ObjectReport> {
        let uri = obj.uri();
        let key = self.quarantine_key(route, obj, version, "error.json");
        let bucket = self.quarantine_bucket(obj);
        let doc = json!({"source": uri, "version": version, "table": route.table,
            "error": reason, "quarantined_at": Utc::now().to_rfc3339()});
        self.store
            .put(
                &bucket,
                &key,
                serde_json::to_vec_pretty(&doc).unwrap_or_default(),
            )
            .await?;
        let mut r = ObjectReport::new(uri, &route.table, Status::Unreadable);
        r.reason = Some(reason);
        r.quarantine = Some(format!("s3://{bucket}/{key}"));
        tracing::warn!(object = %r.object, reason = ?r.reason, "object unreadable; quarantined whole");
        Ok(r)
    }

    /// Uploads the spooled rejected records as one quarantine object; its URI.
    async fn upload_quarantine(
        &self,
        obj: &ObjectRef,
        key: &str,
        spool: rows::SpoolFile,
    ) -> Result<String> {
        let bucket = self.quarantine_bucket(obj);
        // Streamed from the spool file: its size is bounded by max_quarantine_bytes, not memory.
        // The file is removed when `spool` drops, whatever the upload's outcome.
        self.store.put_file(&bucket, key, spool.path()).await?;
        Ok(format!("s3://{bucket}/{key}"))
    }

    fn quarantine_bucket(&self, obj: &ObjectRef) -> String {
        self.config
            .ingest
            .quarantine_bucket
            .clone()
            .unwrap_or_else(|| obj.bucket.clone())
    }

    /// Deterministic, so a redelivery rewrites the same object instead of adding another.
    fn quarantine_key(
        &self,
        route: &RouteConfig,
        obj: &ObjectRef,
        version: &str,
        ext: &str,
    ) -> String {
        let v: String = version
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        format!(
            "{}{}/{}.{}.{}",
            self.config.ingest.quarantine_prefix, route.table, obj.key, v, ext
        )
    }
}

/// The payload's usage as metrics: the whole payload's (GB-seconds, requests by kind), and each
/// table's GB-seconds ([`payload_usage`]).
fn emit_payload_usage(meter: &Meter, reports: &[ObjectReport]) {
    let (total, tables) = payload_usage(meter.usage(), reports);
    crate::metrics::emit_usage(&[], &total);
    for (table, u) in &tables {
        crate::metrics::emit_usage(&[("Table", table)], u);
    }
}

/// The invocation's usage, and each table's: the compute shares of its objects' reports (each
/// object's own preparation and its share of its commit, never another's time). The commits of
/// different tables run side by side, so their shares can add up to more than the time that
/// passed: then every table's is scaled down alike, and together they are at most the
/// invocation's.
fn payload_usage(total: Usage, reports: &[ObjectReport]) -> (Usage, Vec<(&str, Usage)>) {
    let mut per_table: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in reports.iter().filter(|r| !r.table.is_empty()) {
        *per_table.entry(r.table.as_str()).or_default() += r.compute_ms;
    }
    let sum: u64 = per_table.values().sum();
    let scale = |ms: u64| match sum > total.compute_ms {
        true => (ms as u128 * total.compute_ms as u128 / sum as u128) as u64,
        false => ms,
    };
    let tables = per_table
        .into_iter()
        .map(|(table, ms)| {
            let u = Usage {
                compute_ms: scale(ms),
                s3: None,
                ..total.clone()
            };
            (table, u)
        })
        .collect();
    (total, tables)
}

/// The durable identity of the content `meta` describes: its version id, else its ETag.
fn source_object(obj: &ObjectRef, meta: &crate::store::ObjectMeta) -> SourceObject {
    SourceObject {
        bucket: obj.bucket.clone(),
        key: obj.key.clone(),
        version: meta.version_id.clone().unwrap_or_else(|| meta.etag.clone()),
        modified_ms: meta.last_modified.timestamp_millis(),
    }
}

/// The commit events of a payload: one per new snapshot, from the reports of the objects it
/// committed (in payload order).
fn commit_details<'a>(
    reports: impl IntoIterator<Item = &'a ObjectReport>,
) -> Vec<serde_json::Value> {
    let mut commits: Vec<((&str, i64), Vec<&ObjectReport>)> = Vec::new();
    for r in reports {
        let (Status::Committed, Some(snap)) = (r.status, r.snapshot_id) else {
            continue;
        };
        let key = (r.table.as_str(), snap);
        match commits.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(r),
            None => commits.push((key, vec![r])),
        }
    }
    commits
        .iter()
        .map(|(_, members)| commit_detail(members))
        .collect()
}

/// Records the commit's outcome in `r`. Files are deleted only when no commit can reference
/// them (another delivery won, or the schema moved: `Stale`); after an unknown outcome they are
/// kept (unreferenced ones are left to orphan cleanup).
async fn settle_commit(
    r: &mut ObjectReport,
    outcome: Result<Outcome>,
    table: &Table,
    written: &Written,
    writer_id: &str,
) -> Result<()> {
    match outcome {
        Ok(Outcome::Committed {
            snapshot_id,
            attempts,
            ..
        }) => {
            r.snapshot_id = snapshot_id;
            r.attempts = attempts;
            if let Some(hi) = written.et_max {
                r.freshness_seconds = Some((Utc::now().timestamp_micros() - hi) as f64 / 1e6);
            }
            Ok(())
        }
        Ok(Outcome::Skipped(Skipped::AlreadyCommitted(found)))
            if found.writer_id.as_deref() == Some(writer_id) =>
        {
            // Our own commit whose answer was lost: the rows are ours and in the table.
            r.snapshot_id = Some(found.snapshot_id);
            Ok(())
        }
        Ok(Outcome::Skipped(skipped)) => {
            // Another delivery won: our files are referenced by nothing and can go now, and this
            // report adds nothing (the winner's counted the rows and the quarantine).
            *r = report::nothing_added(r.clone());
            r.status = Status::Duplicate;
            if let Skipped::AlreadyCommitted(found) = skipped {
                r.snapshot_id = Some(found.snapshot_id);
            }
            crate::write::delete_uncommitted(table, &written.files).await;
            Ok(())
        }
        // Stale: nothing was committed and these files can never be (wrong schema ids).
        Err(e) if e.kind() == ErrorKind::Stale => {
            crate::write::delete_uncommitted(table, &written.files).await;
            Err(e)
        }
        // The outcome may be unknown (a lost answer): never delete files that might be
        // referenced; unreferenced ones are left to orphan cleanup.
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    /// A local world: SQLite catalog, file warehouse, a local landing bucket `input` whose `a/`
    /// goes to `orders` and `b/` to `orders_b`.
    fn local_config(dir: &Path) -> Config {
        let text = format!(
            "[catalog]\nkind = \"sqlite\"\nuri = \"{w}/catalog.db\"\nwarehouse = \"{w}/warehouse\"\nnamespace = \"usage\"\n\n\
             [storage]\nlocal_root = \"{w}/inputs\"\n\n\
             [[routes]]\nbucket = \"input\"\nprefix = \"a/\"\ntable = \"orders\"\nformat = \"jsonl\"\n\n\
             [[routes]]\nbucket = \"input\"\nprefix = \"b/\"\ntable = \"orders_b\"\nformat = \"jsonl\"\n{a}{b}",
            w = dir.display(),
            a = crate::sample::ORDERS_TABLE_TOML,
            b = crate::sample::ORDERS_TABLE_TOML.replace("name = \"orders\"", "name = \"orders_b\""),
        );
        Config::parse(&text, "usage test").expect("config")
    }

    /// A direct S3 event naming `keys` of bucket `input`.
    fn s3_event(keys: &[&str]) -> Value {
        let records: Vec<Value> = keys
            .iter()
            .map(|k| {
                json!({"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                    "s3": {"bucket": {"name": "input"}, "object": {"key": k}}})
            })
            .collect();
        json!({ "Records": records })
    }

    /// (Table dimension, ComputeMillis, GBSeconds) of every usage line.
    fn usage_lines(lines: &[Value]) -> Vec<(Option<String>, f64, f64)> {
        lines
            .iter()
            .filter(|l| l["Function"] == "ingest" && l.get("GBSeconds").is_some())
            .map(|l| {
                (
                    l.get("Table").and_then(Value::as_str).map(str::to_string),
                    l["ComputeMillis"].as_f64().unwrap_or(f64::NAN),
                    l["GBSeconds"].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect()
    }

    /// Shares that add up to more than the invocation (commits of two tables side by side)
    /// are scaled down alike; shares within it are kept; unrouted objects have no table.
    #[test]
    fn overlapping_table_shares_are_scaled_to_the_invocation() {
        let report = |table: &str, ms: u64| {
            let mut r = ObjectReport::new(format!("s3://b/{table}"), table, Status::Committed);
            r.compute_ms = ms;
            r.millis = 10_000; // a latency, not a share: never summed
            r
        };
        let total = |ms: u64| Usage {
            function: FUNCTION_INGEST.into(),
            compute_ms: ms,
            memory_mb: 1024,
            s3: Some(Default::default()),
        };
        let reports = [
            report("a", 300),
            report("a", 300),
            report("b", 600),
            report("", 50),
        ];
        let (t, tables) = payload_usage(total(1000), &reports);
        assert_eq!(t.compute_ms, 1000);
        let ms: Vec<(&str, u64)> = tables.iter().map(|(t, u)| (*t, u.compute_ms)).collect();
        assert_eq!(ms, vec![("a", 500), ("b", 500)]);
        assert!(tables
            .iter()
            .all(|(_, u)| u.s3.is_none() && u.memory_mb == 1024));
        let (_, tables) = payload_usage(total(5000), &reports);
        let ms: Vec<u64> = tables.iter().map(|(_, u)| u.compute_ms).collect();
        assert_eq!(ms, vec![600, 600]);
    }

    /// The per-table usage metrics of a payload share its time: together they are at most the
    /// invocation's, whether its objects commit in a batch, alone, or as copies of another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn per_table_usage_never_exceeds_the_invocation() {
        let dir = std::env::temp_dir().join(format!("floe-usage-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(dir.join("inputs/input/a")).expect("dir");
        std::fs::create_dir_all(dir.join("inputs/input/b")).expect("dir");
        let keys = ["b/x.jsonl", "a/1.jsonl", "a/2.jsonl", "a/3.jsonl"];
        for (i, k) in keys.iter().enumerate() {
            let rows = crate::sample::orders_jsonl(200, i as u64 + 1, Utc::now());
            std::fs::write(dir.join("inputs/input").join(k), rows).expect("object");
        }
        let ingestor = Ingestor::new(local_config(&dir)).await.expect("ingestor");
        let deadline = || Instant::now() + Duration::from_secs(300);
        // B alone beside A's batch; then the same four again (duplicates), and A/1 twice.
        let payloads = [
            s3_event(&keys),
            s3_event(&keys),
            s3_event(&["a/1.jsonl", "a/1.jsonl", "b/x.jsonl"]),
        ];
        for (n, payload) in payloads.iter().enumerate() {
            let (result, lines) =
                crate::metrics::capture::emitted(ingestor.handle_payload(payload, deadline()))
                    .await;
            assert!(result.errors.is_empty(), "{:?}", result.errors);
            let usage = usage_lines(&lines);
            let total: Vec<_> = usage.iter().filter(|u| u.0.is_none()).collect();
            assert_eq!(total.len(), 1, "one invocation line: {lines:?}");
            let (_, total_ms, total_gbs) = total[0];
            let tables: Vec<_> = usage.iter().filter(|u| u.0.is_some()).collect();
            assert_eq!(tables.len(), 2, "one line per table: {usage:?}");
            let ms: f64 = tables.iter().map(|u| u.1).sum();
            let gbs: f64 = tables.iter().map(|u| u.2).sum();
            assert!(
                ms <= *total_ms && gbs <= total_gbs * (1.0 + 1e-9),
                "payload {n}: tables {usage:?} exceed the invocation"
            );
            if n == 0 {
                // Each table's objects were read, written and committed: time of their own.
                assert!(tables.iter().all(|u| u.1 > 0.0), "payload {n}: {usage:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
