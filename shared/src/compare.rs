//! `floe compare`: a floe table beside what the system it replaces produced, before cutover.
//!
//! The other side is a set of objects (Parquet, CSV or JSON lines, optionally compressed: an
//! export, a query result, the old pipeline's output) on S3 or the local disk, or another Iceberg
//! table. Both sides are streamed once, in batches: per time window the record counts, distinct
//! keys and per-measure sums; per key, whether it is on both sides and whether its time window and
//! measures agree. Memory holds one entry per key of the floe side (bounded by `max_keys`, a clear
//! error beyond), never the rows. The other side's objects are decoded with the floe table's
//! schema (renamed columns mapped), within the configured input limits; its records that do not
//! fit are counted as unreadable.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use arrow::array::{Array, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow_schema::{DataType, Field, Schema as ArrowSchema, TimeUnit};
use futures::TryStreamExt;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{Datum, PrimitiveType, Type};
use iceberg::table::Table;
use serde::Serialize;

use crate::config::{parse_window, Config, Format};
use crate::decode::{DecodeSpec, Piece};
use crate::error::{Error, ErrorKind, Result};

/// What to compare and how.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    /// Columns identifying a record on both sides (floe's names).
    pub keys: Vec<String>,
    /// The time column windows are cut on (floe's name; default: the table's event time).
    pub time: Option<String>,
    /// Numeric columns compared as per-window sums and per-record values (floe's names).
    pub measures: Vec<String>,
    /// Window size, e.g. `1d`, `1h`, `15m`.
    pub window: String,
    /// Relative tolerance on counts, sums and values (0: exact).
    pub tolerance: f64,
    /// Keys listed per kind of difference.
    pub sample: usize,
    /// The other side's column names: its name → floe's name.
    pub rename: BTreeMap<String, String>,
    /// Most keys held (one entry per floe record key).
    pub max_keys: usize,
    /// Only records with time at or after this (RFC 3339), on both sides.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only records with time before this, on both sides.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl CompareSpec {
    /// The spec from a table's `[[compare]]` entry (or the built-in defaults).
    pub fn from_config(config: &Config, table: &str) -> Self {
        let d = config.compare_defaults(table);
        Self {
            keys: d.map(|d| d.keys.clone()).unwrap_or_default(),
            time: d.and_then(|d| d.time.clone()),
            measures: d.map(|d| d.measures.clone()).unwrap_or_default(),
            window: d
                .and_then(|d| d.window.clone())
                .unwrap_or_else(|| "1d".into()),
            tolerance: d.map(|d| d.tolerance).unwrap_or(0.0),
            sample: 10,
            rename: d.map(|d| d.rename.clone()).unwrap_or_default(),
            max_keys: 20_000_000,
            since: None,
            until: None,
        }
    }
}

/// The other side of a comparison.
#[derive(Debug, Clone)]
pub enum Against {
    /// An object, or every object under a prefix, in the configured store (`s3://bucket/prefix`).
    Objects {
        /// `s3://bucket/key-or-prefix`.
        uri: String,
        /// The format (default: from each key's extension).
        format: Option<Format>,
    },
    /// A file, or every file under a directory, on the local disk.
    Local {
        /// The file or directory.
        path: PathBuf,
        /// The format (default: from each file's extension).
        format: Option<Format>,
    },
    /// An Iceberg table in the catalog of `config`.
    Table {
        /// The config whose catalog holds it (floe's own, or the other system's).
        config: Box<Config>,
        /// Its name in that config's namespace.
        table: String,
    },
}

impl Against {
    /// How the report names this side.
    fn label(&self) -> String {
        match self {
            Against::Objects { uri, .. } => uri.clone(),
            Against::Local { path, .. } => path.display().to_string(),
            Against::Table { config, table } => {
                format!("iceberg:{}.{table}", config.catalog.namespace)
            }
        }
    }
}

/// A value on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair<T> {
    /// floe's value.
    pub floe: T,
    /// The other system's value.
    pub against: T,
}

/// One time window on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    /// The window's start (RFC 3339; `null` for records without a time).
    pub window_start: Option<String>,
    /// Records.
    pub rows: Pair<u64>,
    /// Distinct keys.
    pub distinct_keys: Pair<u64>,
    /// Per-measure sums.
    pub sums: BTreeMap<String, Pair<f64>>,
    /// What differs beyond the tolerance (empty: the window matches).
    pub differences: Vec<String>,
}

