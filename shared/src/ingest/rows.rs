//! One object's rows: decode ‖ write. The object is streamed (never held whole) through
//! decompression and decoding on a blocking thread; batches cross a small bounded channel to the
//! writer, which adds `_ingested_at` and `_source`, splits by partition and rolls Parquet files at
//! the target size. Rejected records are spooled to a local file for the quarantine object.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, DictionaryArray, Int32Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::Int32Type;
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, Utc};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{DataFile, PrimitiveType};
use iceberg::table::Table;
use serde_json::json;
use tokio_util::io::SyncIoBridge;

use super::TableCtx;
use crate::config::RouteConfig;
use crate::decode::{self, DecodeFailure, DecodeSpec, Piece, Rejected};
use crate::error::{Error, ErrorKind, Result};
use crate::quality::Contract;
use crate::schema::{self, INGESTED_AT, QUALITY, SOURCE};
use crate::write::build_sink;

pub(super) fn micros_to_rfc3339(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339())
        .unwrap_or_default()
}

/// The local file rejected records are spooled to, removed when dropped: on every path, error
/// and cancellation included, so a warm Lambda's /tmp does not fill up.
#[derive(Debug)]
pub(super) struct SpoolFile(std::path::PathBuf);

impl SpoolFile {
    /// Its path.
    pub(super) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The error of an object whose rejected records exceed `max_quarantine_bytes`.
pub(super) fn quarantine_limit(uri: &str, limit: u64) -> Error {
    // A mostly invalid object: failed whole like the other whole-object limits (not
    // acknowledged as quarantined, which would need unbounded disk).
    Error::new(
        ErrorKind::UnreadableObject,
        format!(
            "{uri}: its rejected records exceed max_quarantine_bytes = {limit}; nothing committed"
        ),
    )
    .with_retryable(false)
}

pub(super) struct Written {
    pub(super) files: Vec<DataFile>,
    pub(super) records_in: u64,
    pub(super) rows: u64,
    pub(super) quarantined: u64,
    pub(super) unknown: BTreeMap<String, Option<PrimitiveType>>,
    pub(super) widen: BTreeMap<String, PrimitiveType>,
    pub(super) deprecated_seen: std::collections::BTreeSet<String>,
    pub(super) quarantine_spool: Option<SpoolFile>,
    /// Rejected records went over `max_quarantine_bytes` in a pass whose limit was deferred
    /// (the spool stopped there): the object fails unless a second pass follows.
    pub(super) quarantine_over_limit: bool,
    pub(super) et_min: Option<i64>,
    pub(super) et_max: Option<i64>,
    pub(super) late: u64,
    pub(super) max_lateness_us: i64,
    /// Per data-quality check: its name, action and the records that failed it.
    pub(super) quality: Vec<(String, crate::config::Action, u64)>,
}

pub(super) enum WriteFailure {
    /// The object cannot be read at all (quarantined whole).
    Unreadable(String),
    /// A record failed a check whose action is `fail` (the reason names both): the object is
    /// refused whole (quarantined whole); the counts of each check up to there.
    Contract(String, Vec<(String, crate::config::Action, u64)>),
    /// Anything else (retryable or not, as the error says).
    Error(Error),
}

impl From<Error> for WriteFailure {
    fn from(e: Error) -> Self {
        WriteFailure::Error(e)
    }
}

/// The per-object settings of [`write_object`].
pub(super) struct WriteParams<'a> {
    pub(super) uri: &'a str,
    /// The identity stored in every row's `_source` (`s3://bucket/key#version`).
    pub(super) source_id: &'a str,
    pub(super) writer_id: &'a str,
    pub(super) ingested_at: DateTime<Utc>,
    pub(super) chunk_records: usize,
    pub(super) late_after_seconds: i64,
    pub(super) allow_unknown: bool,
    pub(super) hash_key: Option<&'a [u8]>,
    pub(super) limits: decode::Limits,
    /// Most bytes of rejected records the object may quarantine (`max_quarantine_bytes`).
    pub(super) max_quarantine_bytes: u64,
    /// Do not fail at the limit, only stop spooling and note it (a first pass that may be
    /// redone with an evolved schema, under which its rejected rows may fit).
    pub(super) defer_quarantine_limit: bool,
    /// The object's stored size (Content-Length), when known.
    pub(super) object_size: Option<u64>,
    /// Appended to every quarantined record's reason (a refused schema change, see
    /// `consumer_gate`); counted against `max_quarantine_bytes` like the rest of the line.
    pub(super) reason_note: Option<&'a str>,
    /// Fields whose value quarantines the record, each with the reason (the refused part of a
    /// schema change: a consumer it would break, a column limit, a name no column takes).
    pub(super) refused: Option<&'a std::collections::BTreeMap<String, String>>,
    /// Most distinct keys `unique` checks remember (`max_unique_keys`).
    pub(super) max_unique_keys: usize,
}

