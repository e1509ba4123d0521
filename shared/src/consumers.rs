//! Schema changes validated against their consumers: every pipeline whose source is a table,
//! or that joins it (`joins`), is planned against a proposed schema of that table, exactly as the
//! process function plans it (the relation `source` with the source's columns, plus
//! `window_start` in aggregate mode, each joined table under its name, the same session and
//! output normalisation, see [`crate::process::transform`]) — the table under change with the
//! proposed schema, the other relations as they are — over *empty* in-memory relations, and its
//! planned output is compared with its sink's current schema the way
//! the process function conforms output to a sink (by name; widening and narrowing cast, any
//! other type change or a required sink column that disappears breaks).
//!
//! Used by `floe schema-diff` (a proposal from a config or a sample object), by ingest before it
//! commits an additive change (new columns, widenings; see `on_consumer_break`), and by
//! `floe schema drop-column` (which pipelines still read a column). Plans are cached per
//! (pipeline SQL, source relation): a warm ingest pays DataFusion planning once per distinct
//! evolved schema, not per object.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::spec::{Schema, Type};
use iceberg::Catalog;
use serde::Serialize;

use crate::config::{Config, Deprecation, PipelineConfig, PipelineMode};
use crate::error::{Error, Result};
use crate::process::transform::{self, PlanFailure};

/// Whether a pipeline still plans (and fits its sink) on a proposed schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Verdict {
    /// The pipeline plans and its output fits its sink.
    Ok,
    /// It would break.
    Breaks {
        /// The column concerned (a source column its SQL reads, or an output/sink column).
        column: Option<String>,
        /// Where the SQL mentions it, `line:column` (1-based), when it does.
        position: Option<String>,
        /// Why.
        reason: String,
    },
}

impl Verdict {
    /// Whether the pipeline would break.
    pub fn breaks(&self) -> bool {
        matches!(self, Verdict::Breaks { .. })
    }
}

/// One consumer of a table against a proposed schema.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerReport {
    /// The pipeline.
    pub pipeline: String,
    /// Its sink table.
    pub sink: String,
    /// Ok or breaks.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// It breaks on the table's current schema too: not this change's doing.
    pub already_broken: bool,
}

impl ConsumerReport {
    /// A one-line description, e.g. `pipeline `p` breaks at 1:8 on column `x`: …`.
    pub fn describe(&self) -> String {
        match &self.verdict {
            Verdict::Ok => format!("pipeline `{}` ok", self.pipeline),
            Verdict::Breaks {
                column,
                position,
                reason,
            } => {
                let mut s = format!("pipeline `{}` breaks", self.pipeline);
                if let Some(c) = column {
                    s.push_str(&format!(" on column `{c}`"));
                }
                if let Some(p) = position {
                    s.push_str(&format!(" (SQL {p})"));
                }
                s.push_str(&format!(": {reason}"));
                s
            }
        }
    }
}

/// Plans of pipelines over source relations, cached by (pipeline, SQL, relation) fingerprint.
#[derive(Debug, Default)]
pub struct Planner {
    cache: Mutex<HashMap<u64, std::result::Result<SchemaRef, PlanFailure>>>,
    /// Current schemas of the relations pipelines read besides the table under change (their
    /// joined tables, and the sources of those joining it), as last loaded from the catalog; a
    /// configured table not loaded is planned with its config schema.
    loaded: Mutex<HashMap<String, Schema>>,
}

