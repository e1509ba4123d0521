//! Reading a pipeline's input: source files in bounded chunks, whole tables for the batch speed,
//! always conformed to the table's current schema as the SQL sees it.

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use iceberg::expr::Predicate;
use iceberg::table::Table;

use super::transform;
use crate::error::{Error, Result};
use crate::scan::{live_files, scan_tasks, LiveFile};

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

/// Reads `files` of `table` into memory with the current schema (metadata-free Arrow schema).
pub(super) async fn read_rows(
    table: &Table,
    files: &[LiveFile],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let schema = transform::table_schema(table)?;
    if files.is_empty() {
        return Ok((schema, Vec::new()));
    }
    let stream = futures::stream::iter(scan_tasks(table, files).into_iter().map(Ok));
    let batches: Vec<RecordBatch> = table
        .reader_builder()
        .with_batch_size(8192)
        .build()
        .read(Box::pin(stream))
        .map_err(|e| Error::iceberg(format!("reading {}", table.identifier()), e))?
        .stream()
        .try_collect()
        .await
        .map_err(|e| {
            Error::iceberg(format!("reading {}", table.identifier()), e).with_retryable(true)
        })?;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        out.push(transform::conform(&b, &schema)?);
    }
    Ok((schema, out))
}

/// All rows of `table`'s current snapshot.
pub(super) async fn scan_table(table: &Table) -> Result<Vec<RecordBatch>> {
    let files = live_files(table).await?;
    Ok(read_rows(table, &files).await?.1)
}

/// Rows of `table` at `snapshot` (default: current) matching `filter`, conformed to `schema`.
pub(super) async fn scan_rows(
    table: &Table,
    snapshot: Option<i64>,
    filter: Option<Predicate>,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let mut scan = table.scan().select_all();
    if let Some(id) = snapshot {
        scan = scan.snapshot_id(id);
    }
    if let Some(f) = filter {
        scan = scan.with_filter(f);
    }
    let failed = |e| Error::iceberg(format!("scanning {}", table.identifier()), e);
    let batches: Vec<RecordBatch> = scan
        .build()
        .map_err(failed)?
        .to_arrow()
        .await
        .map_err(failed)?
        .try_collect()
        .await
        .map_err(|e| failed(e).with_retryable(true))?;
    batches
        .iter()
        .map(|b| transform::conform(b, schema))
        .collect()
}
