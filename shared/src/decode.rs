//! Streaming decode: bytes of one object → Arrow batches typed by the table, plus rejected records.
//!
//! Runs synchronously (inside `spawn_blocking`) and hands its output to a sink piece by piece, so
//! memory holds one chunk of records at a time whatever the object's size. Input is decoded a chunk
//! at a time with arrow-rs; when a chunk fails, it is split in halves until the bad records are
//! isolated, so one bad line costs a few extra decodes instead of failing the object.

use std::collections::BTreeMap;

use iceberg::spec::PrimitiveType;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::{cast_with_options, filter_record_batch, CastOptions};
use arrow::error::ArrowError;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::config::Format;
use crate::store::is_transient_io;

/// Compression of an object, from its key suffix or its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain bytes.
    None,
    /// gzip (`.gz` or magic `1f 8b`).
    Gzip,
    /// Zstandard (`.zst` or magic `28 b5 2f fd`).
    Zstd,
}

/// Detects compression from the magic bytes, falling back to the key suffix.
pub fn detect_compression(key: &str, head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else if head.is_empty() && key.ends_with(".gz") {
        Compression::Gzip
    } else if head.is_empty() && key.ends_with(".zst") {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// A record that cannot go into the table, with where it was and why.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// Line number (JSON lines, CSV) or row number (Parquet), 1-based.
    pub record: u64,
    /// The record's raw text (for Parquet, the row as JSON).
    pub raw: String,
    /// What was expected and what was found.
    pub reason: String,
}

/// One piece of decode output.
#[derive(Debug)]
pub enum Piece {
    /// Valid rows, typed by the decode schema.
    Batch(RecordBatch),
    /// Records that go to quarantine.
    Rejected(Vec<Rejected>),
    /// Fields present in the input but not in the table, with the type their values suggest
    /// (`None` when no value said: nulls, nested values).
    UnknownFields(BTreeMap<String, Option<PrimitiveType>>),
    /// Known fields whose input values need a wider type (e.g. an int column given 2^40).
    Widen(BTreeMap<String, PrimitiveType>),
}

/// Why decoding stopped.
#[derive(Debug, thiserror::Error)]
pub enum DecodeFailure {
    /// The object cannot be read as a whole: quarantine it, do not retry.
    #[error("unreadable object: {0}")]
    Unreadable(String),
    /// The transport failed: retry later.
    #[error("transient read failure: {0}")]
    Transient(std::io::Error),
    /// The consumer went away (it failed first).
    #[error("output closed")]
    Closed,
}

fn io_failure(e: std::io::Error) -> DecodeFailure {
    if is_transient_io(&e) {
        DecodeFailure::Transient(e)
    } else {
        DecodeFailure::Unreadable(e.to_string())
    }
}

/// What to decode and how.
#[derive(Debug, Clone)]
pub struct DecodeSpec {
    /// Input format.
    pub format: Format,
    /// Object key (for compression detection by suffix).
    pub key: String,
    /// Target schema: the table's user columns, all nullable.
    pub schema: SchemaRef,
    /// Names of the columns that must be non-null.
    pub required: Vec<String>,
    /// Records per chunk.
    pub chunk_records: usize,
    /// Whether fields the table lacks are tolerated (else the record is rejected: strict policy).
    pub allow_unknown: bool,
}

/// Decodes `input` per `spec`, sending pieces to `sink` (which returns false when closed).
/// Returns the number of records seen (valid + rejected).
pub fn decode<'a, R: Read + 'a>(
    input: R,
    spec: &DecodeSpec,
    sink: &mut dyn FnMut(Piece) -> bool,
) -> Result<u64, DecodeFailure> {
    let mut raw = BufReader::with_capacity(1 << 20, input);
    let head = raw.fill_buf().map_err(io_failure)?.to_vec();
    if head.is_empty() {
        return Err(DecodeFailure::Unreadable("object is empty".into()));
    }
    let compression = detect_compression(&spec.key, &head[..head.len().min(4)]);
    let reader: Box<dyn Read + 'a> = match compression {
        Compression::None => Box::new(raw),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(raw)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(raw)
                .map_err(|e| DecodeFailure::Unreadable(format!("zstd: {e}")))?,
        ),
    };
    let mut ctx = Ctx {
        spec,
        sink,
        seen: 0,
    };
    match spec.format {
        Format::Jsonl => decode_jsonl(reader, &mut ctx)?,
        Format::Csv => decode_csv(reader, &mut ctx)?,
        Format::Parquet => decode_parquet(reader, &mut ctx)?,
    }
    if ctx.seen == 0 {
        return Err(DecodeFailure::Unreadable("object holds no records".into()));
    }
    Ok(ctx.seen)
}

