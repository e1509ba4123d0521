//! The command line: clap derive structs (their doc comments are the help text).
//!
//! Every command and flag of the hand-written parser this replaced keeps its spelling, default
//! and meaning; scripts depend on them.

use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// Exit codes, shown under the top-level `--help` (README.md says the same).
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  failure, or `process reconcile` found a difference between batch and sink
  2  usage error (bad flag or value); `schema-diff` found a breaking change or a
     pipeline that would break; `schema drop-column` refused (before the column's
     remove_after date, or pipelines still read it and --force was not given)

The config (--config) falls back to $FLOE_CONFIG, then ./floe.toml.";

/// floe: one transactional Apache Iceberg table on S3 as the system of record for batch and
/// streaming.
///
/// The command line over the same library the Lambdas use: a local demo, ingest by hand, table
/// status, maintenance, schema checks for CI, the SQL pipelines (incremental run, batch refresh,
/// batch-vs-sink reconcile), a local stack on moto_server and the benchmarks.
#[derive(Debug, Parser)]
#[command(
    name = "floe",
    version,
    after_help = EXIT_CODES,
    arg_required_else_help = true,
    propagate_version = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Local demo: SQLite catalog + local warehouse, nothing but cargo.
    ///
    /// Writes DIR/floe.toml, lands sample objects in a local "bucket" (good, bad records, late
    /// events, an unknown field, a CSV with a bad row, a corrupt gzip object, an unrouted object,
    /// a duplicate delivery), hands them to the function the ingest Lambda calls, runs both sample
    /// pipelines (also over late events), reconciles them against a batch run and prints the
    /// table status. DIR is deleted first.
    Demo(DemoArgs),
    /// Ingest objects by hand through the Lambda's code path.
    ///
    /// Each s3://bucket/key is routed by the config's `routes`, ingested exactly once (a
    /// duplicate is recognised and skipped) and reported: records in, committed, quarantined,
    /// late, and the snapshot.
    Ingest(IngestArgs),
    /// Backfill or replay: every routed object under a prefix, exactly once, in batches.
    ///
    /// Lists s3://BUCKET/PREFIX (every page), keeps the routed objects last modified in
    /// [--since, --until), leaves out those already in their table (one scan of the table's
    /// `_source` column, durable beyond snapshot expiration) and ingests the rest through the
    /// ingest function's code path: batches of --batch objects of one table, one commit each,
    /// --concurrency batches at a time. Interrupted? Run it again: committed objects are left
    /// out. --dry-run prints per table what would be ingested and the estimated cost. Exit 1 if
    /// any object failed (it stays pending for the next run).
    Backfill(BackfillArgs),
    /// Replay the ingest dead-letter queue (or a list of objects), each object exactly once.
    ///
    /// --dlq reads the ingest DLQ's messages (the original S3 notifications, SNS envelopes or
    /// EventBridge events; ten at a time, hidden for --visibility-timeout) and ingests their
    /// objects through the ingest function's code path: an object already committed is found
    /// and skipped. A message is deleted only when every object it names is committed, already
    /// committed or quarantined; one that failed (transient or permanent), cannot be
    /// understood, or names an object that is gone or unrouted stays, reported with its
    /// reason. An unknown commit outcome deletes nothing until a re-read of the table finds the
    /// object. --keys takes s3://bucket/key[#version] lines instead (nothing to delete).
    /// --dry-run lists what would be replayed and what is committed already, and makes the
    /// messages visible again. Exit 1 if anything was left or failed.
    Replay(ReplayArgs),
    /// Per table: snapshots, files, records, freshness, quarantine, consumers' lag.
    ///
    /// For every configured table (sources and pipeline sinks): snapshots, records, data files
    /// and the small-file share, quarantined records, last commit, freshness lag (commit time −
    /// newest event time) and how far each consumer's checkpoint is behind.
    Status(StatusArgs),
    /// Freshness, throughput, small files, query planning, recovery and cost, per table and
    /// pipeline, from the tables' history.
    ///
    /// Freshness p50/p95/p99 (commit − object LastModified, and commit − event time), rows/s and
    /// bytes/s (overall and per hour), the small-file share, the planning time of a
    /// representative query (DataFusion), the longest stretch with the lag above its objective
    /// (recovery), and the cost: Lambda GB-seconds per function and pipeline, S3 requests by
    /// kind per commit and per maintenance run, storage (live and retained by snapshots only),
    /// in dollars at the `[cost]` prices of the config (defaults: us-east-1 list prices).
    Baseline(crate::baseline_cmd::BaselineArgs),
    /// Compaction, snapshot expiration, orphan cleanup, manifest rewrite.
    ///
    /// Runs the maintain Lambda's operations by hand over one table or all configured ones.
    /// Defaults come from `[maintain]` in the config; table properties win; the flags below win
    /// over both.
    Maintain(MaintainArgs),
    /// Classify schema changes and plan every consumer against them (exit 2 if anything breaks).
    ///
    /// Compares the table's current schema with the config's (or with what an input object
    /// carries, with --object), prints every change with its class, plans every pipeline whose
    /// source is the table against the proposed schema (ok, or breaks naming the column and its
    /// line:column in the SQL), lists deprecated columns with owner, dates and who still produces
    /// or reads them, and exits 2 when any change is breaking or any consumer breaks, so that CI
    /// stops the rollout.
    SchemaDiff(SchemaDiffArgs),
    /// Compare a table with what the system it replaces produced (exit 1 on a difference).
    ///
    /// The other side (--against) is `s3://bucket/prefix` (Parquet, CSV or JSON-lines objects,
    /// optionally gzip/zstd; format from the extension or --format), a local file or directory,
    /// or `iceberg:TABLE` (a table in this config's catalog, or in --against-config's). Per
    /// window of the time column: record counts, distinct keys and per-measure sums; per key:
    /// missing on either side (sampled), duplicated, or differing in window or measures.
    /// Defaults come from the table's `[[compare]]` entry; flags win. Exit 1 when anything
    /// differs beyond --tolerance.
    Compare(CompareArgs),
    /// Schema operations on a table: drop-column (the end of a deprecation).
    Schema(SchemaArgs),
    /// SQL pipelines: incremental run, batch refresh, batch-vs-sink reconcile.
    ///
    /// The process function's work by hand, and the batch side of it.
    Process(ProcessArgs),
    /// The deployed topology on moto_server: S3 → SQS → ingest, events → process, schedule →
    /// maintain.
    ///
    /// Starts moto_server (infra/venv.sh, infra/moto_server.py) on 127.0.0.1, creates bucket
    /// floe-local, the queue and the notification, writes DIR/floe.toml, then loops: landing/
    /// objects → SQS → the ingest code path (partial-batch semantics), floe.commit events →
    /// EventBridge → SQS → the process code path (plus a 60 s poll), maintenance on a timer.
    Local(LocalArgs),
    /// Benchmarks: ingest vs PyIceberg and plain arrow-rs; --maintenance, --planning, --latency,
    /// --checks, --delta.
    ///
    /// Without a mode flag: generates order events and runs floe, PyIceberg and a plain arrow-rs
    /// JSON → Parquet conversion side by side, each in its own process, and prints wall time,
    /// rows/s and peak RSS. Run with --release. Tables go to stdout, progress to stderr.
    Bench(BenchArgs),
    /// Generate template.yaml's per-table parts from floe.toml (table-scoped roles, alarms).
    ///
    /// Rewrites the blocks between `# floe:generated NAME begin|end` markers: each function's
    /// data-plane permissions limited to the tables it needs (ingest: routed tables, landing and
    /// quarantine prefixes; process: sources read-only, sinks; maintain: every table), a freshness
    /// and a stall alarm per table, a lag alarm per pipeline, and the dashboard. The config must
    /// use the Glue catalog; `${FLOE_DATA_BUCKET}` in it stands for the stack's bucket. With
    /// --check nothing is written and the exit status is 1 when the template is stale.
    Template(TemplateArgs),
    /// Print a shell completion script to stdout.
    ///
    /// For example: `floe completions bash > /etc/bash_completion.d/floe`, or
    /// `floe completions zsh > "${fpath[1]}/_floe"`.
    Completions(CompletionsArgs),
}

