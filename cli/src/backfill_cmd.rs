//! `floe backfill`: history (or a replay) through the ingest code path, exactly once, in
//! batches, with a progress bar, a final report and, with --dry-run, the plan and its cost.

use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use floe::config::Config;
use floe::ingest::backfill::{BackfillOptions, BackfillPlan, BackfillReport, BatchProgress};
use floe::ingest::Ingestor;
use serde::Serialize;

use crate::args::BackfillArgs;
use crate::progress;

/// Prices of the estimate (us-east-1, arm64, December 2026 list prices).
const LAMBDA_GB_SECOND: f64 = 0.000_013_333_4;
const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
const S3_GET: f64 = 0.0004 / 1000.0;
const S3_PUT_LIST: f64 = 0.005 / 1000.0;
/// Objects a commit writes besides its data files: manifest, manifest list, metadata.json.
const OBJECTS_PER_COMMIT: u64 = 3;

/// The estimated cost of a plan.
#[derive(Debug, Clone, Serialize)]
struct Estimate {
    objects: u64,
    bytes: u64,
    commits: u64,
    lambda_gb_seconds: f64,
    s3_get: u64,
    s3_put_list: u64,
    dollars: f64,
}

fn estimate(plan: &BackfillPlan, a: &BackfillArgs) -> Estimate {
    let objects: u64 = plan.tables.values().map(|t| t.pending).sum();
    let bytes: u64 = plan.tables.values().map(|t| t.pending_bytes).sum();
    let per = a.batch.max(1) as u64;
    let commits: u64 = plan.tables.values().map(|t| t.pending.div_ceil(per)).sum();
    let seconds = bytes as f64 / (1024.0 * 1024.0) / a.mib_per_second.max(0.001);
    let lambda_gb_seconds = seconds * a.memory_mb as f64 / 1024.0;
    // One GET per object; one data file per object, plus each commit's metadata objects; the
    // listing's pages.
    let s3_get = objects;
    let s3_put_list = objects + commits * OBJECTS_PER_COMMIT + plan.list_pages;
    let dollars = lambda_gb_seconds * LAMBDA_GB_SECOND
        + commits as f64 * LAMBDA_REQUEST
        + s3_get as f64 * S3_GET
        + s3_put_list as f64 * S3_PUT_LIST;
    Estimate {
        objects,
        bytes,
        commits,
        lambda_gb_seconds,
        s3_get,
        s3_put_list,
        dollars,
    }
}

fn time(flag: &str, v: &Option<String>) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
    v.as_deref()
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|t| t.with_timezone(&chrono::Utc))
                .with_context(|| format!("{flag} {t}: expected RFC 3339"))
        })
        .transpose()
}

/// Plans, then (unless --dry-run) ingests; returns false when an object failed.
pub async fn run(config: Config, a: &BackfillArgs) -> Result<bool> {
    let options = BackfillOptions {
        since: time("--since", &a.since)?,
        until: time("--until", &a.until)?,
        batch_objects: a.batch.max(1),
        concurrency: a.concurrency.max(1),
    };
    let ingestor = Ingestor::new(config).await?;
    let spinner = progress::spinner(format!(
        "listing s3://{}/{}",
        a.location.bucket, a.location.key
    ));
    let plan = ingestor
        .plan_backfill(&a.location.bucket, &a.location.key, &options)
        .await?;
    spinner.finish_and_clear();
    let cost = estimate(&plan, a);
    if a.dry_run {
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"plan": plan, "estimate": cost}))?
            );
        } else {
            print_plan(&plan, &cost);
        }
        return Ok(true);
    }
    if let Some(arn) = a.state_machine_arn.as_deref().filter(|_| a.on_aws) {
        print_plan(&plan, &cost);
        let on = crate::backfill_aws::OnAws {
            state_machine_arn: arn,
            bucket: &a.location.bucket,
            listed_prefix: &a.location.key,
            manifest_prefix: &a.manifest_prefix,
            endpoint: a.sfn_endpoint.as_deref(),
            poll: std::time::Duration::from_secs(5),
        };
        return crate::backfill_aws::run(ingestor.config(), &plan, &on, !a.no_wait).await;
    }
    let bar = progress::bar(cost.bytes, "backfilling (bytes)");
    let started = Instant::now();
    let done = Mutex::new((0u64, 0u64));
    let report = ingestor
        .run_backfill(&plan, &options, &|p: &BatchProgress| {
            bar.inc(p.bytes);
            if let Ok(mut d) = done.lock() {
                d.0 += p.objects;
                d.1 += p.records;
                let secs = started.elapsed().as_secs_f64().max(0.001);
                bar.set_message(format!(
                    "{}/{} objects, {:.0} rows/s",
                    d.0,
                    cost.objects,
                    d.1 as f64 / secs
                ));
            }
        })
        .await;
    bar.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"plan": plan, "report": report}))?
        );
    } else {
        print_plan(&plan, &cost);
        print_report(&report);
    }
    Ok(report.failed == 0)
}

fn print_plan(plan: &BackfillPlan, cost: &Estimate) {
    println!(
        "{:<28} {:>9} {:>10} {:>9} {:>14}",
        "table", "listed", "committed", "pending", "pending bytes"
    );
    for (t, p) in &plan.tables {
        println!(
            "{:<28} {:>9} {:>10} {:>9} {:>14}",
            t, p.listed, p.committed, p.pending, p.pending_bytes
        );
    }
    if plan.unrouted > 0 || plan.out_of_range > 0 {
        println!(
            "left out: {} objects outside every route, {} outside the time range",
            plan.unrouted, plan.out_of_range
        );
    }
    println!(
        "estimate: {} objects, {} bytes, {} commits; {:.1} Lambda GB-s, {} GET, {} PUT/LIST: ${:.4}",
        cost.objects,
        cost.bytes,
        cost.commits,
        cost.lambda_gb_seconds,
        cost.s3_get,
        cost.s3_put_list,
        cost.dollars
    );
}

fn print_report(r: &BackfillReport) {
    let secs = r.seconds.max(0.001);
    println!(
        "committed {} objects in {} commits ({:.2} commit retries per commit), {} already in, {} quarantined whole or entirely, {} skipped, {} failed",
        r.committed, r.commits, r.retry_rate, r.duplicates, r.quarantined_objects, r.skipped, r.failed
    );
    println!(
        "records: {} in = {} committed + {} quarantined; {:.1} s, {:.1} objects/s, {:.0} rows/s, {:.1} MiB/s",
        r.records_in,
        r.records_committed,
        r.records_quarantined,
        r.seconds,
        (r.committed + r.duplicates + r.quarantined_objects) as f64 / secs,
        r.records_committed as f64 / secs,
        r.bytes as f64 / 1048576.0 / secs
    );
    for e in &r.errors {
        println!("failed: {e}");
    }
    if r.failed > 0 {
        println!("run the backfill again: failed objects are still pending");
    }
}
