//! Writing rows as Iceberg data files: Parquet through iceberg's writers, split by partition,
//! rolled at the target size. Shared by ingest and compaction.

use arrow::array::RecordBatch;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
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
    DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

/// Where rows go: a partition fan-out or a single unpartitioned writer (both large: boxed).
pub(crate) enum Sink {
    /// Partitioned: split each batch by partition, one rolling writer per partition.
    Fanout(
        Box<(
            FanoutWriter<DataWriterBuilder>,
            RecordBatchPartitionSplitter,
        )>,
    ),
    /// Unpartitioned: one rolling writer.
    Plain(Box<UnpartitionedWriter<DataWriterBuilder>>),
}

impl Sink {
    /// Writes a batch (any partitions).
    pub(crate) async fn write(&mut self, batch: RecordBatch) -> iceberg::Result<()> {
        match self {
            Sink::Fanout(fan) => {
                let (w, splitter) = &mut **fan;
                for (key, part) in splitter.split(&batch)? {
                    w.write(key, part).await?;
                }
                Ok(())
            }
            Sink::Plain(w) => w.write(batch).await,
        }
    }
    /// Closes all files and returns them.
    pub(crate) async fn close(self) -> iceberg::Result<Vec<DataFile>> {
        match self {
            Sink::Fanout(fan) => fan.0.close().await,
            Sink::Plain(w) => w.close().await,
        }
    }
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
        .set_statistics_truncate_length(Some(4096))
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
    let loc = DefaultLocationGenerator::new(md)?;
    let names =
        DefaultFileNameGenerator::new(format!("floe-{writer_id}"), None, DataFileFormat::Parquet);
    let rolling =
        RollingFileWriterBuilder::new(pw, target_bytes, table.file_io().clone(), loc, names);
    let dfw = DataFileWriterBuilder::new(rolling);
    let spec = md.default_partition_spec().clone();
    if spec.is_unpartitioned() {
        Ok(Sink::Plain(Box::new(UnpartitionedWriter::new(dfw))))
    } else {
        let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(schema, spec)?;
        Ok(Sink::Fanout(Box::new((FanoutWriter::new(dfw), splitter))))
    }
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