/// Where the config path came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConfigOrigin {
    /// `--config FILE`.
    Flag,
    /// `$FLOE_CONFIG`.
    Env,
    /// Neither: `floe.toml` in the working directory.
    #[default]
    Default,
}

impl std::fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConfigOrigin::Flag => "given by --config",
            ConfigOrigin::Env => "given by $FLOE_CONFIG",
            ConfigOrigin::Default => "the default; pass --config FILE or set $FLOE_CONFIG",
        })
    }
}

/// `--config FILE`, shared by the commands that read a floe.toml.
#[derive(Debug, Clone, Args)]
pub struct ConfigArg {
    /// The floe.toml: a local path or s3://bucket/key.
    #[arg(
        id = "config",
        long = "config",
        value_name = "FILE",
        env = "FLOE_CONFIG",
        default_value = "floe.toml"
    )]
    pub path: String,
    /// Where `path` came from (filled in by [`parse_from`]).
    #[arg(skip)]
    pub origin: ConfigOrigin,
}

/// `floe demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Working directory (deleted and recreated).
    #[arg(long, value_name = "DIR", default_value = "target/floe-demo")]
    pub dir: String,
}

/// `floe ingest`.
#[derive(Debug, Args)]
pub struct IngestArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Objects to ingest, as s3://bucket/key.
    #[arg(value_name = "s3://BUCKET/KEY", required = true, value_parser = parse_s3_url)]
    pub objects: Vec<S3Url>,
}

/// `floe backfill`.
#[derive(Debug, Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// What to backfill: s3://BUCKET/PREFIX (an empty prefix lists the whole bucket).
    #[arg(value_name = "s3://BUCKET/PREFIX", value_parser = parse_s3_prefix)]
    pub location: S3Url,
    /// Only objects last modified at or after this (RFC 3339).
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
    /// Only objects last modified before this (RFC 3339).
    #[arg(long, value_name = "T")]
    pub until: Option<String>,
    /// Print the plan and the estimated cost; ingest nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Batches in flight at once.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub concurrency: usize,
    /// Objects per batch (one commit each).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub batch: usize,
    /// Cost estimate: ingest throughput per invocation, MiB/s.
    #[arg(long, value_name = "R", default_value_t = 50.0)]
    pub mib_per_second: f64,
    /// Cost estimate: the ingest function's memory, MB.
    #[arg(long, value_name = "MB", default_value_t = 1769)]
    pub memory_mb: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Run on the stack's backfill state machine (a Step Functions Distributed Map) instead of
    /// here: the plan is written as a manifest beside the objects, an execution named after it
    /// is started (the same plan again follows the same execution) and followed to its end.
    /// Batch size, concurrency and tolerated failures are the stack's parameters.
    #[arg(long, requires = "state_machine_arn")]
    pub on_aws: bool,
    /// The state machine: the stack's BackfillStateMachineArn output (--on-aws).
    #[arg(long, value_name = "ARN", requires = "on_aws")]
    pub state_machine_arn: Option<String>,
    /// Key prefix of the manifest in the listed bucket; the state machine reads only under it
    /// (--on-aws).
    #[arg(long, value_name = "PREFIX", default_value = "backfill-manifests/")]
    pub manifest_prefix: String,
    /// Start the execution and exit without following it (--on-aws).
    #[arg(long, requires = "on_aws")]
    pub no_wait: bool,
    /// Step Functions endpoint, for emulators (--on-aws; default: the SDK's).
    #[arg(long, value_name = "URL", requires = "on_aws")]
    pub sfn_endpoint: Option<String>,
}

/// `floe replay`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").args(["dlq", "keys"]).required(true)))]
pub struct ReplayArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The ingest dead-letter queue's URL (the stack's IngestDeadLetterQueueUrl output).
    #[arg(long, value_name = "QUEUE_URL")]
    pub dlq: Option<String>,
    /// A file of s3://bucket/key[#version] lines to replay instead (`-`: standard input).
    #[arg(long, value_name = "FILE|-")]
    pub keys: Option<String>,
    /// At most N messages (or lines).
    #[arg(long, value_name = "N")]
    pub max: Option<usize>,
    /// List what would be replayed and what is committed already; ingest and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Seconds a received message stays hidden; must exceed a round of 10 messages. A message
    /// left in the queue becomes visible again after it.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 1800,
        conflicts_with = "keys"
    )]
    pub visibility_timeout: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