struct Ctx<'a> {
    spec: &'a DecodeSpec,
    sink: &'a mut dyn FnMut(Piece) -> bool,
    seen: u64,
}

impl Ctx<'_> {
    fn send(&mut self, piece: Piece) -> Result<(), DecodeFailure> {
        if (self.sink)(piece) {
            Ok(())
        } else {
            Err(DecodeFailure::Closed)
        }
    }

    /// Splits off rows with nulls in required columns, then emits the rest.
    fn emit_valid(
        &mut self,
        batch: RecordBatch,
        raws: &dyn Fn(usize) -> (u64, String),
    ) -> Result<(), DecodeFailure> {
        let mut bad: Vec<Option<String>> = Vec::new();
        for name in &self.spec.required {
            let Ok(idx) = batch.schema().index_of(name) else {
                continue;
            };
            let col = batch.column(idx);
            if col.null_count() == 0 {
                continue;
            }
            if bad.is_empty() {
                bad = vec![None; batch.num_rows()];
            }
            for (row, slot) in bad.iter_mut().enumerate() {
                if col.is_null(row) && slot.is_none() {
                    *slot = Some(format!("required field `{name}` is missing or null"));
                }
            }
        }
        if bad.is_empty() {
            return self.send(Piece::Batch(batch));
        }
        let (kept, rejected) = split_rejected(&batch, &bad, raws)?;
        self.send(Piece::Rejected(rejected))?;
        if kept.num_rows() > 0 {
            self.send(Piece::Batch(kept))?;
        }
        Ok(())
    }
}

/// Splits the rows that have a reason off `batch`: the kept rows, and the rejected records.
fn split_rejected(
    batch: &RecordBatch,
    reasons: &[Option<String>],
    raws: &dyn Fn(usize) -> (u64, String),
) -> Result<(RecordBatch, Vec<Rejected>), DecodeFailure> {
    let mut rejected = Vec::new();
    let keep: BooleanArray = reasons
        .iter()
        .enumerate()
        .map(|(row, reason)| match reason {
            Some(reason) => {
                let (record, raw) = raws(row);
                rejected.push(Rejected {
                    record,
                    raw,
                    reason: reason.clone(),
                });
                Some(false)
            }
            None => Some(true),
        })
        .collect();
    let kept = filter_record_batch(batch, &keep)
        .map_err(|e| DecodeFailure::Unreadable(format!("filter: {e}")))?;
    Ok((kept, rejected))
}

/// A chunk of text records: one buffer and the spans of its records.
#[derive(Default)]
struct TextChunk {
    buf: Vec<u8>,
    /// (start, end, record number)
    spans: Vec<(usize, usize, u64)>,
}

impl TextChunk {
    fn raw(&self, i: usize) -> (u64, String) {
        let (s, e, n) = self.spans[i];
        let text = String::from_utf8_lossy(&self.buf[s..e]);
        (n, text.trim_end_matches(['\r', '\n']).to_string())
    }
    fn clear(&mut self) {
        self.buf.clear();
        self.spans.clear();
    }
}

/// Decodes a byte range holding `n` records into one batch of `n` rows (or fails).
type ChunkDecoder<'a> = dyn Fn(&[u8], usize) -> Result<RecordBatch, ArrowError> + 'a;

