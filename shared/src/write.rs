//! Writing rows as Iceberg data files: Parquet through iceberg's writers, split by partition,
//! rolled at the target size. Shared by ingest and compaction.

use std::collections::{BTreeSet, HashMap};

use arrow::array::RecordBatch;
use arrow::array::{Array, ArrayRef, Scalar, StructArray};
use iceberg::arrow::{PartitionValueCalculator, RecordBatchPartitionSplitter};
use iceberg::spec::{DataFile, DataFileFormat, Datum};
use iceberg::spec::{PartitionKey, PartitionSpec, Schema, Struct, TableMetadata};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, LocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::unpartitioned_writer::UnpartitionedWriter;
use iceberg::writer::partitioning::PartitioningWriter;
use parquet::basic::{Compression as PqCompression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

type DataWriterBuilder =
    DataFileWriterBuilder<ParquetWriterBuilder, Locations, DefaultFileNameGenerator>;

/// Where a table's data files go: `write.data.path` (else `write.folder-storage.path`, else
/// `<location>/data`), then the partition path with each field's name and value URL-encoded as
/// Iceberg Java writes it (`region=eu%2F`). iceberg's own generator writes values raw: a value
/// holding `/` made directories, one ending in `/` a `//` in the path, which the storage layer
/// stores as `/` (one object, two spellings: orphan cleanup then took the live file for an
/// orphan), and Java's S3FileIO reads as another key.
#[derive(Clone, Debug)]
pub(crate) struct Locations {
    data: String,
}

impl Locations {
    pub(crate) fn new(md: &TableMetadata) -> Self {
        let props = md.properties();
        let data = props
            .get("write.data.path")
            .or_else(|| props.get("write.folder-storage.path"))
            .map(|p| p.trim_end_matches('/').to_string())
            .unwrap_or_else(|| format!("{}/data", md.location().trim_end_matches('/')));
        Self { data }
    }

    /// The directory of the files of `partition` (values of `spec` over `schema`): the data
    /// directory itself for an unpartitioned spec.
    pub(crate) fn dir(&self, spec: &PartitionSpec, schema: &Schema, partition: &Struct) -> String {
        let Ok(kind) = spec.partition_type(schema) else {
            return self.data.clone();
        };
        let parts: Vec<String> = spec
            .fields()
            .iter()
            .zip(kind.fields())
            .enumerate()
            .map(|(i, (field, typed))| {
                let value = partition.fields().get(i).and_then(|v| v.as_ref());
                let value = field.transform.to_human_string(&typed.field_type, value);
                format!("{}={}", escape(&field.name), escape(&value))
            })
            .collect();
        if parts.is_empty() {
            self.data.clone()
        } else {
            format!("{}/{}", self.data, parts.join("/"))
        }
    }
}

impl LocationGenerator for Locations {
    fn generate_location(&self, key: Option<&PartitionKey>, file_name: &str) -> String {
        let dir = match key {
            Some(key) => self.dir(key.spec(), key.schema(), key.data()),
            None => self.data.clone(),
        };
        format!("{dir}/{file_name}")
    }
}

/// A partition path segment as Java's `URLEncoder` keeps it: letters, digits and `.-*_` as they
/// are, everything else (`/`, `=`, spaces, `%`, non-ASCII) percent-encoded.
fn escape(text: &str) -> String {
    const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'.')
        .remove(b'-')
        .remove(b'*')
        .remove(b'_');
    percent_encoding::utf8_percent_encode(text, KEEP).to_string()
}

/// Where rows go ([`Writers`]), and the string/binary columns that held a value too long for
/// exact Parquet statistics (their bounds are left out of the files' entries, see
/// [`Sink::close`]).
pub(crate) struct Sink {
    writers: Writers,
    /// The table's default spec (the files' spec), for rebuilding their entries.
    spec_id: i32,
    /// Field ids of columns that held a value longer than [`STATS_TRUNCATE_BYTES`].
    long_values: BTreeSet<i32>,
    /// Such a value was seen in a column without a field id: every string/binary bound goes.
    long_unidentified: bool,
}

/// A partition fan-out or a single unpartitioned writer (both large: boxed).
pub(crate) enum Writers {
    /// Partitioned: split each batch by partition, one rolling writer per partition. The
    /// calculator gives the batch's partition values, to skip the split of a batch that holds
    /// one partition only.
    Fanout(
        Box<(
            FanoutWriter<DataWriterBuilder>,
            RecordBatchPartitionSplitter,
            PartitionValueCalculator,
        )>,
    ),
    /// Unpartitioned: one rolling writer.
    Plain(Box<UnpartitionedWriter<DataWriterBuilder>>),
}