fn parse_s3_prefix(s: &str) -> Result<S3Url, String> {
    let rest = s
        .strip_prefix("s3://")
        .ok_or_else(|| format!("`{s}`: expected s3://bucket/prefix"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("`{s}`: expected s3://bucket/prefix"));
    }
    Ok(S3Url {
        bucket: bucket.into(),
        key: key.into(),
    })
}

/// An object named as `s3://bucket/key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The key (may contain `/`).
    pub key: String,
}

fn parse_s3_url(s: &str) -> Result<S3Url, String> {
    s.strip_prefix("s3://")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(bucket, key)| !bucket.is_empty() && !key.is_empty())
        .map(|(bucket, key)| S3Url {
            bucket: bucket.into(),
            key: key.into(),
        })
        .ok_or_else(|| format!("`{s}`: expected s3://bucket/key"))
}

/// `floe status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `floe maintain`.
#[derive(Debug, Args)]
pub struct MaintainArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// One table (default: every configured table).
    #[arg(long, value_name = "T")]
    pub table: Option<String>,
    /// Only these operations, comma-separated: compact, expire, orphans, manifests.
    #[arg(long, value_name = "LIST", value_parser = parse_only)]
    pub only: Option<Only>,
    /// Report what would be done; orphans are listed, not deleted.
    #[arg(long)]
    pub dry_run: bool,
    /// Expire snapshots older than H hours (fractions allowed).
    #[arg(long = "older-than-hours", value_name = "H", value_parser = parse_hours)]
    pub older_than: Option<Duration>,
    /// Keep at least the last N snapshots.
    #[arg(long, value_name = "N")]
    pub retain_last: Option<usize>,
    /// Delete only orphan files older than H hours (fractions allowed).
    #[arg(long = "orphan-older-than-hours", value_name = "H", value_parser = parse_hours)]
    pub orphan_older_than: Option<Duration>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Which maintenance operations `--only` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Only {
    /// Compaction.
    pub compact: bool,
    /// Snapshot expiration.
    pub expire: bool,
    /// Orphan-file cleanup.
    pub orphans: bool,
    /// Manifest rewrite.
    pub manifests: bool,
}

impl Only {
    const NONE: Only = Only {
        compact: false,
        expire: false,
        orphans: false,
        manifests: false,
    };
}

/// `--only`: comma-separated, spaces allowed; unknown names are an error (a typo must not
/// silently turn an operation off).
fn parse_only(s: &str) -> Result<Only, String> {
    let mut only = Only::NONE;
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item {
            "compact" => only.compact = true,
            "expire" => only.expire = true,
            "orphans" => only.orphans = true,
            "manifests" => only.manifests = true,
            other => {
                return Err(format!(
                    "unknown operation `{other}` (compact, expire, orphans, manifests)"
                ))
            }
        }
    }
    if only == Only::NONE {
        return Err("name at least one of compact, expire, orphans, manifests".into());
    }
    Ok(only)
}

/// Hours as a non-negative decimal number.
fn parse_hours(s: &str) -> Result<Duration, String> {
    let hours: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected hours"))?;
    Duration::try_from_secs_f64(hours * 3600.0)
        .map_err(|_| format!("`{s}`: expected a non-negative number of hours"))
}

/// `floe schema-diff`.
#[derive(Debug, Args)]
pub struct SchemaDiffArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The table to compare.
    #[arg(long, value_name = "T", required = true)]
    pub table: String,
    /// Compare with the schema this object carries instead of the config's.
    #[arg(long, value_name = "s3://BUCKET/KEY")]
    pub object: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `floe compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The floe table.
    #[arg(long, value_name = "T", required = true)]
    pub table: String,
    /// The other side: s3://bucket/prefix, a local path, or iceberg:TABLE.
    #[arg(long, value_name = "SOURCE", required = true)]
    pub against: String,
    /// The config whose catalog holds an iceberg:TABLE source (default: --config's).
    #[arg(long, value_name = "FILE")]
    pub against_config: Option<String>,
    /// Format of the source's objects (default: from each name's extension).
    #[arg(long, value_parser = ["parquet", "csv", "jsonl"])]
    pub format: Option<String>,
    /// Key columns, comma-separated (floe's names).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub keys: Vec<String>,
    /// Time column windows are cut on (default: the table's event time).
    #[arg(long, value_name = "COLUMN")]
    pub time: Option<String>,
    /// Numeric columns compared as sums and values, comma-separated.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub measures: Vec<String>,
    /// Window size: 1d, 1h, 15m, ... [default: 1d, or the config's]
    #[arg(long, value_name = "SIZE")]
    pub window: Option<String>,
    /// Relative tolerance on counts, sums and values (0 = exact) [default: 0, or the config's]
    #[arg(long, value_name = "R")]
    pub tolerance: Option<f64>,
    /// Columns the source names differently: SOURCE_NAME=FLOE_NAME, comma-separated.
    #[arg(long, value_name = "S=F", value_delimiter = ',')]
    pub rename: Vec<String>,
    /// Only records with time at or after this (RFC 3339).
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
    /// Only records with time before this (RFC 3339).
    #[arg(long, value_name = "T")]
    pub until: Option<String>,
    /// Keys listed per kind of difference.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub sample: usize,
    /// Most distinct keys held in memory.
    #[arg(long, value_name = "N", default_value_t = 20_000_000)]
    pub max_keys: usize,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// `floe schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// The operation.
    #[command(subcommand)]
    pub action: SchemaAction,
}

/// `floe schema drop-column`.
#[derive(Debug, Subcommand)]
pub enum SchemaAction {
    /// Remove a deprecated column once its remove_after date has come (exit 2 if refused).
    ///
    /// Refuses before the column's remove_after date (naming the date and the owner), and while
    /// pipelines still read it (each is planned against the schema without it; listed), unless
    /// --force. Otherwise commits the drop as a new table version (a snapshot without data
    /// changes, summary floe.schema-change). Old files keep their values; ingest no longer adds
    /// the column back when inputs still carry it (counted as an unknown field).
    DropColumn(DropColumnArgs),
}

/// The options of `floe schema drop-column`.
#[derive(Debug, Args)]
pub struct DropColumnArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The table.
    #[arg(long, value_name = "T", required = true)]
    pub table: String,
    /// The column to drop.
    #[arg(long, value_name = "C", required = true)]
    pub column: String,
    /// Check and report only; commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Drop although pipelines still read the column (never before its remove_after date).
    #[arg(long)]
    pub force: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `floe template`.