/// Decodes records `range` of `chunk`; on failure, isolates bad records by halving.
fn decode_isolating(
    chunk: &TextChunk,
    range: std::ops::Range<usize>,
    decode_one: &ChunkDecoder<'_>,
    out: &mut Vec<(RecordBatch, usize)>,
    rejected: &mut Vec<Rejected>,
) {
    if range.is_empty() {
        return;
    }
    let start = chunk.spans[range.start].0;
    let end = chunk.spans[range.end - 1].1;
    match decode_one(&chunk.buf[start..end], range.len()) {
        Ok(batch) => out.push((batch, range.start)),
        Err(e) if range.len() == 1 => {
            let (record, raw) = chunk.raw(range.start);
            rejected.push(Rejected {
                record,
                raw,
                reason: clean_arrow_error(&e),
            });
        }
        Err(_) => {
            let mid = range.start + range.len() / 2;
            decode_isolating(chunk, range.start..mid, decode_one, out, rejected);
            decode_isolating(chunk, mid..range.end, decode_one, out, rejected);
        }
    }
}

fn clean_arrow_error(e: &ArrowError) -> String {
    let s = e.to_string();
    s.strip_prefix("Json error: ")
        .or_else(|| s.strip_prefix("Parser error: "))
        .or_else(|| s.strip_prefix("Csv error: "))
        .unwrap_or(&s)
        .to_string()
}

/// Emits a decoded text chunk: bad records isolated, required fields checked.
fn emit_text_chunk(
    ctx: &mut Ctx<'_>,
    chunk: &TextChunk,
    decode_one: &ChunkDecoder<'_>,
) -> Result<(), DecodeFailure> {
    ctx.seen += chunk.spans.len() as u64;
    let mut batches = Vec::new();
    let mut rejected = Vec::new();
    decode_isolating(
        chunk,
        0..chunk.spans.len(),
        decode_one,
        &mut batches,
        &mut rejected,
    );
    if !rejected.is_empty() {
        ctx.send(Piece::Rejected(rejected))?;
    }
    for (batch, offset) in batches {
        ctx.emit_valid(batch, &|row| chunk.raw(offset + row))?;
    }
    Ok(())
}

fn decode_json_bytes(
    schema: &SchemaRef,
    strict: bool,
    data: &[u8],
    rows: usize,
) -> Result<RecordBatch, ArrowError> {
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(rows.max(1))
        .with_strict_mode(strict)
        .build_decoder()?;
    let mut off = 0;
    while off < data.len() {
        let n = decoder.decode(&data[off..])?;
        if n == 0 {
            return Err(ArrowError::JsonError(
                "a line holds more than one JSON value".into(),
            ));
        }
        off += n;
    }
    let batch = decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone()));
    if batch.num_rows() != rows {
        return Err(ArrowError::JsonError(format!(
            "expected one JSON object per line, found {} values in {rows} lines",
            batch.num_rows()
        )));
    }
    Ok(batch)
}

/// Schema hints from a JSON object line: keys not in `known` with the type their value suggests,
/// and known int columns given integers beyond 32 bits.
fn scan_keys(
    line: &[u8],
    known: &BTreeMap<String, DataType>,
    unknown: &mut BTreeMap<String, Option<PrimitiveType>>,
    widen: &mut BTreeMap<String, PrimitiveType>,
) {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(line)
    else {
        return;
    };
    for (k, v) in map {
        match known.get(&k) {
            Some(DataType::Int32) => {
                if let Some(n) = v.as_i64() {
                    if i32::try_from(n).is_err() {
                        widen.insert(k, PrimitiveType::Long);
                    }
                }
            }
            Some(_) => {}
            None => {
                let t = json_type(&v);
                let slot = unknown.entry(k).or_insert(None);
                *slot = match (slot.take(), t) {
                    (None, t) => t,
                    (Some(a), None) => Some(a),
                    (Some(PrimitiveType::Long), Some(PrimitiveType::Double)) => {
                        Some(PrimitiveType::Double)
                    }
                    (Some(a), Some(b)) if a == b => Some(a),
                    (Some(PrimitiveType::Double), Some(PrimitiveType::Long)) => {
                        Some(PrimitiveType::Double)
                    }
                    (Some(_), Some(_)) => Some(PrimitiveType::String),
                };
            }
        }
    }
}

/// The Iceberg type a JSON value suggests (None for null and nested values).
fn json_type(v: &serde_json::Value) -> Option<PrimitiveType> {
    match v {
        serde_json::Value::Bool(_) => Some(PrimitiveType::Boolean),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(PrimitiveType::Long),
        serde_json::Value::Number(_) => Some(PrimitiveType::Double),
        serde_json::Value::String(_) => Some(PrimitiveType::String),
        _ => None,
    }
}