impl Sink {
    /// Writes a batch (any partitions).
    pub(crate) async fn write(&mut self, batch: RecordBatch) -> iceberg::Result<()> {
        let batch = without_run_ends(batch)?;
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            long_value_columns(
                field,
                column,
                &mut self.long_values,
                &mut self.long_unidentified,
            );
        }
        match &mut self.writers {
            Writers::Fanout(fan) => {
                let (w, splitter, values) = &mut **fan;
                // iceberg's split turns every row's partition value into a `Literal` and hashes
                // it (~17 % of the CPU of ingesting a big object on one core). Batches hold one
                // partition or a few (a day of event time, and the late rows of the day before):
                // they are cut by comparing whole columns of partition values instead, each
                // part keyed by iceberg from its first row.
                let (parts, rest) = by_partition(&values.calculate(&batch)?, batch)?;
                for part in parts {
                    if let Some((key, _)) = splitter.split(&part.slice(0, 1))?.pop() {
                        w.write(key, part).await?;
                    } else {
                        for (key, p) in splitter.split(&part)? {
                            w.write(key, p).await?;
                        }
                    }
                }
                if let Some(rest) = rest {
                    for (key, part) in splitter.split(&rest)? {
                        w.write(key, part).await?;
                    }
                }
                Ok(())
            }
            Writers::Plain(w) => w.write(batch).await,
        }
    }

    /// Closes all files and returns their entries. A column that held a value longer than
    /// [`STATS_TRUNCATE_BYTES`] has no lower/upper bound in them: Parquet truncates such a row
    /// group's min/max (inexact) and iceberg takes the bounds of a file from its exact row
    /// groups only, so with several row groups a file's bounds could exclude some of its rows
    /// and every reader that prunes by them (PyIceberg, DuckDB, Spark, Trino) would skip
    /// matching rows. Iceberg Java leaves such a column's bounds out likewise.
    pub(crate) async fn close(self) -> iceberg::Result<Vec<DataFile>> {
        let files = match self.writers {
            Writers::Fanout(fan) => fan.0.close().await?,
            Writers::Plain(w) => w.close().await?,
        };
        if self.long_values.is_empty() && !self.long_unidentified {
            return Ok(files);
        }
        files
            .into_iter()
            .map(|f| {
                without_bounds(f, self.spec_id, |id, d| {
                    self.long_values.contains(&id)
                        || (self.long_unidentified
                            && matches!(
                                d.data_type(),
                                iceberg::spec::PrimitiveType::String
                                    | iceberg::spec::PrimitiveType::Binary
                                    | iceberg::spec::PrimitiveType::Fixed(_)
                            ))
                })
            })
            .collect()
    }
}

/// `batch` with its run-end encoded columns decoded to their plain type (field ids kept):
/// iceberg's reader gives a column an identity partition holds as one (built from the
/// partition value), which its partition calculator and Parquet writer do not take.
pub(crate) fn without_run_ends(batch: RecordBatch) -> iceberg::Result<RecordBatch> {
    use arrow_schema::DataType;
    if !batch
        .columns()
        .iter()
        .any(|c| matches!(c.data_type(), DataType::RunEndEncoded(..)))
    {
        return Ok(batch);
    }
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        match c.data_type() {
            DataType::RunEndEncoded(_, values) => {
                let plain = arrow::compute::cast(c, values.data_type()).map_err(|e| {
                    iceberg::Error::new(
                        iceberg::ErrorKind::DataInvalid,
                        format!("decoding run-end encoded column `{}`: {e}", f.name()),
                    )
                })?;
                fields.push(std::sync::Arc::new(
                    arrow_schema::Field::new(f.name(), values.data_type().clone(), f.is_nullable())
                        .with_metadata(f.metadata().clone()),
                ));
                columns.push(plain);
            }
            _ => {
                fields.push(f.clone());
                columns.push(c.clone());
            }
        }
    }
    let schema = arrow_schema::Schema::new_with_metadata(fields, schema.metadata().clone());
    RecordBatch::try_new(std::sync::Arc::new(schema), columns).map_err(|e| {
        iceberg::Error::new(
            iceberg::ErrorKind::DataInvalid,
            format!("decoding run-end encoded columns: {e}"),
        )
    })
}

/// Parquet's bound on the min/max it writes exactly (longer values are truncated, inexact).
const STATS_TRUNCATE_BYTES: usize = 4096;

