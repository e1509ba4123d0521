//! Aggregate windows: which windows new rows touch, the source rows of those windows, and the
//! sink rows outside them that the replaced files still hold.

use std::collections::BTreeSet;

use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow_schema::SchemaRef;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{Datum, PrimitiveLiteral, PrimitiveType, Type};
use iceberg::table::Table;

use super::input;
use super::transform::{self, WINDOW_START};
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::LiveFile;

/// The windows the rows of `files` touch (late rows included), one chunk of files at a time:
/// memory is bounded by a chunk, not by the delta.
pub(super) async fn touched(
    source: &Table,
    files: &[LiveFile],
    time_column: &str,
    window: i64,
) -> Result<BTreeSet<i64>> {
    let mut touched = BTreeSet::new();
    for chunk in input::chunks(files) {
        let (_, rows) = input::read_rows(source, chunk).await?;
        for b in &rows {
            let b = transform::with_window_start(b, time_column, window)?;
            touched.extend(transform::window_starts(&b));
        }
    }
    Ok(touched)
}

/// Source rows (with `window_start`) of the `touched` windows at snapshot `at`.
pub(super) async fn read_windows(
    source: &Table,
    at: i64,
    time_column: &str,
    window: i64,
    touched: &BTreeSet<i64>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let schema = transform::table_schema(source)?;
    let tz = matches!(
        source
            .metadata()
            .current_schema()
            .field_by_name(time_column)
            .map(|f| f.field_type.as_ref()),
        Some(Type::Primitive(PrimitiveType::Timestamptz))
    );
    let datum = |us: i64| {
        if tz {
            Datum::timestamptz_micros(us)
        } else {
            Datum::timestamp_micros(us)
        }
    };
    // One range per run of adjacent windows: late rows far back do not pull in everything between.
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for &w in touched {
        match ranges.last_mut() {
            Some((_, hi)) if *hi == w => *hi = w + window,
            _ => ranges.push((w, w + window)),
        }
    }
    let predicate = ranges
        .iter()
        .map(|&(lo, hi)| {
            Reference::new(time_column)
                .greater_than_or_equal_to(datum(lo))
                .and(Reference::new(time_column).less_than(datum(hi)))
        })
        .reduce(Predicate::or)
        .unwrap_or(Predicate::AlwaysFalse);
    let batches = input::scan_rows(source, Some(at), Some(predicate), &schema).await?;
    let empty = RecordBatch::new_empty(schema.clone());
    let out_schema = transform::with_window_start(&empty, time_column, window)?.schema();
    let mut out = Vec::new();
    for b in batches {
        let b = transform::with_window_start(&b, time_column, window)?;
        let keep = in_windows(&b, touched);
        let b = arrow::compute::filter_record_batch(&b, &keep)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering windows: {e}")))?;
        if b.num_rows() > 0 {
            out.push(b);
        }
    }
    Ok((out_schema, out))
}

/// Which rows of `batch` have a `window_start` in `touched`.
fn in_windows(batch: &RecordBatch, touched: &BTreeSet<i64>) -> BooleanArray {
    let starts = batch.column_by_name(WINDOW_START).and_then(|c| {
        arrow::compute::cast(
            c,
            &arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
        )
        .ok()
    });
    let Some(starts) = starts else {
        return BooleanArray::from(vec![false; batch.num_rows()]);
    };
    let Some(a) = starts
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
    else {
        return BooleanArray::from(vec![false; batch.num_rows()]);
    };
    a.iter()
        .map(|v| Some(v.map(|v| touched.contains(&v)).unwrap_or(false)))
        .collect()
}

/// Sink files that may hold rows of the `touched` windows, and their rows outside them (kept).
pub(super) async fn sink_rows_outside(
    sink: &Table,
    touched: &BTreeSet<i64>,
) -> Result<(Vec<String>, Vec<RecordBatch>)> {
    let field = sink
        .metadata()
        .current_schema()
        .field_by_name(WINDOW_START)
        .map(|f| f.id);
    if touched.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let bound = |d: Option<&Datum>| match d.map(|d| d.literal()) {
        Some(PrimitiveLiteral::Long(v)) => Some(*v),
        _ => None,
    };
    let affected: Vec<LiveFile> = crate::scan::live_files(sink)
        .await?
        .into_iter()
        .filter(|f| {
            let Some(id) = field else { return true };
            let min = bound(f.file.lower_bounds().get(&id));
            let max = bound(f.file.upper_bounds().get(&id));
            match (min, max) {
                (Some(min), Some(max)) => touched.range(min..=max).next().is_some(),
                _ => true,
            }
        })
        .collect();
    let paths = affected
        .iter()
        .map(|f| f.file.file_path().to_string())
        .collect();
    let (_, rows) = input::read_rows(sink, &affected).await?;
    let mut kept = Vec::new();
    for b in rows {
        let drop = in_windows(&b, touched);
        let keep = arrow::compute::not(&drop)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering sink rows: {e}")))?;
        let b = arrow::compute::filter_record_batch(&b, &keep)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering sink rows: {e}")))?;
        if b.num_rows() > 0 {
            kept.push(b);
        }
    }
    Ok((paths, kept))
}

pub(super) fn window_missing(p: &PipelineConfig) -> Error {
    Error::new(
        ErrorKind::Transform,
        format!(
            "pipeline `{}`: an aggregate SQL must output `{WINDOW_START}` (group by it) so windows can be replaced",
            p.name
        ),
    )
}

pub(super) fn require_window_column(batches: &[RecordBatch], p: &PipelineConfig) -> Result<()> {
    if batches
        .iter()
        .any(|b| b.column_by_name(WINDOW_START).is_none())
    {
        return Err(window_missing(p));
    }
    Ok(())
}
