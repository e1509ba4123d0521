//! `floe`: the command line over the same library the Lambdas use.
//!
//! ```text
//! floe demo [--dir DIR]                     local demo: SQLite catalog + local warehouse, nothing but cargo
//! floe ingest --config F s3://b/k [...]     ingest objects by hand through the Lambda code path
//! floe backfill --config F s3://b/prefix [--since T] [--until T] [--dry-run] [--concurrency N] [--batch N]   history, exactly once, in batches
//! floe replay --config F --dlq URL|--keys FILE|- [--max N] [--dry-run] [--json]   the ingest DLQ (or keys), exactly once, deleting only what is settled
//! floe status --config F [--json]           per table: snapshots, files, records, freshness, quarantine, cost per day
//! floe baseline --config F [--since T] [--json|--markdown]   freshness, throughput, small files, planning, recovery, cost
//! floe maintain --config F [--table T] [--only compact,expire,orphans,manifests] [--dry-run]
//!               [--older-than-hours H] [--retain-last N] [--orphan-older-than-hours H] [--json]
//! floe schema-diff --config F --table T [--object s3://b/k] [--json]   classify schema changes, plan consumers (exit 2 if anything breaks)
//! floe compare --config F --table T --against s3://b/p|PATH|iceberg:T [--keys K] [--measures M] [--json]   beside the old system (exit 1 on difference)
//! floe schema drop-column --config F --table T --column C [--dry-run] [--force] [--json]   remove a deprecated column (exit 2 if refused)
//! floe process run|refresh|reconcile --config F [--pipeline P] [--json]   incremental run, batch refresh, batch-vs-sink check (exit 1 on difference)
//! floe local [--port 5000] [--dir D]        the deployed topology on moto_server: S3 → SQS → ingest, schedule → maintain
//! floe bench [--big-mb N] [--small N] ...   ingest benchmark vs PyIceberg and plain arrow-rs
//! floe bench --delta [--delta-rows N]       an aggregate run after one object: 100 k vs N-row source
//! floe bench --latest [--latest-keys N] [--latest-buckets B]   a latest-state run vs a full rebuild
//! floe bench --backfill [--backfill-small N] [--backfill-big-mb M]   backfill vs one commit per object
//! floe template --config F [--check]       template.yaml's table-scoped roles and alarms from floe.toml
//! floe completions bash|zsh|fish|...        a shell completion script
//! ```
//!
//! `floe --help` and `floe COMMAND --help` describe every flag; [`args`] defines them.
// The process worker of `floe local` is spawned: proving its processor `Send` goes deep
// (DataFusion's SQL AST).
#![recursion_limit = "256"]

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;
use floe::config::Config;

mod args;
mod backfill_aws;
mod backfill_cmd;
mod baseline_cmd;
mod bench;
mod bench_backfill;
mod bench_checks;
mod bench_delta;
mod bench_freshness;
mod bench_latency;
mod bench_latest;
mod bench_maintain;
mod bench_plan;
mod compare_cmd;
mod demo;
mod ingest_cmd;
mod local;
mod maintain_cmd;
mod process_cmd;
mod progress;
mod replay_cmd;
mod schema_cmd;
mod schema_diff;
mod status;
mod template;

use args::{Cli, Command, ConfigArg};

/// How a command that ran ended, beyond success or an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Exit 0.
    Done,
    /// `process reconcile` found a difference between batch and sink: exit 1.
    Different,
    /// `schema-diff` found a breaking change or a breaking consumer, or `schema drop-column`
    /// refused: exit 2.
    Breaking,
}

impl From<Outcome> for ExitCode {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Done => ExitCode::SUCCESS,
            Outcome::Different => ExitCode::from(1),
            Outcome::Breaking => ExitCode::from(2),
        }
    }
}