/// Adds to `ids` the field ids of the string/binary columns (at any depth) of `array` holding
/// a value longer than [`STATS_TRUNCATE_BYTES`]; `unidentified` when such a column has none.
fn long_value_columns(
    field: &arrow_schema::Field,
    array: &ArrayRef,
    ids: &mut BTreeSet<i32>,
    unidentified: &mut bool,
) {
    use arrow::array::AsArray;
    use arrow_schema::DataType as T;
    const MAX: usize = STATS_TRUNCATE_BYTES;
    let long = match array.data_type() {
        T::Struct(fields) => {
            let s = array.as_struct();
            for (f, c) in fields.iter().zip(s.columns()) {
                long_value_columns(f, c, ids, unidentified);
            }
            false
        }
        T::List(f) => {
            long_value_columns(f, array.as_list::<i32>().values(), ids, unidentified);
            false
        }
        T::LargeList(f) => {
            long_value_columns(f, array.as_list::<i64>().values(), ids, unidentified);
            false
        }
        T::FixedSizeList(f, _) => {
            long_value_columns(f, array.as_fixed_size_list().values(), ids, unidentified);
            false
        }
        T::Map(f, _) => {
            let entries: ArrayRef = std::sync::Arc::new(array.as_map().entries().clone());
            long_value_columns(f, &entries, ids, unidentified);
            false
        }
        // Text and binary (plain, view, fixed-size, dictionary): their longest value.
        _ => crate::decode::value_lengths(array).is_some_and(|(longest, _)| longest > MAX),
    };
    if long {
        match field
            .metadata()
            .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
            .and_then(|v| v.parse::<i32>().ok())
        {
            Some(id) => {
                ids.insert(id);
            }
            None => *unidentified = true,
        }
    }
}

/// `f`'s entry without the lower/upper bounds `drop` names (field id, bound).
fn without_bounds(
    f: DataFile,
    spec_id: i32,
    drop: impl Fn(i32, &iceberg::spec::Datum) -> bool,
) -> iceberg::Result<DataFile> {
    let keep = |m: &std::collections::HashMap<i32, iceberg::spec::Datum>| {
        m.iter()
            .filter(|(id, d)| !drop(**id, d))
            .map(|(id, d)| (*id, d.clone()))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let mut b = iceberg::spec::DataFileBuilder::default();
    b.content(f.content_type())
        .file_path(f.file_path().to_string())
        .file_format(f.file_format())
        .partition(f.partition().clone())
        .partition_spec_id(spec_id)
        .record_count(f.record_count())
        .file_size_in_bytes(f.file_size_in_bytes())
        .column_sizes(f.column_sizes().clone())
        .value_counts(f.value_counts().clone())
        .null_value_counts(f.null_value_counts().clone())
        .nan_value_counts(f.nan_value_counts().clone())
        .lower_bounds(keep(f.lower_bounds()))
        .upper_bounds(keep(f.upper_bounds()))
        .key_metadata(f.key_metadata().map(<[u8]>::to_vec))
        .split_offsets(f.split_offsets().map(<[i64]>::to_vec))
        .equality_ids(f.equality_ids())
        .first_row_id(f.first_row_id())
        .referenced_data_file(f.referenced_data_file())
        .content_offset(f.content_offset())
        .content_size_in_bytes(f.content_size_in_bytes());
    if let Some(id) = f.sort_order_id() {
        b.sort_order_id(id);
    }
    b.build().map_err(|e| {
        iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            format!("rebuilding a data file entry: {e}"),
        )
    })
}

/// Partitions a batch is cut into by [`by_partition`] before the rest goes to iceberg's split.
const MAX_PARTS: usize = 8;

/// Cuts `batch` into parts whose rows share one partition value (`values`: the batch's partition
/// values, one struct per row), in order of first appearance, rows in their order within a part.
/// Rows are equal when every partition column holds the same value or both hold null. Floats
/// are left to iceberg (arrow compares them by their bits, iceberg's keys do not: `-0.0` and
/// `0.0` would be two parts of one key, written to one file out of row order). Past
/// [`MAX_PARTS`] parts, at a part smaller than 1/[`MAX_PARTS`] of the rows left (many small
/// partitions: each cut would copy the batch again), or when the values cannot be compared, the
/// rows left are returned as the rest, for iceberg's row-by-row split.
fn by_partition(
    values: &ArrayRef,
    batch: RecordBatch,
) -> iceberg::Result<(Vec<RecordBatch>, Option<RecordBatch>)> {
    use arrow::compute::kernels::{boolean, cmp};
    use arrow::compute::{filter, filter_record_batch};
    let arrow_err = |e: arrow::error::ArrowError| {
        iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            "splitting a batch by partition",
        )
        .with_source(e)
    };
    let Some(values) = values.as_any().downcast_ref::<StructArray>() else {
        return Ok((Vec::new(), Some(batch)));
    };
    let floats = values.columns().iter().any(|c| c.data_type().is_floating());
    if floats || values.null_count() > 0 || values.len() != batch.num_rows() {
        return Ok((Vec::new(), Some(batch)));
    }
    let mut parts = Vec::new();
    let mut rest = batch;
    let mut columns: Vec<ArrayRef> = values.columns().to_vec();
    while rest.num_rows() > 0 {
        if parts.len() == MAX_PARTS {
            return Ok((parts, Some(rest)));
        }
        // Rows whose every partition column equals the first row's (null equal to null).
        let mut same: Option<arrow::array::BooleanArray> = None;
        for c in &columns {
            let Ok(eq) = cmp::not_distinct(c, &Scalar::new(c.slice(0, 1))) else {
                return Ok((parts, Some(rest)));
            };
            same = Some(match same {
                None => eq,
                Some(s) => boolean::and(&s, &eq).map_err(arrow_err)?,
            });
        }
        let Some(same) = same else {
            // No partition column at all: one partition.
            parts.push(rest);
            break;
        };
        match same.true_count() {
            n if n == rest.num_rows() => {
                parts.push(rest);
                break;
            }
            // A small part (or, defensively, none): leave the rows to iceberg.
            n if n * MAX_PARTS < rest.num_rows() => return Ok((parts, Some(rest))),
            _ => {}
        }
        let others = boolean::not(&same).map_err(arrow_err)?;
        parts.push(filter_record_batch(&rest, &same).map_err(arrow_err)?);
        rest = filter_record_batch(&rest, &others).map_err(arrow_err)?;
        columns = columns
            .iter()
            .map(|c| filter(c, &others))
            .collect::<std::result::Result<_, _>>()
            .map_err(arrow_err)?;
    }
    Ok((parts, None))
}