#[derive(Debug, Args)]
pub struct TemplateArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The SAM template whose generated blocks are rewritten.
    #[arg(long, value_name = "FILE", default_value = "template.yaml")]
    pub template: String,
    /// Only check that the template is current (exit 1 if not); write nothing.
    #[arg(long)]
    pub check: bool,
}

/// `floe process`.
#[derive(Debug, Args)]
#[command(arg_required_else_help = true)]
pub struct ProcessArgs {
    /// run, refresh or reconcile.
    #[command(subcommand)]
    pub action: ProcessAction,
}

/// `floe process run|refresh|reconcile`.
#[derive(Debug, Subcommand)]
pub enum ProcessAction {
    /// Incremental run from each sink's checkpoint (what the process Lambda does).
    ///
    /// Plans only the data files the source's commits added since the checkpoint, runs the SQL
    /// and commits the output together with the new checkpoint.
    Run(ProcessOpts),
    /// Batch / backfill: the whole source table → sink.
    ///
    /// Recomputes the sink from the whole source table and replaces its rows; the recovery for a
    /// changed SQL, an expired checkpoint or a source overwrite/delete. Works in chunks of at
    /// most `[process] refresh_chunk_rows` source rows, one sink commit each, and continues a
    /// refresh in progress (left by an earlier call or the process Lambda) until it is done.
    Refresh(RefreshOpts),
    /// Batch vs sink check (exit 1 on any difference).
    ///
    /// Runs the same SQL as a batch over the whole table at the sink's checkpoint and compares
    /// rows, keys and per-column totals with the incrementally maintained sink.
    Reconcile(ProcessOpts),
}

impl ProcessAction {
    /// The action's name and options.
    pub fn parts(&self) -> (&'static str, &ProcessOpts) {
        match self {
            ProcessAction::Run(o) => ("run", o),
            ProcessAction::Refresh(o) => ("refresh", &o.opts),
            ProcessAction::Reconcile(o) => ("reconcile", o),
        }
    }
}