fn main() -> ExitCode {
    floe::lambda::limit_allocator_retention();
    // Usage errors exit 2, --help and --version 0 (clap's codes).
    let cli = args::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    // The demo and the freshness benchmark print their own tables.
    let quiet = match &cli.command {
        Command::Demo(_) => true,
        Command::Bench(b) => b.freshness,
        _ => false,
    };
    init_tracing(quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr (`RUST_LOG`, default `info`), through the progress bars so they stay intact.
fn init_tracing(demo: bool) {
    // The demo prints its own tables; EMF lines and info logs would bury them. Set before the
    // runtime starts any thread.
    if demo && std::env::var_os("FLOE_METRICS").is_none() {
        std::env::set_var("FLOE_METRICS", "off");
    }
    let level = if demo { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| progress::LogWriter)
        .compact()
        .try_init();
}

async fn run(command: Command) -> Result<Outcome> {
    match command {
        Command::Demo(a) => demo::run(a.dir).await?,
        Command::Ingest(a) => {
            let config = load_config(&a.config).await?;
            ingest_cmd::run(config, &a.objects).await?;
        }
        Command::Backfill(a) => {
            let config = load_config(&a.config).await?;
            if !backfill_cmd::run(config, &a).await? {
                return Ok(Outcome::Different);
            }
        }
        Command::Replay(a) => {
            let config = load_config(&a.config).await?;
            if !replay_cmd::run(config, &a).await? {
                return Ok(Outcome::Different);
            }
        }
        Command::Status(a) => {
            let config = load_config(&a.config).await?;
            status::run(&config, a.json).await?;
        }
        Command::Baseline(a) => {
            let config = load_config(&a.config).await?;
            baseline_cmd::run(&config, &a).await?;
        }
        Command::Maintain(a) => {
            let config = load_config(&a.config).await?;
            maintain_cmd::run(config, &a).await?;
        }
        Command::SchemaDiff(a) => {
            let config = load_config(&a.config).await?;
            if schema_diff::run(&config, &a.table, a.object, a.json).await? {
                // Non-zero on breaking changes, so CI pipelines stop the rollout.
                return Ok(Outcome::Breaking);
            }
        }
        Command::Compare(a) => {
            let config = load_config(&a.config).await?;
            if !compare_cmd::run(&config, &a).await? {
                // The two systems disagree: fail the caller's job.
                return Ok(Outcome::Different);
            }
        }
        Command::Schema(s) => match s.action {
            args::SchemaAction::DropColumn(a) => {
                let config = load_config(&a.config).await?;
                if !schema_cmd::drop_column(&config, &a).await? {
                    return Ok(Outcome::Breaking);
                }
            }
        },
        Command::Process(p) => {
            if !process_cmd::run(&p.action).await? {
                // The two speeds disagree: fail the caller's job.
                return Ok(Outcome::Different);
            }
        }
        Command::Local(a) => {
            local::run(
                a.port,
                a.dir,
                std::time::Duration::from_secs(a.maintain_every_seconds),
                a.exit_after_seconds.map(std::time::Duration::from_secs),
            )
            .await?
        }
        Command::Bench(a) => bench::run(a).await?,
        Command::Template(a) => {
            if !template::run(&a.config.path, &a.template, a.check)? {
                return Ok(Outcome::Different);
            }
        }
        Command::Completions(a) => {
            clap_complete::generate(a.shell, &mut Cli::command(), "floe", &mut std::io::stdout())
        }
    }
    Ok(Outcome::Done)
}

/// Loads the floe.toml that `--config` names (else `$FLOE_CONFIG`, else `./floe.toml`). Errors
/// name the file and where that name came from.
pub(crate) async fn load_config(arg: &ConfigArg) -> Result<Config> {
    let path = arg.path.as_str();
    Config::load(path)
        .await
        .with_context(|| format!("loading config {path} ({})", arg.origin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use args::ConfigOrigin;

    fn arg(path: &str, origin: ConfigOrigin) -> ConfigArg {
        ConfigArg {
            path: path.into(),
            origin,
        }
    }

    async fn error_of(arg: ConfigArg) -> String {
        match load_config(&arg).await {
            Ok(_) => panic!("{arg:?} loaded"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[tokio::test]
    async fn config_errors_name_the_file_and_its_source() {
        let missing = "/nonexistent/floe-cli-test.toml";
        let e = error_of(arg(missing, ConfigOrigin::Flag)).await;
        assert!(e.contains(missing) && e.contains("--config"), "{e}");
        assert!(!e.contains("FLOE_CONFIG"), "{e}");
        let e = error_of(arg(missing, ConfigOrigin::Env)).await;
        assert!(e.contains(missing) && e.contains("$FLOE_CONFIG"), "{e}");
        let e = error_of(arg("floe-cli-test-missing.toml", ConfigOrigin::Default)).await;
        assert!(e.contains("the default"), "{e}");
        let e = error_of(arg("s3://just-a-bucket", ConfigOrigin::Flag)).await;
        assert!(e.contains("expected s3://bucket/key"), "{e}");

        // A file that exists but does not parse: the library's message with the file's line.
        let dir = std::env::temp_dir().join(format!("floe-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[catalog]\nkind = 42\n").expect("write");
        let bad = bad.display().to_string();
        let e = error_of(arg(&bad, ConfigOrigin::Flag)).await;
        assert!(e.contains(&bad) && e.contains("--config"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn outcomes_map_to_the_documented_exit_codes() {
        assert_eq!(ExitCode::from(Outcome::Done), ExitCode::SUCCESS);
        assert_eq!(ExitCode::from(Outcome::Different), ExitCode::from(1));
        assert_eq!(ExitCode::from(Outcome::Breaking), ExitCode::from(2));
    }
}
