//! `floe schema-diff`: classify the changes between a table's schema and a proposed one (the
//! config's, or what an input object carries), as teams run it in CI before a rollout.

use anyhow::Result;
use floe::config::Config;

/// Prints the diff; returns whether any change is breaking.
pub async fn run(config: &Config, table: &str, object: Option<String>, json: bool) -> Result<bool> {
    let report = floe::schema_diff::schema_diff(config, table, object.as_deref()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{:<24} {:<11} change", "field", "class");
        for c in &report.changes {
            println!(
                "{:<24} {:<11} {}",
                c.field,
                format!("{:?}", c.class).to_lowercase(),
                c.change
            );
        }
        if report.changes.is_empty() {
            println!("(no changes)");
        }
        for w in &report.warnings {
            println!("warning: {w}");
        }
    }
    Ok(report.breaking)
}
