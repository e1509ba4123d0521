//! Snapshot expiration that never breaks a consumer: keeps what checkpoints, refs and the ingest
//! dedup window need, then deletes files reachable only from expired snapshots.

use std::collections::HashSet;
use std::time::Duration;

use iceberg::table::Table;
use iceberg::TableIdent;

use super::orphans::{referenced_files, referenced_files_beyond};
use super::*;

/// What other tables' records pin on a table (see [`Maintainer::pins`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pins {
    /// Consumers' checkpoints: each snapshot and every descendant (the consumer reads them).
    pub(crate) checkpoints: Vec<i64>,
    /// Snapshots pipelines joining the table recorded: each one alone (reconcile reads it at
    /// that snapshot, never what came after).
    pub(crate) joined: Vec<i64>,
}

impl Maintainer {
    /// What `table` must keep for others: the snapshots consumers' checkpoints pin (see
    /// [`crate::summary`]), and the one each pipeline joining it recorded in its sink's newest
    /// run.
    pub(crate) async fn pins(&self, table: &Table) -> Result<Pins> {
        let uuid = table.metadata().uuid().to_string();
        let joined = table.identifier().name();
        let mut out = Pins::default();
        for name in self.config.all_tables() {
            let ident = crate::catalog::table_ident(&self.config, &name)?;
            let consumer = match self.committer.catalog().load_table(&ident).await {
                Ok(t) => t,
                // A consumer that does not exist (yet) pins nothing.
                Err(_)
                    if !self
                        .committer
                        .catalog()
                        .table_exists(&ident)
                        .await
                        .unwrap_or(true) =>
                {
                    continue
                }
                // Not knowing a consumer's position is not "no position": expiring now could
                // remove the snapshots it still has to read. Stop; the next run tries again.
                Err(e) => {
                    return Err(Error::iceberg(
                        format!("reading the checkpoints {ident} holds (expiration stopped)"),
                        e,
                    )
                    .with_retryable(true))
                }
            };
            out.checkpoints.extend(
                crate::summary::read_checkpoint(consumer.metadata(), &uuid).map(|c| c.snapshot_id),
            );
            // A pipeline joining this table now recorded the snapshot it read: reconcile reads
            // it. (A pipeline that no longer joins it pins nothing.)
            let joins_it = self
                .config
                .pipelines
                .iter()
                .any(|p| p.sink == name && p.joins.iter().any(|j| j == joined));
            if joins_it {
                out.joined
                    .extend(crate::summary::joined_snapshot(consumer.metadata(), joined));
            }
            // A refresh in progress reads its target snapshot until its last chunk (kept with
            // its descendants, as a checkpoint: the run after the refresh reads on from it).
            // (A malformed position pins nothing: it cannot be continued, only restarted,
            // and a restart reads the source's current snapshot.)
            match crate::summary::read_refresh(consumer.metadata(), &uuid) {
                Ok(r) => out
                    .checkpoints
                    .extend(r.filter(|r| r.source == uuid).map(|r| r.target)),
                Err(e) => {
                    tracing::warn!(table = %ident, error = %e, "a sink's refresh position is unreadable: it pins no snapshot")
                }
            }
        }
        Ok(out)
    }

    /// The short history `[maintain] history_minutes` gives the table, if any: it replaces both
    /// the retention and the dedup window (validation keeps it past the duplicate check's skew).
    fn history(&self, ident: &TableIdent) -> Option<Duration> {
        self.config
            .maintain
            .history_minutes
            .get(ident.name())
            .map(|m| Duration::from_secs_f64(m * 60.0))
    }