impl Planner {
    /// Plans cached since this planner was made.
    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Loads the current schema of every relation `pipelines` (the consumers of `table`) read
    /// besides `table` itself — the tables they join, and the sources of those joining `table` —
    /// so that they are planned with the relations the process function registers (best effort:
    /// a table that does not exist or cannot be read keeps its config schema, if it is a
    /// configured table).
    pub(crate) async fn load_relations(
        &self,
        config: &Config,
        catalog: &dyn Catalog,
        table: &str,
        pipelines: &[&PipelineConfig],
    ) {
        let names: std::collections::BTreeSet<&String> = pipelines
            .iter()
            .flat_map(|p| p.joins.iter().chain(std::iter::once(&p.source)))
            .filter(|name| name.as_str() != table)
            .collect();
        for name in names {
            let Ok(ident) = crate::catalog::table_ident(config, name) else {
                continue;
            };
            match catalog.load_table(&ident).await {
                Ok(t) => {
                    if let Ok(mut j) = self.loaded.lock() {
                        j.insert(name.clone(), t.metadata().current_schema().as_ref().clone());
                    }
                }
                Err(e) => {
                    tracing::debug!(table = %name, error = %e, "relation not loaded; planning with its config schema")
                }
            }
        }
    }

    /// The schema known for relation `name`: loaded, else the config's.
    fn known(&self, config: &Config, name: &str) -> Option<Schema> {
        let loaded = self.loaded.lock().ok()?.get(name).cloned();
        match loaded {
            Some(s) => Some(s),
            None => crate::schema::table_schema(config.table(name)?).ok(),
        }
    }

    /// The relations `p` joins, empty, with the schemas known for them: `schema` for `table`,
    /// the others' loaded, else the config's; a table with neither is left out (the plan then
    /// names it as missing).
    fn joined_relations(
        &self,
        config: &Config,
        p: &PipelineConfig,
        table: &str,
        schema: &Schema,
    ) -> Vec<transform::Relation> {
        p.joins
            .iter()
            .filter_map(|name| {
                let schema = if name == table {
                    schema.clone()
                } else {
                    self.known(config, name)?
                };
                let arrow = iceberg::arrow::schema_to_arrow_schema(&schema).ok()?;
                Some(transform::Relation {
                    name: name.clone(),
                    schema: transform::plain_schema(&arrow),
                    batches: Vec::new(),
                })
            })
            .collect()
    }

    /// The planned output of `p` with `table` (its source, a table it joins, or both) at
    /// `schema` and its other relations as known (cached), or why it fails.
    async fn plan(
        &self,
        config: &Config,
        p: &PipelineConfig,
        table: &str,
        schema: &Schema,
    ) -> std::result::Result<SchemaRef, PlanFailure> {
        let source = if p.source == table {
            schema.clone()
        } else {
            self.known(config, &p.source).ok_or_else(|| PlanFailure {
                reason: format!(
                    "the schema of its source `{}` is unknown (the table does not exist yet)",
                    p.source
                ),
                column: None,
                span: None,
            })?
        };
        let relation = source_relation(config, p, &source)?;
        let joined = self.joined_relations(config, p, table, schema);
        let mut h = DefaultHasher::new();
        p.name.hash(&mut h);
        p.sql.hash(&mut h);
        format!("{:?}", relation.fields()).hash(&mut h);
        for r in &joined {
            r.name.hash(&mut h);
            format!("{:?}", r.schema.fields()).hash(&mut h);
        }
        let key = h.finish();
        if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return hit;
        }
        let planned = transform::plan_output(&p.sql, relation, &joined).await;
        if let Ok(mut c) = self.cache.lock() {
            // Bounded: a long-lived container sees few distinct schemas, but never grows forever.
            if c.len() >= 1024 {
                c.clear();
            }
            c.insert(key, planned.clone());
        }
        planned
    }
}

/// The relation `source` as the process function registers it for `p` over a table with
/// `schema`: the table's columns (field ids dropped), plus `window_start` in aggregate mode.
fn source_relation(
    config: &Config,
    p: &PipelineConfig,
    schema: &Schema,
) -> std::result::Result<SchemaRef, PlanFailure> {
    let arrow = iceberg::arrow::schema_to_arrow_schema(schema).map_err(|e| PlanFailure {
        reason: format!("the schema has no Arrow form: {e}"),
        column: None,
        span: None,
    })?;
    let plain = transform::plain_schema(&arrow);
    if p.mode != PipelineMode::Aggregate {
        return Ok(plain);
    }
    let time_column = p.time_column(config);
    let window = p.window_micros().unwrap_or(60_000_000);
    transform::with_window_start(&RecordBatch::new_empty(plain), time_column, window)
        .map(|b| b.schema())
        .map_err(|e| PlanFailure {
            reason: e.to_string(),
            column: Some(time_column.to_string()),
            span: None,
        })
}

