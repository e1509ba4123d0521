//! `floe bench --latest`: a latest-state pipeline's incremental run against a full rebuild.
//!
//! A source of `--latest-keys` customers (1 M), one order each, is ingested (the ingest code
//! path, Parquet objects) and the sample latest pipeline ("each customer's latest order", a
//! cancelled one deleting the customer) catches up. Then [`ROUNDS`] times, alternating, each
//! in its own child process: [`UPDATES`] new versions spread over a random 1 % of the
//! customers (event times in the latest hour, so many arrive out of order) land in one object,
//! and either the incremental run or a full rebuild (`refresh`: the same SQL over the whole
//! source, the sink and tombstones replaced) is measured. Medians are reported: wall time,
//! bytes read (delta, the touched buckets' sink and tombstone files; for the rebuild the whole
//! source), bytes written, files replaced, sink rows written, position delete files written
//! (a run merges on read: the replaced rows get position deletes), peak RSS, and the ratio of
//! work.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::Utc;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::Ingestor;
use floe::process::Processor;
use floe::sample::{self, Rng};
use serde_json::{json, Value};

use crate::bench::{f, median_run, peak_rss_mb, print_runs, run_child};
use crate::bench_delta::{order_schema, orders_batch_for, write_object};
use crate::progress;

/// New versions per round.
const UPDATES: u64 = 100_000;
/// The share of the customers a round's versions fall on (1 %).
const TOUCHED_SHARE: u64 = 100;
/// Rows per ingested object while building the source.
const OBJECT_ROWS: u64 = 1_000_000;
/// Incremental runs and rebuilds measured (alternating, each in its own process).
const ROUNDS: usize = 3;
const PIPELINE: &str = "customer_latest_order";
const HOUR_US: i64 = 3_600_000_000;

fn config_text(work: &Path, buckets: u32) -> String {
    let inputs = work.join("inputs");
    format!(
        "{}{}",
        crate::bench::bench_config(work, &inputs)
            .replace("format = \"jsonl\"", "format = \"parquet\""),
        sample::LATEST_PIPELINE_TOML.replace(
            "order_by = \"event_time\"",
            &format!("order_by = \"event_time\"\nkey_buckets = {buckets}")
        )
    )
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(3 * 3600)
}

/// Bytes of the live files of `table`.
async fn table_bytes(p: &Processor, config: &Config, table: &str) -> Result<(usize, u64)> {
    let ident = floe::catalog::table_ident(config, table)?;
    if !p.committer().catalog().table_exists(&ident).await? {
        return Ok((0, 0));
    }
    let t = p.committer().load(&ident).await?;
    let files = floe::scan::live_files(&t).await?;
    Ok((
        files.len(),
        files.iter().map(|f| f.file.file_size_in_bytes()).sum(),
    ))
}

/// Child: the source of `keys` customers (one order each, a day old), and the catch-up run.
pub(crate) async fn child_setup(work: &Path, keys: u64, buckets: u32) -> Result<Value> {
    let _ = std::fs::remove_dir_all(work);
    let bucket = work.join("inputs").join("input");
    std::fs::create_dir_all(&bucket)?;
    let text = config_text(work, buckets);
    std::fs::write(work.join("floe.toml"), &text)?;
    let config = Config::parse(&text, "bench")?;
    let schema = order_schema(&config)?;
    let ingestor = Ingestor::new(config.clone()).await?;
    let mut rng = Rng::new(keys);
    let start = Utc::now().timestamp_micros() - 24 * HOUR_US;
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut object = 0;
    while done < keys {
        let n = OBJECT_ROWS.min(keys - done);
        let mut batches = Vec::new();
        let mut i = done;
        while i < done + n {
            let m = (done + n - i).min(65_536);
            let customers: Vec<i64> = (i..i + m).map(|k| k as i64).collect();
            let times: Vec<i64> = (0..m)
                .map(|_| start + rng.below(HOUR_US as u64) as i64)
                .collect();
            batches.push(orders_batch_for(
                &schema,
                &mut rng,
                &times,
                Some(&customers),
            )?);
            i += m;
        }
        let key = format!("history-{object:04}.parquet");
        write_object(&bucket.join(&key), &schema, &batches)?;
        drop(batches);
        let r = ingestor
            .ingest(&ObjectRef::new("input", key.clone()), deadline())
            .await?;
        anyhow::ensure!(r.records_committed == n, "{key}: {r:?}");
        std::fs::remove_file(bucket.join(&key))?;
        done += n;
        object += 1;
    }
    let build = t0.elapsed().as_secs_f64();
    let processor = Processor::new(config.clone()).await?;
    let t1 = Instant::now();
    let r = processor.run(PIPELINE, deadline()).await?;
    let catch_up = t1.elapsed().as_secs_f64();
    let (sink_files, sink_bytes) = table_bytes(&processor, &config, PIPELINE).await?;
    Ok(json!({
        "secs": catch_up,
        "rows": r.rows_in,
        "build_secs": build,
        "sink_rows": r.rows_out,
        "sink_files": sink_files,
        "sink_bytes": sink_bytes,
        "rss_mb": peak_rss_mb(),
    }))
}