/// Keys of one kind of difference: how many, and the first few (in key order).
#[derive(Debug, Clone, Default, Serialize)]
pub struct KeySample {
    /// How many keys.
    pub count: u64,
    /// Up to `sample` of them, smallest first.
    pub keys: Vec<String>,
}

/// A record present on both sides whose window or measure differs.
#[derive(Debug, Clone, Serialize)]
pub struct RowDiff {
    /// Its key.
    pub key: String,
    /// The column that differs (the time column when the window differs).
    pub column: String,
    /// floe's value.
    pub floe: String,
    /// The other system's value.
    pub against: String,
}

/// Records on both sides that differ.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Differing {
    /// Records whose key is on both sides but whose window or measures differ.
    pub count: u64,
    /// Per column: how many records differ in it.
    pub by_column: BTreeMap<String, u64>,
    /// Up to `sample` differences, smallest key first.
    pub rows: Vec<RowDiff>,
}

/// The result of `floe compare`.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// The floe table.
    pub table: String,
    /// The other side.
    pub against: String,
    /// Key columns (floe's names).
    pub keys: Vec<String>,
    /// Time column (floe's name).
    pub time: String,
    /// Measures (floe's names).
    pub measures: Vec<String>,
    /// Window size.
    pub window: String,
    /// Relative tolerance.
    pub tolerance: f64,
    /// Records on each side.
    pub rows: Pair<u64>,
    /// Per window, oldest first.
    pub windows: Vec<WindowReport>,
    /// Keys floe has and the other side lacks.
    pub missing_in_against: KeySample,
    /// Keys the other side has and floe lacks.
    pub missing_in_floe: KeySample,
    /// Keys seen more than once in floe.
    pub duplicate_keys_floe: KeySample,
    /// Keys seen more than once on the other side.
    pub duplicate_keys_against: KeySample,
    /// Records on both sides that differ.
    pub differing: Differing,
    /// Records of the other side that could not be read as the table's types, by reason.
    pub unreadable_against: BTreeMap<String, u64>,
    /// Objects (or files) of the other side read.
    pub objects_read: u64,
    /// Whether everything agrees within the tolerance.
    pub matches: bool,
}

/// Compares `table` (in `config`'s catalog) with `against`, per `spec`.
pub async fn compare(
    config: &Config,
    table: &str,
    against: &Against,
    spec: &CompareSpec,
) -> Result<CompareReport> {
    let window_us = parse_window(&spec.window)
        .map_err(|e| Error::new(ErrorKind::Config, format!("--window: {e}")))?;
    let floe_table = load(config, table).await?;
    let time = match &spec.time {
        Some(t) => t.clone(),
        None => config
            .table(table)
            .map(|t| t.event_time.clone())
            .or_else(|| {
                floe_table
                    .metadata()
                    .properties()
                    .get(crate::summary::EVENT_TIME_COLUMN)
                    .cloned()
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    format!("{table}: no time column configured: pass --time"),
                )
            })?,
    };
    if spec.keys.is_empty() {
        return Err(Error::new(
            ErrorKind::Config,
            format!("{table}: no key columns: pass --keys or set [[compare]] keys"),
        ));
    }
    let cols = Columns {
        keys: spec.keys.clone(),
        time: time.clone(),
        measures: spec.measures.clone(),
    };
    let schema = floe_table.metadata().current_schema();
    for c in cols.all() {
        if schema.field_by_name(c).is_none() {
            return Err(Error::new(
                ErrorKind::Config,
                format!("{table} has no column `{c}`"),
            ));
        }
    }
    let bounds = Bounds {
        since: spec.since.map(|t| t.timestamp_micros()),
        until: spec.until.map(|t| t.timestamp_micros()),
    };
    let mut acc = Accumulator::new(spec, window_us, bounds);
    read_table(&floe_table, &cols, &BTreeMap::new(), bounds, &mut |b| {
        acc.add(Side::Floe, b, &cols)
    })
    .await?;
    let objects_read = match against {
        Against::Table {
            config: other,
            table: name,
        } => {
            let t = load(other, name).await?;
            read_table(&t, &cols, &spec.rename, bounds, &mut |b| {
                acc.add(Side::Against, b, &cols)
            })
            .await?;
            1
        }
        Against::Objects { uri, format } => {
            let (acc2, n) =
                read_objects(config, &floe_table, uri, *format, &cols, spec, acc).await?;
            acc = acc2;
            n
        }
        Against::Local { path, format } => {
            let (acc2, n) =
                read_local(config, &floe_table, path, *format, &cols, spec, acc).await?;
            acc = acc2;
            n
        }
    };
    Ok(acc.finish(table, against.label(), &cols, spec, objects_read))
}

