//! `floe schema-diff`: classify the changes between a table's schema and a proposed one (the
//! config's, or what an input object carries), as teams run it in CI before a rollout.

use anyhow::Result;
use floe::config::Config;

/// Prints the diff, the consumers and the deprecations; returns whether any change is breaking
/// or any consumer breaks.
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
        println!();
        println!("consumers:");
        for c in &report.consumers {
            let note = if c.already_broken {
                " (already broken on the current schema)"
            } else {
                ""
            };
            println!("  {}{note}", c.describe());
        }
        if report.consumers.is_empty() {
            println!("  (no pipeline reads {})", report.table);
        }
        if !report.deprecations.is_empty() {
            println!();
            println!("deprecated:");
            for d in &report.deprecations {
                println!("  {}", d.describe());
            }
        }
    }
    Ok(report.breaking || report.consumers_break)
}
