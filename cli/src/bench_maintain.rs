//! `floe bench --maintenance`: what maintenance buys and costs.
//!
//! 1. Commit latency of the 1st vs the Nth append (median of the first and last 50), without
//!    maintenance and with maintenance every `--every` appends (compaction, expiration keeping the
//!    last 10 snapshots, manifest rewrite).
//! 2. Compaction throughput (MB/s of input) vs a plain arrow-rs Parquet read + write of the same
//!    files with no Iceberg.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::Utc;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::Ingestor;
use floe::maintain::{Maintainer, Options};
use floe::sample;

use crate::bench::median;
use crate::progress;

fn config(work: &Path) -> String {
    crate::bench::bench_config(work, &work.join("inputs"))
}

async fn appends(work: &Path, n: usize, every: Option<usize>) -> Result<(f64, f64, f64, usize)> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work.join("inputs/input"))?;
    let cfg = Config::parse(&config(work), "bench")?;
    let ingestor = Ingestor::new(cfg.clone()).await?;
    let maintainer = Maintainer::new(cfg.clone()).await?;
    let now = Utc::now();
    let mut lat = Vec::with_capacity(n);
    let mut maint_secs = 0.0;
    let bar = progress::bar(
        n as u64,
        match every {
            Some(k) => format!("appends, maintain every {k}"),
            None => "appends".to_string(),
        },
    );
    for i in 0..n {
        let key = format!("{i:06}.jsonl");
        std::fs::write(
            work.join("inputs/input").join(&key),
            sample::orders_jsonl(10, i as u64, now),
        )?;
        let obj = ObjectRef::new("input", key);
        let t = Instant::now();
        ingestor
            .ingest(&obj, Instant::now() + Duration::from_secs(600))
            .await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if let Some(k) = every {
            if (i + 1) % k == 0 {
                let t = Instant::now();
                let opts = Options {
                    orphans: false,
                    expire_older_than: Some(Duration::ZERO),
                    dedup_window: Duration::ZERO,
                    retain_last: Some(10),
                    manifest_threshold: 10,
                    target_file_bytes: Some(64 << 20),
                    ..Options::default()
                };
                maintainer.run("orders", &opts).await?;
                maint_secs += t.elapsed().as_secs_f64();
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let head = median(lat[..50.min(n)].to_vec());
    let tail = median(lat[n.saturating_sub(50)..].to_vec());
    let ident = floe::catalog::table_ident(&cfg, "orders")?;
    let snaps = maintainer
        .committer()
        .load(&ident)
        .await?
        .metadata()
        .snapshots()
        .count();
    Ok((head, tail, maint_secs, snaps))
}

async fn compaction_throughput(
    work: &Path,
    files: usize,
    rows_per_file: usize,
) -> Result<(f64, f64, f64)> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work.join("inputs/input"))?;
    let cfg = Config::parse(&config(work), "bench")?;
    let ingestor = Ingestor::new(cfg.clone()).await?;
    let now = Utc::now();
    let bar = progress::bar(files as u64, "small files to compact");
    for i in 0..files {
        let key = format!("{i:06}.jsonl");
        std::fs::write(
            work.join("inputs/input").join(&key),
            sample::orders_jsonl(rows_per_file, 10_000 + i as u64, now),
        )?;
        let obj = ObjectRef::new("input", key);
        ingestor
            .ingest(&obj, Instant::now() + Duration::from_secs(600))
            .await?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let spinner = progress::spinner("plain arrow-rs rewrite, then floe compaction");
    let ident = floe::catalog::table_ident(&cfg, "orders")?;
    let maintainer = Maintainer::new(cfg).await?;
    let table = maintainer.committer().load(&ident).await?;
    let live = floe::scan::live_files(&table).await?;
    let bytes: u64 = live.iter().map(|f| f.file.file_size_in_bytes()).sum();
    let mb = bytes as f64 / 1048576.0;

    // Plain: read every file with arrow-rs, write one Parquet file, no Iceberg.
    let t = Instant::now();
    let out = std::fs::File::create(work.join("plain.parquet"))?;
    let mut writer: Option<parquet::arrow::ArrowWriter<std::fs::File>> = None;
    let mut out = Some(out);
    for f in &live {
        let path = f.file.file_path().trim_start_matches("file://");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(path)?,
        )?
        .with_batch_size(8192)
        .build()?;
        for b in reader {
            let b = b?;
            if writer.is_none() {
                writer = Some(parquet::arrow::ArrowWriter::try_new(
                    out.take().context("output")?,
                    b.schema(),
                    Some(floe::ingest::writer_properties()),
                )?);
            }
            if let Some(w) = writer.as_mut() {
                w.write(&b)?;
            }
        }
    }
    if let Some(w) = writer {
        w.close()?;
    }
    let plain = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let opts = Options {
        expire: false,
        orphans: false,
        rewrite_manifests: false,
        target_file_bytes: Some(1 << 30),
        ..Options::default()
    };
    let r = maintainer.run("orders", &opts).await?;
    let floe = t.elapsed().as_secs_f64();
    spinner.finish_and_clear();
    anyhow::ensure!(
        r.groups_compacted == 1 && r.files_after == 1,
        "compaction did not run as expected: {r:?}"
    );
    Ok((mb, mb / floe, mb / plain))
}

pub async fn run(appends_n: usize, every: usize, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    progress::note(format!("{appends_n} appends without maintenance…"));
    let (h0, t0, _, s0) = appends(&dir.join("plain"), appends_n, None).await?;
    progress::note(format!(
        "{appends_n} appends with maintenance every {every}…"
    ));
    let (h1, t1, m1, s1) = appends(&dir.join("maintained"), appends_n, Some(every)).await?;
    println!("\n## Commit latency, 1st vs {appends_n}th append (10-row objects; medians of the first and last 50)\n");
    println!("| mode | first 50 (ms) | last 50 (ms) | last/first | snapshots at end | maintenance time (s) |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| no maintenance | {h0:.1} | {t0:.1} | {:.2}× | {s0} | - |",
        t0 / h0
    );
    println!(
        "| maintenance every {every} | {h1:.1} | {t1:.1} | {:.2}× | {s1} | {m1:.1} |",
        t1 / h1
    );
    println!("\ntarget: with maintenance ≤ 1.5× the first");
    progress::note("compaction throughput…");
    let (mb, floe, plain) = compaction_throughput(&dir.join("compact"), 200, 5_000).await?;
    println!("\n## Compaction of 200 small files ({mb:.0} MiB of Parquet) into one\n");
    println!("| contender | MB/s of input |");
    println!("|---|---:|");
    println!("| plain arrow-rs read + write (no Iceberg) | {plain:.1} |");
    println!("| floe compaction (replace commit) | {floe:.1} |");
    println!("\nfloe / plain: {:.2}× (target ≥ 0.7×)", floe / plain);
    Ok(())
}
