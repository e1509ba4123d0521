//! `floe.toml`: the catalog, the warehouse, the tables and the routes from landing objects to tables.
//!
//! Loaded once at start-up from a local path or an `s3://` URI (env `FLOE_CONFIG`). Every problem
//! is reported with the file, the key and the reason, before any event is handled.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use crate::error::{Error, ErrorKind, Result};

mod compare;
pub(crate) mod contract;
mod cost;
mod defaults;
mod process;
pub(crate) mod types;
mod validate;

pub use compare::CompareConfig;
pub use contract::{Action, CheckConfig, CheckKind};
pub use cost::CostConfig;
pub(crate) use defaults::retention_properties;
pub use defaults::DefaultsConfig;
pub use process::ProcessConfig;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Which catalog holds the tables.
    pub catalog: CatalogConfig,
    /// Object storage settings (endpoint overrides for emulators, or a local directory).
    #[serde(default)]
    pub storage: StorageConfig,
    /// Ingest settings shared by every route.
    #[serde(default)]
    pub ingest: IngestConfig,
    /// Maintenance defaults (table properties `history.expire.*` etc. take precedence).
    #[serde(default)]
    pub maintain: MaintainConfig,
    /// The tables floe writes.
    #[serde(default)]
    pub tables: Vec<TableConfig>,
    /// Where landing objects go: bucket + key prefix → table.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Incremental SQL pipelines run by the process function: source table → sink table.
    #[serde(default)]
    pub pipelines: Vec<PipelineConfig>,
    /// Where floe announces its commits (the process function's trigger).
    #[serde(default)]
    pub events: EventsConfig,
    /// Table-creation standards for every table and sink that does not set its own.
    #[serde(default)]
    pub defaults: DefaultsConfig,
    /// How `floe compare` lines tables up against the system they replace.
    #[serde(default)]
    pub compare: Vec<CompareConfig>,
    /// Prices for the cost baseline and local memory sizes (defaults: us-east-1 list prices).
    #[serde(default)]
    pub cost: CostConfig,
    /// The process function's batch speed: how `refresh` chunks its work.
    #[serde(default)]
    pub process: ProcessConfig,
}

/// Commit notifications.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsConfig {
    /// EventBridge bus that receives a `floe.commit` event after every ingest commit (none: off).
    #[serde(default)]
    pub bus: Option<String>,
    /// EventBridge endpoint override (emulators).
    #[serde(default)]
    pub endpoint: Option<String>,
}

/// How a pipeline turns source rows into sink rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PipelineMode {
    /// Stateless filter/project/enrich: the SQL's rows over the new source rows are appended.
    Append,
    /// Grouped by an event-time window: windows touched by new rows (late ones included) are
    /// recomputed from the whole source table and replaced atomically in the sink.
    Aggregate,
    /// Latest state per key (upsert): the sink holds one row per `keys` value, the greatest by
    /// `order_by` (late older versions never overwrite newer ones); a row matching
    /// `delete_when` removes its key. The buckets of the keys a run touches are rewritten.
    Latest,
}

/// One incremental pipeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Pipeline name (also the consumer name in logs and recovery hints).
    pub name: String,
    /// Source table: one of `tables`, or another (append) pipeline's sink, whose commits then
    /// trigger this pipeline (a chain; cycles are refused).
    pub source: String,
    /// Sink table, created from the SQL's output schema on first run.
    pub sink: String,
    /// `append`, `aggregate` or `latest`.
    pub mode: PipelineMode,
    /// SQL over the relation `source` (DataFusion dialect). In `aggregate` mode `source` also has
    /// a `window_start` column (the event time floored to `window`) that the output must carry.
    pub sql: String,
    /// Aggregate window size: `30s`, `1m`, `5 minutes`, `1h`.
    #[serde(default)]
    pub window: Option<String>,
    /// Event-time column the window applies to (default: the source table's `event_time`).
    #[serde(default)]
    pub time_column: Option<String>,
    /// Output columns identifying a row, used by reconcile to report differences per key; in
    /// `latest` mode the upsert key (required).
    #[serde(default)]
    pub keys: Vec<String>,
    /// `latest` mode: the output column that orders versions of a key (event time, a sequence
    /// or version number); the greatest wins, ties broken by the whole row.
    #[serde(default)]
    pub order_by: Option<String>,
    /// `latest` mode: a SQL boolean expression over the output columns (e.g. `op = 'D'`) that
    /// marks a version as a delete: the key leaves the sink, and older versions arriving later
    /// do not bring it back (tombstones in `<sink>_tombstones`).
    #[serde(default)]
    pub delete_when: Option<String>,
    /// `latest` mode: the sink is partitioned by `bucket(key_buckets, <first key>)` (default 16);
    /// a run rewrites the buckets of the keys it touches.
    #[serde(default)]
    pub key_buckets: Option<u32>,
    /// `latest` mode with `delete_when`: tombstones whose `order_by` value lies this far behind
    /// the newest version a run sees are dropped (`7d` by default; `none` keeps them forever).
    /// Only a timestamp `order_by` has a horizon; other types keep tombstones forever.
    #[serde(default)]
    pub tombstone_retention: Option<String>,
    /// Where a pipeline without a checkpoint starts: `earliest`, `latest`, `snapshot:<id>` or
    /// `timestamp:<RFC 3339>`.
    #[serde(default = "default_start")]
    pub start: String,
    /// What to do with source `overwrite`/`delete` snapshots: `fail` (default; a `latest`
    /// pipeline retracts their removed rows instead) or `skip`.
    #[serde(default)]
    pub on_row_change: RowChange,
    /// Optional alert output (append mode): every output row is also sent as a message.
    #[serde(default)]
    pub alert: Option<AlertConfig>,
    /// Lag objective in seconds: the pipeline's lag alarm threshold (default: `[defaults]`, else
    /// 600).
    #[serde(default)]
    pub lag_objective_seconds: u64,
    /// Enrichment joins: other tables (configured tables or other pipelines' sinks) the SQL may
    /// read by name beside `source`, each at its current snapshot when the run starts (the
    /// snapshot ids are recorded in the sink commit; reconcile reads the same ones). A later
    /// change of such a table does not rewrite rows already emitted (`floe process refresh`
    /// does).
    #[serde(default)]
    pub joins: Vec<String>,
    /// Most bytes (Arrow, in memory) the joined tables of one run may hold together; a run
    /// whose joined tables are larger fails naming the table and this limit (default 256 MiB).
    #[serde(default = "default_max_join_bytes")]
    pub max_join_bytes: u64,
    /// Aggregate mode: merge the delta's partial aggregates into the touched windows when the
    /// SQL is decomposable (default); `false` always recomputes the touched windows from the
    /// source (floating-point sums then equal a batch's bit for bit, at the recompute's cost).
    #[serde(default = "default_true")]
    pub merge: bool,
}

/// Policy for row-changing source snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowChange {
    /// Stop with an error naming the snapshot and the recovery.
    #[default]
    Fail,
    /// Skip them (logged).
    Skip,
}

/// Alert output of an append pipeline: at least once, with deterministic ids for dedup.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertConfig {
    /// EventBridge bus name.
    #[serde(default)]
    pub eventbridge_bus: Option<String>,
    /// SQS queue URL.
    #[serde(default)]
    pub sqs_queue_url: Option<String>,
    /// Endpoint override for the alert service (emulators).
    #[serde(default)]
    pub endpoint: Option<String>,
}

/// The catalog kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatalogKind {
    /// An embedded SQLite catalog (the laptop default).
    Sqlite,
    /// AWS Glue Data Catalog.
    Glue,
    /// An Iceberg REST catalog.
    Rest,
}

