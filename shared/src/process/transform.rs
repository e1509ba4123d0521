//! Running a pipeline's SQL: DataFusion over an in-memory relation `source`.
//!
//! The same function runs over a delta (incremental) and over a whole table (batch, backfill,
//! reconcile), so the two speeds execute one piece of code. Only queries are accepted (no DDL,
//! DML or `SET`). Output columns are normalised to types an Iceberg table can hold, all optional.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::execution::context::{SQLOptions, SessionConfig, SessionContext};
use sha2::{Digest, Sha256};

use crate::config::{PipelineConfig, PipelineMode};
use crate::error::{Error, ErrorKind, Result};

/// The column aggregate pipelines see in `source`: the event time floored to the window.
pub(crate) const WINDOW_START: &str = "window_start";

/// The transform's version: a hash of everything that shapes its output (mode, SQL, window,
/// time column). Recorded with every checkpoint; a different hash needs an explicit refresh.
pub(crate) fn transform_hash(p: &PipelineConfig, time_column: &str) -> String {
    let mut h = Sha256::new();
    let mode = match p.mode {
        PipelineMode::Append => "append",
        PipelineMode::Aggregate => "aggregate",
        PipelineMode::Latest => "latest",
    };
    let sql: String = p.sql.split_whitespace().collect::<Vec<_>>().join(" ");
    for part in [
        mode,
        &sql,
        &p.window_micros().unwrap_or(0).to_string(),
        time_column,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    if p.mode == PipelineMode::Latest {
        // What decides which version is the latest, what deletes, and the sink's layout.
        let parts = [
            p.keys.join("\u{1}"),
            p.order_by.clone().unwrap_or_default(),
            p.delete_when.clone().unwrap_or_default(),
            p.key_buckets().to_string(),
        ];
        for part in parts {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
    }
    hex::encode(&h.finalize()[..8])
}

/// Drops field metadata (Iceberg field ids) so batches from different files share one schema.
pub(crate) fn plain_schema(schema: &ArrowSchema) -> SchemaRef {
    Arc::new(ArrowSchema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_metadata(HashMap::new()))
            .collect::<Vec<_>>(),
    ))
}

/// Appends `window_start` = `time_column` floored to `window_us` microseconds. A row without a
/// time belongs to no window and is left out, the same way by every run, refresh and the
/// batch reconcile compares with (the batch counted such rows in a NULL window that
/// incremental runs never touch).
pub(crate) fn with_window_start(
    batch: &RecordBatch,
    time_column: &str,
    window_us: i64,
) -> Result<RecordBatch> {
    let (idx, field) = batch
        .schema()
        .column_with_name(time_column)
        .map(|(i, f)| (i, f.clone()))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Transform,
                format!("the source has no event-time column `{time_column}`"),
            )
        })?;
    let tz = match field.data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => {
            return Err(Error::new(
                ErrorKind::Transform,
                format!("event-time column `{time_column}` is {other}, expected a timestamp"),
            ))
        }
    };
    let micros = cast(
        batch.column(idx),
        &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
    )
    .map_err(|e| Error::new(ErrorKind::Transform, format!("`{time_column}`: {e}")))?;
    let micros = micros
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .ok_or_else(|| Error::new(ErrorKind::Internal, "timestamp cast"))?;
    // Floored toward the past; a time within one window of the earliest representable
    // microsecond (year −290 308) has no window start and is refused, never wrapped.
    let floored: TimestampMicrosecondArray = micros
        .iter()
        .map(|v| {
            v.map(|v| {
                v.checked_sub(v.rem_euclid(window_us)).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Transform,
                        format!("`{time_column}` value {v} µs has no {window_us} µs window start"),
                    )
                })
            })
            .transpose()
        })
        .collect::<Result<TimestampMicrosecondArray>>()?
        .with_timezone_opt(tz.clone());
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns = batch.columns().to_vec();
    fields.push(Field::new(
        WINDOW_START,
        DataType::Timestamp(TimeUnit::Microsecond, tz),
        true,
    ));
    let untimed = floored.null_count() > 0;
    columns.push(Arc::new(floored) as ArrayRef);
    let out = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("adding {WINDOW_START}: {e}")))?;
    if !untimed {
        return Ok(out);
    }
    let timed = arrow::compute::is_not_null(out.column(out.num_columns() - 1))
        .and_then(|timed| arrow::compute::filter_record_batch(&out, &timed))
        .map_err(|e| Error::new(ErrorKind::Internal, format!("rows without a time: {e}")))?;
    Ok(timed)
}

