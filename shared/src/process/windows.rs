//! Aggregate windows: which windows new rows touch, the source rows of those windows, and the
//! sink rows outside them that the replaced files still hold.

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{Array, BooleanArray, RecordBatch};
use arrow_schema::SchemaRef;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{
    Datum, PrimitiveLiteral, PrimitiveType, Transform, Type, UnboundPartitionSpec,
};
use iceberg::table::Table;

use super::input::{self, ReadCost};
use super::transform::{self, WINDOW_START};
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::LiveFile;

/// The windows the rows of `files` touch (late rows included), and what finding them cost.
///
/// Only the time column of the new files is read (a projected read: one column chunk per row
/// group), one chunk of files at a time, so memory is bounded by a chunk, not by the delta. A
/// file whose time bounds (manifest min/max) fall in one window touches exactly that window and
/// is not read at all.
pub(super) async fn touched(
    source: &Table,
    files: &[LiveFile],
    time_column: &str,
    window: i64,
) -> Result<(BTreeSet<i64>, ReadCost)> {
    let field = source
        .metadata()
        .current_schema()
        .field_by_name(time_column)
        .map(|f| f.id);
    let mut touched = BTreeSet::new();
    let mut to_read = Vec::new();
    for f in files {
        let bounds = field.and_then(|id| {
            let lo = f.file.lower_bounds().get(&id).and_then(micros)?;
            let hi = f.file.upper_bounds().get(&id).and_then(micros)?;
            Some((lo.div_euclid(window), hi.div_euclid(window)))
        });
        match bounds {
            Some((lo, hi)) if lo == hi => {
                touched.insert(lo.saturating_mul(window));
            }
            _ => to_read.push(f.clone()),
        }
    }
    let mut cost = ReadCost::default();
    for chunk in input::chunks(&to_read) {
        let (times, c) = input::read_column(source, chunk, time_column).await?;
        cost += c;
        for b in &times {
            let b = transform::with_window_start(b, time_column, window)?;
            touched.extend(transform::window_starts(&b));
        }
    }
    Ok((touched, cost))
}

/// A timestamp bound in microseconds (`timestamp`/`timestamptz` columns; None otherwise).
pub(super) fn micros(d: &Datum) -> Option<i64> {
    match (d.data_type(), d.literal()) {
        (PrimitiveType::Timestamp | PrimitiveType::Timestamptz, PrimitiveLiteral::Long(v)) => {
            Some(*v)
        }
        _ => None,
    }
}

/// At most this many time ranges in the recompute's scan predicate: iceberg evaluates the
/// predicate per manifest, file and row group (recursively), so thousands of scattered windows
/// (a catch-up over a sparse history) are coarsened; the rows read are filtered to the
/// windows exactly afterwards.
const MAX_RANGES: usize = 64;

/// The `[lo, hi)` ranges covering `touched` windows: one per run of adjacent windows, and at
/// most `max` of them (the smallest gaps closed first).
fn ranges(touched: &BTreeSet<i64>, window: i64, max: usize) -> Vec<(i64, i64)> {
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for &w in touched {
        match ranges.last_mut() {
            Some((_, hi)) if *hi == w => *hi = w.saturating_add(window),
            _ => ranges.push((w, w.saturating_add(window))),
        }
    }
    if ranges.len() <= max.max(1) {
        return ranges;
    }
    let gaps: Vec<i64> = ranges
        .windows(2)
        .map(|r| r[1].0.saturating_sub(r[0].1))
        .collect();
    // Close exactly the (n - max) smallest gaps (ties: the earlier first), leaving `max`
    // ranges: equal gaps do not all close at once.
    let mut order: Vec<usize> = (0..gaps.len()).collect();
    order.sort_by_key(|&g| (gaps[g], g));
    let mut closed = vec![false; gaps.len()];
    for &g in &order[..ranges.len() - max.max(1)] {
        closed[g] = true;
    }
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(max);
    for (i, r) in ranges.into_iter().enumerate() {
        match out.last_mut() {
            Some((_, hi)) if i > 0 && closed[i - 1] => *hi = r.1,
            _ => out.push(r),
        }
    }
    out
}

