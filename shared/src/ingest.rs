//! Ingest: one landed object → decoded, validated rows → Parquet data files → one exactly-once commit.
//!
//! Data path: the object is streamed (never held whole) through decompression and decoding on a
//! blocking thread; batches cross a small bounded channel to the writer, which adds `_ingested_at`
//! and `_source`, splits by partition and rolls Parquet files at the target size. Bad records are
//! spooled to a local file and uploaded as one quarantine object. Finally [`crate::commit`] adds
//! the files in one snapshot whose summary names the object, unless it was committed already.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, SchemaRef, TimeUnit};
use chrono::{DateTime, Utc};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{DataFile, PrimitiveType};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use serde::Serialize;
use serde_json::json;
use tokio_util::io::SyncIoBridge;

use crate::catalog;
use crate::commit::{CommitLimits, Committer, Outcome, Skipped, SourceObject};
use crate::config::{Config, RouteConfig, SchemaPolicy, TableConfig};
use crate::decode::{self, DecodeFailure, DecodeSpec, Piece, Rejected};
use crate::dedup;
use crate::error::{Error, ErrorKind, Result};
use crate::event::{self, ObjectRef};
use crate::metrics::{self, Metric};
use crate::schema::{self, INGESTED_AT, SOURCE};
use crate::snapshot::Change;
use crate::store::{ObjectStore, Version};
use crate::write::build_sink;
pub use crate::write::writer_properties;

/// What happened to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Rows committed in a new snapshot.
    Committed,
    /// Already committed earlier (duplicate or concurrent delivery); nothing added.
    Duplicate,
    /// Every record was bad: all went to quarantine, nothing to commit.
    AllQuarantined,
    /// The object could not be read at all and was quarantined whole.
    Unreadable,
    /// No route covers the object: refused.
    Unrouted,
    /// The object no longer exists.
    Missing,
    /// The event named an ETag the object no longer has (overwritten since, on an unversioned
    /// bucket): that content is gone, the newer content comes with its own event. Nothing added.
    Superseded,
}

/// The report of one object's ingestion.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectReport {
    /// `s3://bucket/key`.
    pub object: String,
    /// Target table (empty when unrouted).
    pub table: String,
    /// Outcome.
    pub status: Status,
    /// Records seen.
    pub records_in: u64,
    /// Records in the table from this object.
    pub records_committed: u64,
    /// Records sent to quarantine.
    pub records_quarantined: u64,
    /// Input fields not in the table (ignored, or quarantined under the strict policy).
    pub unknown_fields: Vec<String>,
    /// The schema change this object brought (additive policy), e.g. `added coupon (string)`.
    pub schema_change: Option<String>,
    /// Data files added.
    pub data_files: usize,
    /// Bytes of data files added.
    pub data_bytes: u64,
    /// The snapshot holding the rows (new or earlier).
    pub snapshot_id: Option<i64>,
    /// Commit attempts.
    pub attempts: u32,
    /// Quarantine object written, if any.
    pub quarantine: Option<String>,
    /// Earliest and latest event time among committed rows (RFC 3339).
    pub event_time_range: Option<(String, String)>,
    /// Rows whose ingestion − event time exceeded the late threshold.
    pub late_records: u64,
    /// Largest ingestion − event time, seconds.
    pub max_lateness_seconds: f64,
    /// Commit time − latest event time, seconds (freshness lag).
    pub freshness_seconds: Option<f64>,
    /// Why, for unreadable/unrouted objects.
    pub reason: Option<String>,
    /// Wall time spent, milliseconds.
    pub millis: u64,
}

impl ObjectReport {
    fn new(object: String, table: &str, status: Status) -> Self {
        Self {
            object,
            table: table.into(),
            status,
            records_in: 0,
            records_committed: 0,
            records_quarantined: 0,
            unknown_fields: Vec::new(),
            schema_change: None,
            data_files: 0,
            data_bytes: 0,
            snapshot_id: None,
            attempts: 0,
            quarantine: None,
            event_time_range: None,
            late_records: 0,
            max_lateness_seconds: 0.0,
            freshness_seconds: None,
            reason: None,
            millis: 0,
        }
    }