/// The Iceberg type of an Arrow type, where one exists.
pub fn arrow_to_primitive(t: &DataType) -> Option<PrimitiveType> {
    Some(match t {
        DataType::Boolean => PrimitiveType::Boolean,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16 => {
            PrimitiveType::Int
        }
        DataType::Int64 | DataType::UInt32 => PrimitiveType::Long,
        DataType::Float16 | DataType::Float32 => PrimitiveType::Float,
        DataType::Float64 => PrimitiveType::Double,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => PrimitiveType::String,
        DataType::Date32 => PrimitiveType::Date,
        DataType::Timestamp(_, Some(_)) => PrimitiveType::Timestamptz,
        DataType::Timestamp(_, None) => PrimitiveType::Timestamp,
        DataType::Decimal128(p, s) if *s >= 0 => PrimitiveType::Decimal {
            precision: *p as u32,
            scale: *s as u32,
        },
        _ => return None,
    })
}

fn decode_jsonl(reader: Box<dyn Read + '_>, ctx: &mut Ctx<'_>) -> Result<(), DecodeFailure> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let schema = ctx.spec.schema.clone();
    let known: BTreeMap<String, DataType> = schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let mut reported: BTreeMap<String, Option<PrimitiveType>> = BTreeMap::new();
    let mut widened: BTreeMap<String, PrimitiveType> = BTreeMap::new();
    let mut chunk = TextChunk::default();
    let mut line_no = 0u64;
    let limit = ctx.spec.chunk_records;
    loop {
        let start = chunk.buf.len();
        let n = reader
            .read_until(b'\n', &mut chunk.buf)
            .map_err(io_failure)?;
        let eof = n == 0;
        if !eof {
            line_no += 1;
            if chunk.buf[start..].iter().all(u8::is_ascii_whitespace) {
                chunk.buf.truncate(start);
            } else {
                chunk.spans.push((start, chunk.buf.len(), line_no));
            }
        }
        let full = chunk.spans.len() >= limit || chunk.buf.len() >= 64 << 20;
        if (full || eof) && !chunk.spans.is_empty() {
            // Fast path: strict decoding succeeds when the chunk has no unknown fields.
            let strict_ok = chunk.spans.first().zip(chunk.spans.last()).map(|(f, l)| {
                decode_json_bytes(&schema, true, &chunk.buf[f.0..l.1], chunk.spans.len())
            });
            match strict_ok {
                Some(Ok(batch)) => {
                    ctx.seen += chunk.spans.len() as u64;
                    ctx.emit_valid(batch, &|row| chunk.raw(row))?;
                }
                Some(Err(_)) => {
                    // Unknown fields, bad records or both: report the unknown fields (the
                    // error names only the first problem), then decode leniently, isolating bad records.
                    let mut found = BTreeMap::new();
                    let mut widen = BTreeMap::new();
                    for &(s, e, _) in &chunk.spans {
                        scan_keys(&chunk.buf[s..e], &known, &mut found, &mut widen);
                    }
                    let new: BTreeMap<String, Option<PrimitiveType>> = found
                        .into_iter()
                        .filter(|(k, t)| reported.get(k) != Some(t))
                        .collect();
                    if !new.is_empty() {
                        reported.extend(new.clone());
                        ctx.send(Piece::UnknownFields(new))?;
                    }
                    widen.retain(|k, t| widened.get(k) != Some(t));
                    if !widen.is_empty() {
                        widened.extend(widen.clone());
                        ctx.send(Piece::Widen(widen))?;
                    }
                    // Under a strict schema policy, lines with unknown fields are rejected.
                    let lenient_ok = ctx.spec.allow_unknown;
                    let decode =
                        |d: &[u8], rows: usize| decode_json_bytes(&schema, !lenient_ok, d, rows);
                    emit_text_chunk(ctx, &chunk, &decode)?;
                }
                None => {}
            }
            chunk.clear();
        }
        if eof {
            return Ok(());
        }
    }
}

