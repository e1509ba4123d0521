//! `floe bench --backfill`: `floe backfill` over a local-directory "bucket" of small objects and
//! of big ones, at concurrency 1, 4 and 8, side by side with ingesting the same objects one
//! commit per object (the same code path with batches of one, as one Lambda invocation per
//! object would). Each run is a child process on a fresh table: objects/s, rows/s, commits per
//! object, the commit-retry rate (attempts beyond the first, per commit), objects whose commit
//! gave up (contention: lost races beyond 5 × `max_commit_attempts`) and peak RSS.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use chrono::Utc;
use floe::config::Config;
use floe::ingest::backfill::BackfillOptions;
use floe::ingest::Ingestor;
use floe::sample;
use serde_json::{json, Value};

use crate::bench::{bench_config, f, generate_big, peak_rss_mb, print_runs_with, run_child, Run};
use crate::progress;

/// Lines per small object.
const SMALL_LINES: usize = 200;
/// Big objects.
const BIG_OBJECTS: usize = 20;
/// Batches (or objects) in flight.
const CONCURRENCY: [usize; 3] = [1, 4, 8];
/// Objects per commit: `floe backfill`'s default for small objects; two per commit for the big
/// ones, so that 20 objects make 10 batches for the concurrency to spread.
const SMALL_BATCH: usize = 50;
const BIG_BATCH: usize = 2;

/// Child: plan and run a backfill of `input`'s bucket `input` under a prefix. `mode` is
/// `backfill:<prefix>:<objects per commit>:<concurrency>`.
pub(crate) async fn child(mode: &str, inputs: &Path, work: &Path) -> Result<Value> {
    let parts: Vec<&str> = mode.split(':').collect();
    let [_, prefix, batch, concurrency] = parts[..] else {
        bail!("child mode {mode}: expected backfill:<prefix>:<batch>:<concurrency>");
    };
    let options = BackfillOptions {
        batch_objects: batch.parse().context("batch")?,
        concurrency: concurrency.parse().context("concurrency")?,
        ..Default::default()
    };
    std::fs::create_dir_all(work)?;
    let config = Config::parse(&bench_config(work, inputs), "bench")?;
    let ingestor = Ingestor::new(config).await?;
    let t0 = Instant::now();
    let plan = ingestor.plan_backfill("input", prefix, &options).await?;
    let report = ingestor.run_backfill(&plan, &options, &|_| {}).await;
    let secs = t0.elapsed().as_secs_f64();
    // Objects whose commit gave up (contention beyond its lost-race bound) are a result, not
    // an error: a Lambda's SQS redelivery would retry them.
    Ok(json!({
        "failed": report.failed,
        "first_error": report.errors.first(),
        "secs": secs,
        "rows": report.records_committed,
        "objects": report.committed + report.duplicates + report.quarantined_objects,
        "bytes": report.bytes,
        "commits": report.commits,
        "retry_rate": report.retry_rate,
        "rss_mb": peak_rss_mb(),
    }))
}