/// Parquet writer settings: zstd, row groups small enough to bound memory per open file.
pub fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(PqCompression::ZSTD(
            ZstdLevel::try_new(1).unwrap_or_default(),
        ))
        .set_max_row_group_row_count(Some(128 * 1024))
        // Exact min/max up to 4 KiB: `_source` (`s3://bucket/key#version`, keys up to 1 KiB)
        // keeps exact bounds, which the durable duplicate check prunes files by. parquet's
        // default (64 bytes) makes long values inexact, and iceberg then records no bounds.
        // A longer value makes its row group's min/max inexact: see [`Sink::close`].
        .set_statistics_truncate_length(Some(STATS_TRUNCATE_BYTES))
        .build()
}

/// A writer for `table`'s current schema and spec; file names carry `writer_id`.
pub(crate) fn build_sink(
    table: &Table,
    target_bytes: usize,
    writer_id: &str,
) -> iceberg::Result<Sink> {
    let md = table.metadata();
    let schema = md.current_schema().clone();
    let pw = ParquetWriterBuilder::new(writer_properties(), schema.clone());
    let loc = Locations::new(md);
    let names =
        DefaultFileNameGenerator::new(format!("floe-{writer_id}"), None, DataFileFormat::Parquet);
    let rolling =
        RollingFileWriterBuilder::new(pw, target_bytes, table.file_io().clone(), loc, names);
    let dfw = DataFileWriterBuilder::new(rolling);
    let spec = md.default_partition_spec().clone();
    let spec_id = spec.spec_id();
    let writers = if spec.is_unpartitioned() {
        Writers::Plain(Box::new(UnpartitionedWriter::new(dfw)))
    } else {
        let values = PartitionValueCalculator::try_new(&spec, &schema)?;
        let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(schema, spec)?;
        Writers::Fanout(Box::new((FanoutWriter::new(dfw), splitter, values)))
    };
    Ok(Sink {
        writers,
        spec_id,
        long_values: BTreeSet::new(),
        long_unidentified: false,
    })
}

/// `table` with `schema` as its current schema (locally, for writing; committed with the data).
pub(crate) fn with_schema(table: &Table, schema: iceberg::spec::Schema) -> Result<Table> {
    let md = iceberg::spec::TableMetadataBuilder::new_from_metadata(
        table.metadata().clone(),
        table.metadata_location().map(str::to_string),
    )
    .add_current_schema(schema)
    .and_then(|b| b.build())
    .map_err(|e| Error::iceberg("staging the evolved schema", e))?
    .metadata;
    Table::builder()
        .metadata(md)
        .metadata_location(table.metadata_location().unwrap_or_default().to_string())
        .identifier(table.identifier().clone())
        .file_io(table.file_io().clone())
        .runtime(iceberg::Runtime::try_current().map_err(|e| Error::iceberg("runtime", e))?)
        .build()
        .map_err(|e| Error::iceberg("staging the evolved schema", e))
}

/// Best-effort removal of data files written by an attempt that will not commit (whatever is left
/// behind, orphan cleanup removes). Only for files no commit can reference: never after an
/// unknown commit outcome.
pub(crate) async fn delete_uncommitted(table: &Table, files: &[DataFile]) {
    for f in files {
        if let Err(e) = table.file_io().delete(f.file_path()).await {
            tracing::warn!(file = f.file_path(), error = %e, "could not delete an uncommitted data file; orphan cleanup will");
        }
    }
}

/// Field id of a position delete file's `file_path` column (Iceberg spec, reserved).
pub(crate) const DELETE_FILE_PATH_ID: i32 = 2147483546;
/// Field id of a position delete file's `pos` column (Iceberg spec, reserved).
pub(crate) const DELETE_POS_ID: i32 = 2147483545;

fn delete_schema() -> arrow_schema::SchemaRef {
    let id =
        |n: i32| std::collections::HashMap::from([("PARQUET:field_id".to_string(), n.to_string())]);
    std::sync::Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("file_path", arrow_schema::DataType::Utf8, false)
            .with_metadata(id(DELETE_FILE_PATH_ID)),
        arrow_schema::Field::new("pos", arrow_schema::DataType::Int64, false)
            .with_metadata(id(DELETE_POS_ID)),
    ]))
}