/// Catalog settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogConfig {
    /// `sqlite`, `glue` or `rest`.
    pub kind: CatalogKind,
    /// SQLite: the database file or `sqlite:` URL; Glue: endpoint override (emulators); REST: the URI.
    #[serde(default)]
    pub uri: Option<String>,
    /// Where new tables are created: `s3://bucket/prefix` or `file:///abs/path` (or a relative path).
    pub warehouse: String,
    /// The Iceberg namespace (Glue database) of the tables.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Catalog name (SQLite catalogs key their rows by it).
    #[serde(default = "default_catalog_name")]
    pub name: String,
    /// Extra catalog properties passed through verbatim.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Object storage settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// S3 endpoint override, e.g. `http://127.0.0.1:5000` for moto or MinIO.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// AWS region (defaults to the environment's).
    #[serde(default)]
    pub region: Option<String>,
    /// Path-style addressing (needed by MinIO and emulators).
    #[serde(default)]
    pub path_style: bool,
    /// Static access key (emulators only; in AWS the function's role is used).
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Static secret key (emulators only).
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// Serve buckets from this local directory (`<root>/<bucket>/<key>`) instead of S3: the laptop demo.
    #[serde(default)]
    pub local_root: Option<String>,
    /// MiB of small table files (≤ 2 MiB each: manifests, manifest lists, small data files) a
    /// warm function keeps in memory by path (they never change once written): default 64, on
    /// Lambda at most a sixteenth of the function's memory; 0 turns it off
    /// ([`crate::file_cache`]).
    #[serde(default)]
    pub cache_mb: Option<u64>,
    /// Longest wait, in seconds, for the first byte of an answer from S3 (landing objects,
    /// quarantine), Glue, EventBridge and the REST catalog, counted from the request's start:
    /// default 30. A request answered later (a server that took it and went silent) is failed
    /// as transient and retried, and where it may have taken effect (a commit) what landed is
    /// read back first. Table files go through iceberg's FileIO, which has its own timeouts.
    #[serde(default)]
    pub request_timeout_seconds: Option<u64>,
}

impl StorageConfig {
    /// Bytes of table files kept in memory ([`StorageConfig::cache_mb`]).
    pub fn cache_bytes(&self) -> u64 {
        cache_bytes_for(self.cache_mb, lambda_memory_mb())
    }

    /// [`StorageConfig::request_timeout_seconds`] (at least one second).
    pub fn request_timeout(&self) -> std::time::Duration {
        const DEFAULT_SECONDS: u64 = 30;
        std::time::Duration::from_secs(
            self.request_timeout_seconds
                .unwrap_or(DEFAULT_SECONDS)
                .max(1),
        )
    }
}

/// The file cache's budget: `cache_mb` if set, else 64 MiB, at most 1/16 of `memory_mb`.
pub(crate) fn cache_bytes_for(cache_mb: Option<u64>, memory_mb: Option<u64>) -> u64 {
    const DEFAULT_MB: u64 = 64;
    let mb = cache_mb.unwrap_or_else(|| memory_mb.map_or(DEFAULT_MB, |m| (m / 16).min(DEFAULT_MB)));
    mb.saturating_mul(1 << 20)
}

/// Ingest settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// Bucket for quarantined records (default: the object's own bucket).
    #[serde(default)]
    pub quarantine_bucket: Option<String>,
    /// Key prefix for quarantined records.
    #[serde(default = "default_quarantine_prefix")]
    pub quarantine_prefix: String,
    /// Clock skew tolerated between S3 and the committers when looking for an earlier commit.
    #[serde(default = "default_skew")]
    pub dedup_skew_seconds: u64,
    /// Most failed commit attempts per object before giving the event back for a later retry.
    /// Attempts that lost a race to another writer count apart (each is that writer's
    /// progress): up to 5× this many, within `commit_timeout_seconds`.
    #[serde(default = "default_attempts")]
    pub max_commit_attempts: u32,
    /// Most seconds spent retrying one commit (kept well inside the Lambda timeout).
    #[serde(default = "default_commit_seconds")]
    pub commit_timeout_seconds: u64,
    /// A record is counted late when ingestion time − event time exceeds this.
    #[serde(default = "default_late")]
    pub late_after_seconds: i64,
    /// Records decoded per chunk (the unit of decode and of bad-record isolation).
    #[serde(default = "default_chunk")]
    pub chunk_records: usize,
    /// SSM parameter (SecureString) holding the key for `sensitive = "hash"` columns.
    #[serde(default)]
    pub hash_key_parameter: Option<String>,
    /// SSM endpoint override (emulators).
    #[serde(default)]
    pub ssm_endpoint: Option<String>,
    /// Longest JSON line or CSV record, in bytes; a longer one is quarantined (with a prefix of
    /// its text) and skipped without being buffered.
    #[serde(default = "default_max_line")]
    pub max_line_bytes: u64,
    /// Longest CSV field, in bytes; a record with a longer one is quarantined.
    #[serde(default = "default_max_field")]
    pub max_field_bytes: u64,
    /// Deepest nesting of JSON objects/arrays in a line; a deeper line is quarantined.
    #[serde(default = "default_max_depth")]
    pub max_nesting_depth: usize,
    /// Most bytes one object may decompress to; a larger one fails (not retried usefully: DLQ).
    #[serde(default = "default_max_decompressed")]
    pub max_decompressed_bytes: u64,
    /// Largest Parquet object spooled to local disk (`/tmp`), also bounded by that disk's size.
    #[serde(default = "default_max_spool")]
    pub max_spool_bytes: u64,
    /// Largest Parquet page (uncompressed, as its header says) an object may hold; an object
    /// with a larger one fails, naming the column. parquet-rs holds a page and its values whole
    /// while reading it (about four times its size), so this bounds reading memory: 512 MiB, or
    /// on Lambda a quarter of the function's memory (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`) if less.
    #[serde(default = "default_max_page_bytes")]
    pub max_page_bytes: u64,
    /// Most bytes of rejected records one object may put in quarantine (its spool on local disk
    /// and the quarantine object); an object with more fails whole (nothing committed, not
    /// retried usefully: DLQ), as a mostly invalid object should.
    #[serde(default = "default_max_quarantine")]
    pub max_quarantine_bytes: u64,
    /// Objects of one payload (an SQS batch) that go to the same table commit together, in one
    /// snapshot naming them all (default true); false: one commit per object.
    #[serde(default = "default_true")]
    pub batch_commits: bool,
    /// Most distinct keys a `unique` check remembers per object (128-bit hashes, 16 bytes
    /// each); an object with more fails whole, naming the limit.
    #[serde(default = "default_max_unique_keys")]
    pub max_unique_keys: usize,
    /// Most columns one object may add to its table under the additive policy; records with a
    /// value in a field beyond them are quarantined, naming the limit (a map-like object, keys
    /// that are ids, must not turn into thousands of columns).
    #[serde(default = "default_max_new_columns")]
    pub max_new_columns: usize,
    /// Most top-level columns a table may reach by schema evolution at ingest; beyond it, records
    /// bringing new fields with a value are quarantined, naming the limit.
    #[serde(default = "default_max_columns")]
    pub max_columns: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            quarantine_bucket: None,
            quarantine_prefix: default_quarantine_prefix(),
            dedup_skew_seconds: default_skew(),
            max_commit_attempts: default_attempts(),
            commit_timeout_seconds: default_commit_seconds(),
            late_after_seconds: default_late(),
            chunk_records: default_chunk(),
            hash_key_parameter: None,
            ssm_endpoint: None,
            max_line_bytes: default_max_line(),
            max_field_bytes: default_max_field(),
            max_nesting_depth: default_max_depth(),
            max_decompressed_bytes: default_max_decompressed(),
            max_spool_bytes: default_max_spool(),
            max_page_bytes: default_max_page_bytes(),
            max_quarantine_bytes: default_max_quarantine(),
            batch_commits: true,
            max_unique_keys: default_max_unique_keys(),
            max_new_columns: default_max_new_columns(),
            max_columns: default_max_columns(),
        }
    }
}