async fn load(config: &Config, table: &str) -> Result<Table> {
    let catalog = crate::catalog::connect(config).await?;
    let ident = crate::catalog::table_ident(config, table)?;
    catalog
        .load_table(&ident)
        .await
        .map_err(|e| Error::iceberg(format!("loading {ident}"), e).with_retryable(true))
}

/// The compared columns, by floe's names.
struct Columns {
    keys: Vec<String>,
    time: String,
    measures: Vec<String>,
}

impl Columns {
    fn all(&self) -> impl Iterator<Item = &String> {
        self.keys
            .iter()
            .chain(std::iter::once(&self.time))
            .chain(&self.measures)
    }
}

/// The time range compared, in microseconds (half-open).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    since: Option<i64>,
    until: Option<i64>,
}

impl Bounds {
    fn holds(&self, t: Option<i64>) -> bool {
        match t {
            None => self.since.is_none() && self.until.is_none(),
            Some(t) => self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t < u),
        }
    }
}

/// floe's name of the other side's column `name`.
fn floe_name<'a>(rename: &'a BTreeMap<String, String>, name: &'a str) -> &'a str {
    rename.get(name).map(String::as_str).unwrap_or(name)
}

/// The other side's name of floe's column `name`.
fn against_name<'a>(rename: &'a BTreeMap<String, String>, name: &'a str) -> &'a str {
    rename
        .iter()
        .find(|(_, f)| f.as_str() == name)
        .map(|(a, _)| a.as_str())
        .unwrap_or(name)
}

/// Streams the compared columns of `table`'s current snapshot, renamed to floe's names, with the
/// time range pushed down as a filter (files and row groups outside it are pruned).
async fn read_table(
    table: &Table,
    cols: &Columns,
    rename: &BTreeMap<String, String>,
    bounds: Bounds,
    add: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<()> {
    if table.metadata().current_snapshot().is_none() {
        return Ok(());
    }
    let what = || format!("reading {}", table.identifier());
    let names: Vec<String> = cols
        .all()
        .map(|c| against_name(rename, c).to_string())
        .collect();
    let time_name = against_name(rename, &cols.time).to_string();
    for n in &names {
        if table.metadata().current_schema().field_by_name(n).is_none() {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "{} has no column `{n}` (map names with --rename)",
                    table.identifier()
                ),
            ));
        }
    }
    let mut scan = table.scan().select(names.clone());
    if let Some(filter) = time_filter(table, &time_name, bounds) {
        scan = scan.with_filter(filter);
    }
    let mut stream = scan
        .build()
        .map_err(|e| Error::iceberg(what(), e))?
        .to_arrow()
        .await
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?;
    while let Some(batch) = stream
        .try_next()
        .await
        .map_err(|e| Error::iceberg(what(), e).with_retryable(true))?
    {
        // An identity partition's column comes run-end encoded.
        let batch = crate::write::without_run_ends(batch).map_err(|e| Error::iceberg(what(), e))?;
        add(&renamed(&batch, rename)?)?;
    }
    Ok(())
}

/// The Iceberg filter for the time range on a timestamp column (None: no range, or not a
/// timestamp column; rows are filtered again either way).
fn time_filter(table: &Table, column: &str, bounds: Bounds) -> Option<Predicate> {
    let field = table.metadata().current_schema().field_by_name(column)?;
    let datum = |us: i64| match field.field_type.as_ref() {
        Type::Primitive(PrimitiveType::Timestamptz) => Some(Datum::timestamptz_micros(us)),
        Type::Primitive(PrimitiveType::Timestamp) => Some(Datum::timestamp_micros(us)),
        _ => None,
    };
    let lo = bounds
        .since
        .and_then(datum)
        .map(|d| Reference::new(column).greater_than_or_equal_to(d));
    let hi = bounds
        .until
        .and_then(datum)
        .map(|d| Reference::new(column).less_than(d));
    match (lo, hi) {
        (Some(a), Some(b)) => Some(a.and(b)),
        (a, b) => a.or(b),
    }
}

