//! `floe status`: what each table holds and how fresh it is.

use anyhow::Result;
use chrono::{DateTime, Utc};
use floe::config::Config;
use serde::Serialize;

/// One table's status.
#[derive(Debug, Default, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub snapshots: usize,
    pub current_snapshot: Option<i64>,
    pub records: u64,
    pub data_files: u64,
    /// Share of live data files under a quarter of the target size (compaction candidates).
    pub small_file_share: Option<f64>,
    pub last_commit: Option<String>,
    /// Commit time − latest event time of the newest ingest commit.
    pub freshness_lag_seconds: Option<f64>,
    pub records_quarantined: u64,
    /// Consumers of this table: (consumer table, snapshots behind, seconds behind).
    pub processor_lag: Vec<(String, usize, f64)>,
    /// Deprecated columns: owner, since, remove after, still produced, read by which pipeline.
    pub deprecated: Vec<floe::consumers::DeprecationStatus>,
    /// Data-quality contract version of the newest ingest commit that records one.
    pub contract_version: Option<String>,
    /// Records that failed each data-quality check, summed over the retained snapshots.
    pub quality: Vec<CheckViolations>,
    /// Cost per day (USD, at the `[cost]` prices): the retained history's compute and requests
    /// as a daily rate, plus storage per day (`floe baseline` shows the parts).
    pub cost_per_day_usd: Option<f64>,
}

/// One data-quality check's violations on a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckViolations {
    pub check: String,
    /// `quarantine` or `flag` (objects refused by a `fail` check commit nothing: they show as
    /// the `ContractFailures` metric and in quarantine).
    pub action: String,
    pub violations: u64,
}

/// Per check and action, the violations recorded in `summaries`, summed.
pub fn quality_totals<'a>(
    summaries: impl IntoIterator<Item = &'a iceberg::spec::Summary>,
) -> Vec<CheckViolations> {
    let mut sums: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for s in summaries {
        for (check, action, n) in floe::summary::quality_counts(s) {
            *sums.entry((check, action)).or_default() += n;
        }
    }
    sums.into_iter()
        .map(|((check, action), violations)| CheckViolations {
            check,
            action,
            violations,
        })
        .collect()
}

