//! Writing a run's output to its sink: Parquet data files, evolving the sink's schema additively
//! when the SQL's output gains columns.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::arrow::{arrow_type_to_type, schema_to_arrow_schema};
use iceberg::spec::{DataFile, Type};
use iceberg::table::Table;

use super::transform;
use crate::error::{Error, ErrorKind, Result};

/// Output files being written to a sink, evolving its schema additively when the SQL's output
/// gains columns (new optional columns, committed with the data).
pub(super) struct Output {
    sink: Table,
    writer_id: String,
    writer: Option<crate::write::Sink>,
    evolved: Option<iceberg::spec::Schema>,
    arrow: SchemaRef,
    /// The source's renamed top-level columns: current name → earlier names (same field id).
    renamed: BTreeMap<String, Vec<String>>,
}

impl Output {
    pub(super) fn new(sink: &Table, writer_id: &str) -> Result<Self> {
        let arrow = schema_to_arrow_schema(sink.metadata().current_schema())
            .map_err(|e| Error::iceberg(format!("schema of {}", sink.identifier()), e))?;
        Ok(Self {
            sink: sink.clone(),
            writer_id: writer_id.to_string(),
            writer: None,
            evolved: None,
            arrow: Arc::new(arrow),
            renamed: BTreeMap::new(),
        })
    }

    /// Checks each run's output against the columns `source` renamed (a field id under another
    /// name in an earlier schema): under `SELECT *` a rename reaches the output as a new column
    /// beside the sink's old one, which would go null from then on — one column split in two.
    /// Such an output is refused (a refresh, which rewrites every row, is not checked).
    pub(super) fn refusing_renames_of(mut self, source: &Table) -> Self {
        let md = source.metadata();
        let current = md.current_schema();
        for schema in md.schemas_iter() {
            for old in schema.as_struct().fields() {
                let Some(now) = current.field_by_id(old.id) else {
                    continue;
                };
                if now.name != old.name && current.field_by_name(&old.name).is_none() {
                    let names = self.renamed.entry(now.name.clone()).or_default();
                    if !names.contains(&old.name) {
                        names.push(old.name.clone());
                    }
                }
            }
        }
        self
    }