/// `batch` with its columns under floe's names.
fn renamed(batch: &RecordBatch, rename: &BTreeMap<String, String>) -> Result<RecordBatch> {
    if rename.is_empty() {
        return Ok(batch.clone());
    }
    let fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| {
            f.as_ref()
                .clone()
                .with_name(floe_name(rename, f.name()).to_string())
        })
        .collect();
    RecordBatch::try_new(
        std::sync::Arc::new(ArrowSchema::new(fields)),
        batch.columns().to_vec(),
    )
    .map_err(|e| Error::new(ErrorKind::Internal, format!("renaming columns: {e}")))
}

/// The format of an object from its name: `.parquet`, `.csv`, `.json`/`.jsonl`/`.ndjson`,
/// optionally followed by `.gz`/`.gzip`/`.zst`.
pub fn format_of(name: &str) -> Option<Format> {
    let lower = name.to_ascii_lowercase();
    let base = [".gz", ".gzip", ".zst", ".zstd"]
        .iter()
        .find_map(|s| lower.strip_suffix(s))
        .unwrap_or(&lower);
    if base.ends_with(".parquet") {
        Some(Format::Parquet)
    } else if base.ends_with(".csv") {
        Some(Format::Csv)
    } else if base.ends_with(".jsonl") || base.ends_with(".json") || base.ends_with(".ndjson") {
        Some(Format::Jsonl)
    } else {
        None
    }
}

/// Whether a listed name is a marker or hidden file (`_SUCCESS`, `.crc`), not data.
fn is_marker(name: &str) -> bool {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.is_empty() || last.starts_with('_') || last.starts_with('.')
}

/// The decode spec for the other side's objects: floe's types for the compared columns, under the
/// other side's names, all nullable; other fields ignored.
fn against_spec(
    config: &Config,
    table: &Table,
    cols: &Columns,
    rename: &BTreeMap<String, String>,
    key: &str,
    format: Format,
) -> Result<DecodeSpec> {
    let arrow = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
        .map_err(|e| Error::iceberg("arrow schema", e))?;
    let decode = crate::schema::decode_schema(&std::sync::Arc::new(arrow));
    let mut fields = Vec::new();
    for c in cols.all() {
        let f = decode.field_with_name(c).map_err(|_| {
            Error::new(
                ErrorKind::Config,
                format!("{} has no column `{c}`", table.identifier()),
            )
        })?;
        fields.push(
            f.clone()
                .with_name(against_name(rename, c).to_string())
                .with_nullable(true),
        );
    }
    Ok(DecodeSpec {
        format,
        key: key.to_string(),
        schema: std::sync::Arc::new(ArrowSchema::new(fields)),
        required: Vec::new(),
        chunk_records: config.ingest.chunk_records,
        allow_unknown: true,
        ignored: Default::default(),
        refused: Default::default(),
        debezium: false,
    })
}

/// One object or file of the other side, opened.
struct Input {
    /// How errors name it.
    name: String,
    /// Its content.
    reader: Box<dyn std::io::Read + Send>,
    /// Its stored size.
    size: u64,
}

/// The format of `name`: `format` when given, else from the name.
fn format_for(name: &str, format: Option<Format>) -> Result<Format> {
    format.or_else(|| format_of(name)).ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            format!("{name}: unknown format (pass --format parquet|csv|jsonl)"),
        )
    })
}

