//! `floe bench --planning`: planning a one-snapshot delta must cost the same whatever the
//! table's history (the walk stops at the checkpoint).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use chrono::Utc;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::Ingestor;
use floe::process::{self, RowChangePolicy};
use floe::sample;
use iceberg::spec::{
    Snapshot, SnapshotReference, SnapshotRetention, Summary, TableMetadataBuilder, MAIN_BRANCH,
};

fn config(work: &Path) -> String {
    crate::bench::bench_config(work, &work.join("inputs"))
}

async fn ingest(ingestor: &Ingestor, work: &Path, key: &str, seed: u64) -> Result<i64> {
    std::fs::write(
        work.join("inputs/input").join(key),
        sample::orders_jsonl(100, seed, Utc::now()),
    )?;
    let obj = ObjectRef::new("input", key);
    let r = ingestor
        .ingest(&obj, Instant::now() + Duration::from_secs(600))
        .await?;
    r.snapshot_id.ok_or_else(|| anyhow::anyhow!("no snapshot"))
}

/// Median planning time (ms) of a one-snapshot delta on a table with `history` snapshots.
async fn plan_time(work: &Path, history: usize) -> Result<(f64, usize)> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work.join("inputs/input"))?;
    let cfg = Config::parse(&config(work), "bench")?;
    let ingestor = Ingestor::new(cfg.clone()).await?;
    let first = ingest(&ingestor, work, "000.jsonl", 1).await?;
    let ident = floe::catalog::table_ident(&cfg, "orders")?;
    // Grow the history with metadata-only append snapshots (sharing the first's manifest list).
    let table = ingestor.catalog().load_table(&ident).await?;
    let md = table.metadata();
    let list = md
        .snapshot_by_id(first)
        .map(|s| s.manifest_list().to_string())
        .unwrap_or_default();
    let mut builder = TableMetadataBuilder::new_from_metadata(
        md.clone(),
        table.metadata_location().map(str::to_string),
    );
    let mut parent = first;
    let t0 = md.last_updated_ms();
    for i in 0..history.saturating_sub(2) {
        let id = 1_000_000 + i as i64;
        let snap = Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(Some(parent))
            .with_sequence_number(md.last_sequence_number() + 1 + i as i64)
            .with_timestamp_ms(t0 + 1 + i as i64)
            .with_manifest_list(list.clone())
            .with_schema_id(md.current_schema_id())
            .with_summary(Summary {
                operation: iceberg::spec::Operation::Append,
                additional_properties: Default::default(),
            })
            .build();
        builder = builder.add_snapshot(snap)?;
        parent = id;
    }
    builder = builder.set_ref(
        MAIN_BRANCH,
        SnapshotReference::new(parent, SnapshotRetention::branch(None, None, None)),
    )?;
    let staged = floe::snapshot::write_metadata(&table, builder, true).await?;
    floe::catalog::pointer_swap(&cfg)
        .await?
        .swap(&ident, &staged)
        .await?;
    let checkpoint = parent;
    ingest(&ingestor, work, "001.jsonl", 2).await?;
    let table = ingestor.catalog().load_table(&ident).await?;
    let snapshots = table.metadata().snapshots().count();
    let mut times = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let delta = process::plan(&table, Some(checkpoint), RowChangePolicy::Fail, "bench").await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            delta.files.len() == 1 && delta.records() == 100,
            "unexpected delta"
        );
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok((times[times.len() / 2], snapshots))
}

pub async fn run(dir: &Path) -> Result<()> {
    let spinner = crate::progress::spinner("planning on a 1,000-snapshot table");
    let (small, n_small) = plan_time(&dir.join("h1000"), 1_000).await?;
    spinner.set_message("planning on a 10,000-snapshot table");
    let (large, n_large) = plan_time(&dir.join("h10000"), 10_000).await?;
    spinner.finish_and_clear();
    println!("\n## Planning a one-snapshot delta (median of 21)\n");
    println!("| table history | planning time (ms) |");
    println!("|---:|---:|");
    println!("| {n_small} snapshots | {small:.2} |");
    println!("| {n_large} snapshots | {large:.2} |");
    println!(
        "\n{n_large} vs {n_small}: {:.2}× (target ≤ 1.5×)",
        large / small
    );
    Ok(())
}