/// The window starts (µs) present in `batch`'s `window_start` column.
pub(crate) fn window_starts(batch: &RecordBatch) -> Vec<i64> {
    let Some(col) = batch.column_by_name(WINDOW_START) else {
        return Vec::new();
    };
    let Ok(micros) = cast(col, &DataType::Timestamp(TimeUnit::Microsecond, None)) else {
        return Vec::new();
    };
    micros
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .map(|a| a.iter().flatten().collect())
        .unwrap_or_default()
}

/// A table the SQL reads by its name beside `source`: a pipeline's joined table (`joins`), as
/// read at one snapshot (or only its schema, to plan).
#[derive(Debug, Clone)]
pub(crate) struct Relation {
    /// The name the SQL uses (the table's name).
    pub(crate) name: String,
    /// Its columns (the table's current schema, without field ids).
    pub(crate) schema: SchemaRef,
    /// Its rows (empty to plan).
    pub(crate) batches: Vec<RecordBatch>,
}

/// Runs `sql` over `source` (the given schema and batches) and returns the normalised output.
/// `context` names the pipeline and source in errors; a SQL that no longer fits the source's
/// schema is an error of kind `Transform` naming the field. (Without joined tables: a
/// pipeline's runs use [`run_sql_joined`].)
pub(crate) async fn run_sql(
    sql: &str,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    context: &str,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    run_sql_joined(sql, schema, batches, &[], context).await
}

/// [`run_sql`] with the `joined` relations registered beside `source` under their names.
pub(crate) async fn run_sql_joined(
    sql: &str,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    joined: &[Relation],
    context: &str,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let ctx = session(SessionConfig::new(), schema.clone(), batches, joined)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("{context}: {e}")))?;
    let failed = |e| sql_error(context, &schema, joined, e);
    let df = ctx
        .sql_with_options(sql, query_only())
        .await
        .map_err(failed)?;
    let out_schema = normalised(df.schema().as_arrow(), context)?;
    let batches = df.collect().await.map_err(failed)?;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        if b.num_rows() > 0 {
            out.push(conform(&b, &out_schema)?);
        }
    }
    Ok((out_schema, out))
}

/// DataFusion's logical plan of `sql` over an empty `source` of `schema` (as [`run_sql`] plans
/// it, not optimised) and its normalised output schema.
pub(crate) async fn logical_plan(
    sql: &str,
    schema: SchemaRef,
    joined: &[Relation],
    context: &str,
) -> Result<(datafusion::logical_expr::LogicalPlan, SchemaRef)> {
    let ctx = session(SessionConfig::new(), schema.clone(), Vec::new(), joined)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("{context}: {e}")))?;
    let df = ctx
        .sql_with_options(sql, query_only())
        .await
        .map_err(|e| sql_error(context, &schema, joined, e))?;
    let out = normalised(df.schema().as_arrow(), context)?;
    Ok((df.into_unoptimized_plan(), out))
}