/// Decodes one object or file into the accumulator on a blocking thread, within the
/// configured input limits.
async fn decode_into(
    config: &Config,
    dspec: DecodeSpec,
    input: Input,
    rename: &BTreeMap<String, String>,
    cols: Columns,
    mut acc: Accumulator,
) -> Result<(Accumulator, Columns)> {
    let limits = crate::decode::Limits::from(&config.ingest);
    let rename = rename.clone();
    tokio::task::spawn_blocking(move || {
        let Input { name, reader, size } = input;
        let mut failed: Option<Error> = None;
        let result = crate::decode::decode_within(reader, &dspec, &limits, Some(size), &mut |p| {
            match p {
                Piece::Batch(b) => {
                    if let Err(e) =
                        renamed(&b, &rename).and_then(|b| acc.add(Side::Against, &b, &cols))
                    {
                        failed = Some(e);
                        return false;
                    }
                }
                Piece::Rejected(r) => {
                    for rec in r {
                        *acc.unreadable.entry(rec.reason).or_default() += 1;
                    }
                }
                Piece::UnknownFields(_) | Piece::Widen(_) => {}
            }
            true
        });
        if let Some(e) = failed {
            return Err(e);
        }
        result.map_err(|e| Error::new(ErrorKind::UnreadableObject, format!("{name}: {e}")))?;
        Ok((acc, cols))
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Internal, format!("decoding {e}")))?
}

impl Columns {
    fn copy(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            time: self.time.clone(),
            measures: self.measures.clone(),
        }
    }
}

async fn read_objects(
    config: &Config,
    table: &Table,
    uri: &str,
    format: Option<Format>,
    cols: &Columns,
    spec: &CompareSpec,
    mut acc: Accumulator,
) -> Result<(Accumulator, u64)> {
    let bad = || {
        Error::new(
            ErrorKind::Config,
            format!("`{uri}`: expected s3://bucket/prefix"),
        )
    };
    let rest = uri.strip_prefix("s3://").ok_or_else(bad)?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let store = crate::store::from_config(&config.storage).await;
    let listed = store.list(bucket, prefix).await?;
    let mut n = 0;
    let mut owned = cols.copy();
    for o in listed
        .into_iter()
        .filter(|o| o.size > 0 && !is_marker(&o.key))
    {
        let name = format!("s3://{bucket}/{}", o.key);
        let fmt = format_for(&name, format)?;
        let dspec = against_spec(config, table, &owned, &spec.rename, &o.key, fmt)?;
        let opened = store
            .open(bucket, &o.key, &crate::store::Version::latest())
            .await?;
        let input = Input {
            name,
            reader: Box::new(tokio_util::io::SyncIoBridge::new(opened.body)),
            size: opened.meta.size,
        };
        (acc, owned) = decode_into(config, dspec, input, &spec.rename, owned, acc).await?;
        n += 1;
    }
    if n == 0 {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no data objects under {uri}"),
        ));
    }
    Ok((acc, n))
}

async fn read_local(
    config: &Config,
    table: &Table,
    path: &std::path::Path,
    format: Option<Format>,
    cols: &Columns,
    spec: &CompareSpec,
    mut acc: Accumulator,
) -> Result<(Accumulator, u64)> {
    let io = |p: &std::path::Path, e: std::io::Error| {
        Error::new(ErrorKind::Storage, format!("reading {}", p.display())).with_source(e)
    };
    let mut files = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let md = std::fs::metadata(&d).map_err(|e| io(&d, e))?;
        if md.is_file() {
            files.push((d, md.len()));
            continue;
        }
        for entry in std::fs::read_dir(&d).map_err(|e| io(&d, e))? {
            dirs.push(entry.map_err(|e| io(&d, e))?.path());
        }
    }
    files.sort();
    let mut owned = cols.copy();
    let mut n = 0;
    for (f, size) in files {
        let name = f.display().to_string();
        if size == 0 || is_marker(&name) {
            continue;
        }
        let fmt = format_for(&name, format)?;
        let dspec = against_spec(config, table, &owned, &spec.rename, &name, fmt)?;
        let file = std::fs::File::open(&f).map_err(|e| io(&f, e))?;
        let input = Input {
            name,
            reader: Box::new(file),
            size,
        };
        (acc, owned) = decode_into(config, dspec, input, &spec.rename, owned, acc).await?;
        n += 1;
    }
    if n == 0 {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no data files under {}", path.display()),
        ));
    }
    Ok((acc, n))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Floe,
    Against,
}

/// One window's tallies on one side.
#[derive(Debug, Default)]
struct Tally {
    rows: u64,
    keys: HashSet<u64>,
    sums: Vec<f64>,
}

impl Tally {
    fn add(&mut self, key_hash: u64, measures: &[Option<f64>]) {
        self.rows += 1;
        self.keys.insert(key_hash);
        if self.sums.len() < measures.len() {
            self.sums.resize(measures.len(), 0.0);
        }
        for (s, m) in self.sums.iter_mut().zip(measures) {
            *s += m.unwrap_or(0.0);
        }
    }
}

