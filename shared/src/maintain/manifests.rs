//! Manifest rewrite: fold the current snapshot's data manifests into one per partition spec.

use std::collections::HashMap;

use iceberg::spec::ManifestContentType;
use iceberg::table::Table;
use iceberg::TableIdent;

use super::*;

impl Maintainer {
    /// Folds the current snapshot's data manifests into one per spec when there are too many.
    pub async fn rewrite_manifests(
        &self,
        ident: &TableIdent,
        opts: &Options,
        report: &mut Report,
        run: &RunMeter,
    ) -> Result<()> {
        let table = self.committer.load(ident).await?;
        let count = |ms: &[iceberg::spec::ManifestFile]| {
            ms.iter()
                .filter(|m| m.content == ManifestContentType::Data)
                .count()
        };
        let n = count(&snapshot::current_manifests(&table).await?);
        report.manifests_before = n;
        report.manifests_after = n;
        if n <= opts.manifest_threshold || opts.dry_run {
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
        report.manifests_after = count(&snapshot::current_manifests(&table).await?);
        Ok(())
    }
}