/// Writes one Iceberg v2 position delete file for `table`: the rows `(file_path, pos)` (sorted
/// here by path, then position, as the spec requires), in the partition `partition` of spec
/// `spec_id` (a position delete applies to data files of its own partition only). Its data
/// file entry (content `PositionDeletes`; `referenced_data_file` when it names one file only).
pub(crate) async fn write_position_deletes(
    table: &Table,
    partition: iceberg::spec::Struct,
    spec_id: i32,
    mut rows: Vec<(String, i64)>,
    writer_id: &str,
) -> Result<DataFile> {
    use arrow::array::{Int64Array, StringArray};
    rows.sort();
    rows.dedup();
    let schema = delete_schema();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            std::sync::Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.as_str()),
            )),
            std::sync::Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        ],
    )
    .map_err(|e| {
        Error::new(
            crate::error::ErrorKind::Internal,
            format!("position deletes: {e}"),
        )
    })?;
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema, Some(writer_properties()))
        .map_err(|e| {
        Error::new(
            crate::error::ErrorKind::Internal,
            format!("position deletes: {e}"),
        )
    })?;
    w.write(&batch)
        .and_then(|_| w.close().map(|_| ()))
        .map_err(|e| {
            Error::new(
                crate::error::ErrorKind::Internal,
                format!("position deletes: {e}"),
            )
        })?;
    let md = table.metadata();
    let spec = md.partition_spec_by_id(spec_id).cloned().ok_or_else(|| {
        Error::new(
            crate::error::ErrorKind::Internal,
            format!("unknown partition spec {spec_id}"),
        )
    })?;
    let dir = Locations::new(md).dir(&spec, md.current_schema(), &partition);
    let path = format!(
        "{dir}/floe-{writer_id}-deletes-{}.parquet",
        uuid::Uuid::now_v7()
    );
    let size = buf.len() as u64;
    table
        .file_io()
        .new_output(&path)
        .map_err(|e| Error::iceberg("position delete output", e))?
        .write(buf.into())
        .await
        .map_err(|e| Error::iceberg("writing a position delete file", e).with_retryable(true))?;
    let single = rows
        .first()
        .map(|r| r.0.clone())
        .filter(|p| rows.iter().all(|r| &r.0 == p));
    // The bounds of the paths and positions it names (exact, never truncated): readers attach a
    // delete file only to the data files within them (Java's DeleteFileIndex, PyIceberg, which
    // does not match on partition at all). Without them every delete file of the table with a
    // later sequence number was read for every data file.
    let (mut lower, mut upper) = (HashMap::new(), HashMap::new());
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        lower.insert(DELETE_FILE_PATH_ID, Datum::string(&first.0));
        upper.insert(DELETE_FILE_PATH_ID, Datum::string(&last.0));
        let (lo, hi) = rows.iter().fold((i64::MAX, i64::MIN), |(lo, hi), r| {
            (lo.min(r.1), hi.max(r.1))
        });
        lower.insert(DELETE_POS_ID, Datum::long(lo));
        upper.insert(DELETE_POS_ID, Datum::long(hi));
    }
    let n = rows.len() as u64;
    iceberg::spec::DataFileBuilder::default()
        .content(iceberg::spec::DataContentType::PositionDeletes)
        .file_path(path)
        .file_format(DataFileFormat::Parquet)
        .partition(partition)
        .partition_spec_id(spec_id)
        .record_count(n)
        .file_size_in_bytes(size)
        .referenced_data_file(single)
        .lower_bounds(lower)
        .upper_bounds(upper)
        .value_counts(HashMap::from([
            (DELETE_FILE_PATH_ID, n),
            (DELETE_POS_ID, n),
        ]))
        .null_value_counts(HashMap::from([
            (DELETE_FILE_PATH_ID, 0),
            (DELETE_POS_ID, 0),
        ]))
        .build()
        .map_err(|e| {
            Error::new(
                crate::error::ErrorKind::Internal,
                format!("position delete entry: {e}"),
            )
        })
}