    /// Emits this report as EMF metrics and a structured log line.
    pub fn emit(&self) {
        let status = format!("{:?}", self.status);
        let mut m = vec![
            Metric::count("RecordsIn", self.records_in as f64),
            Metric::count("RecordsCommitted", self.records_committed as f64),
            Metric::count("RecordsQuarantined", self.records_quarantined as f64),
            Metric::count("LateRecords", self.late_records as f64),
            Metric::seconds("MaxLatenessSeconds", self.max_lateness_seconds),
            Metric {
                name: "IngestMillis",
                value: self.millis as f64,
                unit: "Milliseconds",
            },
            Metric::count("CommitAttempts", self.attempts),
        ];
        if let Some(f) = self.freshness_seconds {
            m.push(Metric::seconds("FreshnessLagSeconds", f));
        }
        match self.status {
            Status::Unrouted => m = vec![Metric::count("UnroutedObjects", 1.0)],
            Status::Unreadable => m.push(Metric::count("UnreadableObjects", 1.0)),
            Status::Duplicate => m.push(Metric::count("DuplicateDeliveries", 1.0)),
            _ => {}
        }
        let table = if self.table.is_empty() {
            "-"
        } else {
            self.table.as_str()
        };
        metrics::emit(&[("Table", table)], &m);
        tracing::info!(object = %self.object, table, status, records_in = self.records_in,
            committed = self.records_committed, quarantined = self.records_quarantined,
            snapshot = ?self.snapshot_id, millis = self.millis, "ingested object");
    }
}

/// Per-table state kept across invocations: the loaded table's schema and writer settings.
struct TableCtx {
    ident: TableIdent,
    cfg: TableConfig,
}

/// The ingest service: built once per Lambda container (clients, config), used per event.
pub struct Ingestor {
    config: Arc<Config>,
    committer: Committer,
    store: Arc<dyn ObjectStore>,
    tables: HashMap<String, TableCtx>,
    notifier: Option<crate::notify::Notifier>,
    hash_key: Option<Vec<u8>>,
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

impl Ingestor {
    /// Connects the catalog and store named by the config and creates missing tables.
    pub async fn new(config: Config) -> Result<Self> {
        let catalog = catalog::connect(&config).await?;
        let swap = crate::swap::from_config(&config).await?;
        let store = crate::store::from_config(&config.storage).await;
        let notifier = crate::notify::Notifier::from_config(&config).await;
        let mut me = Self::with_parts(config, Committer::new(catalog, swap), store).await?;
        me.notifier = notifier;
        Ok(me)
    }