fn decode_csv(reader: Box<dyn Read + '_>, ctx: &mut Ctx<'_>) -> Result<(), DecodeFailure> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .buffer_capacity(1 << 20)
        .from_reader(reader);
    let headers = rdr.byte_headers().map_err(csv_failure)?.clone();
    let target = ctx.spec.schema.clone();
    let mut unknown = BTreeMap::new();
    let csv_fields: Vec<Field> = headers
        .iter()
        .map(|h| {
            let name = String::from_utf8_lossy(h).trim().to_string();
            match target.field_with_name(&name) {
                Ok(f) => Field::new(name, f.data_type().clone(), true),
                Err(_) => {
                    unknown.insert(name.clone(), Some(PrimitiveType::String));
                    Field::new(name, DataType::Utf8, true)
                }
            }
        })
        .collect();
    if !unknown.is_empty() {
        ctx.send(Piece::UnknownFields(unknown))?;
    }
    let csv_schema = Arc::new(Schema::new(csv_fields));
    let decode_one = |data: &[u8], rows: usize| -> Result<RecordBatch, ArrowError> {
        let mut d = arrow::csv::ReaderBuilder::new(csv_schema.clone())
            .with_header(false)
            .with_batch_size(rows.max(1))
            .build_decoder();
        let mut off = 0;
        while off < data.len() {
            let n = d.decode(&data[off..])?;
            if n == 0 {
                break;
            }
            off += n;
        }
        let b = d
            .flush()?
            .unwrap_or_else(|| RecordBatch::new_empty(csv_schema.clone()));
        if b.num_rows() != rows {
            return Err(ArrowError::CsvError(format!(
                "expected {rows} rows, decoded {}",
                b.num_rows()
            )));
        }
        project(&b, &target)
    };
    let mut chunk = TextChunk::default();
    let mut record = csv::ByteRecord::new();
    loop {
        let more = rdr.read_byte_record(&mut record).map_err(csv_failure)?;
        if more {
            let line = record.position().map(|p| p.line()).unwrap_or(0);
            let start = chunk.buf.len();
            write_csv_record(&mut chunk.buf, &record);
            chunk.spans.push((start, chunk.buf.len(), line));
        }
        if (!more || chunk.spans.len() >= ctx.spec.chunk_records) && !chunk.spans.is_empty() {
            emit_text_chunk(ctx, &chunk, &decode_one)?;
            chunk.clear();
        }
        if !more {
            return Ok(());
        }
    }
}

/// Re-serialises one parsed CSV record (quoting where needed), so each record's bytes stand alone.
fn write_csv_record(out: &mut Vec<u8>, record: &csv::ByteRecord) {
    for (i, field) in record.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if field
            .iter()
            .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
        {
            out.push(b'"');
            for &b in field {
                if b == b'"' {
                    out.push(b'"');
                }
                out.push(b);
            }
            out.push(b'"');
        } else {
            out.extend_from_slice(field);
        }
    }
    out.push(b'\n');
}

fn csv_failure(e: csv::Error) -> DecodeFailure {
    match e.into_kind() {
        csv::ErrorKind::Io(io) => io_failure(io),
        other => DecodeFailure::Unreadable(format!("{other:?}")),
    }
}

