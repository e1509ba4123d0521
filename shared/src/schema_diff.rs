//! `floe schema-diff`: a proposed schema change classified against the table's current schema
//! before it reaches production, the proposal being the config's columns or what a sample input
//! object carries (new fields, widenings, records whose values do not fit); every pipeline
//! reading the table is planned against the proposal ([`crate::consumers`]), and deprecated
//! columns are listed with owner, dates and who still produces or reads them.

use std::collections::{BTreeMap, BTreeSet};

use iceberg::spec::{PrimitiveType, Schema, TableMetadata};
use serde::Serialize;

use crate::config::{Config, Deprecations, TableConfig};
use crate::consumers::{ConsumerReport, DeprecationStatus, Planner};
use crate::decode::{DecodeSpec, Piece};
use crate::error::{Error, ErrorKind, Result};
use crate::evolve::{diff, evolve_ingest_schema, worst, Class, FieldChange};

/// The result of a schema diff.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// The table.
    pub table: String,
    /// Every classified change.
    pub changes: Vec<FieldChange>,
    /// Deprecated fields still declared or produced.
    pub warnings: Vec<String>,
    /// Whether any change is breaking.
    pub breaking: bool,
    /// Every pipeline reading the table, planned against the proposed schema.
    pub consumers: Vec<ConsumerReport>,
    /// Whether the proposal breaks a consumer the current schema does not (exit 2 like a
    /// breaking change); consumers broken either way are listed as `already_broken`.
    pub consumers_break: bool,
    /// Deprecated columns: owner, dates, still produced (by the object, with `--object`; else
    /// by the newest ingest commit), read by which pipelines.
    pub deprecations: Vec<DeprecationStatus>,
}

/// Compares a table's current schema with the config's (`object` None) or with what an input
/// object carries (new fields, widenings, and records whose values do not fit).
pub async fn schema_diff(config: &Config, table: &str, object: Option<&str>) -> Result<DiffReport> {
    let tcfg = config
        .table(table)
        .ok_or_else(|| config_error(format!("no configured table `{table}`")))?;
    let catalog = crate::catalog::connect(config).await?;
    let ident = crate::catalog::table_ident(config, table)?;
    let current_table = catalog
        .load_table(&ident)
        .await
        .map_err(|e| Error::iceberg(format!("loading {ident}"), e))?;
    let md = current_table.metadata();
    let current = md.current_schema().clone();
    let deprecated = tcfg.deprecations();
    let (changes, warnings, proposed, seen) = match object {
        None => {
            let (c, w, p) = against_config(tcfg, &current, &deprecated)?;
            (c, w, p, None)
        }
        Some(uri) => {
            let (c, w, p, seen) = against_object(config, uri, md, &deprecated).await?;
            (c, w, p, Some(seen))
        }
    };
    let breaking = worst(&changes) == Some(Class::Breaking);
    let planner = Planner::default();
    let consumers = crate::consumers::check_table(
        &planner,
        config,
        catalog.as_ref(),
        table,
        Some(&current),
        &proposed,
    )
    .await?;
    let mut deprecations =
        crate::consumers::deprecation_status(&planner, config, table, Some(md), today()).await;
    if let Some(seen) = seen {
        for d in &mut deprecations {
            d.produced = Some(seen.contains(&d.deprecation.column));
        }
    }
    Ok(DiffReport {
        table: ident.to_string(),
        changes,
        warnings,
        breaking,
        // A consumer broken on the current schema too is reported, not blamed on the proposal.
        consumers_break: consumers
            .iter()
            .any(|c| c.verdict.breaks() && !c.already_broken),
        consumers,
        deprecations,
    })
}

fn config_error(m: String) -> Error {
    Error::new(ErrorKind::Config, m)
}

fn today() -> chrono::NaiveDate {
    chrono::Utc::now().date_naive()
}

/// The config's columns as the proposed schema.
fn against_config(
    tcfg: &TableConfig,
    current: &Schema,
    deprecated: &Deprecations,
) -> Result<(Vec<FieldChange>, Vec<String>, Schema)> {
    let proposed = crate::schema::table_schema(tcfg)?;
    let warnings = deprecated
        .iter()
        .filter(|(f, _)| proposed.field_by_name(f).is_some())
        .map(|(f, d)| format!("`{f}` is deprecated; removal on {d}"))
        .collect();
    let changes = diff(current, &proposed, deprecated, today());
    Ok((changes, warnings, proposed))
}

/// What decoding a sample object against the current schema found.
#[derive(Default)]
struct Scanned {
    unknown: BTreeMap<String, Option<PrimitiveType>>,
    widen: BTreeMap<String, PrimitiveType>,
    /// Rejection reason → records.
    reasons: BTreeMap<String, u64>,
    deprecated_seen: BTreeSet<String>,
}

