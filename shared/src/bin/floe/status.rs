//! `floe status`: what each table holds and how fresh it is.

use anyhow::Result;
use chrono::{DateTime, Utc};
use floe::config::Config;
use serde::Serialize;

/// One table's status.
#[derive(Debug, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub snapshots: usize,
    pub current_snapshot: Option<i64>,
    pub records: u64,
    pub data_files: u64,
    pub last_commit: Option<String>,
    pub freshness_lag_seconds: Option<f64>,
    pub records_quarantined: u64,
}

pub async fn collect(config: &Config) -> Result<Vec<TableStatus>> {
    let catalog = floe::catalog::connect(config).await?;
    let mut out = Vec::new();
    for t in &config.tables {
        let ident = floe::catalog::table_ident(config, &t.name)?;
        let table = match catalog.load_table(&ident).await {
            Ok(t) => t,
            Err(_) => {
                out.push(TableStatus {
                    table: ident.to_string(),
                    snapshots: 0,
                    current_snapshot: None,
                    records: 0,
                    data_files: 0,
                    last_commit: None,
                    freshness_lag_seconds: None,
                    records_quarantined: 0,
                });
                continue;
            }
        };
        let md = table.metadata();
        let snaps: Vec<_> = md.snapshots().collect();
        let current = md.current_snapshot();
        let prop =
            |k: &str| current.and_then(|s| s.summary().additional_properties.get(k).cloned());
        let records = prop("total-records")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let files: u64 = prop("total-data-files")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let quarantined = snaps
            .iter()
            .filter_map(|s| s.summary().additional_properties.get("records-quarantined"))
            .filter_map(|v| v.parse::<u64>().ok())
            .sum();
        let last_commit =
            current.and_then(|s| DateTime::<Utc>::from_timestamp_millis(s.timestamp_ms()));
        let freshness = snaps.iter().rev().find_map(|s| {
            let et = s
                .summary()
                .additional_properties
                .get("floe.event-time-max")?;
            let et = DateTime::parse_from_rfc3339(et).ok()?;
            Some((s.timestamp_ms() - et.timestamp_millis()) as f64 / 1000.0)
        });
        out.push(TableStatus {
            table: ident.to_string(),
            snapshots: snaps.len(),
            current_snapshot: current.map(|s| s.snapshot_id()),
            records,
            data_files: files,
            last_commit: last_commit.map(|t| t.to_rfc3339()),
            freshness_lag_seconds: freshness,
            records_quarantined: quarantined,
        });
    }
    Ok(out)
}

pub async fn run(config: &Config, json: bool) -> Result<()> {
    let rows = collect(config).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    print(&rows);
    Ok(())
}

pub fn print(rows: &[TableStatus]) {
    println!(
        "{:<20} {:>9} {:>10} {:>10} {:>11} {:>26} {:>13}",
        "table",
        "snapshots",
        "records",
        "data files",
        "quarantined",
        "last commit",
        "freshness (s)"
    );
    for r in rows {
        println!(
            "{:<20} {:>9} {:>10} {:>10} {:>11} {:>26} {:>13}",
            r.table,
            r.snapshots,
            r.records,
            r.data_files,
            r.records_quarantined,
            r.last_commit.clone().unwrap_or_else(|| "-".into()),
            r.freshness_lag_seconds
                .map(|f| format!("{f:.1}"))
                .unwrap_or_else(|| "-".into())
        );
    }
}