/// The positions each position delete file of `deletes` marks, by data file path (the files
/// are read whole: a file path column and a position column, by field id or else by order).
pub(crate) async fn read_position_deletes(
    table: &Table,
    deletes: &[iceberg::scan::FileScanTaskDeleteFile],
) -> Result<std::collections::HashMap<String, std::collections::HashSet<i64>>> {
    use arrow::array::{Array, Int64Array, StringArray};
    use futures::{StreamExt, TryStreamExt};
    let mut out: std::collections::HashMap<String, std::collections::HashSet<i64>> =
        Default::default();
    let mut seen = std::collections::HashSet::new();
    let paths: Vec<String> = deletes
        .iter()
        .filter(|d| d.file_type == iceberg::spec::DataContentType::PositionDeletes)
        .filter(|d| seen.insert(d.file_path.clone()))
        .map(|d| d.file_path.clone())
        .collect();
    let file_io = table.file_io().clone();
    let contents: Vec<bytes::Bytes> = futures::stream::iter(paths.into_iter().map(|p| {
        let file_io = file_io.clone();
        async move {
            file_io
                .new_input(&p)
                .map_err(|e| Error::iceberg("position delete input", e))?
                .read()
                .await
                .map_err(|e| {
                    Error::iceberg(format!("reading position delete file {p}"), e)
                        .with_retryable(true)
                })
        }
    }))
    .buffered(16)
    .try_collect()
    .await?;
    for bytes in contents {
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| {
                Error::new(
                    crate::error::ErrorKind::Internal,
                    format!("position delete file: {e}"),
                )
            })?;
        for batch in reader {
            let batch = batch.map_err(|e| {
                Error::new(
                    crate::error::ErrorKind::Internal,
                    format!("position delete file: {e}"),
                )
            })?;
            let col = |id: i32, fallback: usize| {
                batch
                    .schema()
                    .fields()
                    .iter()
                    .position(|f| f.metadata().get("PARQUET:field_id") == Some(&id.to_string()))
                    .unwrap_or(fallback)
            };
            // Another engine's writer may use large strings or another integer width.
            let as_type = |i: usize, t: &arrow_schema::DataType| {
                if i >= batch.num_columns() {
                    return Err(Error::new(
                        crate::error::ErrorKind::Internal,
                        "a position delete file without (file_path string, pos long)",
                    ));
                }
                arrow::compute::cast(batch.column(i), t).map_err(|e| {
                    Error::new(
                        crate::error::ErrorKind::Internal,
                        format!("position delete file: {e}"),
                    )
                })
            };
            let paths = as_type(col(DELETE_FILE_PATH_ID, 0), &arrow_schema::DataType::Utf8)?;
            let pos = as_type(col(DELETE_POS_ID, 1), &arrow_schema::DataType::Int64)?;
            let (Some(paths), Some(pos)) = (
                paths.as_any().downcast_ref::<StringArray>(),
                pos.as_any().downcast_ref::<Int64Array>(),
            ) else {
                return Err(Error::new(
                    crate::error::ErrorKind::Internal,
                    "a position delete file without (file_path string, pos long)",
                ));
            };
            for i in 0..batch.num_rows() {
                if paths.is_valid(i) && pos.is_valid(i) {
                    out.entry(paths.value(i).to_string())
                        .or_default()
                        .insert(pos.value(i));
                }
            }
        }
    }
    Ok(out)
}

