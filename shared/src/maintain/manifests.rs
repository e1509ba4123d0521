//! Manifest rewrite: fold the current snapshot's data manifests into one per partition spec,
//! and its delete manifests (a merge-on-read sink's position deletes, one per run) likewise.

use std::collections::HashMap;

use iceberg::spec::{ManifestContentType, ManifestFile};
use iceberg::table::Table;
use iceberg::TableIdent;

use super::*;

impl Maintainer {
    /// Folds the current snapshot's data manifests into one per spec, and its delete manifests
    /// into one per spec, when either kind passes the threshold.
    pub async fn rewrite_manifests(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
        run: &RunMeter,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        // (data manifests, delete manifests with live files)
        let count = |ms: &[ManifestFile]| {
            let data = ms
                .iter()
                .filter(|m| m.content == ManifestContentType::Data)
                .count();
            let deletes = ms
                .iter()
                .filter(|m| m.content == ManifestContentType::Deletes && snapshot::lists_live(m))
                .count();
            (data, deletes)
        };
        let (data, deletes) = count(&snapshot::current_manifests(&table).await?);
        report.manifests_before = data + deletes;
        report.manifests_after = data + deletes;
        // Each kind against the threshold on its own: a merge-on-read sink folded to one data
        // and one delete manifest is done.
        let over = data.max(deletes) > opts.manifest_threshold;
        if !over || opts.dry_run {
            return Ok(());
        }
        let props = HashMap::from([(
            summary::OPERATION.to_string(),
            "rewrite-manifests".to_string(),
        )]);
        let change = Change::rewrite_manifests(props);
        self.committer
            .commit(
                ident,
                &self.limits(opts),
                run.plan(move |_t: &Table| Ok(Plan::Apply(change.clone()))),
            )
            .await?;
        run.committed();
        let table = self.committer.load(ident).await?;
        let (data, deletes) = count(&snapshot::current_manifests(&table).await?);
        report.manifests_after = data + deletes;
        Ok(())
    }
}