/// Maintenance defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintainConfig {
    /// Expire snapshots older than this many hours (default 120 = 5 days).
    #[serde(default)]
    pub expire_older_than_hours: Option<f64>,
    /// Always keep this many of main's latest snapshots.
    #[serde(default)]
    pub retain_last: Option<usize>,
    /// Keep snapshots this young for the ingest duplicate check: at least the SQS retention.
    #[serde(default = "default_dedup_window_hours")]
    pub dedup_window_hours: f64,
    /// Orphan files must be older than this (default 72; under 1 is refused).
    #[serde(default = "default_orphan_hours")]
    pub orphan_older_than_hours: f64,
    /// Compaction target file size in MiB (default: the table's `write.target-file-size-bytes`, else 512).
    #[serde(default)]
    pub target_file_size_mb: Option<u64>,
    /// Fewest input files worth a compaction group.
    #[serde(default = "default_min_input_files")]
    pub min_input_files: usize,
    /// Rewrite manifests past this many data manifests.
    #[serde(default = "default_manifest_threshold")]
    pub manifest_threshold: usize,
    /// Memory (MiB of Arrow data) a sorted compaction may hold; larger groups are written as
    /// several sorted runs (default 256).
    #[serde(default = "default_sort_memory_mb")]
    pub sort_memory_mb: usize,
    /// Hot tables whose snapshot history is kept short: table → minutes (at least
    /// [`MIN_HISTORY_MINUTES`]). Such a table keeps only the snapshots younger than this
    /// (besides what consumers, refs and `retain_last` keep), whatever `expire_older_than_hours`
    /// and `dedup_window_hours` say, and is expired every minute by its own schedule
    /// (template.yaml's `ExpireShortHistory`; `floe local` likewise): every commit re-reads and
    /// re-writes the table's metadata.json, which grows by a snapshot entry per commit. A
    /// redelivered object older than the history is checked against the table's `_source` rows
    /// instead of the snapshot summaries, so for a table routes ingest into the history must
    /// also exceed `[ingest] dedup_skew_seconds` by a minute.
    #[serde(default)]
    pub history_minutes: BTreeMap<String, f64>,
}

impl Default for MaintainConfig {
    fn default() -> Self {
        Self {
            expire_older_than_hours: None,
            retain_last: None,
            dedup_window_hours: default_dedup_window_hours(),
            orphan_older_than_hours: default_orphan_hours(),
            target_file_size_mb: None,
            min_input_files: default_min_input_files(),
            manifest_threshold: default_manifest_threshold(),
            sort_memory_mb: default_sort_memory_mb(),
            history_minutes: BTreeMap::new(),
        }
    }
}

/// The shortest `[maintain] history_minutes`: Lambda's 15-minute limit on any function holding
/// a snapshot it read until it commits, plus a minute for the expiration schedule's cadence.
pub const MIN_HISTORY_MINUTES: f64 = 16.0;

fn default_dedup_window_hours() -> f64 {
    96.0
}
fn default_orphan_hours() -> f64 {
    72.0
}
fn default_min_input_files() -> usize {
    5
}
fn default_sort_memory_mb() -> usize {
    256
}

fn default_manifest_threshold() -> usize {
    50
}

/// One table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// Table name inside the namespace.
    pub name: String,
    /// The column holding the source-event time (a `timestamptz` or `timestamp` column; required).
    pub event_time: String,
    /// Partition fields, e.g. `["day(event_time)", "identity(region)"]`.
    #[serde(default)]
    pub partition: Vec<String>,
    /// What to do with input fields the table lacks: `additive` (default: add them as optional
    /// columns, widen types the spec allows), `strict` (quarantine such records), `ignore` (drop).
    #[serde(default)]
    pub schema_policy: SchemaPolicy,
    /// Deprecations that outlive their column: field → removal date (`YYYY-MM-DD`), so removing a
    /// deprecated field after its date classifies as compatible.
    #[serde(default)]
    pub deprecated: BTreeMap<String, String>,
    /// What ingest does with an additive schema change (new column, widening) that would break a
    /// pipeline reading this table: `quarantine` (default: the object is ingested without the
    /// change, the records needing it quarantined with the pipeline and column named) or `stop`
    /// (the object fails, not retryable, and lands in the DLQ with the reason).
    #[serde(default)]
    pub on_consumer_break: ConsumerBreak,
    /// Sort order for compaction output, e.g. `["customer_id", "event_time desc"]`.
    #[serde(default)]
    pub sort: Vec<String>,
    /// Target data file size in MiB.
    #[serde(default = "default_target_mb")]
    pub target_file_size_mb: u64,
    /// The columns, in order. floe adds `_ingested_at` and `_source`.
    pub columns: Vec<ColumnConfig>,
    /// Extra table properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Snapshot retention set on the new table (`history.expire.max-snapshot-age-ms`).
    #[serde(default)]
    pub expire_older_than_hours: Option<f64>,
    /// Snapshots the new table always keeps (`history.expire.min-snapshots-to-keep`).
    #[serde(default)]
    pub retain_last: Option<u32>,
    /// Freshness objective in seconds: the table's freshness alarm threshold (default:
    /// `[defaults]`, else 120).
    #[serde(default)]
    pub freshness_objective_seconds: u64,
    /// No record ingested for this many seconds alarms as a stall (default: `[defaults]`, else
    /// 3600).
    #[serde(default)]
    pub stall_after_seconds: u64,
    /// Data-quality contract: checks every ingested record must pass (`[[tables.checks]]`),
    /// each with its action (see [`contract`]).
    #[serde(default)]
    pub checks: Vec<CheckConfig>,
    /// Whether the routes into the table carry change records (`cdc` of its routes, which
    /// agree): a `debezium` table has the columns `_op` and `_cdc_ts` too. Not a key of its own.
    #[serde(skip)]
    pub cdc: Option<Cdc>,
}

/// One column.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// Column name as it appears in the input.
    pub name: String,
    /// `string`, `int`, `long`, `float`, `double`, `boolean`, `date`, `timestamp`, `timestamptz`,
    /// `decimal(P,S)`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Whether the field must be present and non-null.
    #[serde(default)]
    pub required: bool,
    /// Documentation.
    #[serde(default)]
    pub doc: Option<String>,
    /// Deprecated, to be removed on this date (`YYYY-MM-DD`): the older spelling of
    /// `remove_after` (both may be given only with the same date).
    #[serde(default)]
    pub deprecated: Option<String>,
    /// Who owns the column (a team or contact, asked before it changes or goes); required once
    /// the column is deprecated with `deprecated_since` / `remove_after`.
    #[serde(default)]
    pub owner: Option<String>,
    /// The day the column was deprecated (`YYYY-MM-DD`, not after `remove_after`).
    #[serde(default)]
    pub deprecated_since: Option<String>,
    /// The first day the column may be removed (`YYYY-MM-DD`): ingest, status and schema-diff
    /// warn while it is still produced or read; removing it before the date is breaking and
    /// refused, after it `floe schema drop-column` removes it.
    #[serde(default)]
    pub remove_after: Option<String>,
    /// Sensitive data: `hash` (keyed HMAC-SHA256, see [`crate::protect`]) or `drop` (never stored).
    #[serde(default)]
    pub sensitive: Option<Sensitive>,
}

/// What ingest does with a sensitive column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sensitive {
    /// Replace each value by its keyed HMAC-SHA256 (hex): joinable, not reversible.
    Hash,
    /// Store nulls instead of the values.
    Drop,
}

/// What ingest does with a schema change that would break a consumer (`on_consumer_break`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsumerBreak {
    /// Ingest the object without the change (as under `strict`); records needing it are
    /// quarantined with the pipeline and column named.
    #[default]
    Quarantine,
    /// Fail the object (not committed, not retryable: it lands in the DLQ with the reason).
    Stop,
}