    /// Publishes a commit event after every commit (see [`crate::notify`]).
    pub fn with_notifier(mut self, notifier: crate::notify::Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Builds from explicit parts (tests, the CLI).
    pub async fn with_parts(
        config: Config,
        committer: Committer,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Self> {
        catalog::ensure_tables(committer.catalog().as_ref(), &config).await?;
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

    /// Handles a whole Lambda payload (direct S3, SQS batch, EventBridge).
    pub async fn handle_payload(
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
        for delivery in deliveries {
            if delivery.message_id.is_some() {
                result.is_sqs = true;
            }
            let label = delivery
                .message_id
                .clone()
                .unwrap_or_else(|| "event".into());
            let mut failed = false;
            match delivery.objects {
                Err(e) => {
                    tracing::error!(message = %label, error = %e, "cannot parse message; leaving it for retry and the DLQ");
                    result.errors.push(format!("message {label}: {e}"));
                    failed = true;
                }
                Ok(objects) => {
                    for obj in objects {
                        match self.ingest(&obj, deadline).await {
                            Ok(report) => {
                                report.emit();
                                if let (Some(n), Status::Committed) =
                                    (&self.notifier, report.status)
                                {
                                    n.commit(&report).await;
                                }
                                result.reports.push(report);
                            }
                            Err(e) => {
                                tracing::error!(object = %obj.uri(), error = %e, retryable = e.is_retryable(), "ingest failed");
                                result.errors.push(format!("{}: {e}", obj.uri()));
                                failed = true;
                            }
                        }
                    }
                }
            }
            if failed {
                if let Some(id) = delivery.message_id {
                    result.failed_message_ids.push(id);
                }
            }
        }
        result
    }

    /// Ingests one object. Unreadable content is quarantined (Ok); failures that a retry can fix
    /// are errors marked retryable.
    pub async fn ingest(&self, obj: &ObjectRef, deadline: Instant) -> Result<ObjectReport> {
        // A schema that moved differently under a schema-changing object (another object took the
        // new column id) makes the written files unusable: write the object again on the new base.
        let mut tries = 0;
        loop {
            tries += 1;
            match self.ingest_once(obj, deadline).await {
                Err(e)
                    if e.kind() == ErrorKind::Stale && tries < 3 && Instant::now() < deadline =>
                {
                    tracing::info!(object = %obj.uri(), error = %e, "rewriting the object on the new schema");
                }
                other => return other,
            }
        }
    }

    async fn ingest_once(&self, obj: &ObjectRef, deadline: Instant) -> Result<ObjectReport> {
        let started = Instant::now();
        let uri = obj.uri();
        let Some(route) = self.config.route(&obj.bucket, &obj.key).cloned() else {
            let mut r = ObjectReport::new(uri, "", Status::Unrouted);
            r.reason = Some(format!(
                "no route covers bucket `{}` key `{}`",
                obj.bucket, obj.key
            ));
            tracing::warn!(object = %r.object, "refusing object outside every route");
            return Ok(r);
        };
        let tctx = self.tables.get(&route.table).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("route to unknown table `{}`", route.table),
            )
        })?;
        // Exactly the version the event names (its version id, else its ETag as a precondition):
        // the identity recorded is always that of the content read.
        let named = Version::named_by(obj);
        let opened = match self.store.open(&obj.bucket, &obj.key, &named).await {
            Ok(o) => o,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let mut r = ObjectReport::new(uri, &route.table, Status::Missing);
                r.reason = Some(e.to_string());
                return Ok(r);
            }
            Err(e) if e.kind() == ErrorKind::Superseded => {
                let mut r = ObjectReport::new(uri, &route.table, Status::Superseded);
                r.reason = Some(e.to_string());
                tracing::info!(object = %r.object, reason = ?r.reason, "object overwritten since its event; the newer content has its own");
                return Ok(r);
            }
            Err(e) => return Err(e),
        };
        let version = opened
            .meta
            .version_id
            .clone()
            .unwrap_or_else(|| opened.meta.etag.clone());
        let modified_ms = opened.meta.last_modified.timestamp_millis();
        let read = Version::of(&opened.meta);
        let source = SourceObject {
            bucket: obj.bucket.clone(),
            key: obj.key.clone(),
            version,
            modified_ms,
        };
        let skew = Duration::from_secs(self.config.ingest.dedup_skew_seconds);

        let table = self.committer.load(&tctx.ident).await?;
        // Early exit for duplicates (the commit re-checks the versions landing meanwhile): the
        // summaries, or the rows' `_source` once the summaries that could hold it were expired.
        let proven = match dedup::check(&table, &source, skew.as_millis() as i64).await? {
            Ok(found) => {
                let mut r = ObjectReport::new(uri, &route.table, Status::Duplicate);
                r.snapshot_id = Some(found.snapshot_id);
                r.millis = started.elapsed().as_millis() as u64;
                return Ok(r);
            }
            Err(proven) => proven,
        };