/// Runs the benchmark in `dir` (deleted first): `small` objects of 200 lines and 20 objects of
/// `big_mb` MiB of JSON lines (gzip).
pub(crate) fn run(dir: &Path, small: usize, big_mb: usize) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let inputs = dir.join("inputs");
    let bucket = inputs.join("input");
    std::fs::create_dir_all(bucket.join("small"))?;
    std::fs::create_dir_all(bucket.join("big"))?;
    let dir = std::fs::canonicalize(dir)?;
    let inputs = std::fs::canonicalize(&inputs)?;
    let bucket = std::fs::canonicalize(&bucket)?;

    let now = Utc::now();
    let bar = progress::bar(small as u64, "generating small objects");
    for i in 0..small {
        std::fs::write(
            bucket.join(format!("small/{i:05}.jsonl")),
            sample::orders_jsonl(SMALL_LINES, 10_000 + i as u64, now),
        )?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    progress::note(format!(
        "generating {BIG_OBJECTS} objects of {big_mb} MiB of JSON lines (gzip)…"
    ));
    let first = bucket.join("big/00.jsonl.gz");
    let big_rows = generate_big(&first, big_mb)?;
    for i in 1..BIG_OBJECTS {
        std::fs::copy(&first, bucket.join(format!("big/{i:02}.jsonl.gz")))?;
    }
    let big_gz = std::fs::metadata(&first)?.len() as f64 / 1048576.0;

    let exe = std::env::current_exe()?;
    let child = |prefix: &str, batch: usize, concurrency: usize| {
        let mut c = Command::new(&exe);
        c.args([
            "bench",
            "--child",
            &format!("backfill:{prefix}:{batch}:{concurrency}"),
            "--input",
        ])
        .arg(&inputs)
        .arg("--work")
        .arg(dir.join(format!(
            "work-{}-{batch}-{concurrency}",
            prefix.trim_end_matches('/')
        )));
        c.env("FLOE_METRICS", "off").env("RUST_LOG", "warn");
        c
    };
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sets = [
        (
            "small/",
            SMALL_BATCH,
            format!("{small} small objects of {SMALL_LINES} lines"),
        ),
        (
            "big/",
            BIG_BATCH,
            format!(
                "{BIG_OBJECTS} objects of {big_mb} MiB JSON lines ({big_gz:.1} MiB gzip, {big_rows} rows each)"
            ),
        ),
    ];
    for (prefix, batch, title) in sets {
        let mut runs = Vec::new();
        for (per_commit, label) in [
            (batch, format!("backfill, {batch} objects per commit")),
            (1, "one commit per object".to_string()),
        ] {
            for c in CONCURRENCY {
                runs.push(run_child(
                    &format!("{label}, concurrency {c}"),
                    &mut child(prefix, per_commit, c),
                )?);
            }
        }
        println!("\n## Backfill: {title}, {build}, {cores} cores\n");
        print_table(&runs);
    }
    Ok(())
}

fn print_table(runs: &[Run]) {
    let objects_per_s =
        |r: &Run| format!("{:.1}", f(&r.out, "objects") / f(&r.out, "secs").max(1e-9));
    let mib_per_s = |r: &Run| {
        format!(
            "{:.1}",
            f(&r.out, "bytes") / 1048576.0 / f(&r.out, "secs").max(1e-9)
        )
    };
    let commits = |r: &Run| format!("{:.0}", f(&r.out, "commits"));
    let per_object = |r: &Run| {
        format!(
            "{:.3}",
            f(&r.out, "commits") / f(&r.out, "objects").max(1.0)
        )
    };
    let retries = |r: &Run| format!("{:.2}", f(&r.out, "retry_rate"));
    let failed = |r: &Run| format!("{:.0}", f(&r.out, "failed"));
    print_runs_with(
        runs,
        &[
            ("objects/s", &objects_per_s),
            ("MiB/s (input)", &mib_per_s),
            ("commits", &commits),
            ("commits/object", &per_object),
            ("retries/commit", &retries),
            ("failed (gave up)", &failed),
        ],
    );
    // Batched vs one commit per object at the same concurrency.
    let half = runs.len() / 2;
    let ratios: Vec<String> = runs[..half]
        .iter()
        .zip(&runs[half..])
        .zip(CONCURRENCY)
        .map(|((b, o), c)| {
            format!(
                "{:.2}× at concurrency {c}",
                f(&o.out, "secs") / f(&b.out, "secs").max(1e-9)
            )
        })
        .collect();
    println!(
        "\none commit per object / backfill time: {}",
        ratios.join(", ")
    );
    for r in runs {
        if let Some(e) = r.out.get("first_error").and_then(Value::as_str) {
            println!(
                "{}: {:.0} objects failed (left for a retry), e.g. {e}",
                r.name,
                f(&r.out, "failed")
            );
        }
    }
}