/// Reorders `batch` into `target`'s columns by name; absent columns become nulls.
fn project(batch: &RecordBatch, target: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let cols: Vec<ArrayRef> = target
        .fields()
        .iter()
        .map(|f| match batch.schema().index_of(f.name()) {
            Ok(i) => Ok(batch.column(i).clone()),
            Err(_) => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<_, ArrowError>>()?;
    RecordBatch::try_new(target.clone(), cols)
}

fn decode_parquet(mut reader: Box<dyn Read + '_>, ctx: &mut Ctx<'_>) -> Result<(), DecodeFailure> {
    // Parquet needs random access: spool to local disk (Lambda's /tmp), never to memory.
    let path = std::env::temp_dir().join(format!("floe-{}.parquet", uuid::Uuid::new_v4()));
    let result = (|| {
        let mut file = std::fs::File::create(&path).map_err(DecodeFailure::Transient)?;
        std::io::copy(&mut reader, &mut file).map_err(io_failure)?;
        drop(file);
        let file = std::fs::File::open(&path).map_err(DecodeFailure::Transient)?;
        let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| DecodeFailure::Unreadable(format!("not a readable Parquet file: {e}")))?;
        let file_schema = builder.schema().clone();
        let unknown: BTreeMap<String, Option<PrimitiveType>> = file_schema
            .fields()
            .iter()
            .filter(|f| ctx.spec.schema.field_with_name(f.name()).is_err())
            .map(|f| (f.name().clone(), arrow_to_primitive(f.data_type())))
            .collect();
        if !unknown.is_empty() {
            ctx.send(Piece::UnknownFields(unknown))?;
        }
        // Columns whose Parquet type is a spec-allowed widening of the table's (int64 for int...).
        let widen: BTreeMap<String, PrimitiveType> = file_schema
            .fields()
            .iter()
            .filter_map(|f| {
                let target = ctx.spec.schema.field_with_name(f.name()).ok()?;
                let (from, to) = (
                    arrow_to_primitive(target.data_type())?,
                    arrow_to_primitive(f.data_type())?,
                );
                crate::evolve::is_widening(&from, &to).then(|| (f.name().clone(), to))
            })
            .collect();
        if !widen.is_empty() {
            ctx.send(Piece::Widen(widen))?;
        }
        let rows = builder
            .with_batch_size(ctx.spec.chunk_records.min(65_536))
            .build()
            .map_err(|e| DecodeFailure::Unreadable(format!("Parquet: {e}")))?;
        let mut row_base = 0u64;
        for batch in rows {
            let batch = batch.map_err(|e| DecodeFailure::Unreadable(format!("Parquet: {e}")))?;
            ctx.seen += batch.num_rows() as u64;
            emit_parquet_batch(ctx, &batch, row_base)?;
            row_base += batch.num_rows() as u64;
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    result
}

fn row_as_json(batch: &RecordBatch, row: usize) -> String {
    let mut out = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
        let _ = w.write(&batch.slice(row, 1));
        let _ = w.finish();
    }
    String::from_utf8_lossy(&out).trim_end().to_string()
}

/// Casts a Parquet batch to the target types; values that do not convert are rejected per row.
fn emit_parquet_batch(
    ctx: &mut Ctx<'_>,
    batch: &RecordBatch,
    row_base: u64,
) -> Result<(), DecodeFailure> {
    let target = ctx.spec.schema.clone();
    let n = batch.num_rows();
    let mut reasons: Vec<Option<String>> = vec![None; n];
    let mut cols = Vec::with_capacity(target.fields().len());
    let opts = CastOptions {
        safe: true,
        ..Default::default()
    };
    for f in target.fields() {
        let col = match batch.schema().index_of(f.name()) {
            Ok(i) => {
                let src = batch.column(i);
                let cast = cast_with_options(src, f.data_type(), &opts).map_err(|e| {
                    DecodeFailure::Unreadable(format!(
                        "column `{}` of type {} cannot be read as {}: {e}",
                        f.name(),
                        src.data_type(),
                        f.data_type()
                    ))
                })?;
                if cast.null_count() > src.null_count() {
                    for (row, slot) in reasons.iter_mut().enumerate() {
                        if slot.is_none() && cast.is_null(row) && !src.is_null(row) {
                            *slot = Some(format!(
                                "field `{}`: value does not convert from {} to {}",
                                f.name(),
                                src.data_type(),
                                f.data_type()
                            ));
                        }
                    }
                }
                cast
            }
            Err(_) => new_null_array(f.data_type(), n),
        };
        cols.push(col);
    }
    let typed =
        RecordBatch::try_new(target, cols).map_err(|e| DecodeFailure::Unreadable(e.to_string()))?;
    let raws = |row: usize| (row_base + row as u64 + 1, row_as_json(batch, row));
    if reasons.iter().any(Option::is_some) {
        let (kept, rejected) = split_rejected(&typed, &reasons, &raws)?;
        ctx.send(Piece::Rejected(rejected))?;
        // Rows kept keep their original numbering for required-field reasons.
        let index: Vec<usize> = (0..n).filter(|r| reasons[*r].is_none()).collect();
        return ctx.emit_valid(kept, &|row| raws(index[row]));
    }
    ctx.emit_valid(typed, &raws)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::TimeUnit;

    fn spec(format: Format) -> DecodeSpec {
        DecodeSpec {
            format,
            key: "x".into(),
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Utf8, true),
                Field::new("n", DataType::Int64, true),
                Field::new(
                    "t",
                    DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                    true,
                ),
            ])),
            required: vec!["id".into(), "t".into()],
            chunk_records: 4,
            allow_unknown: true,
        }
    }

    fn run(
        input: &[u8],
        spec: &DecodeSpec,
    ) -> (
        u64,
        usize,
        Vec<Rejected>,
        BTreeMap<String, Option<PrimitiveType>>,
    ) {
        let mut rows = 0;
        let mut rejected = Vec::new();
        let mut unknown = BTreeMap::new();
        let seen = decode(input, spec, &mut |p| {
            match p {
                Piece::Batch(b) => rows += b.num_rows(),
                Piece::Rejected(r) => rejected.extend(r),
                Piece::UnknownFields(u) => unknown.extend(u),
                Piece::Widen(_) => {}
            }
            true
        })
        .unwrap();
        rejected.sort_by_key(|r| r.record);
        (seen, rows, rejected, unknown)
    }

    #[test]
    fn jsonl_isolates_bad_lines_and_counts_reconcile() {
        let input = b"{\"id\":\"a\",\"n\":1,\"t\":\"2026-11-30T10:00:00Z\"}\n\
{\"id\":\"b\",\"n\":\"x\",\"t\":\"2026-11-30T10:00:00Z\"}\n\
\n\
not json\n\
{\"n\":3,\"t\":\"2026-11-30T10:00:00Z\"}\n\
{\"id\":\"e\",\"n\":5,\"t\":\"2026-11-30T10:00:00Z\",\"extra\":true}\n\
{\"id\":\"f\",\"n\":6,\"t\":\"2026-11-30T10:00:00Z\"}\n";
        let (seen, rows, rejected, unknown) = run(input, &spec(Format::Jsonl));
        assert_eq!(seen, 6);
        assert_eq!(rows, 3);
        let lines: Vec<u64> = rejected.iter().map(|r| r.record).collect();
        assert_eq!(lines, vec![2, 4, 5]);
        assert!(
            rejected[2].reason.contains("`id`"),
            "{}",
            rejected[2].reason
        );
        assert_eq!(rejected[1].raw, "not json");
        assert_eq!(
            unknown.into_iter().collect::<Vec<_>>(),
            vec![("extra".to_string(), Some(PrimitiveType::Boolean))]
        );
    }

    #[test]
    fn gzip_csv_with_bad_rows() {
        use std::io::Write;
        let csv = "id,n,t,other\na,1,2026-11-30T10:00:00Z,x\nb,zz,2026-11-30T10:00:00Z,y\n,3,2026-11-30T10:00:00Z,z\nd,4,2026-11-30T10:00:00Z,w\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(csv.as_bytes()).unwrap();
        let bytes = gz.finish().unwrap();
        let (seen, rows, rejected, unknown) = run(&bytes, &spec(Format::Csv));
        assert_eq!((seen, rows, rejected.len()), (4, 2, 2));
        assert_eq!(rejected[0].record, 3);
        assert!(rejected[0].raw.starts_with("b,zz"));
        assert!(unknown.contains_key("other"));
    }

    #[test]
    fn corrupt_and_empty_objects_are_unreadable() {
        let mut bytes = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(b"garbage garbage garbage");
        let e = decode(&bytes[..], &spec(Format::Jsonl), &mut |_| true).unwrap_err();
        assert!(matches!(e, DecodeFailure::Unreadable(_)), "{e}");
        let e = decode(&b""[..], &spec(Format::Jsonl), &mut |_| true).unwrap_err();
        assert!(matches!(e, DecodeFailure::Unreadable(_)));
        let e = decode(
            &b"not parquet at all"[..],
            &spec(Format::Parquet),
            &mut |_| true,
        )
        .unwrap_err();
        assert!(matches!(e, DecodeFailure::Unreadable(_)));
    }
}