/// A floe record's key entry.
#[derive(Debug)]
struct Entry {
    window: Option<i64>,
    measures: Vec<Option<f64>>,
    floe_seen: u32,
    against_seen: u32,
}

/// Keeps the `n` smallest keys seen (deterministic samples whatever the input order).
#[derive(Debug, Default)]
struct Smallest {
    count: u64,
    keys: BTreeSet<String>,
}

impl Smallest {
    fn add(&mut self, key: &str, n: usize) {
        self.count += 1;
        if n == 0 {
            return;
        }
        if self.keys.len() < n {
            self.keys.insert(key.to_string());
        } else if self.keys.last().is_some_and(|last| key < last.as_str()) {
            self.keys.insert(key.to_string());
            self.keys.pop_last();
        }
    }

    fn sample(self) -> KeySample {
        KeySample {
            count: self.count,
            keys: self.keys.into_iter().collect(),
        }
    }
}

struct Accumulator {
    window_us: i64,
    bounds: Bounds,
    tolerance: f64,
    sample: usize,
    max_keys: usize,
    windows: BTreeMap<Option<i64>, [Tally; 2]>,
    entries: HashMap<String, Entry>,
    missing_in_floe: Smallest,
    dup_floe: Smallest,
    dup_against: Smallest,
    differing: u64,
    by_column: BTreeMap<String, u64>,
    diff_rows: BTreeMap<(String, String), RowDiff>,
    unreadable: BTreeMap<String, u64>,
    rows: [u64; 2],
}

impl Accumulator {
    fn new(spec: &CompareSpec, window_us: i64, bounds: Bounds) -> Self {
        Self {
            window_us,
            bounds,
            tolerance: spec.tolerance,
            sample: spec.sample,
            max_keys: spec.max_keys,
            windows: BTreeMap::new(),
            entries: HashMap::new(),
            missing_in_floe: Smallest::default(),
            dup_floe: Smallest::default(),
            dup_against: Smallest::default(),
            differing: 0,
            by_column: BTreeMap::new(),
            diff_rows: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            rows: [0, 0],
        }
    }