/// Source rows (with `window_start`) of the `touched` windows at snapshot `at`, and what
/// reading them cost. The scan's time-range predicate lets iceberg skip manifests (partition
/// summaries), data files (partition values, then the time column's min/max) and row groups
/// (Parquet statistics) outside the windows; the rows read are then cut to the windows exactly.
pub(super) async fn read_windows(
    source: &Table,
    at: i64,
    time_column: &str,
    window: i64,
    touched: &BTreeSet<i64>,
) -> Result<(SchemaRef, Vec<RecordBatch>, ReadCost)> {
    let datum = time_datum(source, time_column);
    // One range per run of adjacent windows: late rows far back do not pull in everything between.
    let predicate = ranges(touched, window, MAX_RANGES)
        .iter()
        .map(|&(lo, hi)| {
            Reference::new(time_column)
                .greater_than_or_equal_to(datum(lo))
                .and(Reference::new(time_column).less_than(datum(hi)))
        })
        .reduce(Predicate::or)
        .unwrap_or(Predicate::AlwaysFalse);
    read_source(source, at, time_column, window, Some(predicate), |w| {
        w.is_some_and(|w| touched.contains(&w))
    })
    .await
}

/// A range of windows by their start (µs): `[lo, hi)`, an end left open is unbounded. The
/// range open below also holds the rows without a time (a null `window_start`). A refresh
/// replaces a sink one span after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    /// First window start in the span (None: unbounded, nulls included).
    pub(super) lo: Option<i64>,
    /// First window start after it (None: unbounded).
    pub(super) hi: Option<i64>,
}

impl Span {
    /// Whether a row whose window starts at `w` (None: no time) belongs to the span.
    pub(super) fn contains(&self, w: Option<i64>) -> bool {
        match w {
            None => self.lo.is_none(),
            Some(w) => self.lo.is_none_or(|lo| w >= lo) && self.hi.is_none_or(|hi| w < hi),
        }
    }

    /// Whether values between `min` and `max` (inclusive) may meet the span.
    fn meets(&self, min: i64, max: i64) -> bool {
        self.lo.is_none_or(|lo| max >= lo) && self.hi.is_none_or(|hi| min < hi)
    }
}

/// Source rows (with `window_start`) of the windows in `span` at snapshot `at`, and what reading
/// them cost: iceberg plans only the files (and row groups) whose time range meets the span.
pub(super) async fn read_span(
    source: &Table,
    at: i64,
    time_column: &str,
    window: i64,
    span: Span,
) -> Result<(SchemaRef, Vec<RecordBatch>, ReadCost)> {
    let predicate = span_predicate(source, time_column, span);
    read_source(source, at, time_column, window, predicate, |w| {
        span.contains(w)
    })
    .await
}

/// The scan predicate of the rows of `span` (None: every row).
fn span_predicate(source: &Table, time_column: &str, span: Span) -> Option<Predicate> {
    let datum = time_datum(source, time_column);
    let lo = span
        .lo
        .map(|lo| Reference::new(time_column).greater_than_or_equal_to(datum(lo)));
    let hi = span
        .hi
        .map(|hi| Reference::new(time_column).less_than(datum(hi)));
    match (lo, hi) {
        (Some(lo), Some(hi)) => Some(lo.and(hi)),
        (Some(lo), None) => Some(lo),
        (None, Some(hi)) => Some(hi.or(Reference::new(time_column).is_null())),
        (None, None) => None,
    }
}

/// How many source rows at snapshot `at` each window of `span` holds (key: its start; None:
/// rows without a time), from the time column alone: a projected scan with the span's
/// predicate (the same files and row groups [`read_span`] would read), streamed, so memory
/// holds one batch of one column and the counts. What a refresh chunk really holds, before
/// it reads its rows whole.
pub(super) async fn count_span(
    source: &Table,
    at: i64,
    time_column: &str,
    window: i64,
    span: Span,
) -> Result<(BTreeMap<Option<i64>, u64>, ReadCost)> {
    let predicate = span_predicate(source, time_column, span);
    let mut counts: BTreeMap<Option<i64>, u64> = BTreeMap::new();
    let cost = input::scan_column(source, at, predicate, time_column, |b| {
        let b = transform::with_window_start(b, time_column, window)?;
        let starts = transform::window_starts(&b);
        let nulls = b.num_rows().saturating_sub(starts.len()) as u64;
        if nulls > 0 && span.contains(None) {
            *counts.entry(None).or_default() += nulls;
        }
        for w in starts.into_iter().filter(|w| span.contains(Some(*w))) {
            *counts.entry(Some(w)).or_default() += 1;
        }
        Ok(())
    })
    .await?;
    Ok((counts, cost))
}

