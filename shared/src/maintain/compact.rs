//! Compaction: bin-pack small files per partition (sorted by the table's sort order when it
//! has one) and replace each group in one `replace` commit whose removed files must still be live.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use arrow::array::RecordBatch;
use futures::TryStreamExt;
use iceberg::table::Table;
use iceberg::TableIdent;

use super::*;

impl Maintainer {
    /// Bin-packs small files per partition and rewrites each group as one `replace` commit.
    pub async fn compact(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
        run: &RunMeter,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        if let Err(e) = crate::scan::refuse_equality_deletes(&table, "compaction").await {
            // Rewriting data files without applying another engine's equality deletes would
            // bring deleted rows back. (Position deletes are applied: see below.)
            tracing::warn!(table = %ident, error = %e, "compaction skipped");
            report.compaction_skipped = Some(e.to_string());
            return Ok(());
        }
        let md = table.metadata();
        let target = opts
            .target_file_bytes
            .or_else(|| prop(md, "write.target-file-size-bytes"))
            .unwrap_or(512 << 20);
        let small = (target as f64 * opts.small_file_fraction) as u64;
        let live = live_files(&table).await?;
        let delete_rows: HashMap<String, u64> = crate::scan::live_deletes(&table)
            .await?
            .into_iter()
            .map(|d| (d.file.file_path().to_string(), d.file.record_count()))
            .collect();
        // Position deletes per partition: the rows they delete against the rows of its files.
        let mut rows: HashMap<(i32, String), (u64, u64)> = HashMap::new();
        let mut deletes_seen: HashMap<(i32, String), std::collections::HashSet<String>> =
            HashMap::new();
        for f in &live {
            let key = (f.spec_id, format!("{:?}", f.file.partition()));
            let e = rows.entry(key.clone()).or_default();
            e.0 += f.file.record_count();
            let seen = deletes_seen.entry(key).or_default();
            for d in &f.deletes {
                if seen.insert(d.file_path.clone()) {
                    e.1 += delete_rows.get(&d.file_path).copied().unwrap_or(0);
                }
            }
        }
        let heavy = |key: &(i32, String)| {
            rows.get(key)
                .is_some_and(|&(n, d)| d > 0 && d as f64 >= opts.delete_ratio * n.max(1) as f64)
        };
        let mut by_partition: BTreeMap<(i32, String), Vec<LiveFile>> = BTreeMap::new();
        for f in live {
            let key = (f.spec_id, format!("{:?}", f.file.partition()));
            if f.file.file_size_in_bytes() < small || (!f.deletes.is_empty() && heavy(&key)) {
                by_partition.entry(key).or_default().push(f);
            }
        }
        let mut groups: Vec<Vec<LiveFile>> = Vec::new();
        for (_, mut files) in by_partition {
            files.sort_by_key(|f| f.file.file_size_in_bytes());
            let mut bin: Vec<LiveFile> = Vec::new();
            let mut bytes = 0u64;
            for f in files {
                if bytes + f.file.file_size_in_bytes() > target && !bin.is_empty() {
                    groups.push(std::mem::take(&mut bin));
                    bytes = 0;
                }
                bytes += f.file.file_size_in_bytes();
                bin.push(f);
            }
            groups.push(bin);
        }
        // A group that applies deletes is worth a rewrite however few files it has.
        groups
            .retain(|g| g.len() >= opts.min_input_files || g.iter().any(|f| !f.deletes.is_empty()));
        let total = groups.len();
        for (i, group) in groups.into_iter().enumerate() {
            if Instant::now() >= opts.deadline {
                report.groups_deferred = total - i;
                tracing::info!(table = %ident, deferred = total - i, "deadline reached; compaction continues next run");
                break;
            }
            if opts.dry_run {
                report.groups_compacted += 1;
                continue;
            }
            match self.compact_group(ident, &group, target, opts, run).await? {
                Group::Compacted(dropped) => {
                    report.groups_compacted += 1;
                    report.delete_files_removed += dropped;
                }
                Group::Obsolete => report.groups_obsolete += 1,
                Group::Refused(why) => {
                    // Nothing read; the groups after it would be refused alike.
                    report.compaction_skipped = Some(why);
                    break;
                }
            }
            report.compaction_bytes_read += group
                .iter()
                .map(|f| f.file.file_size_in_bytes())
                .sum::<u64>();
        }
        Ok(())
    }