pub(super) async fn write_object(
    table: &Table,
    tctx: &TableCtx,
    route: &RouteConfig,
    body: std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>,
    params: &WriteParams<'_>,
) -> std::result::Result<Written, WriteFailure> {
    let WriteParams {
        uri,
        source_id,
        writer_id,
        ingested_at,
        chunk_records,
        late_after_seconds,
        allow_unknown,
        hash_key,
        limits,
        max_quarantine_bytes,
        defer_quarantine_limit,
        object_size,
        reason_note,
        refused,
        max_unique_keys,
    } = *params;
    let deprecated: Vec<String> = tctx.cfg.deprecations().into_keys().collect();
    let iceberg_schema = table.metadata().current_schema().clone();
    let arrow_schema: SchemaRef = Arc::new(
        schema_to_arrow_schema(&iceberg_schema)
            .map_err(|e| Error::iceberg(format!("schema of {}", tctx.ident), e))?,
    );
    let decode_schema = schema::decode_schema(&arrow_schema);
    let written_schema = written_schema(table, &arrow_schema);
    let held = crate::evolve::held_by_partitions(table.metadata());
    let mut required: Vec<String> = iceberg_schema
        .as_struct()
        .fields()
        .iter()
        .filter(|f| f.required && !f.name.starts_with('_'))
        .map(|f| f.name.clone())
        .collect();
    // A flat change record must carry its operation and time.
    for col in route.cdc_columns() {
        if !required.contains(&col) {
            required.push(col);
        }
    }
    let spec = DecodeSpec {
        format: route.format,
        key: uri.to_string(),
        schema: decode_schema,
        required,
        chunk_records,
        allow_unknown,
        // Columns the table dropped: inputs still carrying them are not refused for it.
        ignored: crate::evolve::dropped_columns(table.metadata()),
        refused: refused.cloned().unwrap_or_default(),
        debezium: route.cdc == Some(crate::config::Cdc::Debezium),
    };
    // The contract is compiled against this pass's decode schema (an evolved one may have
    // widened a checked column), counting from this object's ingestion time.
    let mut contract = Contract::compile(
        &tctx.cfg.checks,
        &spec.schema,
        ingested_at.timestamp_micros(),
        max_unique_keys,
    )
    .map_err(|reason| {
        Error::new(
            ErrorKind::Config,
            format!("table `{}`: {reason}", tctx.cfg.name),
        )
    })?;
    super::recent_keys::remember_recent_keys(
        table,
        &tctx.cfg.event_time,
        &mut contract,
        ingested_at.timestamp_micros(),
    )
    .await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Piece>(2);
    let decoder = tokio::task::spawn_blocking(move || {
        let reader = SyncIoBridge::new(body);
        let mut send = |p: Piece| tx.blocking_send(p).is_ok();
        let result = decode::decode_checked(
            reader,
            &spec,
            &limits,
            object_size,
            Some(&mut contract),
            &mut send,
        );
        (result, contract.counts())
    });

    let target = (tctx.cfg.target_file_size_mb as usize) << 20;
    let mut sink = build_sink(table, target, writer_id)
        .map_err(|e| Error::iceberg(format!("writer for {}", tctx.ident), e))?;
    let mut w = Written {
        files: Vec::new(),
        records_in: 0,
        rows: 0,
        quarantined: 0,
        unknown: BTreeMap::new(),
        widen: BTreeMap::new(),
        deprecated_seen: Default::default(),
        quarantine_spool: None,
        quarantine_over_limit: false,
        et_min: None,
        et_max: None,
        late: 0,
        max_lateness_us: 0,
        quality: Vec::new(),
    };
    let mut spool: Option<std::io::BufWriter<std::fs::File>> = None;
    let mut spooled: u64 = 0;
    let ingested_us = ingested_at.timestamp_micros();
    let late_us = late_after_seconds.saturating_mul(1_000_000);
    let et_col = tctx.cfg.event_time.clone();
    let mut write_err: Option<Error> = None;
    while let Some(piece) = rx.recv().await {
        match piece {
            Piece::Batch(batch) => {
                let n = batch.num_rows();
                for d in &deprecated {
                    if let Some(c) = batch.column_by_name(d) {
                        if c.null_count() < c.len() {
                            w.deprecated_seen.insert(d.clone());
                        }
                    }
                }
                if let Ok(idx) = batch.schema().index_of(&et_col) {
                    event_time_stats(batch.column(idx), ingested_us, late_us, &mut w);
                }
                let full = match crate::protect::protect(&batch, &tctx.cfg, hash_key)
                    .and_then(|b| with_floe_columns(&b, &written_schema, ingested_us, source_id))
                {
                    Ok(b) => b,
                    Err(e) => {
                        write_err = Some(e);
                        break;
                    }
                };
                if let Err(e) = sink.write(full).await {
                    write_err = Some(Error::iceberg(format!("writing data files for {uri}"), e));
                    break;
                }
                w.rows += n as u64;
            }
            Piece::Rejected(rejected) => {
                w.quarantined += rejected.len() as u64;
                if w.quarantine_over_limit {
                    continue;
                }
                let budget = max_quarantine_bytes.saturating_sub(spooled);
                let out = Spool {
                    file: &mut spool,
                    path: &mut w.quarantine_spool,
                    uri,
                    note: reason_note,
                    held: &held,
                };
                match spool_rejected(out, &rejected, budget) {
                    Ok(Spooled::Within(bytes)) => spooled += bytes,
                    Ok(Spooled::OverBudget) if defer_quarantine_limit => {
                        w.quarantine_over_limit = true;
                    }
                    Ok(Spooled::OverBudget) => {
                        write_err = Some(quarantine_limit(uri, max_quarantine_bytes));
                        break;
                    }
                    Err(e) => {
                        write_err = Some(e);
                        break;
                    }
                }
            }
            Piece::UnknownFields(u) => {
                for (k, t) in u {
                    crate::decode::merge_unknown(&mut w.unknown, k, t);
                }
            }
            Piece::Widen(u) => w.widen.extend(u),
        }
    }
    drop(rx);
    if let Some(mut s) = spool.take() {
        if let Err(e) = s.flush() {
            write_err.get_or_insert(
                Error::new(ErrorKind::Storage, "flushing quarantine spool").with_source(e),
            );
        }
    }
    let (decoded, quality) = decoder.await.map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("decoder task for {uri} failed: {e}"),
        )
    })?;
    w.quality = quality;
    let files = sink.close().await;
    // The spool goes with `w` (dropped on these paths); the data files are deleted here.
    let cleanup = |files: &iceberg::Result<Vec<DataFile>>| -> Vec<String> {
        files
            .as_ref()
            .map(|f| f.iter().map(|d| d.file_path().to_string()).collect())
            .unwrap_or_default()
    };
    if let Some(e) = write_err {
        let paths = cleanup(&files);
        for p in paths {
            let _ = table.file_io().delete(&p).await;
        }
        return Err(WriteFailure::Error(e));
    }
    match decoded {
        Ok(seen) => w.records_in = seen,
        Err(failure) => {
            let paths = cleanup(&files);
            for p in paths {
                let _ = table.file_io().delete(&p).await;
            }
            return Err(match failure {
                DecodeFailure::Unreadable(reason) => WriteFailure::Unreadable(reason),
                DecodeFailure::Contract(reason) => {
                    WriteFailure::Contract(reason, std::mem::take(&mut w.quality))
                }
                DecodeFailure::Transient(e) => WriteFailure::Error(
                    Error::new(ErrorKind::Storage, format!("reading {uri}"))
                        .with_retryable(true)
                        .with_source(e),
                ),
                DecodeFailure::Closed => WriteFailure::Error(Error::new(
                    ErrorKind::Internal,
                    format!("writer for {uri} stopped early"),
                )),
                // Over a limit as a whole: not quarantined and acknowledged (its valid data would
                // be silently skipped) but failed, and not retryable: it goes to the DLQ.
                DecodeFailure::Limit(reason) => WriteFailure::Error(
                    Error::new(ErrorKind::UnreadableObject, format!("{uri}: {reason}"))
                        .with_retryable(false),
                ),
                DecodeFailure::Spool(e) => WriteFailure::Error(
                    Error::new(ErrorKind::Storage, format!("spooling {uri} to local disk"))
                        .with_retryable(true)
                        .with_source(e),
                ),
            });
        }
    }
    w.files = files.map_err(|e| Error::iceberg(format!("closing data files for {uri}"), e))?;
    Ok(w)
}