    /// Tallies one batch of `side` (columns under floe's names).
    fn add(&mut self, side: Side, batch: &RecordBatch, cols: &Columns) -> Result<()> {
        let n = batch.num_rows();
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    format!("compared column `{name}` missing from a batch"),
                )
            })
        };
        let as_type = |name: &str, t: &DataType| -> Result<std::sync::Arc<dyn Array>> {
            cast(column(name)?, t).map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    format!("column `{name}` cannot be compared as {t}: {e}"),
                )
            })
        };
        let keys: Vec<std::sync::Arc<dyn Array>> = cols
            .keys
            .iter()
            .map(|k| as_type(k, &DataType::Utf8))
            .collect::<Result<_>>()?;
        let keys: Vec<&StringArray> = keys
            .iter()
            .filter_map(|a| a.as_any().downcast_ref::<StringArray>())
            .collect();
        let time = as_type(
            &cols.time,
            &DataType::Timestamp(TimeUnit::Microsecond, None),
        )?;
        let time = time
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "time column cast"))?;
        let measures: Vec<std::sync::Arc<dyn Array>> = cols
            .measures
            .iter()
            .map(|m| as_type(m, &DataType::Float64))
            .collect::<Result<_>>()?;
        let measures: Vec<&Float64Array> = measures
            .iter()
            .filter_map(|a| a.as_any().downcast_ref::<Float64Array>())
            .collect();
        let mut key = String::new();
        let mut values = Vec::with_capacity(measures.len());
        for row in 0..n {
            let t = (!time.is_null(row)).then(|| time.value(row));
            if !self.bounds.holds(t) {
                continue;
            }
            key.clear();
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    key.push('|');
                }
                if k.is_null(row) {
                    key.push('∅');
                } else {
                    key.push_str(k.value(row));
                }
            }
            values.clear();
            values.extend(
                measures
                    .iter()
                    .map(|m| (!m.is_null(row)).then(|| m.value(row))),
            );
            // Floored toward the past; a time with no representable window start (within one
            // window of year −290 308) counts as having no time, never wraps.
            let window = t.and_then(|t| t.checked_sub(t.rem_euclid(self.window_us)));
            let mut h = DefaultHasher::new();
            key.hash(&mut h);
            let hash = h.finish();
            let slot = match side {
                Side::Floe => 0,
                Side::Against => 1,
            };
            self.rows[slot] += 1;
            self.windows.entry(window).or_default()[slot].add(hash, &values);
            match side {
                Side::Floe => self.add_floe(&key, window, &values)?,
                Side::Against => self.add_against(&key, window, &values, cols),
            }
        }
        Ok(())
    }

    fn add_floe(&mut self, key: &str, window: Option<i64>, values: &[Option<f64>]) -> Result<()> {
        if let Some(e) = self.entries.get_mut(key) {
            e.floe_seen += 1;
            if e.floe_seen == 2 {
                self.dup_floe.add(key, self.sample);
            }
            return Ok(());
        }
        if self.entries.len() >= self.max_keys {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "more than {} distinct keys: narrow the comparison (--since/--until) or raise --max-keys",
                    self.max_keys
                ),
            ));
        }
        self.entries.insert(
            key.to_string(),
            Entry {
                window,
                measures: values.to_vec(),
                floe_seen: 1,
                against_seen: 0,
            },
        );
        Ok(())
    }

    fn add_against(
        &mut self,
        key: &str,
        window: Option<i64>,
        values: &[Option<f64>],
        cols: &Columns,
    ) {
        let Some(e) = self.entries.get_mut(key) else {
            self.missing_in_floe.add(key, self.sample);
            return;
        };
        e.against_seen += 1;
        if e.against_seen == 2 {
            self.dup_against.add(key, self.sample);
        }
        if e.against_seen > 1 {
            return;
        }
        let mut diffs = Vec::new();
        if e.window != window {
            diffs.push((
                cols.time.clone(),
                window_label(e.window, self.window_us),
                window_label(window, self.window_us),
            ));
        }
        for (i, (a, b)) in e.measures.iter().zip(values).enumerate() {
            let differ = match (a, b) {
                (Some(a), Some(b)) => !within(*a, *b, self.tolerance),
                (None, None) => false,
                _ => true,
            };
            if differ {
                let show = |v: &Option<f64>| v.map(|v| v.to_string()).unwrap_or("null".into());
                diffs.push((cols.measures[i].clone(), show(a), show(b)));
            }
        }
        if diffs.is_empty() {
            return;
        }
        self.differing += 1;
        for (column, floe, against) in diffs {
            *self.by_column.entry(column.clone()).or_default() += 1;
            let k = (key.to_string(), column.clone());
            if self.diff_rows.len() < self.sample
                || self
                    .diff_rows
                    .last_key_value()
                    .is_some_and(|(last, _)| &k < last)
            {
                self.diff_rows.insert(
                    k,
                    RowDiff {
                        key: key.to_string(),
                        column,
                        floe,
                        against,
                    },
                );
                if self.diff_rows.len() > self.sample {
                    self.diff_rows.pop_last();
                }
            }
        }
    }

    fn finish(
        self,
        table: &str,
        against: String,
        cols: &Columns,
        spec: &CompareSpec,
        objects_read: u64,
    ) -> CompareReport {
        let mut missing_in_against = Smallest::default();
        for (k, e) in &self.entries {
            if e.against_seen == 0 {
                missing_in_against.add(k, self.sample);
            }
        }
        let mut windows = Vec::new();
        for (w, [f, a]) in &self.windows {
            let mut differences = Vec::new();
            if !within(f.rows as f64, a.rows as f64, self.tolerance) {
                differences.push(format!("rows {} vs {}", f.rows, a.rows));
            }
            let (fk, ak) = (f.keys.len() as u64, a.keys.len() as u64);
            if !within(fk as f64, ak as f64, self.tolerance) {
                differences.push(format!("distinct keys {fk} vs {ak}"));
            }
            let mut sums = BTreeMap::new();
            for (i, m) in cols.measures.iter().enumerate() {
                let fs = f.sums.get(i).copied().unwrap_or(0.0);
                let asum = a.sums.get(i).copied().unwrap_or(0.0);
                if !within(fs, asum, self.tolerance) {
                    differences.push(format!("sum({m}) {} vs {}", round(fs), round(asum)));
                }
                sums.insert(
                    m.clone(),
                    Pair {
                        floe: round(fs),
                        against: round(asum),
                    },
                );
            }
            windows.push(WindowReport {
                window_start: w.map(|w| window_label(Some(w), self.window_us)),
                rows: Pair {
                    floe: f.rows,
                    against: a.rows,
                },
                distinct_keys: Pair {
                    floe: fk,
                    against: ak,
                },
                sums,
                differences,
            });
        }
        let missing_in_against = missing_in_against.sample();
        let missing_in_floe = self.missing_in_floe.sample();
        let duplicate_keys_floe = self.dup_floe.sample();
        let duplicate_keys_against = self.dup_against.sample();
        let matches = windows.iter().all(|w| w.differences.is_empty())
            && missing_in_against.count == 0
            && missing_in_floe.count == 0
            && duplicate_keys_floe.count == 0
            && duplicate_keys_against.count == 0
            && self.differing == 0
            && self.unreadable.is_empty();
        CompareReport {
            table: table.to_string(),
            against,
            keys: cols.keys.clone(),
            time: cols.time.clone(),
            measures: cols.measures.clone(),
            window: spec.window.clone(),
            tolerance: spec.tolerance,
            rows: Pair {
                floe: self.rows[0],
                against: self.rows[1],
            },
            windows,
            missing_in_against,
            missing_in_floe,
            duplicate_keys_floe,
            duplicate_keys_against,
            differing: Differing {
                count: self.differing,
                by_column: self.by_column,
                rows: self.diff_rows.into_values().collect(),
            },
            unreadable_against: self.unreadable,
            objects_read,
            matches,
        }
    }
}

