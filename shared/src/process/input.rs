//! Reading a pipeline's input: source files in bounded chunks, whole tables for the batch speed,
//! always conformed to the table's current schema as the SQL sees it.

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use iceberg::expr::Predicate;
use iceberg::scan::FileScanTask;
use iceberg::table::Table;

use super::transform;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::{live_files, projected_scan_tasks, scan_tasks, LiveFile};

/// Rows per chunk of an append pipeline (bounds memory whatever the delta's size).
const CHUNK_ROWS: u64 = 256 * 1024;

/// Groups of files with at most [`CHUNK_ROWS`] rows (one file per group at least).
pub(super) fn chunks(files: &[LiveFile]) -> Vec<&[LiveFile]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut rows = 0;
    for (i, f) in files.iter().enumerate() {
        if rows > 0 && rows + f.file.record_count() > CHUNK_ROWS {
            out.push(&files[start..i]);
            start = i;
            rows = 0;
        }
        rows += f.file.record_count();
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// What a read cost: data files opened and bytes fetched from storage (Parquet footers, column
/// chunks) — iceberg's reader counts the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ReadCost {
    /// Data files opened.
    pub(super) files: usize,
    /// Bytes read from them.
    pub(super) bytes: u64,
}

impl std::ops::AddAssign for ReadCost {
    fn add_assign(&mut self, o: Self) {
        self.files += o.files;
        self.bytes += o.bytes;
    }
}

/// Bytes fetched from a Parquet file's end to read its footer in one request. iceberg's
/// default (512 KiB) is not reused for the column chunks read next: a small file would be
/// fetched about twice, and a projected read of one column would fetch most of it.
const FOOTER_HINT: usize = 64 << 10;

/// Reads `tasks` of `table` (as they come: not conformed), counting what the reads cost.
async fn read_tasks(
    table: &Table,
    tasks: Vec<FileScanTask>,
) -> Result<(Vec<RecordBatch>, ReadCost)> {
    let files = tasks.len();
    if files == 0 {
        return Ok((Vec::new(), ReadCost::default()));
    }
    let stream = futures::stream::iter(tasks.into_iter().map(Ok));
    let result = table
        .reader_builder()
        .with_batch_size(8192)
        .with_data_file_concurrency_limit(super::plan::READ_CONCURRENCY)
        .with_metadata_size_hint(FOOTER_HINT)
        .build()
        .read(Box::pin(stream))
        .map_err(|e| Error::iceberg(format!("reading {}", table.identifier()), e))?;
    let metrics = result.metrics().clone();
    let batches: Vec<RecordBatch> = result.stream().try_collect().await.map_err(|e| {
        Error::iceberg(format!("reading {}", table.identifier()), e).with_retryable(true)
    })?;
    let cost = ReadCost {
        files,
        bytes: metrics.bytes_read(),
    };
    Ok((batches, cost))
}

/// Reads `files` of `table` into memory with the current schema (metadata-free Arrow schema).
pub(super) async fn read_rows(
    table: &Table,
    files: &[LiveFile],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let (schema, rows, _) = read_rows_costed(table, files).await?;
    Ok((schema, rows))
}

/// [`read_rows`], with what the read cost.
pub(super) async fn read_rows_costed(
    table: &Table,
    files: &[LiveFile],
) -> Result<(SchemaRef, Vec<RecordBatch>, ReadCost)> {
    let schema = transform::table_schema(table)?;
    let (batches, cost) = read_tasks(table, scan_tasks(table, files)).await?;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        out.push(transform::conform(&b, &schema)?);
    }
    Ok((schema, out, cost))
}

