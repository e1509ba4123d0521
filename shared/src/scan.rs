//! Reading what a table holds now: its live data files (from the current snapshot's manifests)
//! and scan tasks that read them with the table's current schema.

use std::sync::Arc;

use futures::StreamExt;
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::{DataContentType, DataFile, ManifestContentType, ManifestFile};
use iceberg::table::Table;

use crate::error::{Error, ErrorKind, Result};
use crate::snapshot;

/// A live data file and the spec it was written with.
#[derive(Debug, Clone)]
pub struct LiveFile {
    /// The file.
    pub file: DataFile,
    /// Its partition spec id.
    pub spec_id: i32,
    /// The live position delete files that apply to it (same spec and partition, a data
    /// sequence number at or above the file's): every read of it applies them.
    pub deletes: Vec<FileScanTaskDeleteFile>,
}

impl LiveFile {
    /// A file read as written (no delete files apply: a delta's new file).
    pub fn new(file: DataFile, spec_id: i32) -> Self {
        Self {
            file,
            spec_id,
            deletes: Vec::new(),
        }
    }
}

/// A live delete file of the current snapshot.
#[derive(Debug, Clone)]
pub struct LiveDelete {
    /// The delete file.
    pub file: DataFile,
    /// Its partition spec id.
    pub spec_id: i32,
    /// Its data sequence number (it applies to data files at or below it).
    pub seq: i64,
}

impl LiveDelete {
    /// Whether this delete file applies to data file `f` of data sequence number `data_seq`.
    pub fn applies_to(&self, f: &DataFile, spec_id: i32, data_seq: i64) -> bool {
        self.file.content_type() == DataContentType::PositionDeletes
            && self.spec_id == spec_id
            && self.file.partition() == f.partition()
            && data_seq <= self.seq
            && self
                .file
                .referenced_data_file()
                .is_none_or(|r| r == f.file_path())
    }

    /// As a scan task's delete file.
    pub fn task(&self) -> FileScanTaskDeleteFile {
        FileScanTaskDeleteFile {
            file_path: self.file.file_path().to_string(),
            file_size_in_bytes: self.file.file_size_in_bytes(),
            file_type: self.file.content_type(),
            partition_spec_id: self.spec_id,
            equality_ids: self.file.equality_ids(),
        }
    }
}

/// The live delete files of `manifests` (position and equality).
pub(crate) async fn live_deletes_of(
    table: &Table,
    manifests: &[ManifestFile],
) -> Result<Vec<LiveDelete>> {
    let mut out = Vec::new();
    let live = manifests
        .iter()
        .filter(|mf| mf.content == ManifestContentType::Deletes && snapshot::lists_live(mf))
        .cloned()
        .collect::<Vec<_>>();
    let mut loads = snapshot::load_manifests(table, live, "a delete manifest");
    while let Some(loaded) = loads.next().await {
        let (mf, m) = loaded?;
        for e in m.entries().iter().filter(|e| e.is_alive()) {
            out.push(LiveDelete {
                file: e.data_file().clone(),
                spec_id: mf.partition_spec_id,
                seq: e.sequence_number().unwrap_or(0),
            });
        }
    }
    Ok(out)
}

/// The live delete files of the current snapshot.
pub async fn live_deletes(table: &Table) -> Result<Vec<LiveDelete>> {
    let manifests = snapshot::current_manifests(table).await?;
    live_deletes_of(table, &manifests).await
}

/// Live data files of the current snapshot.
pub async fn live_files(table: &Table) -> Result<Vec<LiveFile>> {
    Ok(live_files_added_by(table)
        .await?
        .into_iter()
        .map(|(f, _)| f)
        .collect())
}

/// Live data files of the current snapshot, each with the snapshot that added it.
pub(crate) async fn live_files_added_by(table: &Table) -> Result<Vec<(LiveFile, i64)>> {
    let mut out = Vec::new();
    let manifests = snapshot::current_manifests(table).await?;
    let deletes = Box::pin(live_deletes_of(table, &manifests)).await?;
    let data = manifests
        .into_iter()
        .filter(|mf| mf.content == ManifestContentType::Data);
    let mut loads = snapshot::load_manifests(table, data, "a manifest");
    while let Some(loaded) = loads.next().await {
        let (mf, m) = loaded?;
        for e in m.entries().iter().filter(|e| e.is_alive()) {
            let file = e.data_file().clone();
            let seq = e.sequence_number().unwrap_or(0);
            out.push((
                LiveFile {
                    deletes: applicable(&deletes, &file, mf.partition_spec_id, seq),
                    file,
                    spec_id: mf.partition_spec_id,
                },
                e.snapshot_id().unwrap_or(mf.added_snapshot_id),
            ));
        }
    }
    Ok(out)
}

