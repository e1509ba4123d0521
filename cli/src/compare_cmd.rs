//! `floe compare`: a table beside the output of the system it replaces, run side by side before
//! cutover; exit 1 on any difference beyond the tolerance.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use floe::compare::{compare, Against, CompareReport, CompareSpec};
use floe::config::{Config, Format};

use crate::args::CompareArgs;

/// Runs the comparison and prints it; returns whether both sides agree.
pub async fn run(config: &Config, a: &CompareArgs) -> Result<bool> {
    let spec = spec(config, a)?;
    let against = against(config, a).await?;
    let report = compare(config, &a.table, &against, &spec).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    Ok(report.matches)
}

/// The config's `[[compare]]` defaults with the flags over them.
fn spec(config: &Config, a: &CompareArgs) -> Result<CompareSpec> {
    let mut spec = CompareSpec::from_config(config, &a.table);
    if !a.keys.is_empty() {
        spec.keys = a.keys.clone();
    }
    if a.time.is_some() {
        spec.time = a.time.clone();
    }
    if !a.measures.is_empty() {
        spec.measures = a.measures.clone();
    }
    if let Some(w) = &a.window {
        spec.window = w.clone();
    }
    if let Some(t) = a.tolerance {
        if !(0.0..1.0).contains(&t) {
            bail!("--tolerance {t}: must be at least 0 and below 1 (relative)");
        }
        spec.tolerance = t;
    }
    if !a.rename.is_empty() {
        let mut map = BTreeMap::new();
        for r in &a.rename {
            let (from, to) = r
                .split_once('=')
                .with_context(|| format!("--rename {r}: expected SOURCE_NAME=FLOE_NAME"))?;
            map.insert(from.trim().to_string(), to.trim().to_string());
        }
        spec.rename = map;
    }
    let time = |flag: &str, v: &Option<String>| -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        v.as_deref()
            .map(|t| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|t| t.with_timezone(&chrono::Utc))
                    .with_context(|| format!("{flag} {t}: expected RFC 3339"))
            })
            .transpose()
    };
    spec.since = time("--since", &a.since)?;
    spec.until = time("--until", &a.until)?;
    spec.sample = a.sample;
    spec.max_keys = a.max_keys;
    Ok(spec)
}

/// The other side named by `--against`.
async fn against(config: &Config, a: &CompareArgs) -> Result<Against> {
    let format = match a.format.as_deref() {
        None => None,
        Some("parquet") => Some(Format::Parquet),
        Some("csv") => Some(Format::Csv),
        Some(_) => Some(Format::Jsonl),
    };
    Ok(if let Some(table) = a.against.strip_prefix("iceberg:") {
        let other = match &a.against_config {
            Some(path) => Config::load(path)
                .await
                .with_context(|| format!("loading --against-config {path}"))?,
            None => config.clone(),
        };
        Against::Table {
            config: Box::new(other),
            table: table.to_string(),
        }
    } else if a.against.starts_with("s3://") {
        Against::Objects {
            uri: a.against.clone(),
            format,
        }
    } else {
        Against::Local {
            path: a.against.clone().into(),
            format,
        }
    })
}

fn print(r: &CompareReport) {
    println!(
        "{} vs {} — keys {}, time {}, window {}, tolerance {}",
        r.table,
        r.against,
        r.keys.join(","),
        r.time,
        r.window,
        r.tolerance
    );
    print!(
        "{:<22} {:>10} {:>10} {:>9} {:>9}",
        "window", "rows floe", "rows other", "keys floe", "keys oth"
    );
    for m in &r.measures {
        print!(" {:>16} {:>16}", format!("sum({m}) floe"), "other");
    }
    println!("  status");
    for w in &r.windows {
        print!(
            "{:<22} {:>10} {:>10} {:>9} {:>9}",
            w.window_start.as_deref().unwrap_or("(no time)"),
            w.rows.floe,
            w.rows.against,
            w.distinct_keys.floe,
            w.distinct_keys.against
        );
        for m in &r.measures {
            if let Some(s) = w.sums.get(m) {
                print!(" {:>16.2} {:>16.2}", s.floe, s.against);
            }
        }
        if w.differences.is_empty() {
            println!("  ok");
        } else {
            println!("  DIFFERS: {}", w.differences.join("; "));
        }
    }
    let keys = |label: &str, s: &floe::compare::KeySample| {
        if s.count > 0 {
            println!("{label}: {} (e.g. {})", s.count, s.keys.join(", "));
        }
    };
    keys("keys missing in the other system", &r.missing_in_against);
    keys("keys missing in floe", &r.missing_in_floe);
    keys("keys duplicated in floe", &r.duplicate_keys_floe);
    keys(
        "keys duplicated in the other system",
        &r.duplicate_keys_against,
    );
    if r.differing.count > 0 {
        let cols: Vec<String> = r
            .differing
            .by_column
            .iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect();
        println!(
            "records that differ: {} ({})",
            r.differing.count,
            cols.join(", ")
        );
        for d in &r.differing.rows {
            println!(
                "  {} {}: floe {} vs other {}",
                d.key, d.column, d.floe, d.against
            );
        }
    }
    for (reason, n) in &r.unreadable_against {
        println!("unreadable records in the other system: {n} ({reason})");
    }
    println!(
        "{} records in floe, {} in the other system ({} objects read): {}",
        r.rows.floe,
        r.rows.against,
        r.objects_read,
        if r.matches { "MATCH" } else { "DIFFERENT" }
    );
}