/// Whether `a` and `b` agree within the relative `tolerance` (float sums in another order
/// differ in their last bits: that is never a difference).
fn within(a: f64, b: f64, tolerance: f64) -> bool {
    let scale = a.abs().max(b.abs());
    (a - b).abs() <= tolerance * scale + 1e-9 * scale.max(1.0)
}

/// Sums as printed: 6 decimals (float noise beyond them is not data).
fn round(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// A window start as text: the date for whole days, else RFC 3339.
fn window_label(w: Option<i64>, window_us: i64) -> String {
    let Some(w) = w else {
        return "null".into();
    };
    match chrono::DateTime::<chrono::Utc>::from_timestamp_micros(w) {
        Some(t) if window_us % 86_400_000_000 == 0 => t.format("%Y-%m-%d").to_string(),
        Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        None => w.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_the_name() {
        assert_eq!(format_of("a/b/part-0.parquet"), Some(Format::Parquet));
        assert_eq!(format_of("x.CSV.gz"), Some(Format::Csv));
        assert_eq!(format_of("x.jsonl.zst"), Some(Format::Jsonl));
        assert_eq!(format_of("x.json"), Some(Format::Jsonl));
        assert_eq!(format_of("x.txt"), None);
        assert!(is_marker("out/_SUCCESS"));
        assert!(is_marker("out/.part-0.crc"));
        assert!(!is_marker("out/part-0.parquet"));
    }

    #[test]
    fn tolerance_is_relative_and_absorbs_float_noise() {
        assert!(within(0.1 + 0.2, 0.3, 0.0));
        assert!(!within(100.0, 101.0, 0.0));
        assert!(within(100.0, 100.5, 0.01));
        assert!(!within(100.0, 102.0, 0.01));
        assert!(within(0.0, 0.0, 0.0));
    }

    #[test]
    fn samples_keep_the_smallest_keys_whatever_the_order() {
        let mut s = Smallest::default();
        for k in ["e", "a", "d", "b", "c"] {
            s.add(k, 2);
        }
        let s = s.sample();
        assert_eq!(s.count, 5);
        assert_eq!(s.keys, vec!["a", "b"]);
    }

    #[test]
    fn day_windows_print_as_dates() {
        let day = 86_400_000_000;
        assert_eq!(window_label(Some(day * 20_000), day), "2024-10-04");
        assert_eq!(
            window_label(Some(3_600_000_000), 3_600_000_000),
            "1970-01-01T01:00:00Z"
        );
        assert_eq!(window_label(None, day), "null");
    }
}