/// `Datum`s of the time column's type (`timestamptz` or `timestamp`).
fn time_datum(source: &Table, time_column: &str) -> impl Fn(i64) -> Datum {
    let tz = matches!(
        source
            .metadata()
            .current_schema()
            .field_by_name(time_column)
            .map(|f| f.field_type.as_ref()),
        Some(Type::Primitive(PrimitiveType::Timestamptz))
    );
    move |us: i64| {
        if tz {
            Datum::timestamptz_micros(us)
        } else {
            Datum::timestamp_micros(us)
        }
    }
}

/// Source rows at `at` matching `predicate` with `window_start` added, cut to the rows whose
/// window `keep` says.
async fn read_source(
    source: &Table,
    at: i64,
    time_column: &str,
    window: i64,
    predicate: Option<Predicate>,
    keep: impl Fn(Option<i64>) -> bool,
) -> Result<(SchemaRef, Vec<RecordBatch>, ReadCost)> {
    let schema = transform::table_schema(source)?;
    let (batches, cost) = input::scan_rows(source, Some(at), predicate, &schema).await?;
    let empty = RecordBatch::new_empty(schema.clone());
    let out_schema = transform::with_window_start(&empty, time_column, window)?.schema();
    let mut out = Vec::new();
    for b in batches {
        let b = transform::with_window_start(&b, time_column, window)?;
        let mask = window_mask(&b, &keep, false);
        let b = arrow::compute::filter_record_batch(&b, &mask)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering windows: {e}")))?;
        if b.num_rows() > 0 {
            out.push(b);
        }
    }
    Ok((out_schema, out, cost))
}

/// `batch` with `window_start` added, without its rows that have no time (no window).
pub(super) fn with_window(
    batch: &RecordBatch,
    time_column: &str,
    window: i64,
) -> Result<RecordBatch> {
    let b = transform::with_window_start(batch, time_column, window)?;
    let mask = window_mask(&b, &|w: Option<i64>| w.is_some(), false);
    arrow::compute::filter_record_batch(&b, &mask)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering windows: {e}")))
}

/// Which rows of `batch` have a `window_start` that `f` accepts (None: a null one); `missing`
/// for every row when the batch has no `window_start`.
fn window_mask(
    batch: &RecordBatch,
    f: &impl Fn(Option<i64>) -> bool,
    missing: bool,
) -> BooleanArray {
    let starts = batch.column_by_name(WINDOW_START).and_then(|c| {
        arrow::compute::cast(
            c,
            &arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
        )
        .ok()
    });
    let Some(starts) = starts else {
        return BooleanArray::from(vec![missing; batch.num_rows()]);
    };
    let Some(a) = starts
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
    else {
        return BooleanArray::from(vec![missing; batch.num_rows()]);
    };
    a.iter().map(|v| Some(f(v))).collect()
}

/// The sink side of a run: the sink files that may hold rows of the touched windows (to be
/// replaced) and their rows outside them (kept, rewritten).
pub(super) struct SinkRewrite {
    /// Paths of the files to replace.
    pub(super) paths: Vec<String>,
    /// Their rows outside the touched windows.
    pub(super) kept: Vec<RecordBatch>,
    /// Their total size.
    pub(super) bytes: u64,
    /// Their rows inside the touched windows (only when asked for: a merge).
    pub(super) inside: Vec<RecordBatch>,
    /// What reading them cost.
    pub(super) read: ReadCost,
}

/// Sink files that may hold rows of the `touched` windows (by their `window_start` min/max; a
/// sink partitioned by time keeps each file to one period), and their rows outside them.
pub(super) async fn sink_rows_outside(
    sink: &Table,
    touched: &BTreeSet<i64>,
) -> Result<SinkRewrite> {
    sink_rows_of(sink, touched, false).await
}

/// [`sink_rows_outside`], with the rows inside the touched windows too (what a merge adds the
/// delta's partial aggregates to). They come from exactly the files the commit replaces.
pub(super) async fn sink_rows_split(sink: &Table, touched: &BTreeSet<i64>) -> Result<SinkRewrite> {
    sink_rows_of(sink, touched, true).await
}

async fn sink_rows_of(sink: &Table, touched: &BTreeSet<i64>, inside: bool) -> Result<SinkRewrite> {
    if touched.is_empty() {
        return Ok(SinkRewrite {
            paths: Vec::new(),
            kept: Vec::new(),
            bytes: 0,
            inside: Vec::new(),
            read: ReadCost::default(),
        });
    }
    sink_rewrite(
        sink,
        |min, max, _| touched.range(min..=max).next().is_some(),
        |_, _, _| false,
        |w| w.is_some_and(|w| touched.contains(&w)),
        false,
        inside,
    )
    .await
}