/// Child: [`UPDATES`] versions over 1 % of the customers land; then the incremental run
/// (`rebuild` false) or a full rebuild, timed.
pub(crate) async fn child_round(work: &Path, keys: u64, rebuild: bool) -> Result<Value> {
    let text = std::fs::read_to_string(work.join("floe.toml"))?;
    let config = Config::parse(&text, "bench")?;
    let schema = order_schema(&config)?;
    let ingestor = Ingestor::new(config.clone()).await?;
    let processor = Processor::new(config.clone()).await?;
    let now = Utc::now().timestamp_micros();
    let mut rng = Rng::new(now as u64);
    let touched: Vec<i64> = (0..keys / TOUCHED_SHARE)
        .map(|_| rng.below(keys) as i64)
        .collect();
    let customers: Vec<i64> = (0..UPDATES)
        .map(|_| touched[rng.below(touched.len() as u64) as usize])
        .collect();
    let times: Vec<i64> = (0..UPDATES)
        .map(|_| now - rng.below(HOUR_US as u64) as i64)
        .collect();
    let key = format!("updates-{now}.parquet");
    let batch = orders_batch_for(&schema, &mut rng, &times, Some(&customers))?;
    write_object(
        &work.join("inputs").join("input").join(&key),
        &schema,
        &[batch],
    )?;
    ingestor
        .ingest(&ObjectRef::new("input", key), deadline())
        .await?;
    let tombstones = format!("{PIPELINE}{}", floe::config::TOMBSTONES_SUFFIX);
    let (source_files, source_bytes) = table_bytes(&processor, &config, "orders").await?;
    let t = Instant::now();
    let r = if rebuild {
        processor.refresh(PIPELINE, deadline()).await?
    } else {
        processor.run(PIPELINE, deadline()).await?
    };
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(r.sink_snapshot.is_some(), "unexpected run: {r:?}");
    let (sink_files, sink_bytes) = table_bytes(&processor, &config, PIPELINE).await?;
    let (_, tomb_bytes) = table_bytes(&processor, &config, &tombstones).await?;
    let (read, written, files) = if rebuild {
        // A rebuild reads every live source file and writes the whole sink and tombstones.
        (source_bytes, sink_bytes + tomb_bytes, r.files_replaced)
    } else {
        (
            r.delta_bytes_read + r.sink_bytes_read,
            r.bytes_written,
            r.files_replaced,
        )
    };
    Ok(json!({
        "secs": secs,
        "rows": if rebuild { r.rows_out } else { r.rows_in },
        "keys_touched": r.keys_touched,
        "buckets": r.buckets,
        "bytes_read": read,
        "bytes_written": written,
        "bytes_total": read + written,
        "files_replaced": files,
        "sink_rows_rewritten": r.rows_out,
        "delete_files": r.delete_files,
        "rows_deleted": r.rows_deleted,
        "source_files": source_files,
        "source_bytes": source_bytes,
        "sink_files": sink_files,
        "sink_bytes": sink_bytes,
        "tombstone_bytes": tomb_bytes,
        "rss_mb": peak_rss_mb(),
    }))
}