/// An in-memory table of `metadata` (JSON), named by the last segment of its location (tests).
#[cfg(test)]
pub(crate) fn memory_table(metadata: serde_json::Value) -> Table {
    let md: iceberg::spec::TableMetadata = serde_json::from_value(metadata).unwrap();
    let name = md.location().rsplit('/').next().unwrap_or("t").to_string();
    let location = format!("{}/metadata/00000-x.metadata.json", md.location());
    Table::builder()
        .metadata(md)
        .metadata_location(location)
        .identifier(iceberg::TableIdent::from_strs(["floe", name.as_str()]).unwrap())
        .file_io(iceberg::io::FileIO::new_with_memory())
        .runtime(iceberg::Runtime::try_current().unwrap())
        .build()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, TimestampMicrosecondArray};
    use iceberg::spec::Literal;
    use std::sync::Arc;

    const DAY_US: i64 = 86_400_000_000;

    /// An empty table of (id long, ts timestamptz) partitioned by day(ts), in memory.
    fn table() -> Table {
        memory_table(serde_json::json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "memory:///w/t", "last-sequence-number": 0, "last-updated-ms": 1000,
            "last-column-id": 2, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "id", "required": false, "type": "long"},
                {"id": 2, "name": "ts", "required": false, "type": "timestamptz"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": [
                {"source-id": 2, "field-id": 1000, "name": "ts_day", "transform": "day"}]}],
            "last-partition-id": 1000, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {}, "snapshots": [], "snapshot-log": [], "metadata-log": [],
            "refs": {}
        }))
    }

    fn batch(table: &Table, ts: Vec<Option<i64>>) -> RecordBatch {
        let schema =
            iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap();
        let ids = Int64Array::from_iter_values(0..ts.len() as i64);
        let ts = TimestampMicrosecondArray::from(ts).with_timezone("+00:00");
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(ids), Arc::new(ts)]).unwrap()
    }

    /// (day partition, record count) of each file written for `batches`, sorted.
    async fn files(batches: Vec<Vec<Option<i64>>>) -> Vec<(Option<i32>, u64)> {
        let t = table();
        let mut sink = build_sink(&t, 1 << 20, "w").unwrap();
        for b in batches {
            sink.write(batch(&t, b)).await.unwrap();
        }
        let mut out: Vec<(Option<i32>, u64)> = sink
            .close()
            .await
            .unwrap()
            .iter()
            .map(|f| {
                let day = match f.partition().fields().first() {
                    Some(Some(Literal::Primitive(iceberg::spec::PrimitiveLiteral::Int(d)))) => {
                        Some(*d)
                    }
                    _ => None,
                };
                (day, f.record_count())
            })
            .collect();
        out.sort();
        out
    }

    /// Partition values are URL-encoded in file paths as Iceberg Java writes them: a value
    /// holding or ending in `/` neither makes directories nor a `//` (which the storage layer
    /// stores as one `/`, so the recorded path and the object's key differed).
    #[test]
    fn partition_paths_encode_their_values_and_the_data_path_has_no_trailing_slash() {
        let md: TableMetadata = serde_json::from_value(serde_json::json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "s3://b/w/t/", "last-sequence-number": 0, "last-updated-ms": 1000,
            "last-column-id": 1, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "region", "required": false, "type": "string"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": [
                {"source-id": 1, "field-id": 1000, "name": "re gion", "transform": "identity"}]}],
            "last-partition-id": 1000, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {}, "snapshots": [], "snapshot-log": [], "metadata-log": [],
            "refs": {}
        }))
        .unwrap();
        let spec = md.default_partition_spec().as_ref().clone();
        let dir = |value: Option<&str>| {
            let data = Struct::from_iter([value.map(Literal::string)]);
            Locations::new(&md).dir(&spec, md.current_schema(), &data)
        };
        assert_eq!(dir(Some("eu/")), "s3://b/w/t/data/re%20gion=eu%2F");
        assert_eq!(
            dir(Some("a//b=c%d é")),
            "s3://b/w/t/data/re%20gion=a%2F%2Fb%3Dc%25d%20%C3%A9"
        );
        assert_eq!(
            dir(Some("eu-west_1.x")),
            "s3://b/w/t/data/re%20gion=eu-west_1.x"
        );
        assert_eq!(dir(None), "s3://b/w/t/data/re%20gion=null");
        // `write.data.path` given with a trailing slash (Java strips it too).
        let mut with_path = md.clone();
        let mut props = with_path.properties().clone();
        props.insert("write.data.path".into(), "s3://b/elsewhere/".into());
        with_path = iceberg::spec::TableMetadataBuilder::new_from_metadata(with_path, None)
            .set_properties(props)
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        let unpartitioned = PartitionSpec::unpartition_spec();
        assert_eq!(
            Locations::new(&with_path).dir(&unpartitioned, md.current_schema(), &Struct::empty()),
            "s3://b/elsewhere"
        );
        assert_eq!(
            Locations::new(&with_path).generate_location(None, "f.parquet"),
            "s3://b/elsewhere/f.parquet"
        );
    }

    /// A file of several row groups where one row group holds a value longer than Parquet's
    /// exact statistics: its bounds must still cover every row (or be left out), else a
    /// reader pruning by them skips the long values' rows.
    #[tokio::test]
    async fn bounds_cover_every_row_when_a_row_group_has_a_value_too_long_for_exact_statistics() {
        use arrow::array::StringArray;
        use iceberg::spec::{Datum, PrimitiveLiteral};
        let t = memory_table(serde_json::json!({
            "format-version": 2, "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c2",
            "location": "memory:///w/s", "last-sequence-number": 0, "last-updated-ms": 1000,
            "last-column-id": 2, "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "id", "required": false, "type": "long"},
                {"id": 2, "name": "region", "required": false, "type": "string"}]}],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {}, "snapshots": [], "snapshot-log": [], "metadata-log": [],
            "refs": {}
        }));
        let schema = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(t.metadata().current_schema()).unwrap(),
        );
        // Two row groups (128 Ki rows each at most); the first holds the smallest and the
        // greatest value, both 5,000 bytes long.
        let n = 140_000usize;
        let (low, high) = ("A".repeat(5000), "z".repeat(5000));
        let regions: Vec<String> = (0..n)
            .map(|i| match i {
                5 => low.clone(),
                6 => high.clone(),
                _ => format!("m{:06}", i % 1000),
            })
            .collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..n as i64)),
                Arc::new(StringArray::from(regions)),
            ],
        )
        .unwrap();
        let mut sink = build_sink(&t, 1 << 30, "w").unwrap();
        for start in (0..n).step_by(10_000) {
            sink.write(batch.slice(start, 10_000.min(n - start)))
                .await
                .unwrap();
        }
        let files = sink.close().await.unwrap();
        assert_eq!(files.len(), 1);
        let f = &files[0];
        assert_eq!(f.record_count(), n as u64);
        let text = |d: &Datum| match d.literal() {
            PrimitiveLiteral::String(s) => s.clone(),
            other => panic!("not a string bound: {other:?}"),
        };
        if let Some(lower) = f.lower_bounds().get(&2) {
            let lower = text(lower);
            assert!(lower <= low, "lower bound {lower:.8} excludes a row");
        }
        if let Some(upper) = f.upper_bounds().get(&2) {
            let upper = text(upper);
            assert!(upper >= high, "upper bound {upper:.8} excludes a row");
        }
        // The other column keeps its bounds.
        assert!(f.lower_bounds().contains_key(&1) && f.upper_bounds().contains_key(&1));
    }

    #[tokio::test]
    async fn a_batch_of_one_partition_goes_whole_and_a_mixed_one_is_split() {
        let d = |day: i64, us: i64| Some(day * DAY_US + us);
        // One day: the fast path, one file in that day's partition.
        assert_eq!(
            files(vec![vec![d(20000, 1), d(20000, 5), d(20000, DAY_US - 1)]]).await,
            vec![(Some(20000), 3)]
        );
        // Two days in one batch (and the last row alone in its day): cut in two.
        assert_eq!(
            files(vec![vec![d(20000, 1), d(20001, 0), d(20000, 7)]]).await,
            vec![(Some(20000), 2), (Some(20001), 1)]
        );
        // A null event time: its own (null) partition, the rest in theirs.
        assert_eq!(
            files(vec![vec![d(20000, 1), None, d(20000, 2)]]).await,
            vec![(None, 1), (Some(20000), 2)]
        );
        // Whole batches of different days, and a one-row batch: each in its partition.
        assert_eq!(
            files(vec![
                vec![d(20002, 3), d(20002, 4)],
                vec![d(20000, 0)],
                vec![d(20002, 9)]
            ])
            .await,
            vec![(Some(20000), 1), (Some(20002), 3)]
        );
        // Ten days of two rows in one batch: many small partitions, split by iceberg.
        let ten: Vec<_> = (0..20).map(|i| d(20000 + i % 10, i)).collect();
        assert_eq!(
            files(vec![ten]).await,
            (0..10).map(|i| (Some(20000 + i), 2)).collect::<Vec<_>>()
        );
    }

    fn ids(b: &RecordBatch) -> Vec<i64> {
        b.column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    fn cut(ts: Vec<Option<i64>>) -> (Vec<Vec<i64>>, Option<Vec<i64>>) {
        let t = table();
        let md = t.metadata();
        let values =
            PartitionValueCalculator::try_new(md.default_partition_spec(), md.current_schema())
                .unwrap();
        let b = batch(&t, ts);
        let (parts, rest) = by_partition(&values.calculate(&b).unwrap(), b).unwrap();
        (parts.iter().map(ids).collect(), rest.as_ref().map(ids))
    }

    #[tokio::test]
    async fn a_batch_is_cut_by_partition_in_order_of_first_row_keeping_row_order() {
        let d = |day: i64, us: i64| Some(day * DAY_US + us);
        // Days interleaved, nulls together: parts in order of first appearance.
        assert_eq!(
            cut(vec![
                d(7, 1),
                d(8, 0),
                d(7, 9),
                None,
                d(8, 5),
                None,
                d(7, 2)
            ]),
            (vec![vec![0, 2, 6], vec![1, 4], vec![3, 5]], None)
        );
        // One partition: the batch whole.
        assert_eq!(cut(vec![d(7, 1), d(7, 2)]), (vec![vec![0, 1]], None));
        // More partitions than MAX_PARTS (day i has 10 - i rows, each part at least an eighth
        // of the rows left): the first MAX_PARTS cut, the rows left as the rest.
        let many: Vec<_> = (0..10i64)
            .flat_map(|i| (0..10 - i).map(move |us| d(i, us)))
            .collect();
        let (parts, rest) = cut(many);
        assert_eq!(
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![10, 9, 8, 7, 6, 5, 4, 3]
        );
        assert_eq!(rest, Some(vec![52, 53, 54]));
        // Many small partitions: no cut at all (each would copy the batch again).
        let (parts, rest) = cut((0..16).map(|i| d(i, 0)).collect());
        assert!(parts.is_empty());
        assert_eq!(rest.map(|r| r.len()), Some(16));
        // Float partition values: left to iceberg, whose keys equate -0.0 and 0.0.
        let t = table();
        let b = batch(&t, vec![d(1, 0), d(1, 1)]);
        let zeros: ArrayRef = Arc::new(arrow::array::Float64Array::from(vec![-0.0, 0.0]));
        let values: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(arrow_schema::Field::new(
                "x",
                arrow_schema::DataType::Float64,
                true,
            )),
            zeros,
        )]));
        let (parts, rest) = by_partition(&values, b).unwrap();
        assert!(parts.is_empty());
        assert_eq!(rest.map(|r| r.num_rows()), Some(2));
        // Not a struct of partition values: all of it is the rest.
        let t = table();
        let b = batch(&t, vec![d(1, 0), d(1, 1)]);
        let (parts, rest) =
            by_partition(&(Arc::new(Int64Array::from(vec![1, 1])) as ArrayRef), b).unwrap();
        assert!(parts.is_empty());
        assert_eq!(rest.map(|r| r.num_rows()), Some(2));
    }
}