/// Schema policy of a table at ingest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaPolicy {
    /// A record with a field the table lacks is quarantined.
    Strict,
    /// New fields become optional columns in the same commit; compatible widenings are applied.
    #[default]
    Additive,
    /// Unknown fields are dropped and counted.
    Ignore,
}

/// Input format of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// CSV with a header row.
    Csv,
    /// Apache Parquet.
    Parquet,
}

/// One route: objects under `s3://bucket/prefix` go to `table`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Landing bucket.
    pub bucket: String,
    /// Key prefix (may be empty).
    #[serde(default)]
    pub prefix: String,
    /// Target table name.
    pub table: String,
    /// Input format; compression is detected from `.gz`/`.zst` or magic bytes.
    pub format: Format,
    /// The objects are change records: `debezium` (JSON lines of Debezium envelopes, flattened
    /// to the row of `after`, or `before` for a delete, plus `_op` and `_cdc_ts`) or `flat`
    /// (rows that already carry the operation and time in `op_column` / `ts_column`).
    #[serde(default)]
    pub cdc: Option<Cdc>,
    /// `cdc = "flat"`: the column holding the operation (default `op`).
    #[serde(default)]
    pub op_column: Option<String>,
    /// `cdc = "flat"`: the column holding the change time (default `ts`).
    #[serde(default)]
    pub ts_column: Option<String>,
}

/// How a route's change records are shaped (`cdc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cdc {
    /// Debezium envelopes `{"before", "after", "op", "ts_ms", "source"}` (optionally wrapped in
    /// `{"schema", "payload"}`), one per JSON line.
    Debezium,
    /// Rows with the operation and change time in columns of their own.
    Flat,
}

impl RouteConfig {
    /// `cdc = "flat"`: the operation and time columns every record must carry (none otherwise).
    pub(crate) fn cdc_columns(&self) -> Vec<String> {
        if self.cdc != Some(Cdc::Flat) {
            return Vec::new();
        }
        vec![
            self.op_column.clone().unwrap_or_else(|| "op".into()),
            self.ts_column.clone().unwrap_or_else(|| "ts".into()),
        ]
    }
}

fn default_max_join_bytes() -> u64 {
    256 << 20
}
fn default_start() -> String {
    "earliest".into()
}
fn default_namespace() -> String {
    "floe".into()
}
fn default_catalog_name() -> String {
    "floe".into()
}
fn default_quarantine_prefix() -> String {
    "quarantine/".into()
}
fn default_skew() -> u64 {
    900
}
fn default_attempts() -> u32 {
    20
}
fn default_commit_seconds() -> u64 {
    120
}
fn default_late() -> i64 {
    3600
}
fn default_chunk() -> usize {
    4096
}
fn default_max_line() -> u64 {
    1 << 20
}
fn default_max_field() -> u64 {
    256 << 10
}
fn default_max_depth() -> usize {
    64
}
fn default_max_decompressed() -> u64 {
    50 << 30
}
fn default_max_spool() -> u64 {
    8 << 30
}
fn default_true() -> bool {
    true
}
fn default_max_quarantine() -> u64 {
    1 << 30
}
/// Bytes a remembered key costs at the key set's peak (a 16 B hash, the table's slack while it
/// grows).
const UNIQUE_KEY_PEAK_BYTES: u64 = 45;

/// 10 M keys (~430 MB at the set's peak), or on Lambda the keys that fit in a quarter of the
/// function's memory (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`, MB) if fewer: ~745 k at 128 MB, so an
/// object with more distinct keys fails with the limit named instead of running out of memory.
fn default_max_new_columns() -> usize {
    100
}

fn default_max_columns() -> usize {
    1000
}

fn default_max_page_bytes() -> u64 {
    page_bytes_for_memory(lambda_memory_mb())
}

/// The memory (MB) of the Lambda function this runs in (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`),
/// which memory-bound defaults scale with.
fn lambda_memory_mb() -> Option<u64> {
    std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

fn page_bytes_for_memory(memory_mb: Option<u64>) -> u64 {
    const PAGE: u64 = 512 << 20;
    memory_mb.map_or(PAGE, |mb| ((mb << 20) / 4).clamp(1 << 20, PAGE))
}

fn default_max_unique_keys() -> usize {
    unique_keys_for_memory(lambda_memory_mb())
}

fn unique_keys_for_memory(memory_mb: Option<u64>) -> usize {
    const KEYS: u64 = 10_000_000;
    let fit = memory_mb.map_or(KEYS, |mb| (mb << 20) / 4 / UNIQUE_KEY_PEAK_BYTES);
    fit.clamp(1, KEYS) as usize
}
/// Most JSON nesting `max_nesting_depth` may allow: serde_json's recursion limit (schema hints).
pub(crate) const MAX_NESTING_DEPTH_CAP: usize = 128;
fn default_target_mb() -> u64 {
    128
}

impl Config {
    /// Parses and validates a config text; `origin` names the file in errors. `${NAME}` in the
    /// text is replaced by the environment variable `NAME`.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        Self::parse_with_vars(text, origin, &|name| std::env::var(name).ok())
    }

    /// [`Config::parse`] with `${NAME}` looked up in `vars` instead of the environment.
    pub fn parse_with_vars(
        text: &str,
        origin: &str,
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let text = defaults::expand_vars(text, origin, vars)?;
        let text = text.as_str();
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].lines().count().max(1);
                    format!("line {line}")
                })
                .unwrap_or_else(|| "?".into());
            Error::config(origin, &key, e.message())
        })?;
        let raw: toml::Table =
            toml::from_str(text).map_err(|e| Error::config(origin, "?", e.message()))?;
        defaults::validate(&config.defaults, origin)?;
        config.apply_defaults(&raw);
        for i in 0..config.tables.len() {
            let name = config.tables[i].name.clone();
            config.tables[i].cdc = config
                .routes
                .iter()
                .find(|r| r.table == name)
                .and_then(|r| r.cdc);
        }
        config.validate(origin)?;
        Ok(config)
    }

    /// Loads the config from a local path, or from S3 for `s3://bucket/key`. A file that cannot
    /// be read is a `Config` error naming it.
    pub async fn load(location: &str) -> Result<Self> {
        let unreadable = |e: &dyn std::fmt::Display| {
            Error::new(ErrorKind::Config, format!("cannot read {location}: {e}"))
        };
        let text = if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, key) = rest
                .split_once('/')
                .filter(|(b, k)| !b.is_empty() && !k.is_empty())
                .ok_or_else(|| unreadable(&"expected s3://bucket/key"))?;
            let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
            let out = aws_sdk_s3::Client::new(&sdk)
                .get_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| unreadable(&aws_sdk_s3::error::DisplayErrorContext(e)))?;
            let bytes = out.body.collect().await.map_err(|e| unreadable(&e))?;
            String::from_utf8(bytes.to_vec()).map_err(|e| unreadable(&e))?
        } else {
            std::fs::read_to_string(location).map_err(|e| unreadable(&e))?
        };
        Self::parse(&text, location)
    }

    /// Loads from `FLOE_CONFIG` (default `floe.toml`).
    pub async fn from_env() -> Result<Self> {
        let location = std::env::var("FLOE_CONFIG").unwrap_or_else(|_| "floe.toml".into());
        let mut config = Self::load(&location).await.map_err(|e| {
            Error::new(
                e.kind(),
                format!("{e} (named by FLOE_CONFIG or the default)"),
            )
        })?;
        // Names the deployment creates (template.yaml) win over the file's.
        if let Ok(bus) = std::env::var("FLOE_EVENT_BUS") {
            config.events.bus = Some(bus).filter(|b| !b.is_empty());
        }
        if let Ok(p) = std::env::var("FLOE_HASH_KEY_PARAMETER") {
            config.ingest.hash_key_parameter = Some(p).filter(|p| !p.is_empty());
        }
        Ok(config)
    }

    /// The route for an object, the longest matching prefix winning.
    pub fn route(&self, bucket: &str, key: &str) -> Option<&RouteConfig> {
        self.routes
            .iter()
            .filter(|r| r.bucket == bucket && key.starts_with(&r.prefix))
            .max_by_key(|r| r.prefix.len())
    }

    /// A table by name.
    pub fn table(&self, name: &str) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Every table floe writes: the ingest tables, then the pipelines' sinks (and the tombstone
    /// tables of `latest` pipelines with deletes).
    pub fn all_tables(&self) -> Vec<String> {
        self.tables
            .iter()
            .map(|t| t.name.clone())
            .chain(
                self.pipelines
                    .iter()
                    .flat_map(|p| std::iter::once(p.sink.clone()).chain(p.tombstone_table())),
            )
            .collect()
    }

    /// A pipeline by name.
    pub fn pipeline(&self, name: &str) -> Option<&PipelineConfig> {
        self.pipelines.iter().find(|p| p.name == name)
    }

    /// The pipeline whose sink `table` is, if any (a chained pipeline's source, or a joined
    /// table, may be one).
    pub(crate) fn sink_of(&self, table: &str) -> Option<&PipelineConfig> {
        self.pipelines.iter().find(|p| p.sink == table)
    }
}