/// Where `column` first appears in `sql` as an identifier (case-insensitive, outside string
/// literals), as (line, column), 1-based.
pub(crate) fn find_token(sql: &str, column: &str) -> Option<(u64, u64)> {
    let target: Vec<char> = column.to_lowercase().chars().collect();
    if target.is_empty() {
        return None;
    }
    let chars: Vec<char> = sql.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let (mut line, mut col) = (1u64, 1u64);
    let mut in_string = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            in_string = !in_string;
        } else if !in_string
            && (i == 0 || !ident(chars[i - 1]))
            && i + target.len() <= chars.len()
            && chars[i..i + target.len()]
                .iter()
                .zip(&target)
                .all(|(a, b)| a.to_lowercase().eq(std::iter::once(*b)))
            && chars.get(i + target.len()).is_none_or(|n| !ident(*n))
        {
            return Some((line, col));
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
        i += 1;
    }
    None
}

fn breaks(sql: &str, column: Option<String>, span: Option<(u64, u64)>, reason: String) -> Verdict {
    let span = span.or_else(|| column.as_deref().and_then(|c| find_token(sql, c)));
    Verdict::Breaks {
        column,
        position: span.map(|(l, c)| format!("{l}:{c}")),
        reason,
    }
}

/// `output` against the sink's current schema, as the process function conforms it: matched by
/// name; a widening (sink widened with the data) or narrowing (cast up) is fine; any other type
/// change, or a required sink column the output no longer has, breaks.
fn against_sink(sql: &str, sink_name: &str, output: &SchemaRef, sink: &Schema) -> Verdict {
    for f in output.fields() {
        let Some(existing) = sink.field_by_name(f.name()) else {
            continue;
        };
        let Ok(ty) = iceberg::arrow::arrow_type_to_type(f.data_type()) else {
            continue;
        };
        if *existing.field_type == ty {
            continue;
        }
        let castable = match (existing.field_type.as_ref(), &ty) {
            (Type::Primitive(a), Type::Primitive(b)) => {
                crate::evolve::is_widening(a, b) || crate::evolve::is_widening(b, a)
            }
            _ => false,
        };
        if !castable {
            return breaks(
                sql,
                Some(f.name().clone()),
                None,
                format!(
                    "sink `{sink_name}` stores `{}` as {}, the output would be {ty}",
                    f.name(),
                    existing.field_type
                ),
            );
        }
    }
    for f in sink.as_struct().fields() {
        if f.required && output.column_with_name(&f.name).is_none() {
            return breaks(
                sql,
                Some(f.name.clone()),
                None,
                format!(
                    "sink `{sink_name}` requires `{}`, which the output would no longer have",
                    f.name
                ),
            );
        }
    }
    Verdict::Ok
}

/// `p` with `table` at `schema`: whether it plans, and whether its output fits `sink`.
pub(crate) async fn verdict(
    planner: &Planner,
    config: &Config,
    p: &PipelineConfig,
    table: &str,
    schema: &Schema,
    sink: Option<&Schema>,
) -> Verdict {
    match planner.plan(config, p, table, schema).await {
        Err(f) => breaks(&p.sql, f.column, f.span, f.reason),
        Ok(output) => match sink {
            Some(sink) => against_sink(&p.sql, &p.sink, &output, sink),
            None => Verdict::Ok,
        },
    }
}