/// Only the column `column` (of the current schema) of `files`: a projected read that fetches
/// and decodes that one column chunk per row group. Batches hold that one column (a file
/// written before the column existed reads as nulls).
pub(super) async fn read_column(
    table: &Table,
    files: &[LiveFile],
    column: &str,
) -> Result<(Vec<RecordBatch>, ReadCost)> {
    let id = table
        .metadata()
        .current_schema()
        .field_by_name(column)
        .map(|f| f.id)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Transform,
                format!("{} has no column `{column}`", table.identifier()),
            )
        })?;
    let full = transform::table_schema(table)?;
    let field = full
        .field_with_name(column)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("`{column}`: {e}")))?;
    let schema: SchemaRef = std::sync::Arc::new(arrow_schema::Schema::new(vec![field.clone()]));
    let (batches, cost) = read_tasks(table, projected_scan_tasks(table, files, &[id])).await?;
    let batches = batches
        .iter()
        .map(|b| transform::conform(b, &schema))
        .collect::<Result<Vec<_>>>()?;
    Ok((batches, cost))
}

/// The scan tasks iceberg plans for `scan` over `table` (manifests and data files pruned by
/// partition summaries, partition values and column bounds).
async fn plan_tasks(
    table: &Table,
    scan: iceberg::scan::TableScanBuilder<'_>,
) -> Result<Vec<FileScanTask>> {
    let failed = |e| Error::iceberg(format!("scanning {}", table.identifier()), e);
    scan.build()
        .map_err(failed)?
        .plan_files()
        .await
        .map_err(failed)?
        .try_collect()
        .await
        .map_err(|e| failed(e).with_retryable(true))
}

/// The column `column` of `table`'s rows at `snapshot` matching `filter`, handed to `each` one
/// batch at a time as it is read (never all in memory), and what the read cost. iceberg plans
/// and prunes the files and row groups as for [`scan_rows`]; only that column is fetched.
pub(super) async fn scan_column(
    table: &Table,
    snapshot: i64,
    filter: Option<Predicate>,
    column: &str,
    mut each: impl FnMut(&RecordBatch) -> Result<()>,
) -> Result<ReadCost> {
    let mut scan = table.scan().select([column]).snapshot_id(snapshot);
    if let Some(f) = filter {
        scan = scan.with_filter(f);
    }
    let tasks = plan_tasks(table, scan).await?;
    let files = tasks.len();
    if files == 0 {
        return Ok(ReadCost::default());
    }
    let result = table
        .reader_builder()
        .with_batch_size(8192)
        .with_metadata_size_hint(FOOTER_HINT)
        .build()
        .read(Box::pin(futures::stream::iter(tasks.into_iter().map(Ok))))
        .map_err(|e| Error::iceberg(format!("reading {}", table.identifier()), e))?;
    let metrics = result.metrics().clone();
    let mut stream = result.stream();
    while let Some(b) = stream.try_next().await.map_err(|e| {
        Error::iceberg(format!("reading {}", table.identifier()), e).with_retryable(true)
    })? {
        // An identity partition's column comes run-end encoded.
        let b = crate::write::without_run_ends(b)
            .map_err(|e| Error::iceberg(format!("reading {}", table.identifier()), e))?;
        each(&b)?;
    }
    Ok(ReadCost {
        files,
        bytes: metrics.bytes_read(),
    })
}

/// All rows of `table`'s current snapshot.
pub(super) async fn scan_table(table: &Table) -> Result<Vec<RecordBatch>> {
    let files = live_files(table).await?;
    Ok(read_rows(table, &files).await?.1)
}