/// Buckets of a `latest` sink unless `key_buckets` says otherwise.
pub const DEFAULT_KEY_BUCKETS: u32 = 16;
/// Most buckets a `latest` sink may have (each is at least one file per run that touches it).
pub const MAX_KEY_BUCKETS: u32 = 4096;
/// The name of a `latest` sink's tombstone table: the sink's name and this suffix.
pub const TOMBSTONES_SUFFIX: &str = "_tombstones";
const DEFAULT_TOMBSTONE_RETENTION_US: i64 = 7 * 86_400_000_000;

/// Parses a window size (`30s`, `1m`, `5 minutes`, `1h`, `1 day`) into microseconds.
pub(crate) fn parse_window(text: &str) -> std::result::Result<i64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: i64 = num
        .parse()
        .map_err(|_| format!("`{text}`: expected a number and a unit, e.g. `1m`"))?;
    let unit_us: i64 = match unit.trim() {
        "s" | "sec" | "second" | "seconds" => 1_000_000,
        "m" | "min" | "minute" | "minutes" => 60_000_000,
        "h" | "hour" | "hours" => 3_600_000_000,
        "d" | "day" | "days" => 86_400_000_000,
        other => return Err(format!("`{text}`: unknown unit `{other}` (s, m, h, d)")),
    };
    if n <= 0 {
        return Err(format!("`{text}`: must be positive"));
    }
    Ok(n * unit_us)
}

impl PipelineConfig {
    /// The starting strategy for a pipeline without a checkpoint.
    pub fn start_strategy(&self) -> std::result::Result<Start, String> {
        let s = self.start.trim();
        if s == "earliest" {
            Ok(Start::Earliest)
        } else if s == "latest" {
            Ok(Start::Latest)
        } else if let Some(id) = s.strip_prefix("snapshot:") {
            id.trim()
                .parse()
                .map(Start::AfterSnapshot)
                .map_err(|_| format!("`{s}`: expected snapshot:<id>"))
        } else if let Some(ts) = s.strip_prefix("timestamp:") {
            chrono::DateTime::parse_from_rfc3339(ts.trim())
                .map(|t| Start::AfterTimestamp(t.timestamp_millis()))
                .map_err(|e| format!("`{s}`: expected timestamp:<RFC 3339>: {e}"))
        } else {
            Err(format!(
                "`{s}`: expected earliest, latest, snapshot:<id> or timestamp:<RFC 3339>"
            ))
        }
    }

    /// Window size in microseconds (aggregate mode).
    pub fn window_micros(&self) -> Option<i64> {
        self.window.as_deref().and_then(|w| parse_window(w).ok())
    }

    /// Buckets of a `latest` sink (bucket transform over the first key column).
    pub fn key_buckets(&self) -> u32 {
        self.key_buckets.unwrap_or(DEFAULT_KEY_BUCKETS)
    }

    /// The companion table holding a `latest` pipeline's tombstones (with `delete_when` only).
    pub fn tombstone_table(&self) -> Option<String> {
        (self.mode == PipelineMode::Latest && self.delete_when.is_some())
            .then(|| format!("{}{TOMBSTONES_SUFFIX}", self.sink))
    }

    /// The tombstone horizon in microseconds behind the newest version seen (None: forever).
    pub fn tombstone_retention_micros(&self) -> Option<i64> {
        match self.tombstone_retention.as_deref().map(str::trim) {
            None => Some(DEFAULT_TOMBSTONE_RETENTION_US),
            Some("none") | Some("forever") => None,
            Some(t) => parse_window(t).ok(),
        }
    }

    /// The event-time column windows apply to: `time_column`, else the source table's event
    /// time, else (a source that is another pipeline's sink) the upstream pipeline's.
    pub fn time_column<'a>(&'a self, cfg: &'a Config) -> &'a str {
        let mut p = self;
        // Bounded by the number of pipelines: a chain cannot be longer (no cycles).
        for _ in 0..=cfg.pipelines.len() {
            if let Some(c) = p.time_column.as_deref() {
                return c;
            }
            if let Some(t) = cfg.table(&p.source) {
                return t.event_time.as_str();
            }
            match cfg.sink_of(&p.source) {
                Some(up) if up.name != p.name => p = up,
                _ => break,
            }
        }
        "event_time"
    }
}

/// Deprecation marks: field name → removal date.
pub type Deprecations = HashMap<String, chrono::NaiveDate>;

/// Where a consumer without a checkpoint starts (Flink's starting strategies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From the first snapshot: everything.
    Earliest,
    /// From the current snapshot: only what comes next.
    Latest,
    /// After this snapshot.
    AfterSnapshot(i64),
    /// After the last snapshot committed at or before this time (epoch ms).
    AfterTimestamp(i64),
}

/// One deprecated column: who owns it, since when, and from when it may be removed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Deprecation {
    /// The column.
    pub column: String,
    /// Its owner (contact), when the config names one.
    pub owner: Option<String>,
    /// The day it was deprecated.
    pub since: Option<chrono::NaiveDate>,
    /// The first day it may be removed.
    pub remove_after: chrono::NaiveDate,
}

fn parse_day(d: &str) -> Option<chrono::NaiveDate> {
    chrono::NaiveDate::parse_from_str(d.trim(), "%Y-%m-%d").ok()
}

impl ColumnConfig {
    /// The column's removal date: `remove_after`, else the older `deprecated`.
    pub fn remove_after_date(&self) -> Option<chrono::NaiveDate> {
        self.remove_after
            .as_deref()
            .or(self.deprecated.as_deref())
            .and_then(parse_day)
    }
}

impl TableConfig {
    /// Deprecated columns and their removal dates.
    pub fn deprecations(&self) -> Deprecations {
        self.deprecation_list()
            .into_iter()
            .map(|d| (d.column, d.remove_after))
            .collect()
    }

