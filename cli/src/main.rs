//! `floe`: the command line over the same library the Lambdas use.
//!
//! ```text
//! floe demo [--dir DIR]                     local demo: SQLite catalog + local warehouse, nothing but cargo
//! floe ingest --config F s3://b/k [...]     ingest objects by hand through the Lambda code path
//! floe status --config F [--json]           per table: snapshots, files, records, freshness, quarantine
//! floe maintain --config F [--table T] [--only compact,expire,orphans,manifests] [--dry-run]
//!               [--older-than-hours H] [--retain-last N] [--orphan-older-than-hours H] [--json]
//! floe schema-diff --config F --table T [--object s3://b/k] [--json]   classify schema changes (exit 2 if breaking)
//! floe process run|refresh|reconcile --config F [--pipeline P] [--json]   incremental run, batch refresh, batch-vs-sink check (exit 1 on difference)
//! floe local [--port 5000] [--dir D]        the deployed topology on moto_server: S3 → SQS → ingest, schedule → maintain
//! floe bench [--big-mb N] [--small N] ...   ingest benchmark vs PyIceberg and plain arrow-rs
//! ```

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use floe::config::Config;
use floe::ingest::{Ingestor, ObjectReport};

mod bench;
mod bench_latency;
mod bench_maintain;
mod bench_plan;
mod demo;
mod local;
mod process_cmd;
mod schema_diff;
mod status;

fn usage() -> &'static str {
    "usage:\n  floe demo [--dir DIR]\n  floe ingest --config FILE s3://bucket/key [...]\n  floe status --config FILE [--json]\n  floe maintain --config FILE [--table T] [--only compact,expire,orphans,manifests] [--dry-run] [--older-than-hours H] [--retain-last N] [--orphan-older-than-hours H] [--json]\n  floe process run|refresh|reconcile --config FILE [--pipeline P] [--json]\n  floe local [--port 5000] [--dir DIR] [--maintain-every-seconds N]\n  floe schema-diff --config FILE --table T [--object s3://bucket/key] [--json]\n  floe bench [--big-mb N] [--small N] [--dir DIR] [--python PY] [--skip-pyiceberg]\n  floe bench --maintenance [--appends N] [--every N] | --planning | --latency [--commits N] [--rows N]"
}

/// Minimal flag parsing: `--name value` pairs, bare `--flag`s and positionals.
pub struct Args {
    items: Vec<String>,
}

impl Args {
    fn value(&mut self, name: &str) -> Option<String> {
        let i = self.items.iter().position(|a| a == name)?;
        if i + 1 < self.items.len() {
            let v = self.items.remove(i + 1);
            self.items.remove(i);
            Some(v)
        } else {
            None
        }
    }
    fn flag(&mut self, name: &str) -> bool {
        match self.items.iter().position(|a| a == name) {
            Some(i) => {
                self.items.remove(i);
                true
            }
            None => false,
        }
    }
    fn rest(self) -> Vec<String> {
        self.items
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        bail!("{}", usage());
    }
    let cmd = argv.remove(0);
    if cmd == "demo" {
        // The demo prints its own table; EMF lines and info logs would bury it.
        if std::env::var_os("FLOE_METRICS").is_none() {
            std::env::set_var("FLOE_METRICS", "off");
        }
        floe::lambda::init_tracing_with("warn");
    } else {
        floe::lambda::init_tracing();
    }
    let mut args = Args { items: argv };
    match cmd.as_str() {
        "demo" => {
            demo::run(
                args.value("--dir")
                    .unwrap_or_else(|| "target/floe-demo".into()),
            )
            .await
        }
        "ingest" => {
            let config = load(&mut args).await?;
            let objects = args.rest();
            if objects.is_empty() {
                bail!("name at least one s3://bucket/key\n{}", usage());
            }
            let ingestor = Ingestor::new(config).await?;
            let mut reports = Vec::new();
            for o in objects {
                let rest = o
                    .strip_prefix("s3://")
                    .with_context(|| format!("`{o}`: expected s3://bucket/key"))?;
                let (bucket, key) = rest
                    .split_once('/')
                    .with_context(|| format!("`{o}`: expected s3://bucket/key"))?;
                let obj = floe::event::ObjectRef::new(bucket, key);
                reports.push(
                    ingestor
                        .ingest(&obj, Instant::now() + Duration::from_secs(600))
                        .await?,
                );
            }
            print_reports(&reports);
            Ok(())
        }
        "status" => {
            let json = args.flag("--json");
            let config = load(&mut args).await?;
            status::run(&config, json).await
        }
        "maintain" => {
            let json = args.flag("--json");
            let dry_run = args.flag("--dry-run");
            let table = args.value("--table");
            let only = args.value("--only");
            let hours = |v: Option<String>| -> Result<Option<Duration>> {
                Ok(match v {
                    Some(h) => Some(Duration::from_secs_f64(
                        h.parse::<f64>()
                            .with_context(|| format!("`{h}`: expected hours"))?
                            * 3600.0,
                    )),
                    None => None,
                })
            };
            let older = hours(args.value("--older-than-hours"))?;
            let orphan = hours(args.value("--orphan-older-than-hours"))?;
            let retain = args
                .value("--retain-last")
                .map(|v| v.parse::<usize>())
                .transpose()?;
            let config = load(&mut args).await?;
            let defaults = floe::maintain::Options::from_config(
                &config,
                Instant::now() + Duration::from_secs(3600),
            );
            let mut opts = floe::maintain::Options {
                dry_run,
                expire_older_than: older.or(defaults.expire_older_than),
                retain_last: retain.or(defaults.retain_last),
                ..defaults
            };
            if let Some(o) = orphan {
                opts.orphan_older_than = o;
            }
            if let Some(only) = only {
                let set: Vec<&str> = only.split(',').map(str::trim).collect();
                opts.compact = set.contains(&"compact");
                opts.expire = set.contains(&"expire");
                opts.orphans = set.contains(&"orphans");
                opts.rewrite_manifests = set.contains(&"manifests");
            }
            let tables: Vec<String> = match table {
                Some(t) => vec![t],
                None => config.all_tables(),
            };
            let m = floe::maintain::Maintainer::new(config).await?;
            let mut reports = Vec::new();
            for t in tables {
                reports.push(m.run(&t, &opts).await?);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                print_maintenance(&reports);
            }
            Ok(())
        }
        "schema-diff" => {
            let json = args.flag("--json");
            let table = args.value("--table").context("--table is required")?;
            let object = args.value("--object");
            let config = load(&mut args).await?;
            if schema_diff::run(&config, &table, object, json).await? {
                // Non-zero on breaking changes, so CI pipelines stop the rollout.
                std::process::exit(2);
            }
            Ok(())
        }
        "process" => {
            if args.items.is_empty() {
                bail!("{}", usage());
            }
            let action = args.items.remove(0);
            let json = args.flag("--json");
            let pipeline = args.value("--pipeline");
            let config = load(&mut args).await?;
            if !process_cmd::run(config, &action, pipeline, json).await? {
                // The two speeds disagree: fail the caller's job.
                std::process::exit(1);
            }
            Ok(())
        }
        "local" => {
            let port: u16 = args
                .value("--port")
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(5000);
            let dir = args
                .value("--dir")
                .unwrap_or_else(|| "target/floe-local".into());
            let every: u64 = args
                .value("--maintain-every-seconds")
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(600);
            let exit_after = args
                .value("--exit-after-seconds")
                .map(|v| v.parse::<u64>())
                .transpose()?
                .map(Duration::from_secs);
            local::run(port, dir, Duration::from_secs(every), exit_after).await
        }
        "bench" => bench::run(args).await,
        "help" | "--help" | "-h" => {
            println!("{}", usage());
            Ok(())
        }
        other => bail!("unknown command `{other}`\n{}", usage()),
    }
}