        let ingested_at = Utc::now();
        let writer_id = uuid::Uuid::now_v7().to_string();
        let policy = tctx.cfg.schema_policy;
        let source_id = source.id();
        let params = WriteParams {
            uri: &uri,
            source_id: &source_id,
            writer_id: &writer_id,
            ingested_at,
            chunk_records: self.config.ingest.chunk_records,
            late_after_seconds: self.config.ingest.late_after_seconds,
            allow_unknown: policy != SchemaPolicy::Strict,
            hash_key: self.hash_key.as_deref(),
            limits: decode::Limits::from(&self.config.ingest),
            object_size: Some(opened.meta.size).filter(|s| *s > 0),
        };
        let mut written = write_object(&table, tctx, &route, opened.body, &params).await;
        // Additive policy: new fields (and widenings) evolve the schema in the same commit as the
        // data that brought them. The object is written again with the evolved schema (rare:
        // only objects that change the schema pay for a second read).
        let mut evolved: Option<(iceberg::spec::Schema, String)> = None;
        if let Ok(w) = &written {
            if policy == SchemaPolicy::Additive {
                evolved =
                    crate::evolve::evolve_table_schema(table.metadata(), &w.unknown, &w.widen)
                        .map_err(|e| {
                            Error::iceberg(format!("evolving the schema of {}", tctx.ident), e)
                        })?;
            }
        }
        if let (Some((schema, what)), Ok(first)) = (&evolved, &written) {
            tracing::info!(object = %uri, table = %tctx.ident, change = %what, "input evolves the table schema");
            delete_files(&table, &first.files).await;
            if let Some(spool) = &first.quarantine_spool {
                let _ = std::fs::remove_file(spool);
            }
            let evolved_table = with_schema(&table, schema.clone())?;
            // Pinned to the version read first: an overwrite in between must not put other
            // content under this identity. A mismatch is retryable: the redelivery starts over.
            let reopened = self
                .store
                .open(&obj.bucket, &obj.key, &read)
                .await
                .map_err(|e| {
                    if e.kind() == ErrorKind::Superseded {
                        Error::new(
                            ErrorKind::Superseded,
                            format!("{uri} changed between its two reads; not committed"),
                        )
                        .with_retryable(true)
                        .with_source(e)
                    } else {
                        e
                    }
                })?;
            written = write_object(&evolved_table, tctx, &route, reopened.body, &params).await;
        }
        let written = match written {
            Ok(w) => w,
            Err(WriteFailure::Unreadable(reason)) => {
                let key = self.quarantine_key(&route, obj, &source.version, "error.json");
                let bucket = self.quarantine_bucket(obj);
                let doc = json!({"source": uri, "version": source.version, "table": route.table,
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
                r.millis = started.elapsed().as_millis() as u64;
                tracing::warn!(object = %r.object, reason = ?r.reason, "object unreadable; quarantined whole");
                return Ok(r);
            }
            Err(WriteFailure::Error(e)) => return Err(e),
        };

        let mut r = ObjectReport::new(uri.clone(), &route.table, Status::Committed);
        r.records_in = written.records_in;
        r.records_committed = written.rows;
        r.records_quarantined = written.quarantined;
        r.unknown_fields = match &evolved {
            // Everything the first pass saw is in the evolved schema unless it had no type.
            Some(_) => written
                .unknown
                .iter()
                .filter(|(_, t)| t.is_none())
                .map(|(k, _)| k.clone())
                .collect(),
            None => written.unknown.keys().cloned().collect(),
        };
        r.schema_change = evolved.as_ref().map(|(_, what)| what.clone());
        let deprecated = crate::evolve::deprecated_in_use(
            written.deprecated_seen.iter().map(String::as_str),
            &tctx.cfg.deprecations(),
        );
        for (field, date) in &deprecated {
            tracing::warn!(object = %uri, field, removal = %date, "input still produces a deprecated field");
        }
        r.data_files = written.files.len();
        r.data_bytes = written.files.iter().map(|f| f.file_size_in_bytes()).sum();
        r.late_records = written.late;
        r.max_lateness_seconds = written.max_lateness_us as f64 / 1e6;
        if let (Some(lo), Some(hi)) = (written.et_min, written.et_max) {
            r.event_time_range = Some((micros_to_rfc3339(lo), micros_to_rfc3339(hi)));
        }
        if r.records_in != r.records_committed + r.records_quarantined {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "{uri}: counts do not reconcile: in {} != committed {} + quarantined {}",
                    r.records_in, r.records_committed, r.records_quarantined
                ),
            ));
        }
        if !r.unknown_fields.is_empty() {
            tracing::warn!(object = %uri, fields = ?r.unknown_fields, "input has fields the table lacks; ignored");
        }
        if let Some(spool) = written.quarantine_spool {
            let key = self.quarantine_key(&route, obj, &source.version, "jsonl");
            let bucket = self.quarantine_bucket(obj);
            let body = std::fs::read(&spool).map_err(|e| {
                Error::new(
                    ErrorKind::Storage,
                    format!("reading quarantine spool {}", spool.display()),
                )
                .with_source(e)
            });
            let _ = std::fs::remove_file(&spool);
            self.store.put(&bucket, &key, body?).await?;
            r.quarantine = Some(format!("s3://{bucket}/{key}"));
        }
        if written.files.is_empty() {
            r.status = Status::AllQuarantined;
            r.millis = started.elapsed().as_millis() as u64;
            return Ok(r);
        }