    /// Every deprecated column with owner and dates: those still declared, then the table-level
    /// `deprecated` map (columns removed from the config, no owner recorded).
    pub fn deprecation_list(&self) -> Vec<Deprecation> {
        let mut out: Vec<Deprecation> = self
            .columns
            .iter()
            .filter_map(|c| {
                Some(Deprecation {
                    column: c.name.clone(),
                    owner: c.owner.clone(),
                    since: c.deprecated_since.as_deref().and_then(parse_day),
                    remove_after: c.remove_after_date()?,
                })
            })
            .collect();
        for (f, d) in &self.deprecated {
            if out.iter().any(|o| &o.column == f) {
                continue;
            }
            if let Some(day) = parse_day(d) {
                out.push(Deprecation {
                    column: f.clone(),
                    owner: None,
                    since: None,
                    remove_after: day,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[catalog]
kind = "sqlite"
uri = "sqlite://target/x.db"
warehouse = "file:///tmp/wh"

[[tables]]
name = "orders"
event_time = "event_time"
partition = ["day(event_time)"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "amount", type = "double" },
  { name = "event_time", type = "timestamptz", required = true },
]

[[routes]]
bucket = "landing"
prefix = "orders/"
table = "orders"
format = "jsonl"

[[routes]]
bucket = "landing"
prefix = "orders/eu/"
table = "orders"
format = "csv"
"#;

    #[test]
    fn parses_and_routes_longest_prefix() {
        let c = Config::parse(GOOD, "floe.toml").unwrap();
        assert_eq!(
            c.route("landing", "orders/eu/a.csv").unwrap().format,
            Format::Csv
        );
        assert_eq!(
            c.route("landing", "orders/us/a.json").unwrap().format,
            Format::Jsonl
        );
        assert!(c.route("landing", "other/a.json").is_none());
        assert!(c.route("elsewhere", "orders/a.json").is_none());
    }

    #[test]
    fn the_unique_key_default_fits_the_functions_memory() {
        assert_eq!(unique_keys_for_memory(None), 10_000_000);
        assert_eq!(unique_keys_for_memory(Some(128)), 745_654);
        assert_eq!(unique_keys_for_memory(Some(1769)), 10_000_000);
        assert_eq!(unique_keys_for_memory(Some(0)), 1);
    }

    #[test]
    fn maintenance_hours_are_bounded() {
        for (line, key) in [
            ("dedup_window_hours = 0.01", "maintain.dedup_window_hours"),
            ("dedup_window_hours = inf", "maintain.dedup_window_hours"),
            ("dedup_window_hours = nan", "maintain.dedup_window_hours"),
            (
                "orphan_older_than_hours = 0.5",
                "maintain.orphan_older_than_hours",
            ),
            (
                "orphan_older_than_hours = inf",
                "maintain.orphan_older_than_hours",
            ),
            (
                "expire_older_than_hours = 0",
                "maintain.expire_older_than_hours",
            ),
            (
                "expire_older_than_hours = -inf",
                "maintain.expire_older_than_hours",
            ),
        ] {
            let e = Config::parse(&format!("{GOOD}\n[maintain]\n{line}\n"), "f.toml").unwrap_err();
            assert!(e.to_string().contains(key), "{line}: {e}");
        }
        let ok = Config::parse(
            &format!(
                "{GOOD}\n[maintain]\ndedup_window_hours = 96\nexpire_older_than_hours = 0.5\n"
            ),
            "f.toml",
        )
        .unwrap();
        assert_eq!(ok.maintain.dedup_window_hours, 96.0);
    }

    #[test]
    fn a_short_history_names_a_table_and_outlasts_the_duplicate_checks_skew() {
        let with = |ingest: &str, maintain: &str| {
            Config::parse(
                &format!("{GOOD}\n[ingest]\n{ingest}\n[maintain]\n{maintain}\n"),
                "f.toml",
            )
        };
        for (ingest, maintain, why) in [
            ("", "history_minutes = { nope = 20 }", "no table"),
            ("", "history_minutes = { orders = 0.5 }", "at least 16"),
            ("", "history_minutes = { orders = 15.9 }", "15 minutes"),
            ("", "history_minutes = { orders = inf }", "at least 16"),
            // The skew outlasts the 16-minute floor: a minute more than it.
            (
                "dedup_skew_seconds = 1800",
                "history_minutes = { orders = 20 }",
                "dedup_skew_seconds",
            ),
            // So may the commit loop's window.
            (
                "commit_timeout_seconds = 1200",
                "history_minutes = { orders = 20 }",
                "commit_timeout_seconds",
            ),
        ] {
            let e = with(ingest, maintain).unwrap_err().to_string();
            assert!(
                e.contains("maintain.history_minutes.") && e.contains(why),
                "{maintain}: {e}"
            );
        }
        let ok = with("", "history_minutes = { orders = 16 }").unwrap();
        assert_eq!(ok.maintain.history_minutes["orders"], 16.0);
        let ok = with(
            "dedup_skew_seconds = 1800",
            "history_minutes = { orders = 31 }",
        )
        .unwrap();
        assert_eq!(ok.maintain.history_minutes["orders"], 31.0);
    }

    #[test]
    fn input_limits_default_and_validate() {
        let c = Config::parse(GOOD, "floe.toml").unwrap();
        assert_eq!(c.ingest.max_line_bytes, 1 << 20);
        assert_eq!(c.ingest.max_field_bytes, 256 << 10);
        assert_eq!(c.ingest.max_nesting_depth, 64);
        assert_eq!(c.ingest.max_decompressed_bytes, 50 << 30);
        assert_eq!(c.ingest.max_spool_bytes, 8 << 30);
        assert_eq!(c.ingest.max_page_bytes, 512 << 20);
        assert_eq!(page_bytes_for_memory(Some(1024)), 256 << 20);
        assert_eq!(page_bytes_for_memory(Some(10240)), 512 << 20);
        assert_eq!(page_bytes_for_memory(Some(128)), 32 << 20);
        assert_eq!(c.ingest.max_quarantine_bytes, 1 << 30);
        let with = |lines: &str| format!("{GOOD}\n[ingest]\n{lines}\n");
        let c = Config::parse(
            &with("max_line_bytes = 4096\nmax_field_bytes = 100\nmax_nesting_depth = 8"),
            "f.toml",
        )
        .unwrap();
        assert_eq!(
            (c.ingest.max_line_bytes, c.ingest.max_field_bytes),
            (4096, 100)
        );
        for (lines, key, says) in [
            (
                "max_line_bytes = 10",
                "ingest.max_line_bytes",
                "at least 1024",
            ),
            (
                "max_field_bytes = 0",
                "ingest.max_field_bytes",
                "at least 1",
            ),
            (
                "max_line_bytes = 2048\nmax_field_bytes = 4096",
                "ingest.max_field_bytes",
                "above max_line_bytes",
            ),
            (
                "max_nesting_depth = 0",
                "ingest.max_nesting_depth",
                "between 1",
            ),
            (
                "max_nesting_depth = 1000",
                "ingest.max_nesting_depth",
                "128",
            ),
            (
                "max_decompressed_bytes = 0",
                "ingest.max_decompressed_bytes",
                "at least 1",
            ),
            (
                "max_spool_bytes = 0",
                "ingest.max_spool_bytes",
                "at least 1",
            ),
            (
                // one malformed line of max_line_bytes must fit, JSON-escaped
                "max_quarantine_bytes = 1024",
                "ingest.max_quarantine_bytes",
                "at least 8388608",
            ),
            (
                "max_quarantine_bytes = 6442450944",
                "ingest.max_quarantine_bytes",
                "largest single S3 PutObject",
            ),
        ] {
            let e = Config::parse(&with(lines), "f.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("f.toml") && e.contains(key) && e.contains(says),
                "{lines}: {e}"
            );
        }
    }

    #[test]
    fn deprecation_keys_validate_and_list_owner_and_dates() {
        let amount = "{ name = \"amount\", type = \"double\" }";
        let with = |col: &str| GOOD.replace(amount, col);
        let c = Config::parse(
            &with("{ name = \"amount\", type = \"double\", owner = \"payments@x\", deprecated_since = \"2026-01-01\", remove_after = \"2026-06-01\" }"),
            "f.toml",
        )
        .unwrap();
        let d = c.tables[0].deprecation_list();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].owner.as_deref(), Some("payments@x"));
        assert_eq!(d[0].since, parse_day("2026-01-01"));
        assert_eq!(d[0].remove_after, parse_day("2026-06-01").unwrap());
        // The older key is an alias of remove_after, valid without an owner.
        let c = Config::parse(
            &with("{ name = \"amount\", type = \"double\", deprecated = \"2026-06-01\" }"),
            "f.toml",
        )
        .unwrap();
        assert_eq!(
            c.tables[0].deprecations().get("amount"),
            parse_day("2026-06-01").as_ref()
        );
        assert_eq!(c.tables[0].on_consumer_break, ConsumerBreak::Quarantine);
        for (col, key, says) in [
            ("remove_after = \"2026-06-01\"", "columns[1].owner", "owner"),
            (
                "owner = \"o\", remove_after = \"June\"",
                "columns[1].remove_after",
                "YYYY-MM-DD",
            ),
            (
                "owner = \"o\", deprecated_since = \"2026-07-01\", remove_after = \"2026-06-01\"",
                "columns[1].deprecated_since",
                "after remove_after",
            ),
            (
                "owner = \"o\", deprecated_since = \"2026-07-01\"",
                "columns[1].deprecated_since",
                "needs `remove_after`",
            ),
            (
                "owner = \"o\", deprecated = \"2026-05-01\", remove_after = \"2026-06-01\"",
                "columns[1].remove_after",
                "differs",
            ),
        ] {
            let text = with(&format!(
                "{{ name = \"amount\", type = \"double\", {col} }}"
            ));
            let e = Config::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{col}: {e}");
        }
        let stop = GOOD.replace(
            "partition = [\"day(event_time)\"]",
            "partition = [\"day(event_time)\"]\non_consumer_break = \"stop\"",
        );
        let c = Config::parse(&stop, "f.toml").unwrap();
        assert_eq!(c.tables[0].on_consumer_break, ConsumerBreak::Stop);
        let by_default = format!("[defaults]\non_consumer_break = \"stop\"\n{GOOD}");
        let c = Config::parse(&by_default, "f.toml").unwrap();
        assert_eq!(c.tables[0].on_consumer_break, ConsumerBreak::Stop);
    }

    #[test]
    fn errors_name_file_key_and_reason() {
        let bad = GOOD.replace("event_time = \"event_time\"", "event_time = \"when\"");
        let e = Config::parse(&bad, "conf/floe.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("conf/floe.toml")
                && e.contains("tables[0].event_time")
                && e.contains("when"),
            "{e}"
        );

        let bad = GOOD.replace("type = \"double\"", "type = \"money\"");
        let e = Config::parse(&bad, "f.toml").unwrap_err().to_string();
        assert!(
            e.contains("tables[0].columns[1].type") && e.contains("money"),
            "{e}"
        );

        let bad = GOOD.replace("day(event_time)", "day(nope)");
        let e = Config::parse(&bad, "f.toml").unwrap_err().to_string();
        assert!(e.contains("partition[0]"), "{e}");

        let bad = GOOD.replace(
            "table = \"orders\"\nformat = \"csv\"",
            "table = \"nope\"\nformat = \"csv\"",
        );
        let e = Config::parse(&bad, "f.toml").unwrap_err().to_string();
        assert!(e.contains("routes[1].table"), "{e}");

        let bad = GOOD.replace("kind = \"sqlite\"", "kind = \"oracle\"");
        let e = Config::parse(&bad, "f.toml").unwrap_err().to_string();
        assert!(e.contains("f.toml") && e.contains("line"), "{e}");
    }

    #[test]
    fn joins_name_tables_or_sinks_and_cycles_are_refused_by_name() {
        let tables = GOOD.find("[[tables]]").unwrap_or(0);
        let routes = GOOD.find("[[routes]]").unwrap_or(GOOD.len());
        let customers = GOOD[tables..routes].replace("name = \"orders\"", "name = \"customers\"");
        let pipeline = |name: &str, sink: &str, joins: &str| {
            format!(
                "\n[[pipelines]]\nname = \"{name}\"\nsource = \"orders\"\nsink = \"{sink}\"\n\
                 mode = \"append\"\nsql = \"SELECT 1\"\njoins = [{joins}]\n"
            )
        };
        let with = |pipelines: &str| format!("{GOOD}\n{customers}\n{pipelines}");
        let ok = Config::parse(
            &with(&(pipeline("a", "sa", "\"customers\"") + &pipeline("b", "sb", "\"sa\""))),
            "f.toml",
        )
        .unwrap();
        assert_eq!(ok.pipelines[0].joins, vec!["customers".to_string()]);
        assert_eq!(ok.pipelines[0].max_join_bytes, 256 << 20);
        assert_eq!(ok.sink_of("sa").map(|p| p.name.as_str()), Some("a"));
        for (joins, says) in [
            ("\"nope\"", "no table or pipeline sink named `nope`"),
            ("\"orders\"", "is the pipeline's source"),
            ("\"sa\"", "own sink"),
            ("\"source\"", "cannot be joined by name"),
            ("\"customers\", \"customers\"", "joined twice"),
        ] {
            let e = Config::parse(&with(&pipeline("a", "sa", joins)), "f.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("pipelines[0].joins[") && e.contains(says),
                "{joins}: {e}"
            );
        }
        let e = Config::parse(
            &with(&(pipeline("a", "sa", "") + "max_join_bytes = 0\n")),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("pipelines[0].max_join_bytes"), "{e}");
        // a joins b's sink and b joins a's: each sink's commits would feed the other.
        let e = Config::parse(
            &with(&(pipeline("a", "sa", "\"sb\"") + &pipeline("b", "sb", "\"sa\""))),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cycle: sa → sb → sa") && e.contains("`a`, `b`"),
            "{e}"
        );
    }

    #[test]
    fn a_sink_can_be_a_source_and_cycles_are_refused_by_name() {
        let pipeline = |name: &str, source: &str, sink: &str, mode: &str| {
            let window = if mode == "aggregate" {
                "window = \"1m\"\n"
            } else {
                ""
            };
            format!(
                "\n[[pipelines]]\nname = \"{name}\"\nsource = \"{source}\"\nsink = \"{sink}\"\n\
                 mode = \"{mode}\"\n{window}sql = \"SELECT 1\"\n"
            )
        };
        let chain = format!(
            "{GOOD}{}{}",
            pipeline("b", "sa", "sb", "aggregate"),
            pipeline("a", "orders", "sa", "append")
        );
        let c = Config::parse(&chain, "f.toml").unwrap();
        assert_eq!(
            c.pipeline("b").map(|b| b.time_column(&c)),
            Some("event_time"),
            "the upstream's time column"
        );
        let e = Config::parse(
            &format!(
                "{GOOD}{}{}",
                pipeline("a", "orders", "sa", "aggregate"),
                pipeline("b", "sa", "sb", "append")
            ),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("pipelines[1].source") && e.contains("replace rows"),
            "{e}"
        );
        let e = Config::parse(
            &format!(
                "{GOOD}{}{}{}",
                pipeline("a", "orders", "s0", "append"),
                pipeline("b", "sb", "sa", "append"),
                pipeline("c", "sa", "sb", "append")
            ),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("pipelines[1]")
                && e.contains("cycle: sa → sb → sa")
                && e.contains("`b`, `c`"),
            "{e}"
        );
        let e = Config::parse(
            &format!("{GOOD}{}", pipeline("a", "nope", "sa", "append")),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("pipelines[0].source") && e.contains("no table or pipeline sink"),
            "{e}"
        );
    }

    #[test]
    fn cdc_routes_validate_and_mark_their_table() {
        let head = &GOOD[..GOOD.find("[[routes]]").unwrap_or(GOOD.len())];
        let route = |prefix: &str, format: &str, lines: &str| {
            format!(
                "\n[[routes]]\nbucket = \"landing\"\nprefix = \"{prefix}\"\ntable = \"orders\"\n\
                 format = \"{format}\"\n{lines}\n"
            )
        };
        let with = |routes: &[String]| format!("{head}{}", routes.concat());
        let c = Config::parse(
            &with(&[
                route("a/", "jsonl", "cdc = \"debezium\""),
                route("b/", "jsonl", "cdc = \"debezium\""),
            ]),
            "f.toml",
        )
        .unwrap();
        assert_eq!(c.tables[0].cdc, Some(Cdc::Debezium));
        let schema = crate::schema::table_schema(&c.tables[0]).unwrap();
        assert!(schema.field_by_name("_op").is_some() && schema.field_by_name("_cdc_ts").is_some());
        let plain = Config::parse(GOOD, "f.toml").unwrap();
        assert_eq!(plain.tables[0].cdc, None);
        let schema = crate::schema::table_schema(&plain.tables[0]).unwrap();
        assert!(schema.field_by_name("_op").is_none());
        let flat = "cdc = \"flat\"\nop_column = \"order_id\"\nts_column = \"event_time\"";
        let c = Config::parse(&with(&[route("a/", "csv", flat)]), "f.toml").unwrap();
        assert_eq!(c.routes[0].cdc_columns(), ["order_id", "event_time"]);
        assert_eq!(c.tables[0].cdc, Some(Cdc::Flat));
        for (routes, key, says) in [
            (
                vec![
                    route("a/", "jsonl", "cdc = \"debezium\""),
                    route("b/", "jsonl", ""),
                ],
                "routes[0].cdc",
                "disagree: cdc = \"debezium\" here, no cdc for prefix `b/`",
            ),
            (
                vec![route("a/", "csv", "cdc = \"debezium\"")],
                "routes[0].cdc",
                "JSON lines",
            ),
            (
                vec![route("a/", "jsonl", "op_column = \"kind\"")],
                "routes[0].op_column",
                "only a `cdc = \"flat\"`",
            ),
            (
                vec![route("a/", "jsonl", "cdc = \"flat\"")],
                "routes[0].op_column",
                "no column `op`",
            ),
        ] {
            let e = Config::parse(&with(&routes), "f.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(says), "{key}: {e}");
        }
    }

    #[test]
    fn latest_pipelines_need_keys_and_an_order_and_name_what_is_wrong() {
        let with = |extra: &str| {
            format!(
                "{GOOD}\n[[pipelines]]\nname = \"p\"\nsource = \"orders\"\nsink = \"s\"\nsql = \"SELECT 1\"\n{extra}"
            )
        };
        let ok = Config::parse(
            &with("mode = \"latest\"\nkeys = [\"customer_id\"]\norder_by = \"event_time\"\ndelete_when = \"status = 'cancelled'\"\nkey_buckets = 32\ntombstone_retention = \"2d\""),
            "f.toml",
        )
        .unwrap();
        let p = &ok.pipelines[0];
        assert_eq!(p.mode, PipelineMode::Latest);
        assert_eq!(p.key_buckets(), 32);
        assert_eq!(p.tombstone_table().as_deref(), Some("s_tombstones"));
        assert_eq!(p.tombstone_retention_micros(), Some(2 * 86_400_000_000));
        assert!(ok.all_tables().contains(&"s_tombstones".to_string()));
        let plain = Config::parse(
            &with("mode = \"latest\"\nkeys = [\"customer_id\"]\norder_by = \"event_time\"\ntombstone_retention = \"none\""),
            "f.toml",
        )
        .unwrap();
        let p = &plain.pipelines[0];
        assert_eq!((p.key_buckets(), p.tombstone_table()), (16, None));
        assert_eq!(p.tombstone_retention_micros(), None);
        for (extra, key) in [
            ("mode = \"latest\"\norder_by = \"event_time\"", "pipelines[0].keys"),
            ("mode = \"latest\"\nkeys = [\"a\", \"a\"]\norder_by = \"t\"", "pipelines[0].keys"),
            ("mode = \"latest\"\nkeys = [\"customer_id\"]", "pipelines[0].order_by"),
            ("mode = \"latest\"\nkeys = [\"t\"]\norder_by = \"t\"", "pipelines[0].order_by"),
            ("mode = \"latest\"\nkeys = [\"k\"]\norder_by = \"t\"\nkey_buckets = 0", "pipelines[0].key_buckets"),
            ("mode = \"latest\"\nkeys = [\"k\"]\norder_by = \"t\"\ndelete_when = \" \"", "pipelines[0].delete_when"),
            ("mode = \"latest\"\nkeys = [\"k\"]\norder_by = \"t\"\ntombstone_retention = \"a while\"", "pipelines[0].tombstone_retention"),
            ("mode = \"latest\"\nkeys = [\"k\"]\norder_by = \"t\"\nwindow = \"1m\"", "pipelines[0].window"),
            ("mode = \"append\"\norder_by = \"t\"", "pipelines[0].order_by"),
            ("mode = \"aggregate\"\nwindow = \"1m\"\nkey_buckets = 4", "pipelines[0].key_buckets"),
        ] {
            let e = Config::parse(&with(extra), "f.toml").unwrap_err().to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
        // The tombstone table must not collide with a table.
        let clash = format!(
            "{}\n[[pipelines]]\nname = \"q\"\nsource = \"orders\"\nsink = \"s_tombstones\"\nmode = \"append\"\nsql = \"SELECT 1\"\n",
            with("mode = \"latest\"\nkeys = [\"k\"]\norder_by = \"t\"\ndelete_when = \"op = 'D'\"")
        );
        let e = Config::parse(&clash, "f.toml").unwrap_err().to_string();
        assert!(e.contains("tombstone table `s_tombstones`"), "{e}");
        let tables = GOOD.find("[[tables]]").unwrap_or(0);
        let routes = GOOD.find("[[routes]]").unwrap_or(GOOD.len());
        let customers = GOOD[tables..routes].replace("name = \"orders\"", "name = \"customers\"");
        let joined = format!(
            "{}\n{customers}",
            with("mode = \"latest\"\nkeys = [\"k\"]\norder_by = \"t\"\njoins = [\"customers\"]")
        );
        let e = Config::parse(&joined, "f.toml").unwrap_err().to_string();
        assert!(
            e.contains("pipelines[0].joins") && e.contains("do not join"),
            "{e}"
        );
    }

    #[test]
    fn pipelines_validate_start_window_and_sinks() {
        let with = |extra: &str| {
            format!(
                "{GOOD}\n[[pipelines]]\nname = \"p\"\nsource = \"orders\"\nsink = \"s\"\n{extra}"
            )
        };
        let ok = Config::parse(&with("mode = \"aggregate\"\nwindow = \"5 minutes\"\nsql = \"SELECT 1\"\nstart = \"snapshot:42\""), "f.toml").unwrap();
        let p = &ok.pipelines[0];
        assert_eq!(p.window_micros(), Some(300_000_000));
        assert_eq!(p.start_strategy(), Ok(Start::AfterSnapshot(42)));
        assert_eq!(p.time_column(&ok), "event_time");
        let ts = Config::parse(
            &with(
                "mode = \"append\"\nsql = \"SELECT 1\"\nstart = \"timestamp:2026-11-30T10:00:00Z\"",
            ),
            "f.toml",
        )
        .unwrap();
        assert!(
            matches!(ts.pipelines[0].start_strategy(), Ok(Start::AfterTimestamp(ms)) if ms == 1_796_032_800_000)
        );
        for (extra, key) in [
            (
                "mode = \"aggregate\"\nsql = \"SELECT 1\"",
                "pipelines[0].window",
            ),
            (
                "mode = \"append\"\nwindow = \"1m\"\nsql = \"SELECT 1\"",
                "pipelines[0].window",
            ),
            (
                "mode = \"append\"\nsql = \"SELECT 1\"\nstart = \"yesterday\"",
                "pipelines[0].start",
            ),
            (
                "mode = \"aggregate\"\nwindow = \"1 fortnight\"\nsql = \"SELECT 1\"",
                "pipelines[0].window",
            ),
        ] {
            let e = Config::parse(&with(extra), "f.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
        let e = Config::parse(
            &with("mode = \"append\"\nsql = \"SELECT 1\"")
                .replace("sink = \"s\"", "sink = \"orders\""),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("pipelines[0].sink"), "{e}");
    }
}