/// Runs the benchmark in `dir` (deleted first).
pub(crate) fn run(dir: &Path, keys: u64, buckets: u32) -> Result<()> {
    let dir = crate::bench::fresh_dir(dir)?;
    let exe = std::env::current_exe()?;
    let work = dir.join("work");
    let child = |mode: &str| {
        let mut c = crate::bench::child_command(&exe, mode, &work, &work);
        c.arg("--child-rows")
            .arg(keys.to_string())
            .arg("--child-buckets")
            .arg(buckets.to_string());
        c
    };
    progress::note(format!(
        "{keys} customers, {buckets} key buckets: building the source and catching up…"
    ));
    let setup = run_child("catch-up (every key)", &mut child("latest-setup"))?;
    let (mut inc, mut full) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        inc.push(run_child(
            &format!("incremental run {}/{ROUNDS}", round + 1),
            &mut child("latest-run"),
        )?);
        full.push(run_child(
            &format!("full rebuild {}/{ROUNDS}", round + 1),
            &mut child("latest-rebuild"),
        )?);
    }
    let i = median_run(format!("incremental run (median of {ROUNDS})"), &inc);
    let r = median_run(format!("full rebuild (median of {ROUNDS})"), &full);
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    println!(
        "\n## Latest-state pipeline: {UPDATES} versions over 1 % of {keys} keys per round, \
         {buckets} key buckets, {build}\n"
    );
    print_runs(&[setup.clone(), i.clone(), r.clone()]);
    println!(
        "\n| per round (median of {ROUNDS}) | incremental | full rebuild | rebuild / incremental |"
    );
    println!("|---|---:|---:|---:|");
    let row = |name: &str, k: &str, scale: f64, unit: &str| {
        let (x, y) = (f(&i.out, k) / scale, f(&r.out, k) / scale);
        let ratio = if x > 0.0 {
            format!("{:.2}×", y / x)
        } else {
            "-".into()
        };
        println!("| {name}{unit} | {x:.1} | {y:.1} | {ratio} |");
    };
    row("wall time", "secs", 1e-3, " (ms)");
    row("bytes read", "bytes_read", 1048576.0, " (MiB)");
    row("bytes written", "bytes_written", 1048576.0, " (MiB)");
    row("bytes read + written", "bytes_total", 1048576.0, " (MiB)");
    row("sink files replaced", "files_replaced", 1.0, "");
    row("sink rows written", "sink_rows_rewritten", 1.0, "");
    row("position delete files written", "delete_files", 1.0, "");
    row("sink rows deleted by position", "rows_deleted", 1.0, "");
    row("peak RSS", "rss_mb", 1.0, " (MiB)");
    println!(
        "| keys touched / buckets touched | {:.0} / {:.0} of {buckets} | | |",
        f(&i.out, "keys_touched"),
        f(&i.out, "buckets")
    );
    println!(
        "| source at the last round: files / MiB | {:.0} / {:.1} | | |",
        f(&r.out, "source_files"),
        f(&r.out, "source_bytes") / 1048576.0
    );
    println!(
        "| sink: files / MiB; tombstones MiB | {:.0} / {:.1}; {:.2} | | |",
        f(&r.out, "sink_files"),
        f(&r.out, "sink_bytes") / 1048576.0,
        f(&r.out, "tombstone_bytes") / 1048576.0
    );
    println!(
        "\nfull rebuild / incremental: {:.2}× the bytes read + written, {:.2}× the bytes written, \
         {:.2}× the time (target ≥ 20× less work)",
        f(&r.out, "bytes_total") / f(&i.out, "bytes_total").max(1.0),
        f(&r.out, "bytes_written") / f(&i.out, "bytes_written").max(1.0),
        f(&r.out, "secs") / f(&i.out, "secs").max(1e-9)
    );
    let _ = setup.out.get("secs").context("setup result")?;
    Ok(())
}
