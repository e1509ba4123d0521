//! Orphan-file cleanup: files under the table location that no retained metadata references and
//! that are older than the safety window.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use iceberg::table::Table;
use iceberg::TableIdent;

use super::*;

impl Maintainer {
    /// Deletes files under the table location that no retained metadata references and that are
    /// older than the safety window (a dry run only lists them).
    pub(crate) async fn remove_orphans(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
    ) -> Result<()> {
        if opts.orphan_older_than < MIN_ORPHAN_AGE {
            return Err(Error::new(
                ErrorKind::Config,
                format!("orphan window {:?} is under the 1 hour minimum: files of writes in flight could be deleted", opts.orphan_older_than),
            ));
        }
        let table = self.committer.load(ident).await?;
        let md = table.metadata();
        let all: Vec<i64> = md.snapshots().map(|s| s.snapshot_id()).collect();
        let (lists, manifests, data) = referenced_files(&table, &all).await?;
        let mut reachable: HashSet<String> =
            lists.into_iter().chain(manifests).chain(data).collect();
        if let Some(loc) = table.metadata_location() {
            reachable.insert(loc.to_string());
        }
        reachable.extend(md.metadata_log().iter().map(|l| l.metadata_file.clone()));
        reachable.extend(md.statistics_iter().map(|s| s.statistics_path.clone()));
        reachable.extend(
            md.partition_statistics_iter()
                .map(|s| s.statistics_path.clone()),
        );
        // Other engines write `s3a://`/`s3n://` (Hadoop) for the same objects the listing names
        // `s3://`: compare one spelling, or every file they wrote would look orphaned.
        let reachable: HashSet<String> = reachable.iter().map(|p| same_object_key(p)).collect();
        let cutoff =
            opts.now - chrono::Duration::from_std(opts.orphan_older_than).unwrap_or_default();
        let listed = list_location(&self.config, md.location()).await?;
        let mut orphans: Vec<String> = listed
            .into_iter()
            .filter(|(path, modified)| {
                *modified < cutoff && !reachable.contains(&same_object_key(path))
            })
            .map(|(path, _)| path)
            .collect();
        orphans.sort();
        if !opts.dry_run {
            delete_paths(&table, orphans.iter().cloned()).await;
            report.orphans_deleted = orphans.len();
        }
        report.orphans_found = orphans;
        Ok(())
    }
}

/// Every file under a table location with its last-modified time (S3 `ListObjectsV2`, paginated;
/// or a local directory walk).
pub(crate) async fn list_location(
    cfg: &Config,
    location: &str,
) -> Result<Vec<(String, DateTime<Utc>)>> {
    let location = location.trim_end_matches('/');
    if let Some(rest) = location
        .strip_prefix("s3://")
        .or_else(|| location.strip_prefix("s3a://"))
    {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let client = crate::store::s3_client(&cfg.storage).await;
        let mut out = Vec::new();
        let mut pages = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(format!("{prefix}/"))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| {
                Error::new(
                    ErrorKind::Storage,
                    format!(
                        "ListObjectsV2 s3://{bucket}/{prefix}: {}",
                        aws_sdk_s3::error::DisplayErrorContext(&e)
                    ),
                )
                .with_retryable(true)
            })?;
            for o in page.contents() {
                let (Some(key), Some(m)) = (o.key(), o.last_modified()) else {
                    continue;
                };
                let modified = DateTime::<Utc>::from_timestamp(m.secs(), m.subsec_nanos())
                    .unwrap_or_else(Utc::now);
                out.push((format!("s3://{bucket}/{key}"), modified));
            }
        }
        Ok(out)
    } else {
        let root = location
            .strip_prefix("file://")
            .unwrap_or(location)
            .to_string();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut stack = vec![std::path::PathBuf::from(&root)];
            while let Some(dir) = stack.pop() {
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if let Ok(md) = e.metadata() {
                        let modified = md
                            .modified()
                            .map(DateTime::<Utc>::from)
                            .unwrap_or_else(|_| Utc::now());
                        out.push((format!("file://{}", p.display()), modified));
                    }
                }
            }
            out
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Internal, format!("listing {location}: {e}")))
    }
}

/// Manifest lists and manifests read at once by [`referenced_files`].
const READS_AT_ONCE: usize = 16;

/// Manifest lists, manifests and live data files referenced by the given snapshots.
pub(super) async fn referenced_files(
    table: &Table,
    snapshot_ids: &[i64],
) -> Result<(HashSet<String>, HashSet<String>, HashSet<String>)> {
    referenced_files_beyond(table, snapshot_ids, &HashSet::new()).await
}

/// [`referenced_files`], the manifests in `known` not read (files never change: whoever read
/// them has their data files already); they are still listed among the manifests.
pub(super) async fn referenced_files_beyond(
    table: &Table,
    snapshot_ids: &[i64],
    known: &HashSet<String>,
) -> Result<(HashSet<String>, HashSet<String>, HashSet<String>)> {
    use futures::{StreamExt, TryStreamExt};
    let md = table.metadata();
    let snapshots: Vec<_> = snapshot_ids
        .iter()
        .filter_map(|id| md.snapshot_by_id(*id).cloned())
        .collect();
    let lists: HashSet<String> = snapshots
        .iter()
        .map(|s| s.manifest_list().to_string())
        .collect();
    // A hot table keeps hundreds of snapshots: their lists (and then the manifests they share)
    // are read several at a time, not one request after another.
    // (Owned items and boxed futures: a closure over borrowed items keeps the caller's future
    // from being `Send` for every lifetime, which a spawned maintainer needs.)
    type Load<'a, T> = futures::future::BoxFuture<'a, Result<T>>;
    let mut loaded = futures::stream::iter(snapshots.into_iter().map(
        |s| -> Load<'_, iceberg::spec::ManifestList> {
            Box::pin(async move {
                table
                    .manifest_list_reader(&s)
                    .load()
                    .await
                    .map_err(|e| Error::iceberg("reading a manifest list", e))
            })
        },
    ))
    .buffer_unordered(READS_AT_ONCE);
    let mut manifests: HashMap<String, iceberg::spec::ManifestFile> = HashMap::new();
    while let Some(list) = loaded.try_next().await? {
        for mf in list.consume_entries() {
            manifests.entry(mf.manifest_path.clone()).or_insert(mf);
        }
    }
    let paths: HashSet<String> = manifests.keys().cloned().collect();
    let files: Vec<iceberg::spec::ManifestFile> = manifests
        .into_iter()
        .filter(|(path, _)| !known.contains(path))
        .map(|(_, mf)| mf)
        .collect();
    let mut live = futures::stream::iter(files.into_iter().map(|mf| -> Load<'_, Vec<String>> {
        Box::pin(async move {
            let m = mf
                .load_manifest(table.file_io())
                .await
                .map_err(|e| Error::iceberg("reading a manifest", e))?;
            // Only live entries: a DELETED entry is a tombstone; the file is reachable only
            // through a retained snapshot in which it is live.
            Ok(m.entries()
                .iter()
                .filter(|e| e.is_alive())
                .map(|e| e.data_file().file_path().to_string())
                .collect())
        })
    }))
    .buffer_unordered(READS_AT_ONCE);
    let mut data = HashSet::new();
    while let Some(files) = live.try_next().await? {
        data.extend(files);
    }
    Ok((lists, paths, data))
}
