//! `floe bench --delta`: an aggregate pipeline's incremental run costs the delta, not the table.
//!
//! Two sources of the sample orders, 100 k rows and `--delta-rows` (10 M), at the same event
//! rate ([`ROWS_PER_DAY`]): the big one has a longer history, not denser windows. Each is
//! ingested (the ingest code path) from Parquet objects of up to [`OBJECT_ROWS`] rows in time
//! order, and the sample aggregate pipeline (revenue per region per minute) catches up once.
//! Then, [`ROUNDS`] times per source (alternating, each in its own child process), one small
//! object ([`NEW_EVENTS`] events in the latest hour) lands and the incremental run is measured
//! (medians are reported): wall time, bytes read from the source, data files opened, sink files and
//! bytes rewritten, peak RSS — side by side, with the ratio.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::SchemaRef;
use chrono::Utc;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::Ingestor;
use floe::process::Processor;
use floe::sample::{self, Rng};
use serde_json::{json, Value};

use crate::bench::{f, median_run, peak_rss_mb, print_runs, run_child, Run};
use crate::progress;

/// Events per day in both sources.
const ROWS_PER_DAY: u64 = 25_000;
/// Rows per ingested object while building a source.
const OBJECT_ROWS: u64 = 1_000_000;
/// Events in the new object, all within the latest hour.
const NEW_EVENTS: usize = 200;
/// Incremental runs measured per source (one new object each, each in its own process); the
/// medians are reported.
const ROUNDS: usize = 5;
/// The small source.
const SMALL_ROWS: u64 = 100_000;
/// The pipeline measured.
const PIPELINE: &str = "revenue_per_region_minute";
const DAY_US: i64 = 86_400_000_000;

/// Set (by `--recompute`) in the children's environment: the aggregate runs with `merge = false`.
const RECOMPUTE_ENV: &str = "FLOE_BENCH_RECOMPUTE";

fn config_text(work: &Path) -> String {
    let inputs = work.join("inputs");
    let pipelines = crate::local::sample_pipelines(std::env::var_os(RECOMPUTE_ENV).is_some());
    format!(
        "{}{}",
        crate::bench::bench_config(work, &inputs)
            .replace("format = \"jsonl\"", "format = \"parquet\""),
        pipelines
    )
}

/// The ingest decode schema of the sample orders (what an object's columns are cast to).
pub(crate) fn order_schema(config: &Config) -> Result<SchemaRef> {
    let table = config.table("orders").context("orders table")?;
    let schema = floe::schema::table_schema(table)?;
    let arrow = iceberg::arrow::schema_to_arrow_schema(&schema)?;
    Ok(floe::schema::decode_schema(&arrow))
}

/// Sample orders at the event times `times` (µs), as a batch of `schema`.
fn orders_batch(schema: &SchemaRef, rng: &mut Rng, times: &[i64]) -> Result<RecordBatch> {
    orders_batch_for(schema, rng, times, None)
}