/// All rows of `table` at `snapshot`, conformed to `schema`, read batch by batch and counted in
/// memory (Arrow bytes) on top of `held`: once the total passes `max_bytes` the read stops and
/// `over(total)` is the error, so memory stays bounded by the limit plus one batch. Returns the
/// rows and the new total.
pub(super) async fn scan_bounded(
    table: &Table,
    snapshot: i64,
    schema: &SchemaRef,
    held: u64,
    max_bytes: u64,
    over: impl Fn(u64) -> Error,
) -> Result<(Vec<RecordBatch>, u64)> {
    let tasks = plan_tasks(table, table.scan().select_all().snapshot_id(snapshot)).await?;
    if tasks.is_empty() {
        return Ok((Vec::new(), held));
    }
    let stream = futures::stream::iter(tasks.into_iter().map(Ok));
    let result = table
        .reader_builder()
        .with_batch_size(8192)
        .with_metadata_size_hint(FOOTER_HINT)
        .build()
        .read(Box::pin(stream))
        .map_err(|e| Error::iceberg(format!("reading {}", table.identifier()), e))?;
    let mut batches = result.stream();
    let mut total = held;
    let mut out = Vec::new();
    while let Some(b) = batches.try_next().await.map_err(|e| {
        Error::iceberg(format!("reading {}", table.identifier()), e).with_retryable(true)
    })? {
        let b = transform::conform(&b, schema)?;
        total = total.saturating_add(b.get_array_memory_size() as u64);
        if total > max_bytes {
            return Err(over(total));
        }
        out.push(b);
    }
    Ok((out, total))
}

/// Rows of `table` at `snapshot` (default: current) matching `filter`, conformed to `schema`,
/// with what the read cost. iceberg plans the files: manifests whose partition summaries
/// cannot match are skipped, then data files by partition value and by column min/max; its
/// reader skips row groups by their Parquet statistics and filters the rows.
pub(super) async fn scan_rows(
    table: &Table,
    snapshot: Option<i64>,
    filter: Option<Predicate>,
    schema: &SchemaRef,
) -> Result<(Vec<RecordBatch>, ReadCost)> {
    let mut scan = table.scan().select_all();
    if let Some(id) = snapshot {
        scan = scan.snapshot_id(id);
    }
    if let Some(f) = filter {
        scan = scan.with_filter(f);
    }
    let tasks = plan_tasks(table, scan).await?;
    let (batches, cost) = read_tasks(table, tasks).await?;
    let batches = batches
        .iter()
        .map(|b| transform::conform(b, schema))
        .collect::<Result<Vec<_>>>()?;
    Ok((batches, cost))
}

/// The rows of each of `files` as written (their delete files not applied), in file order:
/// row `r` of a file's batches is its position `r`, what a position delete names. Only the
/// columns `columns` (by name, of the current schema; None: all), conformed to `schema`.
/// Files are read several at once, each by a reader of its own (so its rows stay in order).
pub(super) async fn read_positioned(
    table: &Table,
    files: &[LiveFile],
    columns: Option<&[String]>,
    schema: &SchemaRef,
) -> Result<(Vec<Vec<RecordBatch>>, ReadCost)> {
    use futures::StreamExt;
    let current = table.metadata().current_schema().clone();
    let ids: Vec<i32> = match columns {
        None => current.as_struct().fields().iter().map(|f| f.id).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                current.field_by_name(n).map(|f| f.id).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Transform,
                        format!("{} has no column `{n}`", table.identifier()),
                    )
                })
            })
            .collect::<Result<_>>()?,
    };
    let read = |f: &LiveFile| {
        let bare = LiveFile::new(f.file.clone(), f.spec_id);
        let tasks = projected_scan_tasks(table, std::slice::from_ref(&bare), &ids);
        let expect = f.file.record_count();
        let path = f.file.file_path().to_string();
        async move {
            let (batches, cost) = read_tasks(table, tasks).await?;
            let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
            if rows != expect {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("{path}: read {rows} rows, its manifest entry says {expect}"),
                ));
            }
            let batches = batches
                .iter()
                .map(|b| transform::conform(b, schema))
                .collect::<Result<Vec<_>>>()?;
            Ok::<_, Error>((batches, cost))
        }
    };
    let results: Vec<(Vec<RecordBatch>, ReadCost)> = futures::stream::iter(files.iter().map(read))
        .buffered(super::plan::READ_CONCURRENCY)
        .try_collect()
        .await?;
    let mut cost = ReadCost::default();
    let mut out = Vec::with_capacity(results.len());
    for (b, c) in results {
        cost += c;
        out.push(b);
    }
    Ok((out, cost))
}