    /// Rewrites one group with its position deletes applied, removing the delete files that
    /// then apply to no live file (see [`Group`]).
    async fn compact_group(
        &self,
        ident: &TableIdent,
        group: &[LiveFile],
        target: u64,
        opts: &Options,
        run: &RunMeter,
    ) -> Result<Group> {
        let table = self.committer.load(ident).await?;
        // Equality deletes committed since the run's own check (another engine's upsert): the
        // group read now would be rewritten without them, and its new files, numbered after the
        // deletes, would bring the deleted rows back. (After this load, `planned_on` makes any
        // delete file a conflict.)
        match crate::scan::refuse_equality_deletes(&table, "compaction").await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Stale => {
                tracing::warn!(table = %ident, error = %e, "compaction stopped");
                return Ok(Group::Refused(e.to_string()));
            }
            Err(e) => return Err(e),
        }
        // The group as the version read now holds it (its files' delete files may have grown
        // since the plan); a file no longer live: obsolete.
        let live_now = live_files(&table).await?;
        let by_path: HashMap<&str, &LiveFile> =
            live_now.iter().map(|f| (f.file.file_path(), f)).collect();
        let mut fresh = Vec::with_capacity(group.len());
        for f in group {
            match by_path.get(f.file.file_path()) {
                Some(f) => fresh.push((*f).clone()),
                None => return Ok(Group::Obsolete),
            }
        }
        let group = &fresh[..];
        let md = table.metadata();
        let schema = md.current_schema().clone();
        let tasks = scan_tasks(&table, group);
        let stream = futures::stream::iter(tasks.into_iter().map(Ok));
        let batches = table
            .reader_builder()
            .with_batch_size(8192)
            .build()
            .read(Box::pin(stream))
            .map_err(|e| Error::iceberg("reading files to compact", e))?
            .stream();
        let writer_id = format!("compact-{}", uuid::Uuid::now_v7());
        let mut sink = crate::write::build_sink(&table, target as usize, &writer_id)
            .map_err(|e| Error::iceberg("compaction writer", e))?;
        let sort = md.default_sort_order().clone();
        // Decode on one task, encode on this one: two cores, both busy.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<iceberg::Result<RecordBatch>>(4);
        let reader = tokio::spawn(async move {
            let mut batches = batches;
            loop {
                let item = match batches.try_next().await {
                    Ok(Some(b)) => Ok(b),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
        });
        // A sorted table's rows are held and sorted in runs of at most `sort_memory_bytes`; each
        // run is written to files of its own, so every output file is sorted and memory stays
        // bounded whatever the group's size.
        let mut held: Vec<RecordBatch> = Vec::new();
        let mut held_bytes = 0usize;
        let mut added = Vec::new();
        let mut runs = 0u32;
        while let Some(b) = rx.recv().await {
            let b = b.map_err(|e| Error::iceberg("reading files to compact", e))?;
            if sort.is_unsorted() {
                sink.write(b)
                    .await
                    .map_err(|e| Error::iceberg("writing compacted files", e))?;
                continue;
            }
            held_bytes += b.get_array_memory_size();
            held.push(b);
            if held_bytes >= opts.sort_memory_bytes {
                let sorted = sort_batches(&std::mem::take(&mut held), &sort, &schema)?;
                held_bytes = 0;
                sink.write(sorted)
                    .await
                    .map_err(|e| Error::iceberg("writing compacted files", e))?;
                // Each run's files get names of their own (a writer numbers its files from 0).
                runs += 1;
                let next = crate::write::build_sink(
                    &table,
                    target as usize,
                    &format!("{writer_id}-{runs}"),
                )
                .map_err(|e| Error::iceberg("compaction writer", e))?;
                let run = std::mem::replace(&mut sink, next);
                added.extend(
                    run.close()
                        .await
                        .map_err(|e| Error::iceberg("closing compacted files", e))?,
                );
            }
        }
        let _ = reader.await;
        if !held.is_empty() {
            let sorted = sort_batches(&held, &sort, &schema)?;
            sink.write(sorted)
                .await
                .map_err(|e| Error::iceberg("writing compacted files", e))?;
        }
        added.extend(
            sink.close()
                .await
                .map_err(|e| Error::iceberg("closing compacted files", e))?,
        );
        let removed: Vec<String> = group
            .iter()
            .map(|f| f.file.file_path().to_string())
            .collect();
        // The rows read are the group's rows less those its position deletes delete.
        let deleted = crate::write::read_position_deletes(
            &table,
            &group
                .iter()
                .flat_map(|f| f.deletes.iter().cloned())
                .collect::<Vec<_>>(),
        )
        .await?;
        let rows_deleted: u64 = group
            .iter()
            .map(|f| {
                deleted.get(f.file.file_path()).map_or(0, |p| {
                    p.iter()
                        .filter(|&&p| p >= 0 && (p as u64) < f.file.record_count())
                        .count() as u64
                })
            })
            .sum();
        let rows_in: u64 = group.iter().map(|f| f.file.record_count()).sum::<u64>() - rows_deleted;
        // Delete files that apply to no live file once the group is replaced.
        let gone: std::collections::HashSet<&str> = removed.iter().map(String::as_str).collect();
        let mut still: std::collections::HashSet<String> = Default::default();
        for f in &live_now {
            if !gone.contains(f.file.file_path()) {
                still.extend(f.deletes.iter().map(|d| d.file_path.clone()));
            }
        }
        let mut dropped_deletes: Vec<String> = group
            .iter()
            .flat_map(|f| f.deletes.iter().map(|d| d.file_path.clone()))
            .filter(|p| !still.contains(p))
            .collect();
        dropped_deletes.sort();
        dropped_deletes.dedup();
        let rows_out: u64 = added.iter().map(|f| f.record_count()).sum();
        if rows_in != rows_out {
            delete_paths(&table, added.iter().map(|f| f.file_path().to_string())).await;
            return Err(Error::new(
                ErrorKind::Internal,
                format!("compaction of {ident} read {rows_in} rows but wrote {rows_out}"),
            ));
        }
        let props = HashMap::from([
            (summary::OPERATION.to_string(), "compaction".to_string()),
            (
                summary::REWRITTEN_FILES.to_string(),
                removed.len().to_string(),
            ),
        ]);
        let n_dropped = dropped_deletes.len();
        let change = Change {
            removed_deletes: dropped_deletes,
            // Deletes (or a rewrite) since the group was read would be lost by it: `Stale`.
            planned_on: Some(md.current_snapshot_id()),
            ..Change::replace(added.clone(), removed.clone(), props)
        }
        .written_with(md.default_partition_spec_id());
        let result = self
            .committer
            .commit(
                ident,
                &self.limits(opts),
                run.plan(move |_: &Table| Ok(Plan::Apply(change.clone()))),
            )
            .await;
        match result {
            Ok(Outcome::Committed { .. }) => {
                run.committed();
                tracing::info!(table = %ident, files = removed.len(), rows_deleted, delete_files_removed = n_dropped, "compacted");
                Ok(Group::Compacted(n_dropped))
            }
            Ok(Outcome::Skipped(why)) => {
                tracing::info!(table = %ident, ?why, "compaction group obsolete; dropped");
                delete_paths(&table, added.iter().map(|f| f.file_path().to_string())).await;
                Ok(Group::Obsolete)
            }
            Err(e) if e.kind() == ErrorKind::Stale => {
                tracing::info!(table = %ident, error = %e, "compaction group obsolete; dropped");
                delete_paths(&table, added.iter().map(|f| f.file_path().to_string())).await;
                Ok(Group::Obsolete)
            }
            Err(e) => Err(e),
        }
    }
}

/// What became of one compaction group.
enum Group {
    /// Committed; how many delete files it removed.
    Compacted(usize),
    /// Its files were replaced (or got deletes) meanwhile: nothing committed.
    Obsolete,
    /// The table it was read from cannot be compacted (equality deletes): why.
    Refused(String),
}

fn sort_batches(
    batches: &[RecordBatch],
    order: &iceberg::spec::SortOrder,
    schema: &iceberg::spec::Schema,
) -> Result<RecordBatch> {
    use arrow::compute::{
        concat_batches, lexsort_to_indices, take_record_batch, SortColumn, SortOptions,
    };
    let all = concat_batches(&batches[0].schema(), batches)
        .map_err(|e| Error::new(ErrorKind::Internal, "concatenating for sort").with_source(e))?;
    let mut cols = Vec::new();
    for f in &order.fields {
        let Some(field) = schema.field_by_id(f.source_id) else {
            continue;
        };
        let Ok(idx) = all.schema().index_of(&field.name) else {
            continue;
        };
        cols.push(SortColumn {
            values: all.column(idx).clone(),
            options: Some(SortOptions {
                descending: f.direction == iceberg::spec::SortDirection::Descending,
                nulls_first: f.null_order == iceberg::spec::NullOrder::First,
            }),
        });
    }
    let idx = lexsort_to_indices(&cols, None)
        .map_err(|e| Error::new(ErrorKind::Internal, "sorting").with_source(e))?;
    take_record_batch(&all, &idx)
        .map_err(|e| Error::new(ErrorKind::Internal, "sorting").with_source(e))
}