/// The options of every `floe process` action.
#[derive(Debug, Args)]
pub struct ProcessOpts {
    #[command(flatten)]
    pub config: ConfigArg,
    /// One pipeline (default: every configured pipeline).
    #[arg(long, value_name = "P")]
    pub pipeline: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `floe process refresh`'s options.
#[derive(Debug, Args)]
pub struct RefreshOpts {
    #[command(flatten)]
    pub opts: ProcessOpts,
    /// Start a new refresh instead of continuing the one in progress (the way out of a refresh
    /// position that cannot be continued; the new refresh replaces the whole sink).
    #[arg(long)]
    pub restart: bool,
}

/// `floe local`.
#[derive(Debug, Args)]
pub struct LocalArgs {
    /// moto_server's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 5000)]
    pub port: u16,
    /// Working directory: floe.toml, the SQLite catalog, moto.log.
    #[arg(long, value_name = "DIR", default_value = "target/floe-local")]
    pub dir: String,
    /// Run maintenance (the schedule) every N seconds.
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub maintain_every_seconds: u64,
    /// Stop after N seconds (for scripts and tests; default: run until interrupted).
    #[arg(long, value_name = "N")]
    pub exit_after_seconds: Option<u64>,
}

/// `floe bench`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").args(["maintenance", "planning", "latency", "delta", "latest", "backfill", "freshness"])))]
pub struct BenchArgs {
    /// Freshness benchmark: objects PUT at --rate for --seconds into the local stack (moto S3 →
    /// SQS → ingest → commit event → SQS → process); PUT → both sinks and each leg,
    /// p50/p95/p99/max, the rates side by side.
    #[arg(long)]
    pub freshness: bool,
    /// Objects per second (--freshness; several, comma-separated, run one after another).
    #[arg(
        long,
        value_name = "N",
        value_delimiter = ',',
        default_value = "10,50",
        requires = "freshness"
    )]
    pub rate: Vec<NonZeroU32>,
    /// Seconds of load per rate (--freshness).
    #[arg(long, value_name = "S", default_value = "300", requires = "freshness")]
    pub seconds: u64,
    /// Ingest workers (concurrent invocations; --freshness) [default: the deployed shape's].
    #[arg(long, value_name = "N", requires = "freshness")]
    pub ingest_concurrency: Option<NonZeroUsize>,
    /// Process workers (concurrent invocations on the commit-event queue; --freshness)
    /// [default: the local stack's].
    #[arg(long, value_name = "N", requires = "freshness")]
    pub process_concurrency: Option<NonZeroUsize>,
    /// Ingest batching window in ms (--freshness) [default: the deployed shape's].
    #[arg(long, value_name = "MS", requires = "freshness")]
    pub batch_window_ms: Option<u64>,
    /// Maintenance benchmark: commit latency of the 1st vs the Nth append with and without
    /// periodic maintenance, and compaction throughput vs plain arrow-rs.
    #[arg(long)]
    pub maintenance: bool,
    /// Appends per run (--maintenance).
    #[arg(
        long,
        value_name = "N",
        default_value = "5000",
        requires = "maintenance"
    )]
    pub appends: usize,
    /// Maintain every N appends (--maintenance).
    #[arg(
        long,
        value_name = "N",
        default_value = "100",
        requires = "maintenance"
    )]
    pub every: NonZeroUsize,
    /// Planning benchmark: a one-snapshot delta on tables with 1,000 and 10,000 snapshots.
    #[arg(long)]
    pub planning: bool,
    /// Data-quality benchmark: the big object (--big-mb) ingested with no checks and with ten.
    #[arg(long, conflicts_with = "mode")]
    pub checks: bool,
    /// Runs of each contender, alternating, reported with their medians (--checks).
    #[arg(long, value_name = "N", default_value = "5", requires = "checks")]
    pub repeat: NonZeroUsize,
    /// Pipeline benchmark: source commit → derived commit latency of both sample pipelines,
    /// beside the batch alternative.
    #[arg(long)]
    pub latency: bool,
    /// Ingest commits (--latency).
    #[arg(long, value_name = "N", default_value = "120", requires = "latency")]
    pub commits: NonZeroUsize,
    /// Rows per commit (--latency).
    #[arg(long, value_name = "N", default_value = "200", requires = "latency")]
    pub rows: usize,
    /// Delta benchmark: an aggregate pipeline's incremental run after one small object, on a
    /// 100 k-row source and on a --delta-rows source (same event rate, longer history), side by
    /// side: wall time, source bytes read, data files opened, sink bytes rewritten, peak RSS.
    #[arg(long)]
    pub delta: bool,
    /// Rows of the big source (--delta).
    #[arg(long, value_name = "N", default_value = "10000000", requires = "delta")]
    pub delta_rows: u64,
    /// Run the aggregate with `merge = false` (--delta, --freshness): its touched windows
    /// recomputed from the source, as before decomposable aggregates were merged.
    #[arg(long)]
    pub recompute: bool,
    /// Run the process function as before its rounds ran side by side (--freshness): no file
    /// cache (`[storage] cache_mb = 0`), one pipeline at a time (`concurrent_pipelines = 1`).
    #[arg(long, requires = "freshness")]
    pub sequential: bool,
    /// Latest-state benchmark: 100 k new versions over 1 % of --latest-keys customers per
    /// round; the incremental run beside a full rebuild: wall time, bytes read and written.
    #[arg(long)]
    pub latest: bool,
    /// Customers (keys) in the source (--latest).
    #[arg(long, value_name = "N", default_value = "1000000", requires = "latest")]
    pub latest_keys: u64,
    /// Key buckets of the sink (--latest).
    #[arg(long, value_name = "N", default_value = "16", requires = "latest")]
    pub latest_buckets: u32,
    /// Backfill benchmark: small and big objects backfilled at concurrency 1/4/8, beside one
    /// commit per object: objects/s, rows/s, commits per object, commit-retry rate.
    #[arg(long)]
    pub backfill: bool,
    /// Small objects of 200 lines (--backfill).
    #[arg(long, value_name = "N", default_value = "2000", requires = "backfill")]
    pub backfill_small: usize,
    /// MiB of JSON lines in each of the 20 big objects (--backfill).
    #[arg(long, value_name = "M", default_value = "50", requires = "backfill")]
    pub backfill_big_mb: usize,
    /// MiB of JSON lines in the big object (ingest benchmark).
    #[arg(long, value_name = "N", default_value = "200", conflicts_with = "mode")]
    pub big_mb: usize,
    /// Number of small objects of 500 lines (ingest benchmark).
    #[arg(long, value_name = "N", default_value = "300", conflicts_with = "mode")]
    pub small: usize,
    /// Rounds of the ingest benchmark: the plain conversion and floe alternate on the big
    /// object, and floe ingests the small objects, this many times; medians are reported.
    #[arg(long, value_name = "N", default_value = "3", conflicts_with = "mode")]
    pub rounds: NonZeroUsize,
    /// Also ingest an object of N MiB to check memory stays flat (ingest benchmark; 0: skip).
    #[arg(long, value_name = "N", default_value = "0", conflicts_with = "mode")]
    pub huge_mb: usize,
    /// Python with PyIceberg (default: the one infra/venv.sh prepares).
    #[arg(long, value_name = "PY", conflicts_with = "mode")]
    pub python: Option<String>,
    /// Run floe and plain arrow-rs only.
    #[arg(long, conflicts_with = "mode")]
    pub skip_pyiceberg: bool,
    /// Working directory, deleted first [default: target/floe-bench, target/floe-bench-maintain,
    /// target/floe-bench-plan, target/floe-bench-latency or target/floe-bench-delta by mode].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Internal: the benchmark's child process (plain, floe-big, floe-small).
    #[arg(long, hide = true, value_name = "MODE", requires_all = ["input", "work"], conflicts_with = "mode")]
    pub child: Option<String>,
    /// Internal: the child's input.
    #[arg(long, hide = true, requires = "child")]
    pub input: Option<PathBuf>,
    /// Internal: the child's working directory.
    #[arg(long, hide = true, requires = "child")]
    pub work: Option<PathBuf>,
    /// Internal: the child's row count (delta benchmark).
    #[arg(long, hide = true, requires = "child")]
    pub child_rows: Option<u64>,
    /// Internal: the child's key buckets (latest benchmark).
    #[arg(long, hide = true, requires = "child")]
    pub child_buckets: Option<u32>,
}

impl BenchArgs {
    /// `--dir`, or the mode's default.
    pub fn dir_or(&self, default: &str) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| PathBuf::from(default))
    }
}

/// `floe completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

impl Command {
    /// The `--config` of the commands that read one.
    pub fn config_mut(&mut self) -> Option<&mut ConfigArg> {
        match self {
            Command::Ingest(a) => Some(&mut a.config),
            Command::Backfill(a) => Some(&mut a.config),
            Command::Replay(a) => Some(&mut a.config),
            Command::Status(a) => Some(&mut a.config),
            Command::Baseline(a) => Some(&mut a.config),
            Command::Maintain(a) => Some(&mut a.config),
            Command::SchemaDiff(a) => Some(&mut a.config),
            Command::Compare(a) => Some(&mut a.config),
            Command::Schema(s) => Some(match &mut s.action {
                SchemaAction::DropColumn(a) => &mut a.config,
            }),
            Command::Template(a) => Some(&mut a.config),
            Command::Process(p) => Some(match &mut p.action {
                ProcessAction::Run(o) | ProcessAction::Reconcile(o) => &mut o.config,
                ProcessAction::Refresh(o) => &mut o.opts.config,
            }),
            Command::Demo(_) | Command::Local(_) | Command::Bench(_) | Command::Completions(_) => {
                None
            }
        }
    }
}

/// Parses the command line (argv\[0\] first) and records where `--config` came from.
pub fn parse_from<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let Some(config) = cli.command.config_mut() {
        config.origin = match config_source(&matches) {
            Some(ValueSource::CommandLine) => ConfigOrigin::Flag,
            Some(ValueSource::EnvVariable) => ConfigOrigin::Env,
            _ => ConfigOrigin::Default,
        };
    }
    Ok(cli)
}