/// The current schema of `p`'s sink, None when the sink does not exist yet.
pub(crate) async fn sink_schema(
    config: &Config,
    catalog: &dyn Catalog,
    p: &PipelineConfig,
) -> Result<Option<Schema>> {
    let ident = crate::catalog::table_ident(config, &p.sink)?;
    let exists = catalog
        .table_exists(&ident)
        .await
        .map_err(|e| Error::iceberg(format!("checking sink {ident}"), e).with_retryable(true))?;
    if !exists {
        return Ok(None);
    }
    let t = catalog
        .load_table(&ident)
        .await
        .map_err(|e| Error::iceberg(format!("loading sink {ident}"), e).with_retryable(true))?;
    Ok(Some(t.metadata().current_schema().as_ref().clone()))
}

/// The pipelines reading `table`: as their source, or joining it.
pub(crate) fn consumers_of<'a>(config: &'a Config, table: &str) -> Vec<&'a PipelineConfig> {
    config
        .pipelines
        .iter()
        .filter(|p| p.source == table || p.joins.iter().any(|j| j == table))
        .collect()
}

/// Every pipeline reading `table`, planned against `proposed` and checked against its sink
/// (`sinks`: pipeline → the sink's current schema, None when it does not exist). With
/// `current`, a pipeline that breaks is also planned against it: if it breaks there too, the
/// break is marked as not this change's doing.
pub(crate) async fn check(
    planner: &Planner,
    config: &Config,
    table: &str,
    current: Option<&Schema>,
    proposed: &Schema,
    sinks: &HashMap<String, Schema>,
) -> Vec<ConsumerReport> {
    let mut out = Vec::new();
    for p in consumers_of(config, table) {
        let sink = sinks.get(&p.name);
        let verdict = verdict(planner, config, p, table, proposed, sink).await;
        let already_broken = match (current, verdict.breaks()) {
            (Some(c), true) => verdict_on(planner, config, p, table, c, sink).await,
            _ => false,
        };
        out.push(ConsumerReport {
            pipeline: p.name.clone(),
            sink: p.sink.clone(),
            verdict,
            already_broken,
        });
    }
    out
}

async fn verdict_on(
    planner: &Planner,
    config: &Config,
    p: &PipelineConfig,
    table: &str,
    schema: &Schema,
    sink: Option<&Schema>,
) -> bool {
    verdict(planner, config, p, table, schema, sink)
        .await
        .breaks()
}

/// [`check`] with the sinks' schemas loaded from `catalog`.
pub async fn check_table(
    planner: &Planner,
    config: &Config,
    catalog: &dyn Catalog,
    table: &str,
    current: Option<&Schema>,
    proposed: &Schema,
) -> Result<Vec<ConsumerReport>> {
    let mut sinks = HashMap::new();
    let consumers = consumers_of(config, table);
    for p in &consumers {
        if let Some(s) = sink_schema(config, catalog, p).await? {
            sinks.insert(p.name.clone(), s);
        }
    }
    planner
        .load_relations(config, catalog, table, &consumers)
        .await;
    Ok(check(planner, config, table, current, proposed, &sinks).await)
}

/// `schema` without the top-level column `column` (same schema id + 1, identifier fields kept).
pub(crate) fn without_column(schema: &Schema, column: &str) -> iceberg::Result<Schema> {
    Schema::builder()
        .with_schema_id(schema.schema_id() + 1)
        .with_identifier_field_ids(schema.identifier_field_ids())
        .with_fields(
            schema
                .as_struct()
                .fields()
                .iter()
                .filter(|f| f.name != column)
                .cloned(),
        )
        .build()
}

