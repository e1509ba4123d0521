//! `floe process run|refresh|reconcile`: the process function's work by hand, and the batch side.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use floe::process::{Processor, Reconciliation, RunReport};

use crate::args::ProcessAction;
use crate::progress;

/// Runs `floe process run|refresh|reconcile [--pipeline P] [--json]`; returns false when
/// reconcile found a difference.
pub async fn run(action: &ProcessAction) -> Result<bool> {
    let (verb, opts) = action.parts();
    let config = crate::load_config(&opts.config).await?;
    let names: Vec<String> = match &opts.pipeline {
        Some(p) => vec![p.clone()],
        None => config.pipelines.iter().map(|p| p.name.clone()).collect(),
    };
    if names.is_empty() {
        bail!("no pipelines configured (add [[pipelines]] to the config)");
    }
    let processor = Processor::new(config).await?;
    let deadline = Instant::now() + Duration::from_secs(900);
    let bar = progress::bar(names.len() as u64, format!("process {verb}"));
    match action {
        ProcessAction::Refresh(r) => {
            bar.finish_and_clear();
            let mut reports = Vec::new();
            for name in &names {
                reports.push(refresh_to_the_end(&processor, name, r.restart).await?);
            }
            if opts.json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                print_runs(&reports);
            }
            Ok(true)
        }
        ProcessAction::Run(_) => {
            let mut reports = Vec::new();
            for name in &names {
                bar.set_message(format!("{verb} {name}"));
                let r = processor.run(name, deadline).await?;
                reports.push(r);
                bar.inc(1);
            }
            bar.finish_and_clear();
            if opts.json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                print_runs(&reports);
            }
            Ok(true)
        }
        ProcessAction::Reconcile(_) => {
            let mut all = Vec::new();
            for name in &names {
                bar.set_message(format!("{verb} {name}"));
                all.push(processor.reconcile(name).await?);
                bar.inc(1);
            }
            bar.finish_and_clear();
            if opts.json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                print_reconciliations(&all);
            }
            Ok(all.iter().all(Reconciliation::matches))
        }
    }
}

/// A refresh chunk by chunk until it is finished (a refresh the process Lambda left in
/// progress is continued; `restart`: a new one is started instead), a bar of chunks on
/// stderr; one report for the whole refresh.
async fn refresh_to_the_end(processor: &Processor, name: &str, restart: bool) -> Result<RunReport> {
    let bar = progress::bar(1, format!("refresh {name}"));
    let mut total: Option<RunReport> = None;
    loop {
        // Each chunk has the whole commit window of a Lambda invocation. After the first call
        // only continue: a refresh another caller finished meanwhile is done, not restarted.
        let deadline = Instant::now() + Duration::from_secs(900);
        let r = match total {
            None if restart => processor.restart_refresh_chunk(name, deadline).await?,
            None => processor.refresh_chunk(name, deadline).await?,
            Some(_) => processor.continue_refresh_chunk(name, deadline).await?,
        };
        let done = r.refresh_progress.as_ref().is_none_or(|g| g.done);
        if let Some(g) = &r.refresh_progress {
            bar.set_length(g.chunks_done + g.remaining);
            bar.set_position(g.chunks_done);
            if let Some(why) = &g.restarted {
                progress::note(format!("{name}: {why}"));
            }
        }
        total = Some(match total {
            None => r,
            Some(t) => merged(t, r),
        });
        if done {
            break;
        }
    }
    bar.finish_and_clear();
    total.ok_or_else(|| anyhow::anyhow!("refresh of {name}: no chunk ran"))
}

/// Two calls of one refresh as one report: counts summed, the later call's position.
fn merged(a: RunReport, b: RunReport) -> RunReport {
    let progress = match (a.refresh_progress, b.refresh_progress) {
        (Some(a), Some(b)) => Some(floe::process::RefreshProgress {
            chunks: a.chunks + b.chunks,
            max_chunk_rows: a.max_chunk_rows.max(b.max_chunk_rows),
            restarted: b.restarted.or(a.restarted),
            ..b
        }),
        (a, b) => b.or(a),
    };
    RunReport {
        from_snapshot: a.from_snapshot,
        rows_out: a.rows_out + b.rows_out,
        rows_recomputed: a.rows_recomputed + b.rows_recomputed,
        files: a.files + b.files,
        files_replaced: a.files_replaced + b.files_replaced,
        recompute_bytes_read: a.recompute_bytes_read + b.recompute_bytes_read,
        replans: a.replans + b.replans,
        seconds: a.seconds + b.seconds,
        refresh_progress: progress,
        ..b
    }
}

/// Prints pipeline runs as a table.
pub fn print_runs(reports: &[RunReport]) {
    println!(
        "{:<26} {:>21} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7}",
        "pipeline", "source snapshot", "commits", "rows in", "rows out", "win/bkt", "alerts", "ms"
    );
    for r in reports {
        println!(
            "{:<26} {:>21} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7.0}",
            r.pipeline,
            r.to_snapshot
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            if let Some(g) = &r.refresh_progress {
                format!("refresh {}/{}", g.chunks_done, g.chunks_done + g.remaining)
            } else if r.refresh {
                "refresh".to_string()
            } else {
                r.source_snapshots.to_string()
            },
            r.rows_in,
            r.rows_out,
            r.windows + r.buckets,
            r.alerts,
            r.seconds * 1e3
        );
    }
}

/// Prints reconcile results as a table, then the differences.
pub fn print_reconciliations(all: &[Reconciliation]) {
    println!(
        "{:<26} {:>21} {:>10} {:>10} {:>7} {:>9}  result",
        "pipeline", "at source snapshot", "batch rows", "sink rows", "keys", "differing"
    );
    for r in all {
        println!(
            "{:<26} {:>21} {:>10} {:>10} {:>7} {:>9}  {}",
            r.pipeline,
            r.at_snapshot
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            r.batch_rows,
            r.sink_rows,
            r.keys,
            r.differing,
            if r.matches() { "MATCH" } else { "DIFFERENT" }
        );
        for (col, b, s) in &r.totals {
            println!("    total {col}: batch {b:.2} · sink {s:.2}");
        }
        for d in &r.differences {
            println!("    {d}");
        }
    }
}