    pub(super) async fn write(&mut self, batches: Vec<RecordBatch>) -> Result<()> {
        for b in batches {
            if b.num_rows() == 0 {
                continue;
            }
            self.fit(&b.schema()).await?;
            let b = transform::conform(&b, &self.arrow)?;
            if self.writer.is_none() {
                let table = match &self.evolved {
                    Some(s) => crate::write::with_schema(&self.sink, s.clone())?,
                    None => self.sink.clone(),
                };
                let target = table
                    .metadata()
                    .properties()
                    .get("write.target-file-size-bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(128usize << 20);
                self.writer = Some(
                    crate::write::build_sink(&table, target, &self.writer_id).map_err(|e| {
                        Error::iceberg(format!("writer for {}", self.sink.identifier()), e)
                    })?,
                );
            }
            if let Some(w) = self.writer.as_mut() {
                w.write(b).await.map_err(|e| {
                    Error::iceberg(format!("writing {}", self.sink.identifier()), e)
                })?;
            }
        }
        Ok(())
    }

    /// Settles the sink schema from the SQL's output schema before any row is written: a run
    /// that writes the sink's kept rows (old schema) before its new output must not open the
    /// writer with the old schema and then meet the new columns. Kept rows get the new columns
    /// as nulls (a refresh recomputes their windows in a later chunk; an incremental run keeps
    /// them as they were, under the column added after them).
    pub(super) async fn settle(&mut self, output: &SchemaRef) -> Result<()> {
        self.fit(output).await
    }

    /// Adds output columns the sink lacks (before the first file is opened); a changed type is
    /// an error asking for a refresh.
    async fn fit(&mut self, schema: &SchemaRef) -> Result<()> {
        let current = self
            .evolved
            .clone()
            .unwrap_or_else(|| self.sink.metadata().current_schema().as_ref().clone());
        // A source column renamed: the output's new name beside the sink's old one, which the
        // output no longer has (nested and widened columns too).
        for f in schema.fields() {
            if current.field_by_name(f.name()).is_some() {
                continue;
            }
            let Some(olds) = self.renamed.get(f.name()) else {
                continue;
            };
            let lost = olds.iter().find(|old| {
                current.field_by_name(old).is_some()
                    && schema.fields().iter().all(|o| o.name() != *old)
            });
            if let Some(old) = lost {
                return Err(Error::new(
                    ErrorKind::Transform,
                    format!(
                        "sink {}: source column `{old}` was renamed `{}`: the output has the new name and the sink the old one (added, it would split one column in two). Select it under the sink's name (`{} AS {old}`), or drop the sink table, then `floe process refresh`",
                        self.sink.identifier(),
                        f.name(),
                        f.name()
                    ),
                ));
            }
        }
        let mut unknown = BTreeMap::new();
        let mut widen = BTreeMap::new();
        for f in schema.fields() {
            let ty = arrow_type_to_type(f.data_type()).ok();
            match (current.field_by_name(f.name()), ty) {
                (Some(existing), Some(ty)) if *existing.field_type != ty => {
                    match (existing.field_type.as_ref(), &ty) {
                        // The source widened (e.g. int → long): widen the sink column too.
                        (Type::Primitive(a), Type::Primitive(b)) if crate::evolve::is_widening(a, b) => {
                            widen.insert(f.name().clone(), b.clone());
                        }
                        // Narrower output than the sink's column: cast up on write.
                        (Type::Primitive(a), Type::Primitive(b)) if crate::evolve::is_widening(b, a) => {}
                        _ => {
                            return Err(Error::new(
                                ErrorKind::Transform,
                                format!(
                                    "sink {}: output column `{}` is now {ty}, the sink has {}; drop the sink table, then `floe process refresh`",
                                    self.sink.identifier(),
                                    f.name(),
                                    existing.field_type
                                ),
                            ))
                        }
                    }
                }
                (None, Some(Type::Primitive(p))) => {
                    unknown.insert(f.name().clone(), Some(p));
                }
                _ => {}
            }
        }
        if unknown.is_empty() && widen.is_empty() {
            return Ok(());
        }
        if self.writer.is_some() {
            return Err(Error::new(
                ErrorKind::Transform,
                format!(
                    "sink {}: output columns changed within one run",
                    self.sink.identifier()
                ),
            ));
        }
        if let Some((_, why)) =
            crate::evolve::partition_bound_widenings(self.sink.metadata(), &widen)
                .into_iter()
                .next()
        {
            return Err(Error::new(
                ErrorKind::Transform,
                format!(
                    "sink {}: {why}; drop the sink table, then `floe process refresh`",
                    self.sink.identifier()
                ),
            ));
        }
        // Ids above the sink's last-column-id: a column dropped by another engine keeps its id.
        let evolved = crate::evolve::evolve_table_schema(self.sink.metadata(), &unknown, &widen)
            .map_err(|e| Error::iceberg("evolving the sink schema", e))?;
        if let Some((schema, what)) = evolved {
            tracing::info!(sink = %self.sink.identifier(), change = %what, "sink schema evolves");
            self.arrow = Arc::new(
                schema_to_arrow_schema(&schema).map_err(|e| Error::iceberg("sink schema", e))?,
            );
            self.evolved = Some(schema);
        }
        Ok(())
    }

    pub(super) async fn close(self) -> Result<(Vec<DataFile>, Option<iceberg::spec::Schema>)> {
        let files = match self.writer {
            Some(w) => w.close().await.map_err(|e| {
                Error::iceberg(format!("closing files of {}", self.sink.identifier()), e)
            })?,
            None => Vec::new(),
        };
        Ok((files, self.evolved))
    }
}
