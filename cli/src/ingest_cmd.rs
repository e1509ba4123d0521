//! `floe ingest`: objects by hand through the Lambda's code path, and the report table.

use std::time::{Duration, Instant};

use anyhow::Result;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::{Ingestor, ObjectReport};

use crate::args::S3Url;
use crate::progress;

/// Ingests `objects` in order and prints the reports; stops at the first error.
pub async fn run(config: Config, objects: &[S3Url]) -> Result<()> {
    let ingestor = Ingestor::new(config).await?;
    let bar = progress::bar(objects.len() as u64, "ingesting objects");
    let mut reports = Vec::new();
    for o in objects {
        let obj = ObjectRef::new(o.bucket.as_str(), o.key.as_str());
        reports.push(
            ingestor
                .ingest(&obj, Instant::now() + Duration::from_secs(600))
                .await?,
        );
        bar.inc(1);
    }
    bar.finish_and_clear();
    print_reports(&reports);
    Ok(())
}

/// Prints ingest reports as a table.
pub fn print_reports(reports: &[ObjectReport]) {
    println!(
        "{:<44} {:<15} {:>8} {:>9} {:>11} {:>6} {:>20}",
        "object", "status", "in", "committed", "quarantined", "late", "snapshot"
    );
    for r in reports {
        // The tail of long names (by characters: keys may hold any UTF-8).
        let chars = r.object.chars().count();
        let name = if chars > 44 {
            format!("…{}", r.object.chars().skip(chars - 43).collect::<String>())
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