/// The schema a sample object implies: the current one evolved by its new fields and widenings;
/// fields with no scalar type and rejected records are breaking.
#[allow(clippy::type_complexity)]
async fn against_object(
    config: &Config,
    uri: &str,
    md: &TableMetadata,
    deprecated: &Deprecations,
) -> Result<(Vec<FieldChange>, Vec<String>, Schema, BTreeSet<String>)> {
    let current = md.current_schema().as_ref();
    let scanned = scan_object(config, uri, current, deprecated).await?;
    let warnings = scanned
        .deprecated_seen
        .iter()
        .filter_map(|f| {
            deprecated.get(f).map(|d| {
                format!("`{f}` is deprecated (removal on {d}) but {uri} still produces it")
            })
        })
        .collect();
    // As ingest would evolve it: new ids above last-column-id, dropped columns not re-added, no
    // column of a field ingest refuses (a name no column takes, beyond the column limits).
    let refused = crate::evolve::refuse_new_columns(
        md,
        &scanned.unknown,
        config.ingest.max_new_columns,
        config.ingest.max_columns,
    );
    let admitted: std::collections::BTreeMap<_, _> = scanned
        .unknown
        .iter()
        .filter(|(name, _)| !refused.contains_key(*name))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let proposed = evolve_ingest_schema(md, &admitted, &scanned.widen)
        .map_err(|e| Error::iceberg("evolving", e))?
        .map(|(s, _)| s)
        .unwrap_or_else(|| current.clone());
    let mut changes = diff(current, &proposed, deprecated, today());
    for name in scanned
        .unknown
        .iter()
        .filter(|(_, t)| t.is_none())
        .map(|(n, _)| n)
    {
        changes.push(FieldChange {
            field: name.clone(),
            change: "new field with no scalar type (null or nested): not added".into(),
            class: Class::Breaking,
        });
    }
    for (name, reason) in refused {
        changes.push(FieldChange {
            field: name,
            change: format!("not added, its records quarantined: {reason}"),
            class: Class::Breaking,
        });
    }
    for (reason, n) in scanned.reasons {
        changes.push(FieldChange {
            field: "(records)".into(),
            change: format!("{n} record(s): {reason}"),
            class: Class::Breaking,
        });
    }
    Ok((changes, warnings, proposed, scanned.deprecated_seen))
}

/// Decodes the object at `uri` (routed as ingest would) against `current`, within the
/// configured input limits.
async fn scan_object(
    config: &Config,
    uri: &str,
    current: &Schema,
    deprecated: &Deprecations,
) -> Result<Scanned> {
    let bad = || config_error(format!("`{uri}`: expected s3://bucket/key"));
    let rest = uri.strip_prefix("s3://").ok_or_else(bad)?;
    let (bucket, key) = rest.split_once('/').ok_or_else(bad)?;
    let route = config
        .route(bucket, key)
        .ok_or_else(|| config_error(format!("no route covers {uri}")))?;
    let store = crate::store::from_config(&config.storage).await;
    let opened = store
        .open(bucket, key, &crate::store::Version::latest())
        .await?;
    let arrow = iceberg::arrow::schema_to_arrow_schema(current)
        .map_err(|e| Error::iceberg("arrow schema", e))?;
    let spec = DecodeSpec {
        format: route.format,
        key: key.to_string(),
        schema: crate::schema::decode_schema(&arrow),
        required: current
            .as_struct()
            .fields()
            .iter()
            .filter(|f| f.required && !f.name.starts_with('_'))
            .map(|f| f.name.clone())
            .chain(route.cdc_columns())
            .collect(),
        chunk_records: config.ingest.chunk_records,
        allow_unknown: true,
        ignored: Default::default(),
        refused: Default::default(),
        debezium: route.cdc == Some(crate::config::Cdc::Debezium),
    };
    let body = opened.body;
    let limits = crate::decode::Limits::from(&config.ingest);
    let size = Some(opened.meta.size);
    let deprecated_names: Vec<String> = deprecated.keys().cloned().collect();
    let (result, scanned) = tokio::task::spawn_blocking(move || {
        let reader = tokio_util::io::SyncIoBridge::new(body);
        let mut s = Scanned::default();
        let result = crate::decode::decode_within(reader, &spec, &limits, size, &mut |p| {
            match p {
                Piece::UnknownFields(u) => s.unknown.extend(u),
                Piece::Widen(w) => s.widen.extend(w),
                Piece::Rejected(r) => {
                    for rec in r {
                        *s.reasons.entry(rec.reason).or_default() += 1;
                    }
                }
                Piece::Batch(b) => {
                    for d in &deprecated_names {
                        if b.column_by_name(d)
                            .map(|c| c.null_count() < c.len())
                            .unwrap_or(false)
                        {
                            s.deprecated_seen.insert(d.clone());
                        }
                    }
                }
            }
            true
        });
        (result, s)
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Internal, format!("scanning {uri}: {e}")))?;
    result.map_err(|e| Error::new(ErrorKind::UnreadableObject, format!("{uri}: {e}")))?;
    Ok(scanned)
}