/// Live data files of snapshot `snapshot_id` (None when the table no longer has it: expired).
pub(crate) async fn live_files_at(
    table: &Table,
    snapshot_id: i64,
) -> Result<Option<Vec<LiveFile>>> {
    let Some(snap) = table.metadata().snapshot_by_id(snapshot_id) else {
        return Ok(None);
    };
    let list = table
        .manifest_list_reader(snap)
        .load()
        .await
        .map_err(|e| Error::iceberg("reading a manifest list", e).with_retryable(true))?;
    let manifests: Vec<iceberg::spec::ManifestFile> = list.consume_entries().into_iter().collect();
    let deletes = Box::pin(live_deletes_of(table, &manifests)).await?;
    let mut out = Vec::new();
    let data = manifests
        .into_iter()
        .filter(|mf| mf.content == ManifestContentType::Data);
    let mut loads = snapshot::load_manifests(table, data, "a manifest");
    while let Some(loaded) = loads.next().await {
        let (mf, m) = loaded.map_err(|e| e.with_retryable(true))?;
        for e in m.entries().iter().filter(|e| e.is_alive()) {
            let file = e.data_file().clone();
            let seq = e.sequence_number().unwrap_or(0);
            out.push(LiveFile {
                deletes: applicable(&deletes, &file, mf.partition_spec_id, seq),
                file,
                spec_id: mf.partition_spec_id,
            });
        }
    }
    Ok(Some(out))
}

/// The position delete files of `deletes` that apply to data file `file` (of spec `spec_id`,
/// data sequence number `seq`).
fn applicable(
    deletes: &[LiveDelete],
    file: &DataFile,
    spec_id: i32,
    seq: i64,
) -> Vec<FileScanTaskDeleteFile> {
    deletes
        .iter()
        .filter(|d| d.applies_to(file, spec_id, seq))
        .map(LiveDelete::task)
        .collect()
}

/// Scan tasks reading `files` with `table`'s current schema (older files: new columns null).
pub fn scan_tasks(table: &Table, files: &[LiveFile]) -> Vec<FileScanTask> {
    let ids: Vec<i32> = table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.id)
        .collect();
    projected_scan_tasks(table, files, &ids)
}

/// Scan tasks reading only the columns `field_ids` (of the current schema) of `files`: Parquet
/// fetches and decodes just those column chunks. Each file's position delete files
/// ([`LiveFile::deletes`]) go with its task: iceberg's reader skips the rows they delete.
pub fn projected_scan_tasks(
    table: &Table,
    files: &[LiveFile],
    field_ids: &[i32],
) -> Vec<FileScanTask> {
    let md = table.metadata();
    let schema = md.current_schema().clone();
    // Files added without field ids (Spark/PyIceberg `add_files`, migrations) are read by the
    // table's name mapping, as iceberg's own scan does; without it they would be read by position.
    let name_mapping = md
        .properties()
        .get(iceberg::spec::DEFAULT_SCHEMA_NAME_MAPPING)
        .and_then(|raw| {
            serde_json::from_str::<iceberg::spec::NameMapping>(raw)
                .map_err(|e| tracing::warn!(table = %table.identifier(), error = %e, "unreadable name mapping"))
                .ok()
        })
        .map(Arc::new);
    files
        .iter()
        .map(|f| {
            FileScanTask::builder()
                .with_file_size_in_bytes(f.file.file_size_in_bytes())
                .with_start(0)
                .with_length(f.file.file_size_in_bytes())
                .with_record_count(Some(f.file.record_count()))
                .with_data_file_path(f.file.file_path().to_string())
                .with_data_file_format(f.file.file_format())
                .with_schema(schema.clone())
                .with_project_field_ids(field_ids.to_vec())
                .with_partition(Some(f.file.partition().clone()))
                .with_partition_spec(md.partition_spec_by_id(f.spec_id).cloned())
                .with_name_mapping(name_mapping.clone())
                .with_case_sensitive(true)
                .with_deletes(f.deletes.clone())
                .build()
        })
        .collect()
}

/// `Stale` when the current snapshot has live equality delete files (another engine's
/// row-level deletes by value). floe's readers apply position deletes (every scan task carries
/// the ones of its file, [`LiveFile::deletes`]), not equality deletes, so they must
/// not run over such a table as if its rows were all live.
pub(crate) async fn refuse_equality_deletes(table: &Table, what: &str) -> Result<()> {
    let eq: Vec<String> = live_deletes(table)
        .await?
        .into_iter()
        .filter(|d| d.file.content_type() == DataContentType::EqualityDeletes)
        .map(|d| d.file.file_path().to_string())
        .collect();
    if eq.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Stale,
        format!(
            "{} has {} equality delete file(s) (row-level deletes by value, written by another \
             engine: {}); floe applies position deletes only and would return deleted rows, so \
             {what} did not run. Rewrite the table's deleted rows away with that engine (a \
             compaction that applies deletes, or copy-on-write) first",
            table.identifier(),
            eq.len(),
            eq.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ),
    ))
}