        let mut props = HashMap::from([
            ("records-in".to_string(), r.records_in.to_string()),
            (
                "records-committed".to_string(),
                r.records_committed.to_string(),
            ),
            (
                "records-quarantined".to_string(),
                r.records_quarantined.to_string(),
            ),
            ("floe.late-records".to_string(), r.late_records.to_string()),
            (
                "floe.max-lateness-seconds".to_string(),
                format!("{:.3}", r.max_lateness_seconds),
            ),
        ]);
        if let Some((lo, hi)) = &r.event_time_range {
            props.insert("floe.event-time-min".into(), lo.clone());
            props.insert("floe.event-time-max".into(), hi.clone());
        }
        if !r.unknown_fields.is_empty() {
            props.insert("floe.unknown-fields".into(), r.unknown_fields.join(","));
        }
        if let Some(q) = &r.quarantine {
            props.insert("floe.quarantine".into(), q.clone());
        }
        if let Some((schema, what)) = &evolved {
            props.insert(
                "floe.schema-change".into(),
                format!("{what} (schema {}, by ingest of {uri})", schema.schema_id()),
            );
        }
        let files = written.files;
        let mut change = Change::append(files.clone(), props);
        change.schema = evolved.as_ref().map(|(s, _)| s.clone());
        // The commit window starts now, whatever decoding and writing took (bounded by the
        // Lambda's own deadline): a large object must not reach its commit with no time left.
        let limits = CommitLimits {
            max_attempts: self.config.ingest.max_commit_attempts,
            deadline: deadline.min(
                Instant::now() + Duration::from_secs(self.config.ingest.commit_timeout_seconds),
            ),
            skew,
        };
        let plan = dedup::append_once_plan(&source, &writer_id, change, limits.skew, proven);
        match self
            .committer
            .commit_from(&tctx.ident, Some(table.clone()), &limits, plan)
            .await
        {
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
            }
            Ok(Outcome::Skipped(Skipped::AlreadyCommitted(found)))
                if found.writer_id.as_deref() == Some(&writer_id) =>
            {
                // Our own commit whose answer was lost: the rows are ours and in the table.
                r.snapshot_id = Some(found.snapshot_id);
            }
            Ok(Outcome::Skipped(skipped)) => {
                // Another delivery won: our files are referenced by nothing and can go now.
                r.status = Status::Duplicate;
                if let Skipped::AlreadyCommitted(found) = skipped {
                    r.snapshot_id = Some(found.snapshot_id);
                }
                delete_files(&table, &files).await;
            }
            // Stale: nothing was committed and these files can never be (wrong schema ids).
            Err(e) if e.kind() == ErrorKind::Stale => {
                delete_files(&table, &files).await;
                return Err(e);
            }
            // The outcome may be unknown (a lost answer): never delete files that might be
            // referenced; unreferenced ones are left to orphan cleanup.
            Err(e) => return Err(e),
        }
        r.millis = started.elapsed().as_millis() as u64;
        Ok(r)
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