/// The pipelines reading `column` of `table` (whose schema is `schema`): those that no longer
/// plan without it, or whose output would lose a column.
pub(crate) async fn readers_of(
    planner: &Planner,
    config: &Config,
    table: &str,
    schema: &Schema,
    column: &str,
) -> Vec<ConsumerReport> {
    let Ok(without) = without_column(schema, column) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in consumers_of(config, table) {
        // A pipeline that does not plan on the current schema reads nothing of it.
        let Ok(before) = planner.plan(config, p, table, schema).await else {
            continue;
        };
        let verdict = match planner.plan(config, p, table, &without).await {
            Err(f) => breaks(&p.sql, f.column, f.span, f.reason),
            Ok(after) => {
                let lost: Vec<String> = before
                    .fields()
                    .iter()
                    .filter(|f| after.column_with_name(f.name()).is_none())
                    .map(|f| f.name().clone())
                    .collect();
                if lost.is_empty() {
                    Verdict::Ok
                } else {
                    breaks(
                        &p.sql,
                        Some(column.to_string()),
                        None,
                        format!(
                            "its output would lose {} (sink `{}`)",
                            lost.join(", "),
                            p.sink
                        ),
                    )
                }
            }
        };
        if verdict.breaks() {
            out.push(ConsumerReport {
                pipeline: p.name.clone(),
                sink: p.sink.clone(),
                verdict,
                already_broken: false,
            });
        }
    }
    out
}

/// A deprecated column of a table: who owns it, its dates, and who still produces or reads it.
#[derive(Debug, Clone, Serialize)]
pub struct DeprecationStatus {
    /// Column, owner, since, remove after.
    #[serde(flatten)]
    pub deprecation: Deprecation,
    /// The table's current schema still has the column.
    pub in_table: bool,
    /// Still produced: by the table's newest ingest commit (status), or by the sample object
    /// (schema-diff --object); None when unknown.
    pub produced: Option<bool>,
    /// The pipelines still reading it.
    pub read_by: Vec<String>,
    /// Its remove-after date has come (`floe schema drop-column` may remove it).
    pub removable: bool,
}

/// Every deprecated column of `table` (config `table`, `current` its Iceberg metadata when it
/// exists) with owner, dates, whether the newest ingest commit still produced it and which
/// pipelines read it.
pub async fn deprecation_status(
    planner: &Planner,
    config: &Config,
    table: &str,
    current: Option<&iceberg::spec::TableMetadata>,
    today: chrono::NaiveDate,
) -> Vec<DeprecationStatus> {
    let Some(tcfg) = config.table(table) else {
        return Vec::new();
    };
    // The newest ingest commit: the newest snapshot naming its source objects.
    let newest_ingest = current.and_then(|md| {
        let mut s = md.current_snapshot();
        while let Some(snap) = s {
            let props = &snap.summary().additional_properties;
            if props.contains_key(crate::summary::SOURCE_OBJECTS) {
                return Some(
                    props
                        .get(crate::summary::DEPRECATED_PRODUCED)
                        .map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
                        .unwrap_or_default(),
                );
            }
            s = snap.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
        }
        None
    });
    let mut out = Vec::new();
    for d in tcfg.deprecation_list() {
        let schema = current.map(|md| md.current_schema());
        let in_table = schema.is_some_and(|s| s.field_by_name(&d.column).is_some());
        let read_by = match schema {
            Some(s) if in_table => readers_of(planner, config, table, s, &d.column)
                .await
                .into_iter()
                .map(|r| r.pipeline)
                .collect(),
            _ => Vec::new(),
        };
        out.push(DeprecationStatus {
            produced: newest_ingest
                .as_ref()
                .map(|cols| in_table && cols.contains(&d.column)),
            removable: today >= d.remove_after,
            in_table,
            read_by,
            deprecation: d,
        });
    }
    out
}