    /// Expires old snapshots, keeping what consumers and the dedup window need (or only the
    /// table's short history), then deletes files reachable only from expired snapshots.
    pub async fn expire(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        let md = table.metadata();
        let Some(current) = md.current_snapshot() else {
            return Ok(());
        };
        let older_than = opts
            .expire_older_than
            .or_else(|| {
                prop::<u64>(md, "history.expire.max-snapshot-age-ms").map(Duration::from_millis)
            })
            .unwrap_or(Duration::from_secs(5 * 86_400));
        let retain_last = opts
            .retain_last
            .or_else(|| prop(md, "history.expire.min-snapshots-to-keep"))
            .unwrap_or(1)
            .max(1);
        let keep_after = opts.now.timestamp_millis()
            - self
                .history(ident)
                .unwrap_or(older_than.max(opts.dedup_window))
                .as_millis() as i64;
        let mut keep: HashSet<i64> = HashSet::new();
        let ancestry: Vec<i64> = ancestors(md, current.snapshot_id())
            .iter()
            .map(|s| s.snapshot_id())
            .collect();
        keep.extend(ancestry.iter().take(retain_last));
        // Every branch's head and its own retention (main's included), as Iceberg Java honours
        // it: at least its `min-snapshots-to-keep` latest snapshots, and those younger than its
        // `max-snapshot-age-ms` (a user pinning history on a branch; never fewer than floe keeps).
        let now_ms = opts.now.timestamp_millis();
        for r in refs(md) {
            keep.insert(r.snapshot_id);
            if !r.branch {
                continue;
            }
            // A branch without its own setting keeps the table's (Java's default for each).
            let line = ancestors(md, r.snapshot_id);
            let n = r.min_snapshots_to_keep.unwrap_or(retain_last);
            keep.extend(line.iter().take(n).map(|s| s.snapshot_id()));
            if let Some(age) = r.max_snapshot_age_ms {
                keep.extend(
                    line.iter()
                        .filter(|s| s.timestamp_ms() >= now_ms.saturating_sub(age))
                        .map(|s| s.snapshot_id()),
                );
            }
        }
        for s in md.snapshots() {
            if s.timestamp_ms() >= keep_after {
                keep.insert(s.snapshot_id());
            }
        }
        // A consumer's own position: the newest snapshot carrying each `floe.checkpoint.*` and
        // everything after it (another engine's snapshots on top carry none; expiring the one
        // that does would reset the pipeline).
        let mut positions: HashSet<&str> = HashSet::new();
        for (i, id) in ancestry.iter().enumerate() {
            let Some(s) = md.snapshot_by_id(*id) else {
                continue;
            };
            for k in s.summary().additional_properties.keys() {
                if k.starts_with(summary::CHECKPOINT_PREFIX) && positions.insert(k.as_str()) {
                    keep.extend(&ancestry[..=i]);
                }
            }
        }
        let pins = self.pins(&table).await?;
        for cp in pins.checkpoints {
            // The consumer will read everything after its checkpoint: keep it and its descendants.
            if let Some(pos) = ancestry.iter().position(|id| *id == cp) {
                keep.extend(&ancestry[..=pos]);
            }
        }
        // A joined snapshot is read as it is: keep it alone.
        keep.extend(
            pins.joined
                .into_iter()
                .filter(|id| md.snapshot_by_id(*id).is_some()),
        );
        let expired: Vec<i64> = md
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| !keep.contains(id))
            .collect();
        report.snapshots_expired = expired.len();
        if expired.is_empty() || opts.dry_run {
            return Ok(());
        }
        // Files of expired snapshots, minus everything retained snapshots reference.
        let (exp_lists, exp_manifests, exp_data) = referenced_files(&table, &expired).await?;
        let kept: Vec<i64> = md
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| keep.contains(id))
            .collect();
        let (keep_lists, keep_manifests, keep_data) = referenced_files(&table, &kept).await?;
        let plan_ids = expired.clone();
        // The version the last plan was made on and the snapshots it removes: the expiry's
        // files are deleted only if it was applied on exactly that version.
        let planned_on = std::sync::Arc::new(std::sync::Mutex::new((None::<String>, Vec::new())));
        let planned = planned_on.clone();
        let outcome = self
            .committer
            .commit(ident, &self.limits(opts), move |t: &Table| {
                let on = t.metadata_location().map(str::to_string);
                // A branch or tag created meanwhile keeps its snapshot (removing the snapshot
                // would silently drop the ref).
                let refs = ref_snapshot_ids(t.metadata());
                let present: Vec<i64> = plan_ids
                    .iter()
                    .copied()
                    .filter(|id| t.metadata().snapshot_by_id(*id).is_some() && !refs.contains(id))
                    .collect();
                if let Ok(mut p) = planned.lock() {
                    *p = (on, present.clone());
                }
                Ok(if present.is_empty() {
                    Plan::Skip(Skipped::Obsolete("already expired".into()))
                } else {
                    Plan::Apply(Change::expire(present))
                })
            })
            .await?;
        // A REST server applies the removal on whatever version is current when main's
        // snapshot still matches, and drops every ref naming a removed snapshot with it: a tag
        // another writer put on an expired snapshot meanwhile is gone, and its files must not
        // go too. So files are deleted only when the removal was applied on the version it was
        // planned on (always so for a compare-and-swap). A skip means another expiry (or an
        // attempt whose answer was lost) removed them: its applied-on is unknown, and orphan
        // cleanup finds the files once nothing references them.
        let (planned_on, removed) = planned_on.lock().map(|p| p.clone()).unwrap_or_default();
        match &outcome {
            Outcome::Committed { applied_on, .. }
                if applied_on.is_some() && *applied_on == planned_on => {}
            Outcome::Committed { applied_on, .. } => {
                tracing::warn!(table = %ident, planned_on = ?planned_on, applied_on = ?applied_on, "the expiry was applied on another version than planned (a commit came between); its files are left to orphan cleanup");
                // Until what the catalog dropped with it is known, this run's orphan cleanup
                // stays away from the files.
                let dropped = match applied_on {
                    Some(on) => refs_dropped(&table, on, &removed).await,
                    None => Err(Error::new(
                        ErrorKind::Catalog,
                        "the catalog's answer named no version it was applied on",
                    )),
                };
                match dropped {
                    Ok(refs) if refs.is_empty() => {}
                    Ok(refs) => {
                        tracing::error!(table = %ident, refs = ?refs, "the catalog dropped refs created meanwhile on the expired snapshots; their files are kept by this run, a later orphan cleanup past its window deletes them: re-create the refs before then");
                        report.refs_dropped = refs;
                    }
                    Err(e) => {
                        tracing::error!(table = %ident, error = %e, "whether the catalog dropped refs with the expired snapshots is unknown: the version it applied the expiry on cannot be read");
                        report.expiry_unsettled = true;
                    }
                }
                return Ok(());
            }
            Outcome::Skipped(why) => {
                tracing::info!(table = %ident, ?why, "the planned snapshots were already gone; their files are left to orphan cleanup");
                report.expiry_unsettled = true;
                return Ok(());
            }
        }
        // Files are deleted only for exactly the planned expiry: had anything kept a planned
        // snapshot (a ref created meanwhile), its files are left to orphan cleanup.
        let after = self.committer.load(ident).await?;
        if expired
            .iter()
            .any(|id| after.metadata().snapshot_by_id(*id).is_some())
        {
            tracing::warn!(table = %ident, "some planned snapshots were kept (refs created meanwhile); their files are left to orphan cleanup");
            return Ok(());
        }
        // What the version that landed references decides, not only what the planned-on one
        // kept: a snapshot committed meanwhile may reference the expired ones' files again
        // (another engine rolled main back to an expired snapshot and appended on top of it,
        // or branched from it). Snapshot files never change, so only the new ones are read.
        let new_ids: Vec<i64> = after
            .metadata()
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| !keep.contains(id))
            .collect();
        let (new_lists, new_manifests, new_data) = if new_ids.is_empty() {
            Default::default()
        } else {
            match referenced_files_beyond(&after, &new_ids, &keep_manifests).await {
                Ok(files) => files,
                // The expiry landed; what its files are still needed for is unknown: delete
                // nothing (orphan cleanup finds them once nothing references them).
                Err(e) => {
                    tracing::warn!(table = %ident, error = %e, "expired; reading the snapshots committed meanwhile failed, so their files are left to orphan cleanup");
                    return Ok(());
                }
            }
        };
        // Compared in one spelling: a file a kept snapshot names `s3a://` is not doomed because
        // an expired one named it `s3://`.
        let kept_files: HashSet<String> = keep_data
            .iter()
            .chain(&keep_manifests)
            .chain(&keep_lists)
            .chain(&new_data)
            .chain(&new_manifests)
            .chain(&new_lists)
            .map(|p| same_object_key(p))
            .collect();
        let doomed: Vec<String> = exp_data
            .iter()
            .chain(&exp_manifests)
            .chain(&exp_lists)
            .filter(|p| !kept_files.contains(&same_object_key(p)))
            .cloned()
            .collect();
        report.expired_files_deleted = doomed.len();
        delete_paths(&table, doomed.into_iter()).await;
        Ok(())
    }
}

/// The branches and tags of the version at `on` (the one a catalog applied an expiry on) that
/// named a snapshot in `removed`: the catalog dropped them with the snapshots.
async fn refs_dropped(table: &Table, on: &str, removed: &[i64]) -> Result<Vec<String>> {
    let md = TableMetadata::read_from(table.file_io(), on)
        .await
        .map_err(|e| Error::iceberg(format!("reading {on}"), e).with_retryable(true))?;
    let mut names: Vec<String> = refs(&md)
        .into_iter()
        .filter(|r| removed.contains(&r.snapshot_id))
        .map(|r| r.name)
        .collect();
    names.sort();
    Ok(names)
}

/// `head` and its ancestors, newest first (as far as the table still has them).
fn ancestors(md: &TableMetadata, head: i64) -> Vec<&iceberg::spec::SnapshotRef> {
    let mut line = Vec::new();
    let mut cur = md.snapshot_by_id(head);
    while let Some(s) = cur {
        line.push(s);
        cur = s.parent_snapshot_id().and_then(|p| md.snapshot_by_id(p));
    }
    line
}