/// Sink files that may hold rows of windows in `span` (by their `window_start` min/max, and
/// their null counts for the span open below), and their rows outside it. A sink without
/// `window_start` (another transform's) is all in the span open below. Files wholly inside
/// the span are replaced without being read: what a chunk reads of the sink is the files
/// across its two ends (a partitioned sink: those periods' files).
pub(super) async fn sink_rows_outside_span(sink: &Table, span: Span) -> Result<SinkRewrite> {
    sink_rewrite(
        sink,
        |min, max, nulls| span.meets(min, max) || (span.lo.is_none() && nulls),
        |min, max, nulls| {
            span.contains(Some(min)) && span.contains(Some(max)) && (!nulls || span.lo.is_none())
        },
        |w| span.contains(w),
        span.lo.is_none(),
        false,
    )
    .await
}

/// The sink files `affects` says may hold rows to replace (given their `window_start` min, max
/// and whether they may hold nulls; files without bounds always), and their rows whose window
/// `replaced` does not take (rows without `window_start` are replaced when `missing`). Files
/// `covered` says hold only rows to replace are removed without being read. `want_inside`: the
/// rows to replace are returned too.
async fn sink_rewrite(
    sink: &Table,
    affects: impl Fn(i64, i64, bool) -> bool,
    covered: impl Fn(i64, i64, bool) -> bool,
    replaced: impl Fn(Option<i64>) -> bool,
    missing: bool,
    want_inside: bool,
) -> Result<SinkRewrite> {
    let field = sink
        .metadata()
        .current_schema()
        .field_by_name(WINDOW_START)
        .map(|f| f.id);
    let bound = |d: Option<&Datum>| match d.map(|d| (d.data_type(), d.literal())) {
        Some((
            PrimitiveType::Timestamp | PrimitiveType::Timestamptz | PrimitiveType::Long,
            PrimitiveLiteral::Long(v),
        )) => Some(*v),
        _ => None,
    };
    // (file, whether it holds only rows to replace)
    let affected: Vec<(LiveFile, bool)> = crate::scan::live_files(sink)
        .await?
        .into_iter()
        .filter_map(|f| {
            let Some(id) = field else {
                return Some((f, false));
            };
            let min = bound(f.file.lower_bounds().get(&id));
            let max = bound(f.file.upper_bounds().get(&id));
            let nulls = f.file.null_value_counts().get(&id).is_none_or(|n| *n > 0);
            match (min, max) {
                (Some(min), Some(max)) if affects(min, max, nulls) => {
                    let all = covered(min, max, nulls);
                    Some((f, all))
                }
                (Some(_), Some(_)) => None,
                _ => Some((f, false)),
            }
        })
        .collect();
    let paths = affected
        .iter()
        .map(|(f, _)| f.file.file_path().to_string())
        .collect();
    let bytes = affected
        .iter()
        .map(|(f, _)| f.file.file_size_in_bytes())
        .sum();
    let to_read: Vec<LiveFile> = affected
        .into_iter()
        .filter(|(_, all)| !all)
        .map(|(f, _)| f)
        .collect();
    let (_, rows, read) = input::read_rows_costed(sink, &to_read).await?;
    let keep_row = |w: Option<i64>| !replaced(w);
    let mut kept = Vec::new();
    let mut inside = Vec::new();
    let filter = |b: &RecordBatch, mask: &BooleanArray| {
        arrow::compute::filter_record_batch(b, mask)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("filtering sink rows: {e}")))
    };
    for b in rows {
        let keep = window_mask(&b, &keep_row, !missing);
        if want_inside {
            let rest = filter(
                &b,
                &arrow::compute::not(&keep).map_err(|e| {
                    Error::new(ErrorKind::Internal, format!("filtering sink rows: {e}"))
                })?,
            )?;
            if rest.num_rows() > 0 {
                inside.push(rest);
            }
        }
        let b = filter(&b, &keep)?;
        if b.num_rows() > 0 {
            kept.push(b);
        }
    }
    Ok(SinkRewrite {
        paths,
        kept,
        bytes,
        inside,
        read,
    })
}