/// A session with `source` registered over `batches` and each of `joined` under its name
/// (2 partitions: the Lambda's two cores).
fn session(
    config: SessionConfig,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    joined: &[Relation],
) -> datafusion::error::Result<SessionContext> {
    let ctx = SessionContext::new_with_config(config.with_target_partitions(2));
    let table = MemTable::try_new(schema, vec![batches])?;
    ctx.register_table("source", Arc::new(table))?;
    for r in joined {
        let table = MemTable::try_new(r.schema.clone(), vec![r.batches.clone()])?;
        ctx.register_table(
            datafusion::sql::TableReference::bare(r.name.as_str()),
            Arc::new(table),
        )?;
    }
    Ok(ctx)
}

/// Only queries: no DDL, DML or `SET`.
fn query_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Why a pipeline's SQL does not plan over a schema: the reason, the column it names (when
/// one) and where the SQL mentions it (line, column; 1-based), when DataFusion's span says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanFailure {
    /// DataFusion's (or the output check's) reason.
    pub(crate) reason: String,
    /// The column the failure is about.
    pub(crate) column: Option<String>,
    /// Its position in the SQL (from DataFusion's span).
    pub(crate) span: Option<(u64, u64)>,
}

/// Plans `sql` over an empty `source` of `schema` exactly as [`run_sql`] does (same session,
/// same query-only options, same output normalisation) without running it, with spans
/// collected so that a failure can point into the SQL: the output schema, or why it fails.
pub(crate) async fn plan_output(
    sql: &str,
    schema: SchemaRef,
    joined: &[Relation],
) -> std::result::Result<SchemaRef, PlanFailure> {
    let failure = |e: datafusion::error::DataFusionError| {
        let span = e
            .diagnostic()
            .and_then(|d| d.span)
            .filter(|s| s.start.line > 0)
            .map(|s| (s.start.line, s.start.column));
        PlanFailure {
            column: error_column(&e.to_string()),
            reason: e.to_string(),
            span,
        }
    };
    let mut config = SessionConfig::new();
    config.options_mut().sql_parser.collect_spans = true;
    let ctx = session(config, schema, Vec::new(), joined).map_err(failure)?;
    let df = ctx
        .sql_with_options(sql, query_only())
        .await
        .map_err(failure)?;
    normalise_fields(df.schema().as_arrow()).map_err(|(column, reason)| PlanFailure {
        reason,
        column: Some(column),
        span: None,
    })
}

/// The column a planning error is about: a missing field, or an output name that would be
/// ambiguous or duplicate (qualifier dropped).
fn error_column(text: &str) -> Option<String> {
    const MARKERS: [&str; 4] = [
        "No field named ",
        "unqualified field name ",
        "duplicate qualified field name ",
        "have the same name ",
    ];
    MARKERS.iter().find_map(|m| {
        let rest = text.split(m).nth(1)?;
        let token: String = rest
            .trim_start_matches(['"', '`', '\''])
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        let name = token.trim_end_matches('.').rsplit('.').next()?.to_string();
        (!name.is_empty()).then_some(name)
    })
}