fn micros_to_rfc3339(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339())
        .unwrap_or_default()
}

/// Best-effort removal of files written by an attempt that will not commit (else orphan cleanup does it).
async fn delete_files(table: &Table, files: &[DataFile]) {
    for f in files {
        if let Err(e) = table.file_io().delete(f.file_path()).await {
            tracing::warn!(file = f.file_path(), error = %e, "could not delete uncommitted data file; orphan cleanup will");
        }
    }
}

struct Written {
    files: Vec<DataFile>,
    records_in: u64,
    rows: u64,
    quarantined: u64,
    unknown: BTreeMap<String, Option<PrimitiveType>>,
    widen: BTreeMap<String, PrimitiveType>,
    deprecated_seen: std::collections::BTreeSet<String>,
    quarantine_spool: Option<std::path::PathBuf>,
    et_min: Option<i64>,
    et_max: Option<i64>,
    late: u64,
    max_lateness_us: i64,
}

enum WriteFailure {
    Unreadable(String),
    Error(Error),
}

impl From<Error> for WriteFailure {
    fn from(e: Error) -> Self {
        WriteFailure::Error(e)
    }
}

/// The per-object settings of [`write_object`].
struct WriteParams<'a> {
    uri: &'a str,
    /// The identity stored in every row's `_source` (`s3://bucket/key#version`).
    source_id: &'a str,
    writer_id: &'a str,
    ingested_at: DateTime<Utc>,
    chunk_records: usize,
    late_after_seconds: i64,
    allow_unknown: bool,
    hash_key: Option<&'a [u8]>,
    limits: decode::Limits,
    /// The object's stored size (Content-Length), when known.
    object_size: Option<u64>,
}

/// `table` with `schema` as its current schema (locally, for writing; committed with the data).
pub(crate) fn with_schema(table: &Table, schema: iceberg::spec::Schema) -> Result<Table> {
    let md = iceberg::spec::TableMetadataBuilder::new_from_metadata(
        table.metadata().clone(),
        table.metadata_location().map(str::to_string),
    )
    .add_current_schema(schema)
    .and_then(|b| b.build())
    .map_err(|e| Error::iceberg("staging the evolved schema", e))?
    .metadata;
    Table::builder()
        .metadata(md)
        .metadata_location(table.metadata_location().unwrap_or_default().to_string())
        .identifier(table.identifier().clone())
        .file_io(table.file_io().clone())
        .runtime(iceberg::Runtime::try_current().map_err(|e| Error::iceberg("runtime", e))?)
        .build()
        .map_err(|e| Error::iceberg("staging the evolved schema", e))
}