impl DeprecationStatus {
    /// One line: column, owner, dates, produced, read by.
    pub fn describe(&self) -> String {
        let d = &self.deprecation;
        format!(
            "`{}` deprecated{} (owner {}), remove after {}{}; {}; {}",
            d.column,
            d.since.map(|s| format!(" since {s}")).unwrap_or_default(),
            d.owner.as_deref().unwrap_or("-"),
            d.remove_after,
            if self.removable { " (due)" } else { "" },
            match (self.in_table, self.produced) {
                (false, _) => "no longer in the table",
                (true, Some(true)) => "still produced",
                (true, Some(false)) => "no longer produced",
                (true, None) => "produced: unknown",
            },
            if self.read_by.is_empty() {
                "read by no pipeline".to_string()
            } else {
                format!("read by {}", self.read_by.join(", "))
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{NestedField, PrimitiveType};
    use std::sync::Arc;

    fn config(sql: &str, mode: &str) -> Config {
        let window = if mode == "aggregate" {
            "window = \"1m\"\n"
        } else {
            ""
        };
        let text = format!(
            r#"
[catalog]
kind = "sqlite"
uri = "sqlite://target/x.db"
warehouse = "file:///tmp/wh"

[[tables]]
name = "orders"
event_time = "event_time"
columns = [
  {{ name = "order_id", type = "string", required = true }},
  {{ name = "amount", type = "double" }},
  {{ name = "event_time", type = "timestamptz", required = true }},
]

[[pipelines]]
name = "p"
source = "orders"
sink = "out"
mode = "{mode}"
{window}sql = """{sql}"""
"#
        );
        Config::parse(&text, "f.toml").unwrap()
    }

    fn schema(fields: Vec<NestedField>) -> Schema {
        Schema::builder()
            .with_fields(fields.into_iter().map(Arc::new))
            .build()
            .unwrap()
    }

    fn orders(amount: PrimitiveType, extra: Option<NestedField>) -> Schema {
        let mut f = vec![
            NestedField::required(1, "order_id", Type::Primitive(PrimitiveType::String)),
            NestedField::optional(2, "amount", Type::Primitive(amount)),
            NestedField::required(3, "event_time", Type::Primitive(PrimitiveType::Timestamptz)),
        ];
        f.extend(extra);
        schema(f)
    }

    #[tokio::test]
    async fn a_pipeline_that_still_plans_is_ok_and_plans_are_cached() {
        let cfg = config(
            "SELECT window_start, sum(amount) AS revenue FROM source GROUP BY window_start",
            "aggregate",
        );
        let planner = Planner::default();
        let s = orders(PrimitiveType::Double, None);
        let r = check(&planner, &cfg, "orders", None, &s, &HashMap::new()).await;
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].verdict, Verdict::Ok, "{r:?}");
        check(&planner, &cfg, "orders", None, &s, &HashMap::new()).await;
        assert_eq!(planner.cached(), 1, "the same relation is planned once");
        assert!(check(&planner, &cfg, "other", None, &s, &HashMap::new())
            .await
            .is_empty());
    }

    #[tokio::test]
    async fn a_missing_column_is_named_with_its_position() {
        let cfg = config(
            "SELECT order_id,\n       amount * 2 AS doubled\nFROM source",
            "append",
        );
        let planner = Planner::default();
        let current = orders(PrimitiveType::Double, None);
        let proposed = schema(vec![
            NestedField::required(1, "order_id", Type::Primitive(PrimitiveType::String)),
            NestedField::required(3, "event_time", Type::Primitive(PrimitiveType::Timestamptz)),
        ]);
        let r = check(
            &planner,
            &cfg,
            "orders",
            Some(&current),
            &proposed,
            &HashMap::new(),
        )
        .await;
        match &r[0].verdict {
            Verdict::Breaks {
                column, position, ..
            } => {
                assert_eq!(column.as_deref(), Some("amount"));
                assert_eq!(position.as_deref(), Some("2:8"), "{r:?}");
            }
            Verdict::Ok => panic!("removing `amount` should break p"),
        }
        assert!(!r[0].already_broken);
        assert!(r[0].describe().contains("`amount`"));
        // readers_of finds the same pipeline for the column, and none for another.
        assert_eq!(
            readers_of(&planner, &cfg, "orders", &current, "amount")
                .await
                .len(),
            1
        );
        assert!(readers_of(&planner, &cfg, "orders", &current, "event_time")
            .await
            .is_empty());
    }

    #[tokio::test]
    async fn a_type_change_against_the_sink_breaks_and_a_widening_does_not() {
        let cfg = config("SELECT order_id, amount FROM source", "append");
        let planner = Planner::default();
        let sink = schema(vec![
            NestedField::optional(1, "order_id", Type::Primitive(PrimitiveType::String)),
            NestedField::optional(2, "amount", Type::Primitive(PrimitiveType::Float)),
        ]);
        let sinks = HashMap::from([("p".to_string(), sink)]);
        let widened = orders(PrimitiveType::Double, None);
        let r = check(&planner, &cfg, "orders", None, &widened, &sinks).await;
        assert_eq!(r[0].verdict, Verdict::Ok, "float → double widens the sink");
        let changed = orders(PrimitiveType::String, None);
        let r = check(&planner, &cfg, "orders", None, &changed, &sinks).await;
        match &r[0].verdict {
            Verdict::Breaks {
                column,
                position,
                reason,
            } => {
                assert_eq!(column.as_deref(), Some("amount"));
                assert_eq!(position.as_deref(), Some("1:18"));
                assert!(reason.contains("sink `out`"), "{reason}");
            }
            Verdict::Ok => panic!("double → string against a float sink column should break"),
        }
    }

    #[tokio::test]
    async fn a_new_column_colliding_with_an_alias_under_select_star_breaks() {
        let cfg = config("SELECT *, amount * 0.9 AS net FROM source", "append");
        let planner = Planner::default();
        let current = orders(PrimitiveType::Double, None);
        let proposed = orders(
            PrimitiveType::Double,
            Some(NestedField::optional(
                4,
                "net",
                Type::Primitive(PrimitiveType::Double),
            )),
        );
        let r = check(
            &planner,
            &cfg,
            "orders",
            Some(&current),
            &proposed,
            &HashMap::new(),
        )
        .await;
        match &r[0].verdict {
            Verdict::Breaks { column, reason, .. } => {
                assert_eq!(column.as_deref(), Some("net"), "{reason}")
            }
            Verdict::Ok => panic!("a duplicate output column should break"),
        }
        let harmless = orders(
            PrimitiveType::Double,
            Some(NestedField::optional(
                4,
                "coupon",
                Type::Primitive(PrimitiveType::String),
            )),
        );
        let r = check(&planner, &cfg, "orders", None, &harmless, &HashMap::new()).await;
        assert_eq!(r[0].verdict, Verdict::Ok);
    }

    #[tokio::test]
    async fn a_joined_table_is_planned_beside_source_with_its_schema() {
        let sql =
            "SELECT o.order_id, c.segment FROM source o JOIN customers c ON o.order_id = c.id";
        let base = config(sql, "append");
        let mut customers = base.tables[0].clone();
        customers.name = "customers".into();
        customers.columns[0].name = "id".into();
        customers.columns[1] = crate::config::ColumnConfig {
            name: "segment".into(),
            type_name: "string".into(),
            ..Default::default()
        };
        let mut cfg = base.clone();
        cfg.tables.push(customers);
        cfg.pipelines[0].joins = vec!["customers".into()];
        let planner = Planner::default();
        let s = orders(PrimitiveType::Double, None);
        let r = check(&planner, &cfg, "orders", None, &s, &HashMap::new()).await;
        assert_eq!(r[0].verdict, Verdict::Ok, "{r:?}");
        // Without the joined relation the same SQL does not plan.
        let r = check(&planner, &base, "orders", None, &s, &HashMap::new()).await;
        assert!(r[0].verdict.breaks(), "{r:?}");
    }

    #[test]
    fn tokens_are_found_as_identifiers_outside_strings() {
        let sql = "SELECT 'amount' AS label,\n  x_amount, Amount FROM source";
        assert_eq!(find_token(sql, "amount"), Some((2, 13)));
        assert_eq!(find_token(sql, "nope"), None);
    }
}