/// [`orders_batch`] for the given `customers` (one per row; default: random ones).
pub(crate) fn orders_batch_for(
    schema: &SchemaRef,
    rng: &mut Rng,
    times: &[i64],
    customers: Option<&[i64]>,
) -> Result<RecordBatch> {
    let n = times.len();
    let pick = |rng: &mut Rng, values: &[&'static str]| -> Vec<&'static str> {
        (0..n)
            .map(|_| values[rng.below(values.len() as u64) as usize])
            .collect()
    };
    let ids: Vec<String> = (0..n).map(|_| floe::sample::uuid_v4(rng)).collect();
    let customers: Vec<i64> = match customers {
        Some(c) => c.to_vec(),
        None => (0..n).map(|_| rng.below(1_000_000) as i64).collect(),
    };
    let regions = pick(rng, &sample::REGIONS);
    let amounts: Vec<f64> = (0..n).map(|_| rng.below(500_000) as f64 / 100.0).collect();
    let currencies = pick(rng, &sample::CURRENCIES);
    let items: Vec<i64> = (0..n).map(|_| 1 + rng.below(9) as i64).collect();
    let statuses = pick(rng, &sample::STATUSES);
    let payments = pick(rng, &sample::PAYMENTS);
    let mut columns: Vec<ArrayRef> = Vec::new();
    for field in schema.fields() {
        let col: ArrayRef = match field.name().as_str() {
            "order_id" => Arc::new(StringArray::from_iter_values(&ids)),
            "customer_id" => Arc::new(Int64Array::from(customers.clone())),
            "region" => Arc::new(StringArray::from(regions.clone())),
            "amount" => Arc::new(Float64Array::from(amounts.clone())),
            "currency" => Arc::new(StringArray::from(currencies.clone())),
            "items" => Arc::new(Int64Array::from(items.clone())),
            "status" => Arc::new(StringArray::from(statuses.clone())),
            "payment_method" => Arc::new(StringArray::from(payments.clone())),
            "event_time" => {
                Arc::new(TimestampMicrosecondArray::from(times.to_vec()).with_timezone("+00:00"))
            }
            _ => arrow::array::new_null_array(field.data_type(), n),
        };
        columns.push(arrow::compute::cast(&col, field.data_type())?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Writes `batches` as one Parquet object at `path`.
pub(crate) fn write_object(path: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let file = std::fs::File::create(path)?;
    let mut w = parquet::arrow::ArrowWriter::try_new(
        file,
        schema.clone(),
        Some(floe::ingest::writer_properties()),
    )?;
    for b in batches {
        w.write(b)?;
    }
    w.close()?;
    Ok(())
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// Child: builds a source of `rows` orders ending now (objects in time order, through the
/// ingest code path), then runs the aggregate pipeline once to catch up.
pub(crate) async fn child_setup(work: &Path, rows: u64) -> Result<Value> {
    let _ = std::fs::remove_dir_all(work);
    let bucket = work.join("inputs").join("input");
    std::fs::create_dir_all(&bucket)?;
    let text = config_text(work);
    std::fs::write(work.join("floe.toml"), &text)?;
    let config = Config::parse(&text, "bench")?;
    let schema = order_schema(&config)?;
    let ingestor = Ingestor::new(config.clone()).await?;
    let mut rng = Rng::new(rows);
    let now = Utc::now().timestamp_micros();
    let days = rows.div_ceil(ROWS_PER_DAY).max(1);
    let span = days as i64 * DAY_US;
    // Evenly spread from `now - span` to now (the latest hour has events already, as a live
    // table's does), each event jittered by up to a second.
    let step = span as f64 / rows as f64;
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut object = 0;
    while done < rows {
        let n = OBJECT_ROWS.min(rows - done);
        let mut batches = Vec::new();
        let mut i = done;
        while i < done + n {
            let m = (done + n - i).min(65_536);
            let times: Vec<i64> = (i..i + m)
                .map(|k| now - span + (k as f64 * step) as i64 + rng.below(1_000_000) as i64)
                .collect();
            batches.push(orders_batch(&schema, &mut rng, &times)?);
            i += m;
        }
        let key = format!("history-{object:04}.parquet");
        write_object(&bucket.join(&key), &schema, &batches)?;
        drop(batches);
        let r = ingestor
            .ingest(&ObjectRef::new("input", key.clone()), deadline())
            .await?;
        anyhow::ensure!(
            r.records_committed == n,
            "{key}: {} of {n} rows committed",
            r.records_committed
        );
        std::fs::remove_file(bucket.join(&key))?;
        done += n;
        object += 1;
    }
    let build = t0.elapsed().as_secs_f64();
    let processor = Processor::new(config.clone()).await?;
    let t1 = Instant::now();
    let r = processor.run(PIPELINE, deadline()).await?;
    let catch_up = t1.elapsed().as_secs_f64();
    let source = processor
        .committer()
        .load(&floe::catalog::table_ident(&config, "orders")?)
        .await?;
    let live = floe::scan::live_files(&source).await?;
    let sink = processor
        .committer()
        .load(&floe::catalog::table_ident(&config, PIPELINE)?)
        .await?;
    let sink_files = floe::scan::live_files(&sink).await?;
    Ok(json!({
        "secs": catch_up,
        "rows": r.rows_in,
        "build_secs": build,
        "days": days,
        "objects": object,
        "source_files": live.len(),
        "source_bytes": live.iter().map(|f| f.file.file_size_in_bytes()).sum::<u64>(),
        "sink_files": sink_files.len(),
        "sink_rows": r.rows_out,
        "rss_mb": peak_rss_mb(),
    }))
}

/// Child: one new object of [`NEW_EVENTS`] events in the latest hour lands, then the
/// incremental run (timed).
pub(crate) async fn child_run(work: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(work.join("floe.toml"))?;
    let config = Config::parse(&text, "bench")?;
    let schema = order_schema(&config)?;
    let ingestor = Ingestor::new(config.clone()).await?;
    let processor = Processor::new(config).await?;
    let now = Utc::now().timestamp_micros();
    let mut rng = Rng::new(now as u64);
    let times: Vec<i64> = (0..NEW_EVENTS)
        .map(|_| now - rng.below(3_600_000_000) as i64)
        .collect();
    let key = format!("new-{now}.parquet");
    write_object(
        &work.join("inputs").join("input").join(&key),
        &schema,
        &[orders_batch(&schema, &mut rng, &times)?],
    )?;
    ingestor
        .ingest(&ObjectRef::new("input", key), deadline())
        .await?;
    let t = Instant::now();
    let r = processor.run(PIPELINE, deadline()).await?;
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        r.rows_in == NEW_EVENTS as u64 && r.sink_snapshot.is_some(),
        "unexpected run: {r:?}"
    );
    Ok(json!({
        "secs": secs,
        "rows": r.rows_in,
        "windows": r.windows,
        "delta_bytes": r.delta_bytes_read,
        "source_bytes": r.delta_bytes_read + r.recompute_bytes_read,
        "files_opened": r.delta_files_read + r.recompute_files_read,
        "rows_recomputed": r.rows_recomputed,
        "sink_files": r.files_replaced,
        "sink_bytes": r.sink_bytes_replaced,
        "sink_read_bytes": r.sink_bytes_read,
        "rows_out": r.rows_out,
        "rss_mb": peak_rss_mb(),
    }))
}

/// Runs the benchmark in `dir` (deleted first): a 100 k-row and a `big_rows` source.
pub(crate) fn run(dir: &Path, big_rows: u64, recompute: bool) -> Result<()> {
    let dir = crate::bench::fresh_dir(dir)?;
    let exe = std::env::current_exe()?;
    let child = |mode: &str, work: &Path, rows: u64| {
        let mut c = crate::bench::child_command(&exe, mode, work, work);
        c.arg("--child-rows").arg(rows.to_string());
        if recompute {
            c.env(RECOMPUTE_ENV, "1");
        }
        c
    };
    let sizes = [SMALL_ROWS, big_rows];
    let label = |rows: u64| match rows {
        r if r >= 1_000_000 && r % 1_000_000 == 0 => format!("{} M rows", r / 1_000_000),
        r if r >= 1_000 && r % 1_000 == 0 => format!("{} k rows", r / 1_000),
        r => format!("{r} rows"),
    };
    let mut setups = Vec::new();
    let mut works = Vec::new();
    for rows in sizes {
        let work = dir.join(format!("rows-{rows}"));
        progress::note(format!(
            "{}: building the source ({} days) and catching up…",
            label(rows),
            rows.div_ceil(ROWS_PER_DAY)
        ));
        setups.push(run_child(
            &format!("catch-up, {}", label(rows)),
            &mut child("delta-setup", &work, rows),
        )?);
        works.push(work);
    }
    // The rounds alternate between the sources, so a load change on the machine meets both.
    let mut rounds: Vec<Vec<Run>> = vec![Vec::new(); sizes.len()];
    for round in 0..ROUNDS {
        for (i, rows) in sizes.iter().enumerate() {
            rounds[i].push(run_child(
                &format!("incremental run {}/{ROUNDS}, {}", round + 1, label(*rows)),
                &mut child("delta-run", &works[i], *rows),
            )?);
        }
    }
    let runs: Vec<Run> = sizes
        .iter()
        .zip(&rounds)
        .map(|(rows, r)| {
            median_run(
                format!("incremental run, {} (median of {ROUNDS})", label(*rows)),
                r,
            )
        })
        .collect();
    let strategy = if recompute {
        "windows recomputed, merge = false"
    } else {
        "partial aggregates merged"
    };
    let build = if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    };
    println!(
        "\n## Aggregate pipeline ({strategy}) after one new object ({NEW_EVENTS} events in the \
         latest hour), {} vs {} source at {ROWS_PER_DAY} events/day, {build}\n",
        label(sizes[0]),
        label(sizes[1])
    );
    print_runs(&[&setups[..], &runs[..]].concat());
    let (s, b) = (&runs[0].out, &runs[1].out);
    let (ss, sb) = (&setups[0].out, &setups[1].out);
    println!(
        "\n| incremental run (median of {ROUNDS}) | {} | {} | {} / {} |",
        label(sizes[0]),
        label(sizes[1]),
        label(sizes[1]),
        label(sizes[0])
    );
    println!("|---|---:|---:|---:|");
    let row = |name: &str, k: &str, scale: f64, unit: &str| {
        let (x, y) = (f(s, k) / scale, f(b, k) / scale);
        let ratio = if x > 0.0 {
            format!("{:.2}×", y / x)
        } else {
            "-".into()
        };
        println!("| {name}{unit} | {x:.1} | {y:.1} | {ratio} |");
    };
    row("wall time", "secs", 1e-3, " (ms)");
    row("source bytes read", "source_bytes", 1024.0, " (KiB)");
    row(
        "… of it from the new files",
        "delta_bytes",
        1024.0,
        " (KiB)",
    );
    row("source data files opened", "files_opened", 1.0, "");
    row("source rows recomputed", "rows_recomputed", 1.0, "");
    row("windows recomputed or merged", "windows", 1.0, "");
    row("sink files rewritten", "sink_files", 1.0, "");
    row("sink bytes rewritten", "sink_bytes", 1024.0, " (KiB)");
    row(
        "sink bytes read to merge",
        "sink_read_bytes",
        1024.0,
        " (KiB)",
    );
    row("peak RSS", "rss_mb", 1.0, " (MiB)");
    println!(
        "| source: days / data files / MiB | {:.0} / {:.0} / {:.1} | {:.0} / {:.0} / {:.1} | |",
        f(ss, "days"),
        f(ss, "source_files"),
        f(ss, "source_bytes") / 1048576.0,
        f(sb, "days"),
        f(sb, "source_files"),
        f(sb, "source_bytes") / 1048576.0
    );
    println!(
        "| setup: ingest / catch-up run (s) | {:.1} / {:.1} | {:.1} / {:.1} | |",
        f(ss, "build_secs"),
        f(ss, "secs"),
        f(sb, "build_secs"),
        f(sb, "secs")
    );
    println!(
        "\n{} / {} incremental run time: {:.2}× (target ≤ 2×); the source is {:.0}× larger",
        label(sizes[1]),
        label(sizes[0]),
        f(b, "secs") / f(s, "secs").max(1e-9),
        sizes[1] as f64 / sizes[0] as f64
    );
    Ok(())
}
