//! `floe replay`: the ingest dead-letter queue (or a list of objects) through the ingest code
//! path, each object exactly once, a message deleted only once its objects are settled; the
//! report per message and in total, or JSON.

use std::io::Read;
use std::time::Duration;

use anyhow::{Context, Result};
use floe::config::Config;
use floe::ingest::replay::{Action, Outcome, ReplayOptions, ReplayReport, SqsQueue};
use floe::ingest::Ingestor;

use crate::args::ReplayArgs;
use crate::progress;

/// Replays and prints the report; returns false when anything was left, skipped or failed (a
/// dry run only reports).
pub async fn run(config: Config, a: &ReplayArgs) -> Result<bool> {
    let options = ReplayOptions {
        max: a.max,
        dry_run: a.dry_run,
        visibility_timeout: Duration::from_secs(a.visibility_timeout),
        ..Default::default()
    };
    let ingestor = Ingestor::new(config).await?;
    let report = match (&a.dlq, &a.keys) {
        (Some(url), _) => {
            let queue = SqsQueue::connect(ingestor.config(), url).await?;
            let spinner = progress::spinner(format!("replaying {url}"));
            let report = ingestor.replay_queue(&queue, &options).await;
            spinner.finish_and_clear();
            report.with_context(|| format!("reading {url}"))?
        }
        (None, Some(file)) => {
            let text = if file == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading keys from standard input")?;
                text
            } else {
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading keys from {file}"))?
            };
            let spinner = progress::spinner(format!("replaying the objects of {file}"));
            let report = ingestor.replay_objects(&text, &options).await;
            spinner.finish_and_clear();
            report
        }
        (None, None) => anyhow::bail!("give --dlq QUEUE_URL or --keys FILE"),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(a.dry_run || report.settled())
}

fn outcome(o: Outcome) -> &'static str {
    match o {
        Outcome::Replayed => "replayed",
        Outcome::AlreadyCommitted => "already committed",
        Outcome::Quarantined => "quarantined",
        Outcome::Skipped => "skipped",
        Outcome::Failed => "FAILED",
        Outcome::WouldReplay => "would replay",
    }
}

/// The tail of a long name (by characters: keys may hold any UTF-8).
fn tail(s: &str, n: usize) -> String {
    let chars = s.chars().count();
    if chars > n {
        format!("…{}", s.chars().skip(chars + 1 - n).collect::<String>())
    } else {
        s.to_string()
    }
}

/// A reason cut to a readable length (the JSON report keeps it whole).
fn short(reason: &str) -> String {
    match reason.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &reason[..i]),
        None => reason.to_string(),
    }
}

fn print_report(r: &ReplayReport) {
    println!(
        "{:<14} {:<44} {:<18} {:>9} {:>11} {:>20} {:<8}",
        "message/line", "object", "outcome", "committed", "quarantined", "snapshot", "message"
    );
    for item in &r.items {
        let from = match (&item.message_id, item.line) {
            (Some(id), _) => tail(id, 14),
            (None, Some(line)) => format!("line {line}"),
            (None, None) => "-".into(),
        };
        let action = match item.action {
            Action::Deleted => "deleted",
            Action::Left => "left",
            Action::Kept => "-",
        };
        if item.objects.is_empty() {
            println!(
                "{:<14} {:<44} {:<18} {:>9} {:>11} {:>20} {:<8}",
                from, "-", "-", "-", "-", "-", action
            );
        }
        for o in &item.objects {
            println!(
                "{:<14} {:<44} {:<18} {:>9} {:>11} {:>20} {:<8}",
                from,
                tail(&o.object, 44),
                outcome(o.outcome),
                o.records_committed,
                o.records_quarantined,
                o.snapshot_id
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "-".into()),
                action
            );
            if let Some(reason) = &o.reason {
                println!("    {}", short(reason));
            }
            if let Some(q) = &o.quarantine {
                println!("    quarantine: {q}");
            }
        }
        if let (Action::Left, Some(reason)) = (item.action, &item.reason) {
            println!("    stays: {}", short(reason));
        } else if let Some(reason) = &item.reason {
            println!("    {}", short(reason));
        }
    }
    let what = if r.items.iter().any(|i| i.message_id.is_some()) {
        "messages"
    } else {
        "lines"
    };
    if r.dry_run {
        println!(
            "dry run: {} {what}, {} objects: {} would be replayed, {} already committed, {} skipped, {} failed; {} not understood. Nothing ingested or deleted; the messages are visible again.",
            r.messages, r.objects, r.would_replay, r.already_committed, r.skipped, r.failed, r.unparsed
        );
    } else {
        println!(
            "{} {what}: {} deleted, {} left ({} not understood)",
            r.messages, r.deleted, r.left, r.unparsed
        );
        println!(
            "{} objects: {} replayed, {} already committed, {} quarantined, {} skipped, {} failed; {} records committed, {} quarantined, in {} commits; {:.1} s",
            r.objects,
            r.replayed,
            r.already_committed,
            r.quarantined,
            r.skipped,
            r.failed,
            r.records_committed,
            r.records_quarantined,
            r.commits,
            r.seconds
        );
    }
    for e in &r.errors {
        println!("error: {e}");
    }
}
