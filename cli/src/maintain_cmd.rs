//! `floe maintain`: the maintain Lambda's operations by hand, and the report table.

use std::time::{Duration, Instant};

use anyhow::Result;
use floe::config::Config;
use floe::maintain::{Maintainer, Options, Report};

use crate::args::MaintainArgs;
use crate::progress;

/// Maintains `--table` or every configured table and prints the reports (or JSON).
pub async fn run(config: Config, args: &MaintainArgs) -> Result<()> {
    let defaults = Options::from_config(&config, Instant::now() + Duration::from_secs(3600));
    let mut opts = Options {
        dry_run: args.dry_run,
        expire_older_than: args.older_than.or(defaults.expire_older_than),
        retain_last: args.retain_last.or(defaults.retain_last),
        ..defaults
    };
    if let Some(o) = args.orphan_older_than {
        opts.orphan_older_than = o;
    }
    if let Some(only) = args.only {
        opts.compact = only.compact;
        opts.expire = only.expire;
        opts.orphans = only.orphans;
        opts.rewrite_manifests = only.manifests;
    }
    let tables: Vec<String> = match &args.table {
        Some(t) => vec![t.clone()],
        None => config.all_tables(),
    };
    let m = Maintainer::new(config).await?;
    let bar = progress::bar(tables.len() as u64, "maintaining tables");
    let mut reports = Vec::new();
    for t in tables {
        bar.set_message(format!("maintaining {t}"));
        reports.push(m.run(&t, &opts).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        print_maintenance(&reports);
    }
    Ok(())
}

/// Prints maintenance reports as a table.
pub fn print_maintenance(reports: &[Report]) {
    println!(
        "{:<20} {:>12} {:>16} {:>7} {:>8} {:>10} {:>9} {:>9}",
        "table", "files", "MiB", "groups", "expired", "exp. files", "orphans", "manifests"
    );
    for r in reports {
        println!(
            "{:<20} {:>12} {:>16} {:>7} {:>8} {:>10} {:>9} {:>9}",
            r.table,
            format!("{} → {}", r.files_before, r.files_after),
            format!(
                "{:.1} → {:.1}",
                r.bytes_before as f64 / 1048576.0,
                r.bytes_after as f64 / 1048576.0
            ),
            r.groups_compacted,
            r.snapshots_expired,
            r.expired_files_deleted,
            if r.dry_run {
                format!("{} (dry)", r.orphans_found.len())
            } else {
                r.orphans_deleted.to_string()
            },
            format!("{} → {}", r.manifests_before, r.manifests_after),
        );
        for o in &r.orphans_found {
            println!(
                "    orphan{}: {o}",
                if r.dry_run {
                    " (would delete)"
                } else {
                    " deleted"
                }
            );
        }
    }
}