pub async fn collect(config: &Config) -> Result<Vec<TableStatus>> {
    let catalog = floe::catalog::connect(config).await?;
    let mut loaded = Vec::new();
    for name in config.all_tables() {
        let ident = floe::catalog::table_ident(config, &name)?;
        let target_mb = config
            .table(&name)
            .map(|t| t.target_file_size_mb)
            .unwrap_or(128);
        loaded.push((
            target_mb,
            ident.clone(),
            catalog.load_table(&ident).await.ok(),
        ));
    }
    // Over every retained snapshot, from the metadata already loaded (no second load).
    let cost_window = floe::baseline::Options {
        planning_runs: 0,
        ..Default::default()
    };
    let mut out = Vec::new();
    let planner = floe::consumers::Planner::default();
    let today = Utc::now().date_naive();
    for (target_mb, ident, table) in &loaded {
        let deprecated = floe::consumers::deprecation_status(
            &planner,
            config,
            ident.name(),
            table.as_ref().map(|t| t.metadata()),
            today,
        )
        .await;
        let Some(table) = table else {
            out.push(TableStatus {
                table: ident.to_string(),
                deprecated,
                ..Default::default()
            });
            continue;
        };
        let md = table.metadata();
        let mut snaps: Vec<_> = md.snapshots().collect();
        snaps.sort_by_key(|s| s.timestamp_ms());
        let current = md.current_snapshot();
        let prop =
            |k: &str| current.and_then(|s| s.summary().additional_properties.get(k).cloned());
        let num = |k: &str| prop(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let live = floe::scan::live_files(table).await?;
        let target = (target_mb << 20) as f64;
        let small = live
            .iter()
            .filter(|f| (f.file.file_size_in_bytes() as f64) < target / 4.0)
            .count();
        let freshness = snaps.iter().rev().find_map(|s| {
            let et = s
                .summary()
                .additional_properties
                .get(floe::summary::EVENT_TIME_MAX)?;
            let et = DateTime::parse_from_rfc3339(et).ok()?;
            Some((s.timestamp_ms() - et.timestamp_millis()) as f64 / 1000.0)
        });
        // Consumers: configured tables whose summaries checkpoint this one.
        let uuid = md.uuid().to_string();
        let mut lag = Vec::new();
        for (_, consumer, ct) in &loaded {
            let Some(ct) = ct else { continue };
            let Some(cp) = floe::summary::read_checkpoint(ct.metadata(), &uuid) else {
                continue;
            };
            let mut behind = 0;
            let mut cur = current;
            while let Some(s) = cur {
                if s.snapshot_id() == cp.snapshot_id {
                    break;
                }
                behind += 1;
                cur = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
            }
            let cp_ts = md.snapshot_by_id(cp.snapshot_id).map(|s| s.timestamp_ms());
            let secs = match (current, cp_ts) {
                (Some(c), Some(t0)) => (c.timestamp_ms() - t0) as f64 / 1000.0,
                _ => f64::NAN,
            };
            lag.push((consumer.to_string(), behind, secs));
        }
        out.push(TableStatus {
            table: ident.to_string(),
            snapshots: snaps.len(),
            current_snapshot: current.map(|s| s.snapshot_id()),
            records: num("total-records"),
            data_files: num("total-data-files"),
            small_file_share: (!live.is_empty()).then(|| small as f64 / live.len() as f64),
            last_commit: current
                .and_then(|s| DateTime::<Utc>::from_timestamp_millis(s.timestamp_ms()))
                .map(|t| t.to_rfc3339()),
            freshness_lag_seconds: freshness,
            records_quarantined: snaps
                .iter()
                .filter_map(|s| s.summary().additional_properties.get("records-quarantined"))
                .filter_map(|v| v.parse::<u64>().ok())
                .sum(),
            processor_lag: lag,
            deprecated,
            contract_version: snaps.iter().rev().find_map(|s| {
                s.summary()
                    .additional_properties
                    .get(floe::summary::CONTRACT_VERSION)
                    .cloned()
            }),
            quality: quality_totals(snaps.iter().map(|s| s.summary())),
            cost_per_day_usd: Some(
                floe::baseline::table_cost(config, md, &cost_window).per_day_usd,
            ),
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
        "{:<32} {:>9} {:>9} {:>6} {:>6} {:>11} {:>26} {:>9} {:>10}",
        "table",
        "snapshots",
        "records",
        "files",
        "small",
        "quarantined",
        "last commit",
        "fresh (s)",
        "$/day"
    );
    for r in rows {
        println!(
            "{:<32} {:>9} {:>9} {:>6} {:>6} {:>11} {:>26} {:>9} {:>10}",
            r.table,
            r.snapshots,
            r.records,
            r.data_files,
            r.small_file_share
                .map(|s| format!("{:.0}%", s * 100.0))
                .unwrap_or_else(|| "-".into()),
            r.records_quarantined,
            r.last_commit.clone().unwrap_or_else(|| "-".into()),
            r.freshness_lag_seconds
                .map(|f| format!("{f:.1}"))
                .unwrap_or_else(|| "-".into()),
            r.cost_per_day_usd
                .map(|c| format!("{c:.4}"))
                .unwrap_or_else(|| "-".into())
        );
        for (consumer, behind, secs) in &r.processor_lag {
            println!("    consumer {consumer}: {behind} snapshot(s), {secs:.1} s behind");
        }
        for d in &r.deprecated {
            println!("    deprecated {}", d.describe());
        }
        if let Some(v) = r.contract_version.as_deref().filter(|v| *v != "none") {
            println!("    contract {v}");
        }
        for q in &r.quality {
            println!(
                "    check {} ({}): {} violation(s)",
                q.check, q.action, q.violations
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{Operation, Summary};

    /// A table whose current metadata.json is gone cannot load: its row shows nothing ("-"),
    /// and the other tables' rows are still there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_survives_an_unloadable_table() {
        let dir = std::env::temp_dir().join(format!(
            "floe-status-{}-{}",
            std::process::id(),
            Utc::now().timestamp_nanos_opt().unwrap_or(0)
        ));
        let inputs = dir.join("inputs");
        std::fs::create_dir_all(inputs.join("input")).expect("inputs");
        let text = format!(
            "{}\n{}",
            crate::bench::bench_config(&dir, &inputs),
            floe::sample::PIPELINES_TOML
        );
        let cfg = Config::parse(&text, "status test").expect("config");
        let ingestor = floe::ingest::Ingestor::new(cfg.clone())
            .await
            .expect("ingestor");
        std::fs::write(
            inputs.join("input/a.jsonl"),
            floe::sample::orders_jsonl(20, 1, Utc::now()),
        )
        .expect("object");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        let r = ingestor
            .ingest(&floe::event::ObjectRef::new("input", "a.jsonl"), deadline)
            .await
            .expect("ingest");
        assert_eq!(r.records_committed, 20);
        let before = collect(&cfg).await.expect("status");
        let orders = |rows: &[TableStatus]| {
            rows.iter()
                .find(|r| r.table.ends_with(".orders"))
                .map(|r| (r.snapshots, r.records, r.cost_per_day_usd))
                .expect("orders row")
        };
        assert_eq!(orders(&before).0, 1);
        assert!(orders(&before).2.is_some());

        let catalog = floe::catalog::connect(&cfg).await.expect("catalog");
        let ident = floe::catalog::table_ident(&cfg, "orders").expect("ident");
        let table = catalog.load_table(&ident).await.expect("load");
        let location = table.metadata_location().expect("metadata location");
        let path = location.strip_prefix("file://").unwrap_or(location);
        std::fs::remove_file(path).expect("delete metadata.json");
        // A fresh connection, as `collect` makes: this one keeps the file it read in memory.
        let fresh = floe::catalog::connect(&cfg).await.expect("catalog");
        assert!(fresh.load_table(&ident).await.is_err());

        let after = collect(&cfg)
            .await
            .expect("status with an unloadable table");
        assert_eq!(orders(&after), (0, 0, None));
        assert_eq!(after.len(), before.len(), "every table has its row");
        print(&after);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn violations_sum_per_check_and_action_over_snapshots() {
        let summary = |pairs: &[(&str, &str)]| Summary {
            operation: Operation::Append,
            additional_properties: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let snaps = [
            summary(&[
                ("floe.quality.amount_range.quarantine", "2"),
                ("floe.quality.euro.flag", "1"),
                ("records-in", "10"),
            ]),
            summary(&[("floe.quality.amount_range.quarantine", "3")]),
            summary(&[("floe.operation", "compaction")]),
        ];
        let got = quality_totals(snaps.iter());
        let v = |check: &str, action: &str, violations| CheckViolations {
            check: check.into(),
            action: action.into(),
            violations,
        };
        assert_eq!(
            got,
            vec![v("amount_range", "quarantine", 5), v("euro", "flag", 1)]
        );
    }
}
