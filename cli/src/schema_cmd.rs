//! `floe schema drop-column`: remove a deprecated column once its date has come and no pipeline
//! reads it (or with --force), through the library's one commit path.

use anyhow::Result;
use floe::commit::Committer;
use floe::config::Config;
use floe::drop_column::{drop_column as run_drop, DropRequest};

use crate::args::DropColumnArgs;

/// Runs the drop (or the dry run) and prints its report; false when it was refused (exit 2).
pub async fn drop_column(config: &Config, a: &DropColumnArgs) -> Result<bool> {
    let catalog = floe::catalog::connect(config).await?;
    let swap = floe::catalog::pointer_swap(config).await?;
    let committer = Committer::new(catalog, swap);
    let req = DropRequest {
        table: a.table.clone(),
        column: a.column.clone(),
        dry_run: a.dry_run,
        force: a.force,
        today: chrono::Utc::now().date_naive(),
    };
    let report = run_drop(config, &committer, &req).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(report.refused.is_none());
    }
    if let Some(d) = &report.deprecation {
        println!(
            "`{}` of {}: owner {}, deprecated since {}, remove after {}",
            d.column,
            report.table,
            d.owner.as_deref().unwrap_or("-"),
            d.since.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            d.remove_after
        );
    }
    for r in &report.readers {
        println!("still read: {}", r.describe());
    }
    match (&report.refused, report.already_dropped, report.snapshot_id) {
        (Some(why), _, _) => println!("refused: {why}"),
        (None, true, _) => println!("`{}` is already dropped; nothing to do", report.column),
        (None, false, Some(id)) => println!("dropped `{}` in snapshot {id}", report.column),
        (None, false, None) => println!("dry run: `{}` may be dropped", report.column),
    }
    Ok(report.refused.is_none())
}