fn event_time_stats(col: &ArrayRef, ingested_us: i64, late_us: i64, w: &mut Written) {
    let Some(ts) = col.as_any().downcast_ref::<TimestampMicrosecondArray>() else {
        return;
    };
    for v in ts.iter().flatten() {
        w.et_min = Some(w.et_min.map_or(v, |m| m.min(v)));
        w.et_max = Some(w.et_max.map_or(v, |m| m.max(v)));
        let lateness = ingested_us - v;
        if lateness > late_us {
            w.late += 1;
        }
        if lateness > w.max_lateness_us {
            w.max_lateness_us = lateness;
        }
    }
}

/// The schema an object's batches are written with: the table's (`arrow_schema`), `_source` as
/// a dictionary of one value. Every row of an object carries the same identity; as a plain
/// string column each batch copied it once per row, and Parquet's writer then hashed and
/// compared each copy (~6 % of ingesting a big object on one core, spread over memory). The
/// file is the same: Parquet's dictionary encoding, the column's own type (the file's schema
/// comes from the table's, not from the batch). A table partitioned by `_source` keeps the
/// plain column, which partition transforms read.
fn written_schema(table: &Table, arrow_schema: &SchemaRef) -> SchemaRef {
    let md = table.metadata();
    let partitioned_by_source = md.current_schema().field_by_name(SOURCE).is_some_and(|f| {
        md.default_partition_spec()
            .fields()
            .iter()
            .any(|p| p.source_id == f.id)
    });
    if partitioned_by_source {
        return arrow_schema.clone();
    }
    let fields: Vec<Arc<Field>> = arrow_schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 if f.name() == SOURCE => Arc::new(
                Field::new(
                    f.name(),
                    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                    f.is_nullable(),
                )
                .with_metadata(f.metadata().clone()),
            ),
            _ => f.clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        arrow_schema.metadata().clone(),
    ))
}

