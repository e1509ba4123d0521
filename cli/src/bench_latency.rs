//! `floe bench --latency`: source commit → derived commit latency of both sample pipelines over
//! ≥100 ingest commits (p50/p99), beside the batch alternative (the same SQL over the whole table).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use chrono::Utc;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::Ingestor;
use floe::process::Processor;
use floe::sample;

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub async fn run(dir: &Path, commits: usize, rows: usize) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    let inputs = dir.join("inputs");
    std::fs::create_dir_all(inputs.join("input"))?;
    let text = format!(
        "{}{}",
        crate::bench::bench_config(dir, &inputs),
        sample::PIPELINES_TOML
    );
    let config = Config::parse(&text, "bench")?;
    let ingestor = Ingestor::new(config.clone()).await?;
    let processor = Processor::new(config.clone()).await?;
    let names: Vec<String> = config.pipelines.iter().map(|p| p.name.clone()).collect();
    let mut latency: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut run_ms: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let deadline = || Instant::now() + Duration::from_secs(600);
    let bar = crate::progress::bar(commits as u64, "commits + pipeline runs");
    for i in 0..commits {
        let key = format!("{i:05}.jsonl");
        // Every tenth object carries late events (10–70 minutes old).
        let body = if i % 10 == 9 {
            sample::late_orders_jsonl(rows, i as u64, Utc::now(), 600 * (1 + (i as i64 % 7)))
        } else {
            sample::orders_jsonl(rows, i as u64, Utc::now())
        };
        std::fs::write(inputs.join("input").join(&key), body)?;
        ingestor
            .ingest(&ObjectRef::new("input", key), deadline())
            .await?;
        for (j, name) in names.iter().enumerate() {
            let t = Instant::now();
            let r = processor.run(name, deadline()).await?;
            run_ms[j].push(t.elapsed().as_secs_f64() * 1e3);
            if let Some(ms) = r.latency_ms {
                latency[j].push(ms as f64);
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let spinner = crate::progress::spinner("batch refresh + reconcile");
    let mut rows_out = Vec::new();
    for (j, name) in names.iter().enumerate() {
        let t = Instant::now();
        processor.refresh(name, deadline()).await?;
        let batch_ms = t.elapsed().as_secs_f64() * 1e3;
        let rec = processor.reconcile(name).await?;
        let n = latency[j].len();
        let p50 = pct(&mut latency[j], 0.5);
        let p99 = pct(&mut latency[j], 0.99);
        let r50 = pct(&mut run_ms[j], 0.5);
        rows_out.push(format!(
            "| {name} | {n} | {p50:.0} | {p99:.0} | {r50:.0} | {batch_ms:.0} | {:.1}× | {} |",
            batch_ms / r50.max(0.001),
            if rec.matches() { "match" } else { "DIFFERENT" }
        ));
    }
    spinner.finish_and_clear();
    println!("\n## Source commit → derived commit ({commits} commits of {rows} rows, pipelines run in turn after each commit)\n");
    println!("| pipeline | commits | p50 latency (ms) | p99 latency (ms) | p50 run (ms) | batch refresh over the table (ms) | batch / incremental p50 | reconcile |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for row in &rows_out {
        println!("{row}");
    }
    println!(
        "\nReference: Flink's Iceberg source polls every 60 s by default (monitor-interval), so its \
         commit → output latency is up to 60,000 ms plus processing. Peak RSS: {:.0} MiB.",
        crate::bench::peak_rss_mb()
    );
    Ok(())
}