async fn write_object(
    table: &Table,
    tctx: &TableCtx,
    route: &RouteConfig,
    body: std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>,
    params: &WriteParams<'_>,
) -> std::result::Result<Written, WriteFailure> {
    let WriteParams {
        uri,
        source_id,
        writer_id,
        ingested_at,
        chunk_records,
        late_after_seconds,
        allow_unknown,
        hash_key,
        limits,
        object_size,
    } = *params;
    let deprecated: Vec<String> = tctx.cfg.deprecations().into_keys().collect();
    let iceberg_schema = table.metadata().current_schema().clone();
    let arrow_schema: SchemaRef = Arc::new(
        schema_to_arrow_schema(&iceberg_schema)
            .map_err(|e| Error::iceberg(format!("schema of {}", tctx.ident), e))?,
    );
    let decode_schema = schema::decode_schema(&arrow_schema);
    let required: Vec<String> = iceberg_schema
        .as_struct()
        .fields()
        .iter()
        .filter(|f| f.required && !f.name.starts_with('_'))
        .map(|f| f.name.clone())
        .collect();
    let spec = DecodeSpec {
        format: route.format,
        key: uri.to_string(),
        schema: decode_schema,
        required,
        chunk_records,
        allow_unknown,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Piece>(2);
    let decoder = tokio::task::spawn_blocking(move || {
        let reader = SyncIoBridge::new(body);
        let mut send = |p: Piece| tx.blocking_send(p).is_ok();
        decode::decode_within(reader, &spec, &limits, object_size, &mut send)
    });

    let target = (tctx.cfg.target_file_size_mb as usize) << 20;
    let mut sink = build_sink(table, target, writer_id)
        .map_err(|e| Error::iceberg(format!("writer for {}", tctx.ident), e))?;
    let mut w = Written {
        files: Vec::new(),
        records_in: 0,
        rows: 0,
        quarantined: 0,
        unknown: BTreeMap::new(),
        widen: BTreeMap::new(),
        deprecated_seen: Default::default(),
        quarantine_spool: None,
        et_min: None,
        et_max: None,
        late: 0,
        max_lateness_us: 0,
    };
    let mut spool: Option<std::io::BufWriter<std::fs::File>> = None;
    let ingested_us = ingested_at.timestamp_micros();
    let late_us = late_after_seconds.saturating_mul(1_000_000);
    let et_col = tctx.cfg.event_time.clone();
    let mut write_err: Option<Error> = None;
    while let Some(piece) = rx.recv().await {
        match piece {
            Piece::Batch(batch) => {
                let n = batch.num_rows();
                for d in &deprecated {
                    if let Some(c) = batch.column_by_name(d) {
                        if c.null_count() < c.len() {
                            w.deprecated_seen.insert(d.clone());
                        }
                    }
                }
                if let Ok(idx) = batch.schema().index_of(&et_col) {
                    event_time_stats(batch.column(idx), ingested_us, late_us, &mut w);
                }
                let full = match crate::protect::protect(&batch, &tctx.cfg, hash_key)
                    .and_then(|b| with_floe_columns(&b, &arrow_schema, ingested_us, source_id))
                {
                    Ok(b) => b,
                    Err(e) => {
                        write_err = Some(e);
                        break;
                    }
                };
                if let Err(e) = sink.write(full).await {
                    write_err = Some(Error::iceberg(format!("writing data files for {uri}"), e));
                    break;
                }
                w.rows += n as u64;
            }
            Piece::Rejected(rejected) => {
                w.quarantined += rejected.len() as u64;
                if let Err(e) = spool_rejected(&mut spool, &mut w.quarantine_spool, uri, &rejected)
                {
                    write_err = Some(e);
                    break;
                }
            }
            Piece::UnknownFields(u) => w.unknown.extend(u),
            Piece::Widen(u) => w.widen.extend(u),
        }
    }
    drop(rx);
    if let Some(mut s) = spool.take() {
        if let Err(e) = s.flush() {
            write_err.get_or_insert(
                Error::new(ErrorKind::Storage, "flushing quarantine spool").with_source(e),
            );
        }
    }
    let decoded = decoder.await.map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("decoder task for {uri} failed: {e}"),
        )
    })?;
    let files = sink.close().await;
    let cleanup = |files: &iceberg::Result<Vec<DataFile>>, spool: &Option<std::path::PathBuf>| {
        let paths: Vec<String> = files
            .as_ref()
            .map(|f| f.iter().map(|d| d.file_path().to_string()).collect())
            .unwrap_or_default();
        if let Some(p) = spool {
            let _ = std::fs::remove_file(p);
        }
        paths
    };
    if let Some(e) = write_err {
        let paths = cleanup(&files, &w.quarantine_spool);
        for p in paths {
            let _ = table.file_io().delete(&p).await;
        }
        return Err(WriteFailure::Error(e));
    }
    match decoded {
        Ok(seen) => w.records_in = seen,
        Err(failure) => {
            let paths = cleanup(&files, &w.quarantine_spool);
            for p in paths {
                let _ = table.file_io().delete(&p).await;
            }
            return Err(match failure {
                DecodeFailure::Unreadable(reason) => WriteFailure::Unreadable(reason),
                DecodeFailure::Transient(e) => WriteFailure::Error(
                    Error::new(ErrorKind::Storage, format!("reading {uri}"))
                        .with_retryable(true)
                        .with_source(e),
                ),
                DecodeFailure::Closed => WriteFailure::Error(Error::new(
                    ErrorKind::Internal,
                    format!("writer for {uri} stopped early"),
                )),
                // Over a limit as a whole: not quarantined and acknowledged (its valid data would
                // be silently skipped) but failed, and not retryable: it goes to the DLQ.
                DecodeFailure::Limit(reason) => WriteFailure::Error(
                    Error::new(ErrorKind::UnreadableObject, format!("{uri}: {reason}"))
                        .with_retryable(false),
                ),
                DecodeFailure::Spool(e) => WriteFailure::Error(
                    Error::new(ErrorKind::Storage, format!("spooling {uri} to local disk"))
                        .with_retryable(true)
                        .with_source(e),
                ),
            });
        }
    }
    w.files = files.map_err(|e| Error::iceberg(format!("closing data files for {uri}"), e))?;
    Ok(w)
}