/// Adds `_ingested_at` and `_source` (the object's identity `s3://bucket/key#version`, the
/// durable duplicate check's key) and puts the columns in the table's order and types
/// (`target`, from [`written_schema`]).
fn with_floe_columns(
    batch: &RecordBatch,
    target: &SchemaRef,
    ingested_us: i64,
    uri: &str,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for f in target.fields() {
        let col: ArrayRef = if f.name() == INGESTED_AT {
            let tz = match f.data_type() {
                DataType::Timestamp(TimeUnit::Microsecond, tz) => tz.clone(),
                _ => Some("+00:00".into()),
            };
            Arc::new(TimestampMicrosecondArray::from_value(ingested_us, n).with_timezone_opt(tz))
        } else if f.name() == SOURCE {
            if matches!(f.data_type(), DataType::Dictionary(..)) {
                let one = DictionaryArray::<Int32Type>::try_new(
                    Int32Array::from_value(0, n),
                    Arc::new(StringArray::from_iter_values([uri])),
                )
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Internal,
                        format!("the `{SOURCE}` column of {uri}"),
                    )
                    .with_source(e)
                })?;
                Arc::new(one)
            } else {
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(uri, n)))
            }
        } else if f.name() == QUALITY && batch.column_by_name(QUALITY).is_none() {
            // The table flags (or once did) but this contract has no flag check: none failed.
            arrow::array::new_null_array(f.data_type(), n)
        } else {
            let idx = batch.schema().index_of(f.name()).map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("decoded batch lacks column `{}`", f.name()),
                )
                .with_source(e)
            })?;
            batch.column(idx).clone()
        };
        cols.push(col);
    }
    RecordBatch::try_new(target.clone(), cols).map_err(|e| {
        Error::new(ErrorKind::Internal, format!("assembling rows of {uri}")).with_source(e)
    })
}

/// What [`spool_rejected`] did.
enum Spooled {
    /// All records spooled: their bytes.
    Within(u64),
    /// The budget ran out at a record (spooled up to there).
    OverBudget,
}