/// The field a "No field named …" error names.
fn missing_field(text: &str) -> Option<String> {
    text.split("No field named ")
        .nth(1)
        .map(|rest| {
            rest.trim_start_matches(['"', '`', '\''])
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|f| !f.is_empty())
}

fn sql_error(
    context: &str,
    schema: &ArrowSchema,
    joined: &[Relation],
    e: datafusion::error::DataFusionError,
) -> Error {
    let text = e.to_string();
    let field = missing_field(&text);
    let message = match field {
        Some(field) => {
            let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            let mut has = format!("it has: {}", known.join(", "));
            for r in joined {
                let cols: Vec<&str> = r
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect();
                has.push_str(&format!("; joined `{}` has: {}", r.name, cols.join(", ")));
            }
            format!(
                "{context}: the SQL reads field `{field}`, which the source schema no longer has \
                 ({has}); fix the SQL or the source, then `floe process refresh`"
            )
        }
        None => format!("{context}: the SQL failed: {text}"),
    };
    Error::new(ErrorKind::Transform, message)
}

/// The output schema as an Iceberg-friendly, all-optional Arrow schema.
fn normalised(schema: &ArrowSchema, context: &str) -> Result<SchemaRef> {
    normalise_fields(schema)
        .map_err(|(_, reason)| Error::new(ErrorKind::Transform, format!("{context}: {reason}")))
}

/// [`normalised`]'s check: the output, or the column that no Iceberg table can hold and why.
fn normalise_fields(schema: &ArrowSchema) -> std::result::Result<SchemaRef, (String, String)> {
    let mut seen = std::collections::HashSet::new();
    let mut fields = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        if !seen.insert(f.name().clone()) {
            return Err((
                f.name().clone(),
                format!("the SQL outputs column `{}` twice; alias it", f.name()),
            ));
        }
        let ty = match f.data_type() {
            DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
            DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
            DataType::Timestamp(_, tz) => DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
            DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => {
                DataType::Int32
            }
            DataType::UInt32 | DataType::UInt64 => DataType::Int64,
            DataType::Float16 => DataType::Float32,
            t @ (DataType::Boolean
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Utf8
            | DataType::Binary
            | DataType::Date32
            | DataType::Decimal128(_, _)) => t.clone(),
            other => {
                return Err((
                    f.name().clone(),
                    format!(
                        "output column `{}` has type {other}, which an Iceberg table \
                         cannot hold; cast it in the SQL",
                        f.name()
                    ),
                ))
            }
        };
        fields.push(Field::new(f.name(), ty, true));
    }
    Ok(Arc::new(ArrowSchema::new(fields)))
}

/// `batch` with `schema`'s columns, matched by name (missing ones null, types cast).
pub(crate) fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut cols = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let col = match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => c.clone(),
            Some(c) => cast(c, f.data_type()).map_err(|e| {
                Error::new(ErrorKind::Transform, format!("column `{}`: {e}", f.name()))
            })?,
            None => arrow::array::new_null_array(f.data_type(), batch.num_rows()),
        };
        cols.push(col);
    }
    RecordBatch::try_new(schema.clone(), cols)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("conforming a batch: {e}")))
}

/// The Arrow schema of `table`'s current schema, without field ids (what `source` holds).
pub(crate) fn table_schema(table: &iceberg::table::Table) -> Result<SchemaRef> {
    let arrow = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
        .map_err(|e| Error::iceberg(format!("schema of {}", table.identifier()), e))?;
    Ok(plain_schema(&arrow))
}