async fn load(args: &mut Args) -> Result<Config> {
    let path = args
        .value("--config")
        .or_else(|| std::env::var("FLOE_CONFIG").ok())
        .unwrap_or_else(|| "floe.toml".into());
    Ok(Config::load(&path).await?)
}

/// Prints ingest reports as a table.
pub fn print_reports(reports: &[ObjectReport]) {
    println!(
        "{:<44} {:<15} {:>8} {:>9} {:>11} {:>6} {:>20}",
        "object", "status", "in", "committed", "quarantined", "late", "snapshot"
    );
    for r in reports {
        let name = if r.object.len() > 44 {
            format!("…{}", &r.object[r.object.len() - 43..])
        } else {
            r.object.clone()
        };
        println!(
            "{:<44} {:<15} {:>8} {:>9} {:>11} {:>6} {:>20}",
            name,
            format!("{:?}", r.status),
            r.records_in,
            r.records_committed,
            r.records_quarantined,
            r.late_records,
            r.snapshot_id
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into())
        );
        if let Some(reason) = &r.reason {
            println!("    reason: {reason}");
        }
        if !r.unknown_fields.is_empty() {
            println!(
                "    unknown fields (ignored): {}",
                r.unknown_fields.join(", ")
            );
        }
        if let Some(q) = &r.quarantine {
            println!("    quarantine: {q}");
        }
    }
}

/// Prints maintenance reports as a table.
pub fn print_maintenance(reports: &[floe::maintain::Report]) {
    println!(
        "{:<20} {:>12} {:>16} {:>7} {:>8} {:>10} {:>9} {:>9}",
        "table", "files", "MiB", "groups", "expired", "exp. files", "orphans", "manifests"
    );
    for r in reports {
        println!(
            "{:<20} {:>12} {:>16} {:>7} {:>8} {:>10} {:>9} {:>9}",
            r.table,
            format!("{} → {}", r.files_before, r.files_after),
            format!(
                "{:.1} → {:.1}",
                r.bytes_before as f64 / 1048576.0,
                r.bytes_after as f64 / 1048576.0
            ),
            r.groups_compacted,
            r.snapshots_expired,
            r.expired_files_deleted,
            if r.dry_run {
                format!("{} (dry)", r.orphans_found.len())
            } else {
                r.orphans_deleted.to_string()
            },
            format!("{} → {}", r.manifests_before, r.manifests_after),
        );
        for o in &r.orphans_found {
            println!(
                "    orphan{}: {o}",
                if r.dry_run {
                    " (would delete)"
                } else {
                    " deleted"
                }
            );
        }
    }
}