/// The value source of the innermost subcommand's `--config`.
fn config_source(matches: &ArgMatches) -> Option<ValueSource> {
    if matches.ids().any(|id| id.as_str() == "config") {
        return matches.value_source("config");
    }
    matches.subcommand().and_then(|(_, sub)| config_source(sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Cli {
        match parse_from(argv.iter().copied()) {
            Ok(cli) => cli,
            Err(e) => panic!("{argv:?} did not parse: {e}"),
        }
    }

    fn parse_err(argv: &[&str]) -> clap::Error {
        match parse_from(argv.iter().copied()) {
            Ok(cli) => panic!("{argv:?} parsed, expected an error: {cli:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn command_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_help_renders() {
        fn walk(cmd: &mut clap::Command, path: &str, seen: &mut Vec<String>) {
            let name = format!("{path} {}", cmd.get_name()).trim().to_string();
            let long = cmd.render_long_help().to_string();
            let short = cmd.render_help().to_string();
            assert!(long.contains("Usage:"), "{name}: {long}");
            assert!(!short.is_empty(), "{name}");
            // clap's generated `help` subcommands are exempt.
            if name != "floe" && !name.split(' ').any(|w| w == "help") {
                assert!(
                    cmd.get_about().is_some(),
                    "{name} has no one-line description"
                );
            }
            seen.push(name.clone());
            for sub in cmd.get_subcommands_mut() {
                walk(sub, &name, seen);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut seen = Vec::new();
        walk(&mut cmd, "", &mut seen);
        for expected in [
            "floe demo",
            "floe ingest",
            "floe backfill",
            "floe replay",
            "floe status",
            "floe maintain",
            "floe schema-diff",
            "floe compare",
            "floe schema drop-column",
            "floe process run",
            "floe process refresh",
            "floe process reconcile",
            "floe local",
            "floe bench",
            "floe completions",
        ] {
            assert!(
                seen.iter().any(|s| s == expected),
                "{expected} missing: {seen:?}"
            );
        }
        let top = Cli::command().render_long_help().to_string();
        assert!(top.contains("Exit codes:"), "{top}");
    }

    #[test]
    fn process_reconcile_legacy_form() {
        let cli = parse(&[
            "floe",
            "process",
            "reconcile",
            "--config",
            "f.toml",
            "--pipeline",
            "p",
            "--json",
        ]);
        let Command::Process(p) = cli.command else {
            panic!("{cli:?}")
        };
        let (action, o) = p.action.parts();
        assert_eq!(action, "reconcile");
        assert_eq!(o.config.path, "f.toml");
        assert_eq!(o.config.origin, ConfigOrigin::Flag);
        assert_eq!(o.pipeline.as_deref(), Some("p"));
        assert!(o.json);
        // Flags in any order after the action, as before.
        let cli = parse(&["floe", "process", "run", "--json", "--config", "g.toml"]);
        let Command::Process(p) = cli.command else {
            panic!("{cli:?}")
        };
        let (action, o) = p.action.parts();
        assert_eq!(
            (action, o.config.path.as_str(), o.json),
            ("run", "g.toml", true)
        );
        assert_eq!(o.pipeline, None);
        let Command::Process(p) = parse(&["floe", "process", "refresh", "--config", "f"]).command
        else {
            panic!()
        };
        assert_eq!(p.action.parts().0, "refresh");
        parse_err(&["floe", "process", "rerun", "--config", "f"]);
    }

    #[test]
    fn backfill_takes_a_prefix() {
        let cli = parse(&[
            "floe",
            "backfill",
            "--config",
            "f",
            "s3://b/landing/",
            "--dry-run",
            "--batch",
            "20",
        ]);
        let Command::Backfill(a) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (a.location.bucket.as_str(), a.location.key.as_str()),
            ("b", "landing/")
        );
        assert!(a.dry_run);
        assert_eq!((a.batch, a.concurrency), (20, 4));
        let Command::Backfill(a) = parse(&["floe", "backfill", "s3://b"]).command else {
            panic!()
        };
        assert_eq!(a.location.key, "");
        parse_err(&["floe", "backfill", "b/landing"]);
    }

    #[test]
    fn replay_takes_a_queue_or_a_key_list() {
        let cli = parse(&[
            "floe",
            "replay",
            "--config",
            "f",
            "--dlq",
            "https://sqs.us-east-1.amazonaws.com/1/dlq",
            "--max",
            "20",
            "--dry-run",
        ]);
        let Command::Replay(a) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(a.config.origin, ConfigOrigin::Flag);
        assert_eq!(
            a.dlq.as_deref(),
            Some("https://sqs.us-east-1.amazonaws.com/1/dlq")
        );
        assert_eq!((a.max, a.dry_run, a.json), (Some(20), true, false));
        assert_eq!((a.keys, a.visibility_timeout), (None, 1800));
        let Command::Replay(a) = parse(&["floe", "replay", "--keys", "-", "--json"]).command else {
            panic!()
        };
        assert_eq!((a.keys.as_deref(), a.dlq, a.json), (Some("-"), None, true));
        // Exactly one of the two sources; the visibility timeout is a queue's.
        parse_err(&["floe", "replay", "--config", "f"]);
        parse_err(&["floe", "replay", "--dlq", "u", "--keys", "k"]);
        parse_err(&[
            "floe",
            "replay",
            "--keys",
            "k",
            "--visibility-timeout",
            "60",
        ]);
    }

    #[test]
    fn bench_backfill_sizes() {
        let Command::Bench(b) = parse(&["floe", "bench", "--backfill"]).command else {
            panic!()
        };
        assert!(b.backfill && !b.planning);
        assert_eq!((b.backfill_small, b.backfill_big_mb), (2000, 50));
        let Command::Bench(b) = parse(&[
            "floe",
            "bench",
            "--backfill",
            "--backfill-small",
            "40",
            "--backfill-big-mb",
            "2",
        ])
        .command
        else {
            panic!()
        };
        assert_eq!((b.backfill_small, b.backfill_big_mb), (40, 2));
        parse_err(&["floe", "bench", "--backfill-small", "40"]);
        parse_err(&["floe", "bench", "--backfill", "--latency"]);
        parse_err(&["floe", "bench", "--backfill", "--big-mb", "5"]);
    }

    #[test]
    fn compare_takes_lists_and_renames() {
        let cli = parse(&[
            "floe",
            "compare",
            "--config",
            "f.toml",
            "--table",
            "orders",
            "--against",
            "s3://legacy/out/",
            "--keys",
            "order_id,region",
            "--measures",
            "amount",
            "--rename",
            "total=amount,id=order_id",
            "--tolerance",
            "0.01",
            "--json",
        ]);
        let Command::Compare(a) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(a.keys, vec!["order_id", "region"]);
        assert_eq!(a.measures, vec!["amount"]);
        assert_eq!(a.rename, vec!["total=amount", "id=order_id"]);
        assert_eq!((a.tolerance, a.json, a.sample), (Some(0.01), true, 10));
        parse_err(&["floe", "compare", "--config", "f", "--table", "t"]);
        parse_err(&[
            "floe",
            "compare",
            "--table",
            "t",
            "--against",
            "x",
            "--format",
            "xml",
        ]);
    }

    #[test]
    fn maintain_legacy_form() {
        let cli = parse(&[
            "floe",
            "maintain",
            "--config",
            "f",
            "--table",
            "t",
            "--only",
            "compact,expire",
            "--dry-run",
            "--older-than-hours",
            "2",
            "--retain-last",
            "3",
            "--orphan-older-than-hours",
            "4",
            "--json",
        ]);
        let Command::Maintain(m) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(m.config.path, "f");
        assert_eq!(m.table.as_deref(), Some("t"));
        assert_eq!(
            m.only,
            Some(Only {
                compact: true,
                expire: true,
                orphans: false,
                manifests: false
            })
        );
        assert!(m.dry_run && m.json);
        assert_eq!(m.older_than, Some(Duration::from_secs(7200)));
        assert_eq!(m.retain_last, Some(3));
        assert_eq!(m.orphan_older_than, Some(Duration::from_secs(4 * 3600)));

        let Command::Maintain(m) = parse(&["floe", "maintain", "--config", "f"]).command else {
            panic!()
        };
        assert_eq!(
            (m.table, m.only, m.dry_run, m.json),
            (None, None, false, false)
        );
        assert_eq!(
            (m.older_than, m.retain_last, m.orphan_older_than),
            (None, None, None)
        );

        // Fractional hours and spaces in --only, as the old parser accepted.
        let Command::Maintain(m) = parse(&[
            "floe",
            "maintain",
            "--config",
            "f",
            "--only",
            "orphans, manifests",
            "--older-than-hours",
            "0.5",
        ])
        .command
        else {
            panic!()
        };
        assert_eq!(m.older_than, Some(Duration::from_secs(1800)));
        let only = m
            .only
            .map(|o| (o.compact, o.expire, o.orphans, o.manifests));
        assert_eq!(only, Some((false, false, true, true)));

        for bad in [
            ["--only", "compact,oprhans"],
            ["--older-than-hours", "soon"],
            ["--older-than-hours", "-1"],
            ["--retain-last", "x"],
        ] {
            let mut argv = vec!["floe", "maintain", "--config", "f"];
            argv.extend(bad);
            let e = parse_err(&argv);
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn ingest_legacy_form() {
        let cli = parse(&["floe", "ingest", "--config", "f", "s3://b/k1", "s3://b/k2"]);
        let Command::Ingest(i) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(i.config.path, "f");
        let names: Vec<_> = i
            .objects
            .iter()
            .map(|o| (o.bucket.as_str(), o.key.as_str()))
            .collect();
        assert_eq!(names, [("b", "k1"), ("b", "k2")]);
        // --config between or after the objects, as before.
        let Command::Ingest(i) =
            parse(&["floe", "ingest", "s3://b/k1", "--config", "f", "s3://b/k2"]).command
        else {
            panic!()
        };
        assert_eq!((i.config.path.as_str(), i.objects.len()), ("f", 2));
        let Command::Ingest(i) =
            parse(&["floe", "ingest", "--config", "f", "s3://b/a/b/c.jsonl.gz"]).command
        else {
            panic!()
        };
        assert_eq!(i.objects[0].key, "a/b/c.jsonl.gz");
        // No object, or not an s3:// URL: a usage error.
        assert_eq!(
            parse_err(&["floe", "ingest", "--config", "f"]).exit_code(),
            2
        );
        for bad in ["b/k", "s3://b", "s3:///k", "s3://b/"] {
            let e = parse_err(&["floe", "ingest", "--config", "f", bad]);
            assert!(e.to_string().contains("expected s3://bucket/key"), "{e}");
        }
    }

    #[test]
    fn bench_legacy_forms() {
        let Command::Bench(b) = parse(&[
            "floe",
            "bench",
            "--maintenance",
            "--appends",
            "10",
            "--every",
            "5",
        ])
        .command
        else {
            panic!()
        };
        assert!(b.maintenance && !b.planning && !b.latency);
        assert_eq!((b.appends, b.every.get()), (10, 5));
        assert_eq!(
            b.dir_or("target/floe-bench-maintain"),
            PathBuf::from("target/floe-bench-maintain")
        );

        let Command::Bench(b) = parse(&["floe", "bench"]).command else {
            panic!()
        };
        assert_eq!((b.big_mb, b.small, b.huge_mb), (200, 300, 0));
        assert_eq!(b.rounds.get(), 3);
        assert_eq!(
            (b.appends, b.every.get(), b.commits.get(), b.rows),
            (5000, 100, 120, 200)
        );
        assert!(!b.skip_pyiceberg && b.python.is_none() && b.dir.is_none() && b.child.is_none());

        let Command::Bench(b) = parse(&[
            "floe",
            "bench",
            "--big-mb",
            "20",
            "--small",
            "30",
            "--huge-mb",
            "64",
            "--rounds",
            "1",
            "--dir",
            "d",
            "--python",
            "py",
            "--skip-pyiceberg",
        ])
        .command
        else {
            panic!()
        };
        assert_eq!((b.big_mb, b.small, b.huge_mb), (20, 30, 64));
        assert_eq!(b.rounds.get(), 1);
        assert_eq!(b.dir, Some(PathBuf::from("d")));
        assert_eq!(b.python.as_deref(), Some("py"));
        assert!(b.skip_pyiceberg);

        let Command::Bench(b) = parse(&[
            "floe",
            "bench",
            "--latency",
            "--commits",
            "7",
            "--rows",
            "9",
            "--dir",
            "l",
        ])
        .command
        else {
            panic!()
        };
        assert!(b.latency);
        assert_eq!((b.commits.get(), b.rows), (7, 9));
        let Command::Bench(b) = parse(&["floe", "bench", "--planning"]).command else {
            panic!()
        };
        assert!(b.planning);
        let Command::Bench(b) = parse(&["floe", "bench", "--checks", "--big-mb", "50"]).command
        else {
            panic!()
        };
        assert!(b.checks && !b.planning);
        assert_eq!(b.big_mb, 50);
        parse_err(&["floe", "bench", "--checks", "--planning"]);
        let Command::Bench(b) = parse(&["floe", "bench", "--delta"]).command else {
            panic!()
        };
        assert!(b.delta && !b.planning);
        assert_eq!(b.delta_rows, 10_000_000);
        let Command::Bench(b) =
            parse(&["floe", "bench", "--delta", "--delta-rows", "1000000"]).command
        else {
            panic!()
        };
        assert_eq!(b.delta_rows, 1_000_000);
        parse_err(&["floe", "bench", "--delta", "--latency"]);
        parse_err(&["floe", "bench", "--delta-rows", "5"]);
        let Command::Bench(b) =
            parse(&["floe", "bench", "--latest", "--latest-buckets", "64"]).command
        else {
            panic!()
        };
        assert!(b.latest && b.latest_keys == 1_000_000 && b.latest_buckets == 64);
        parse_err(&["floe", "bench", "--latest", "--delta"]);

        // The child form the benchmark spawns itself with.
        let Command::Bench(b) = parse(&[
            "floe", "bench", "--child", "floe-big", "--input", "i", "--work", "w",
        ])
        .command
        else {
            panic!()
        };
        assert_eq!(b.child.as_deref(), Some("floe-big"));
        assert_eq!((b.input, b.work), (Some("i".into()), Some("w".into())));

        // Nonsense combinations are usage errors now (they were silently ignored).
        parse_err(&["floe", "bench", "--planning", "--latency"]);
        parse_err(&["floe", "bench", "--appends", "10"]);
        parse_err(&["floe", "bench", "--maintenance", "--every", "0"]);
        parse_err(&["floe", "bench", "--latency", "--commits", "0"]);
    }

    #[test]
    fn local_and_demo_legacy_forms() {
        let Command::Local(l) = parse(&[
            "floe",
            "local",
            "--port",
            "5001",
            "--dir",
            "d",
            "--maintain-every-seconds",
            "9",
            "--exit-after-seconds",
            "3",
        ])
        .command
        else {
            panic!()
        };
        assert_eq!(
            (
                l.port,
                l.dir.as_str(),
                l.maintain_every_seconds,
                l.exit_after_seconds
            ),
            (5001, "d", 9, Some(3))
        );
        let Command::Local(l) = parse(&["floe", "local"]).command else {
            panic!()
        };
        assert_eq!(
            (
                l.port,
                l.dir.as_str(),
                l.maintain_every_seconds,
                l.exit_after_seconds
            ),
            (5000, "target/floe-local", 600, None)
        );
        assert_eq!(
            parse_err(&["floe", "local", "--port", "70000"]).exit_code(),
            2
        );

        let Command::Demo(d) = parse(&["floe", "demo"]).command else {
            panic!()
        };
        assert_eq!(d.dir, "target/floe-demo");
        let Command::Demo(d) = parse(&["floe", "demo", "--dir", "/tmp/x"]).command else {
            panic!()
        };
        assert_eq!(d.dir, "/tmp/x");
    }

    #[test]
    fn schema_diff_and_status_legacy_forms() {
        let cli = parse(&[
            "floe",
            "schema-diff",
            "--config",
            "f",
            "--table",
            "t",
            "--object",
            "s3://b/k",
            "--json",
        ]);
        let Command::SchemaDiff(s) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (
                s.config.path.as_str(),
                s.table.as_str(),
                s.object.as_deref(),
                s.json
            ),
            ("f", "t", Some("s3://b/k"), true)
        );
        let e = parse_err(&["floe", "schema-diff", "--config", "f"]);
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--table"), "{e}");

        let Command::Status(s) = parse(&["floe", "status", "--json", "--config", "f"]).command
        else {
            panic!()
        };
        assert_eq!((s.config.path.as_str(), s.json), ("f", true));
    }

    #[test]
    fn completions_and_usage_errors() {
        let Command::Completions(c) = parse(&["floe", "completions", "bash"]).command else {
            panic!()
        };
        assert_eq!(c.shell, clap_complete::Shell::Bash);
        parse(&["floe", "completions", "zsh"]);
        parse(&["floe", "completions", "fish"]);
        assert_eq!(
            parse_err(&["floe", "completions", "cmd.exe"]).exit_code(),
            2
        );
        assert_eq!(parse_err(&["floe", "frobnicate"]).exit_code(), 2);
        assert_eq!(parse_err(&["floe", "status", "--jsn"]).exit_code(), 2);
        // --help and --version exit 0 (clap prints them).
        assert_eq!(parse_err(&["floe", "--help"]).exit_code(), 0);
        assert_eq!(parse_err(&["floe", "--version"]).exit_code(), 0);
        assert_eq!(
            parse_err(&["floe", "process", "reconcile", "--help"]).exit_code(),
            0
        );
    }

    /// The only test that touches FLOE_CONFIG (tests run in parallel threads); every other
    /// test passes --config or does not read it.
    #[test]
    fn config_falls_back_to_env_then_default() {
        fn status_config(argv: &[&str]) -> ConfigArg {
            match parse(argv).command {
                Command::Status(s) => s.config,
                other => panic!("{other:?}"),
            }
        }
        std::env::set_var("FLOE_CONFIG", "from-env.toml");
        let env = status_config(&["floe", "status"]);
        let flag = status_config(&["floe", "status", "--config", "flag.toml"]);
        let Command::Process(p) = parse(&["floe", "process", "reconcile"]).command else {
            panic!()
        };
        std::env::remove_var("FLOE_CONFIG");
        let default = status_config(&["floe", "status"]);
        assert_eq!(
            (env.path.as_str(), env.origin),
            ("from-env.toml", ConfigOrigin::Env)
        );
        assert_eq!(
            (flag.path.as_str(), flag.origin),
            ("flag.toml", ConfigOrigin::Flag)
        );
        let (_, o) = p.action.parts();
        assert_eq!(
            (o.config.path.as_str(), o.config.origin),
            ("from-env.toml", ConfigOrigin::Env)
        );
        assert_eq!(
            (default.path.as_str(), default.origin),
            ("floe.toml", ConfigOrigin::Default)
        );
    }
}