/// An object's quarantine spool (created on first use) and what each of its lines carries.
struct Spool<'s> {
    file: &'s mut Option<std::io::BufWriter<std::fs::File>>,
    path: &'s mut Option<SpoolFile>,
    uri: &'s str,
    /// Appended to every reason (`reason; note`).
    note: Option<&'s str>,
    /// Columns a partition keeps from widening, with why: appended to a reason that a value is
    /// out of range for such a column.
    held: &'s std::collections::BTreeMap<String, String>,
}

/// Appends `rejected` to the object's quarantine spool until `budget` bytes are used up; each
/// line is counted as written, note included.
fn spool_rejected(out: Spool<'_>, rejected: &[Rejected], budget: u64) -> Result<Spooled> {
    let Spool {
        file: spool,
        path,
        uri,
        note,
        held,
    } = out;
    // A full disk is worth a retry (another container, or after cleanup), like the Parquet spool.
    let io = |e: std::io::Error| {
        Error::new(ErrorKind::Storage, "writing quarantine spool")
            .with_retryable(true)
            .with_source(e)
    };
    if spool.is_none() {
        let p =
            std::env::temp_dir().join(format!("floe-quarantine-{}.jsonl", uuid::Uuid::new_v4()));
        let file = std::fs::File::create(&p).map_err(io)?;
        *path = Some(SpoolFile(p));
        *spool = Some(std::io::BufWriter::new(file));
    }
    let mut bytes = 0;
    if let Some(s) = spool.as_mut() {
        for r in rejected {
            let mut reason = match note {
                Some(n) => format!("{}; {n}", r.reason),
                None => r.reason.clone(),
            };
            if reason.contains("out of range") {
                if let Some((_, why)) = held.iter().find(|(col, _)| {
                    reason.contains(&format!("'{col}'")) || reason.contains(&format!("`{col}`"))
                }) {
                    reason = format!("{reason}; {why}");
                }
            }
            let line = json!({"source": uri, "record": r.record, "raw": r.raw, "reason": reason});
            let mut buf = serde_json::to_vec(&line).map_err(|e| io(e.into()))?;
            buf.push(b'\n');
            if bytes + buf.len() as u64 > budget {
                return Ok(Spooled::OverBudget);
            }
            s.write_all(&buf).map_err(io)?;
            bytes += buf.len() as u64;
        }
    }
    Ok(Spooled::Within(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spool_file_is_removed_when_dropped() {
        let p = std::env::temp_dir().join(format!("floe-spool-test-{}", uuid::Uuid::new_v4()));
        std::fs::write(&p, b"x").unwrap();
        let spool = SpoolFile(p.clone());
        assert!(spool.path().exists());
        drop(spool);
        assert!(!p.exists(), "the spool outlived its owner");
    }

    fn spool_of<'s>(
        file: &'s mut Option<std::io::BufWriter<std::fs::File>>,
        path: &'s mut Option<SpoolFile>,
    ) -> Spool<'s> {
        Spool {
            file,
            path,
            uri: "s3://b/k",
            note: None,
            held: &NO_HELD,
        }
    }

    static NO_HELD: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();

    #[test]
    fn spooling_stops_at_the_record_that_crosses_the_budget() {
        let rec = |i: u64| Rejected {
            record: i,
            raw: "x".repeat(100),
            reason: "bad".into(),
        };
        let rejected: Vec<Rejected> = (0..10).map(rec).collect();
        let (mut spool, mut path) = (None, None);
        let out = spool_rejected(spool_of(&mut spool, &mut path), &rejected, 500).unwrap();
        assert!(matches!(out, Spooled::OverBudget));
        drop(spool);
        let written = std::fs::read_to_string(path.as_ref().unwrap().path()).unwrap();
        assert!(written.len() <= 500, "{} bytes spooled", written.len());
        assert!(written.lines().count() >= 1);
        let (mut spool, mut path) = (None, None);
        match spool_rejected(spool_of(&mut spool, &mut path), &rejected, 1 << 20).unwrap() {
            Spooled::Within(n) => assert!(n > 1000),
            Spooled::OverBudget => panic!("over a 1 MiB budget"),
        }
    }

    #[test]
    fn the_note_is_in_every_reason_and_within_the_budget() {
        let rejected: Vec<Rejected> = (0..10)
            .map(|i| Rejected {
                record: i,
                raw: "x".repeat(10),
                reason: "bad".into(),
            })
            .collect();
        let note = "n".repeat(100);
        let (mut spool, mut path) = (None, None);
        let out = Spool {
            file: &mut spool,
            path: &mut path,
            uri: "s3://b/k",
            note: Some(&note),
            held: &NO_HELD,
        };
        // Without the note the ten lines fit 1000 bytes; with it they do not.
        assert!(matches!(
            spool_rejected(out, &rejected, 1000).unwrap(),
            Spooled::OverBudget
        ));
        drop(spool);
        let written = std::fs::read_to_string(path.as_ref().unwrap().path()).unwrap();
        assert!(written.len() <= 1000, "{} bytes spooled", written.len());
        for line in written.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["reason"], format!("bad; {note}"));
        }
    }

    /// An in-memory table of (id long, _ingested_at timestamptz, _source string), partitioned
    /// by `partition` (a partition spec's fields, JSON).
    fn source_table(partition: serde_json::Value) -> Table {
        crate::write::memory_table(json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c3",
            "location": "memory:///w/src", "last-sequence-number": 0, "last-updated-ms": 1000,
            "last-column-id": 3, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "id", "required": false, "type": "long"},
                {"id": 2, "name": INGESTED_AT, "required": false, "type": "timestamptz"},
                {"id": 3, "name": SOURCE, "required": false, "type": "string"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": partition}],
            "last-partition-id": 1000, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {}, "snapshots": [], "snapshot-log": [], "metadata-log": [],
            "refs": {}
        }))
    }

    /// `_source` is written from a one-value dictionary, yet the file is what a plain column
    /// makes: a string column (as the table's schema and any reader have it) holding the
    /// object's identity in every row, with exact bounds for the duplicate check; a table
    /// partitioned by `_source` gets the plain column its partition transform reads.
    #[tokio::test]
    async fn every_row_carries_the_object_identity_as_a_plain_string_column() {
        use arrow::array::{AsArray, Int64Array};
        use iceberg::spec::Datum;
        let uri = "s3://landing/orders/2026/12/07/part-0001.json.gz#3HL4kqtJlcpXroDTDmJ";
        for (partition, dictionary) in [
            (json!([]), true),
            (
                json!([{"source-id": 3, "field-id": 1000, "name": "src", "transform": "identity"}]),
                false,
            ),
        ] {
            let t = source_table(partition);
            let arrow = Arc::new(schema_to_arrow_schema(t.metadata().current_schema()).unwrap());
            let target = written_schema(&t, &arrow);
            assert_eq!(
                matches!(
                    target.field_with_name(SOURCE).unwrap().data_type(),
                    DataType::Dictionary(..)
                ),
                dictionary
            );
            let mut sink = build_sink(&t, 1 << 30, "w").unwrap();
            let n = 20_000;
            for start in [0, n] {
                let ids = Int64Array::from_iter_values(start..start + n);
                let decoded =
                    RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef)]).unwrap();
                let full =
                    with_floe_columns(&decoded, &target, 1_765_000_000_000_000, uri).unwrap();
                sink.write(full).await.unwrap();
            }
            let files = sink.close().await.unwrap();
            assert_eq!(files.len(), 1);
            let f = &files[0];
            assert_eq!(f.record_count(), 2 * n as u64);
            let exact = Datum::string(uri);
            assert_eq!(f.lower_bounds().get(&3), Some(&exact));
            assert_eq!(f.upper_bounds().get(&3), Some(&exact));
            let bytes = t
                .file_io()
                .new_input(f.file_path())
                .unwrap()
                .read()
                .await
                .unwrap();
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .unwrap();
            let column = reader.metadata().row_group(0).column(2);
            assert_eq!(column.column_path().string(), SOURCE);
            assert!(
                column
                    .encodings()
                    .any(|e| e == parquet::basic::Encoding::RLE_DICTIONARY),
                "{:?}",
                column.encodings().collect::<Vec<_>>()
            );
            let mut rows = 0;
            for b in reader.build().unwrap() {
                let b = b.unwrap();
                let c = b.column_by_name(SOURCE).unwrap();
                assert_eq!(c.data_type(), &DataType::Utf8, "as the table has it");
                assert!(c.as_string::<i32>().iter().all(|v| v == Some(uri)));
                rows += b.num_rows();
            }
            assert_eq!(rows, 2 * n as usize);
        }
    }
}