/// The partition spec of a new aggregate sink: `window_start` by day for windows up to an
/// hour, by month up to a day, by year above (a sink file holds one period, so a run rewrites
/// only the periods of the windows it touches; each period holds at least ~24 windows). None
/// when the SQL's `window_start` is not a timestamp.
pub(super) fn sink_partition(
    schema: &iceberg::spec::Schema,
    window: i64,
) -> Result<Option<UnboundPartitionSpec>> {
    let Some(field) = schema.field_by_name(WINDOW_START) else {
        return Ok(None);
    };
    if !matches!(
        field.field_type.as_ref(),
        Type::Primitive(PrimitiveType::Timestamp | PrimitiveType::Timestamptz)
    ) {
        return Ok(None);
    }
    const HOUR: i64 = 3_600_000_000;
    let (transform, name) = if window <= HOUR {
        (Transform::Day, "window_start_day")
    } else if window <= 24 * HOUR {
        (Transform::Month, "window_start_month")
    } else {
        (Transform::Year, "window_start_year")
    };
    let spec = UnboundPartitionSpec::builder()
        .with_spec_id(0)
        .add_partition_field(field.id, name, transform)
        .map_err(|e| Error::iceberg("the sink's partition spec", e))?
        .build();
    Ok(Some(spec))
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000_000;

    #[test]
    fn ranges_join_adjacent_windows_and_stay_few() {
        let touched: BTreeSet<i64> = [0, 1, 2, 5, 9, 10].iter().map(|w| w * MIN).collect();
        assert_eq!(
            ranges(&touched, MIN, 64),
            vec![(0, 3 * MIN), (5 * MIN, 6 * MIN), (9 * MIN, 11 * MIN)]
        );
        // The smallest gap (5 → 9 is 3 windows, 2 → 5 is 2) closes first.
        assert_eq!(
            ranges(&touched, MIN, 2),
            vec![(0, 6 * MIN), (9 * MIN, 11 * MIN)]
        );
        assert_eq!(ranges(&touched, MIN, 1), vec![(0, 11 * MIN)]);
        assert!(ranges(&BTreeSet::new(), MIN, 4).is_empty());
        // Thousands of scattered windows: at most the cap, every window still covered.
        let scattered: BTreeSet<i64> = (0..5_000).map(|i| i * i % 100_003 * MIN).collect();
        let r = ranges(&scattered, MIN, MAX_RANGES);
        assert!(r.len() <= MAX_RANGES && !r.is_empty(), "{}", r.len());
        for w in &scattered {
            assert!(
                r.iter().any(|(lo, hi)| lo <= w && w < hi),
                "{w} not covered"
            );
        }
        assert!(r.windows(2).all(|p| p[0].1 < p[1].0), "ordered, disjoint");
    }

    #[test]
    fn equal_gaps_do_not_collapse_the_ranges() {
        // One event a day at noon for 100 days, 1-minute windows: 100 equal gaps.
        let day = 1440 * MIN;
        let touched: BTreeSet<i64> = (0..100).map(|d| d * day + 720 * MIN).collect();
        let r = ranges(&touched, MIN, MAX_RANGES);
        assert_eq!(r.len(), MAX_RANGES, "{r:?}");
        let span: i64 = r.iter().map(|(lo, hi)| hi - lo).sum();
        assert!(span <= 40 * day, "{} days read", span / day);
        for w in &touched {
            assert!(
                r.iter().any(|(lo, hi)| lo <= w && w < hi),
                "{w} not covered"
            );
        }
    }

    #[test]
    fn aggregate_sinks_are_partitioned_by_the_period_of_their_windows() {
        use iceberg::spec::{NestedField, Schema};
        let schema = |ty: PrimitiveType| {
            Schema::builder()
                .with_fields(vec![
                    NestedField::optional(1, "region", Type::Primitive(PrimitiveType::String))
                        .into(),
                    NestedField::optional(2, WINDOW_START, Type::Primitive(ty)).into(),
                ])
                .build()
                .unwrap()
        };
        let tz = schema(PrimitiveType::Timestamptz);
        for (window, transform) in [
            (MIN, Transform::Day),
            (60 * MIN, Transform::Day),
            (6 * 60 * MIN, Transform::Month),
            (7 * 24 * 60 * MIN, Transform::Year),
        ] {
            let spec = sink_partition(&tz, window).unwrap().unwrap();
            let f = &spec.fields()[0];
            assert_eq!((f.source_id, f.transform), (2, transform), "{window}");
        }
        assert!(sink_partition(&schema(PrimitiveType::Timestamp), MIN)
            .unwrap()
            .is_some());
        assert!(sink_partition(&schema(PrimitiveType::String), MIN)
            .unwrap()
            .is_none());
    }
}