fn event_time_stats(col: &ArrayRef, ingested_us: i64, late_us: i64, w: &mut Written) {
    let Some(ts) = col.as_any().downcast_ref::<TimestampMicrosecondArray>() else {
        return;
    };
    for v in ts.iter().flatten() {
        w.et_min = Some(w.et_min.map_or(v, |m| m.min(v)));
        w.et_max = Some(w.et_max.map_or(v, |m| m.max(v)));
        let lateness = ingested_us - v;
        if lateness > late_us {
            w.late += 1;
        }
        if lateness > w.max_lateness_us {
            w.max_lateness_us = lateness;
        }
    }
}

/// Adds `_ingested_at` and `_source` (the object's identity `s3://bucket/key#version`, the
/// durable duplicate check's key) and puts the columns in the table's order and types.
fn with_floe_columns(
    batch: &RecordBatch,
    target: &SchemaRef,
    ingested_us: i64,
    uri: &str,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for f in target.fields() {
        let col: ArrayRef = if f.name() == INGESTED_AT {
            let tz = match f.data_type() {
                DataType::Timestamp(TimeUnit::Microsecond, tz) => tz.clone(),
                _ => Some("+00:00".into()),
            };
            Arc::new(TimestampMicrosecondArray::from_value(ingested_us, n).with_timezone_opt(tz))
        } else if f.name() == SOURCE {
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(uri, n)))
        } else {
            let idx = batch.schema().index_of(f.name()).map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("decoded batch lacks column `{}`", f.name()),
                )
                .with_source(e)
            })?;
            batch.column(idx).clone()
        };
        cols.push(col);
    }
    RecordBatch::try_new(target.clone(), cols).map_err(|e| {
        Error::new(ErrorKind::Internal, format!("assembling rows of {uri}")).with_source(e)
    })
}

fn spool_rejected(
    spool: &mut Option<std::io::BufWriter<std::fs::File>>,
    path: &mut Option<std::path::PathBuf>,
    uri: &str,
    rejected: &[Rejected],
) -> Result<()> {
    let io = |e: std::io::Error| {
        Error::new(ErrorKind::Storage, "writing quarantine spool").with_source(e)
    };
    if spool.is_none() {
        let p =
            std::env::temp_dir().join(format!("floe-quarantine-{}.jsonl", uuid::Uuid::new_v4()));
        *spool = Some(std::io::BufWriter::new(
            std::fs::File::create(&p).map_err(io)?,
        ));
        *path = Some(p);
    }
    if let Some(s) = spool.as_mut() {
        for r in rejected {
            let line = json!({"source": uri, "record": r.record, "raw": r.raw, "reason": r.reason});
            serde_json::to_writer(&mut *s, &line).map_err(|e| io(e.into()))?;
            s.write_all(b"\n").map_err(io)?;
        }
    }
    Ok(())
}