/// Rows of `batches` as canonical strings (floats in full, the shortest form that reads back
/// the same), for comparing a batch result with a sink. Columns are taken in `columns` order; a missing column is NULL.
pub(crate) fn canonical_rows(
    batches: &[RecordBatch],
    columns: &[String],
) -> Result<Vec<Vec<String>>> {
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    let opts = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let mut per_col: Vec<Box<dyn Fn(usize) -> String + '_>> = Vec::new();
        for name in columns {
            match b.column_by_name(name) {
                None => per_col.push(Box::new(|_| "NULL".to_string())),
                Some(col) => match col.data_type() {
                    DataType::Float64 | DataType::Float32 => {
                        let f = cast(col, &DataType::Float64).map_err(|e| {
                            Error::new(ErrorKind::Internal, format!("`{name}`: {e}"))
                        })?;
                        per_col.push(Box::new(move |i| {
                            let a = f
                                .as_any()
                                .downcast_ref::<arrow::array::Float64Array>()
                                .filter(|a| a.is_valid(i));
                            match a {
                                Some(a) => format!("{:e}", a.value(i)),
                                None => "NULL".to_string(),
                            }
                        }));
                    }
                    _ => {
                        let fmt = ArrayFormatter::try_new(col.as_ref(), &opts).map_err(|e| {
                            Error::new(ErrorKind::Internal, format!("`{name}`: {e}"))
                        })?;
                        per_col.push(Box::new(move |i| fmt.value(i).to_string()));
                    }
                },
            }
        }
        for i in 0..b.num_rows() {
            rows.push(per_col.iter().map(|f| f(i)).collect());
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, StringArray};

    fn orders() -> (SchemaRef, RecordBatch) {
        let schema = Arc::new(ArrowSchema::new(vec![
            Field::new("region", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                false,
            ),
        ]));
        let t = TimestampMicrosecondArray::from(vec![59_000_000, 60_000_000, 61_000_000])
            .with_timezone("+00:00");
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["eu", "eu", "us"])),
                Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0])),
                Arc::new(t),
            ],
        )
        .unwrap();
        (schema, b)
    }

    #[test]
    fn window_starts_floor_toward_the_past_and_refuse_the_earliest_times() {
        let (schema, _) = orders();
        let batch = |t: Vec<i64>| {
            let n = t.len();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(vec!["eu"; n])),
                    Arc::new(Float64Array::from(vec![1.0; n])),
                    Arc::new(TimestampMicrosecondArray::from(t).with_timezone("+00:00")),
                ],
            )
            .unwrap()
        };
        let b = with_window_start(
            &batch(vec![-1, -60_000_000, i64::MAX]),
            "event_time",
            60_000_000,
        )
        .unwrap();
        assert_eq!(
            window_starts(&b),
            vec![
                -60_000_000,
                -60_000_000,
                i64::MAX - i64::MAX.rem_euclid(60_000_000)
            ]
        );
        // i64::MIN floored to a minute would be before the earliest representable time.
        let e = with_window_start(&batch(vec![0, i64::MIN]), "event_time", 60_000_000).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transform);
        assert!(e.to_string().contains("no 60000000 µs window start"), "{e}");
    }

    /// Review helper-51 #1: a row without an event time belongs to no window. The batch (and a
    /// refresh) counted such rows in a NULL window, which incremental runs never recompute:
    /// reconcile differed. Every path now leaves them out alike.
    #[test]
    fn rows_without_a_time_belong_to_no_window() {
        let schema = Arc::new(ArrowSchema::new(vec![Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        )]));
        let t = TimestampMicrosecondArray::from(vec![Some(0), None, Some(60_000_001), None])
            .with_timezone("+00:00");
        let b = RecordBatch::try_new(schema, vec![Arc::new(t)]).unwrap();
        let b = with_window_start(&b, "event_time", 60_000_000).unwrap();
        assert_eq!(b.num_rows(), 2);
        assert_eq!(window_starts(&b), vec![0, 60_000_000]);
    }

    #[tokio::test]
    async fn windows_and_aggregates() {
        let (_, b) = orders();
        let b = with_window_start(&b, "event_time", 60_000_000).unwrap();
        assert_eq!(window_starts(&b), vec![0, 60_000_000, 60_000_000]);
        let (schema, out) = run_sql(
            "SELECT window_start, region, sum(amount) AS revenue, count(*) AS n FROM source \
             GROUP BY window_start, region ORDER BY window_start, region",
            b.schema(),
            vec![b],
            "test",
        )
        .await
        .unwrap();
        assert!(schema.fields().iter().all(|f| f.is_nullable()));
        let cols: Vec<String> = ["window_start", "region", "revenue", "n"]
            .map(String::from)
            .to_vec();
        let rows = canonical_rows(&out, &cols).unwrap();
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(rows[1][1], "eu");
        assert_eq!(rows[1][2], format!("{:e}", 2.0));
    }

    #[tokio::test]
    async fn a_missing_field_is_named_and_ddl_refused() {
        let (schema, b) = orders();
        let e = run_sql(
            "SELECT country FROM source",
            schema.clone(),
            vec![b.clone()],
            "pipeline p",
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transform);
        assert!(e.to_string().contains("`country`"), "{e}");
        let e = run_sql("CREATE TABLE x (a int)", schema, vec![b], "pipeline p")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transform);
    }
}
