//! Planning time of a representative query over a table: DataFusion parses, plans and optimises
//! the SQL and builds its physical plan, whose scan plans the table's files from its manifests
//! (iceberg's scan planning, as an engine reading the table does), without reading data.
//!
//! The median of several runs, as `floe bench --planning` measures delta planning. Filters are
//! not pushed into the file planning (every live file is planned): the figure is that of a
//! full-table query, the upper bound for one that prunes.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use iceberg::table::Table;
use serde::Serialize;

use crate::error::{Error, ErrorKind, Result};

/// What planning the query took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Planning {
    /// The SQL planned.
    pub query: String,
    /// Runs measured.
    pub runs: usize,
    /// Median planning time (ms).
    pub median_ms: f64,
    /// Slowest run (ms).
    pub max_ms: f64,
    /// Data files the scan planned (the table's live files).
    pub files_planned: usize,
}

/// The table as DataFusion sees it for planning: its schema, and a scan that plans its files.
#[derive(Debug)]
struct Planned {
    table: Table,
    schema: SchemaRef,
    files: Arc<AtomicUsize>,
}

#[async_trait]
impl TableProvider for Planned {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let mut planned = 0;
        if self.table.metadata().current_snapshot().is_some() {
            let names: Vec<String> = projected
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            let builder = self.table.scan();
            let builder = if names.is_empty() {
                builder.select_empty()
            } else {
                builder.select(names)
            };
            let scan = builder
                .build()
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            let tasks: Vec<_> = scan
                .plan_files()
                .await
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
                .try_collect()
                .await
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            planned = tasks.len();
        }
        self.files.store(planned, Ordering::Relaxed);
        Ok(Arc::new(EmptyExec::new(projected)))
    }
}

/// The default representative query: the rows and the newest event time (`time_column`, when
/// the table has one) — a freshness check every consumer of the table runs.
pub fn default_query(time_column: Option<&str>) -> String {
    match time_column {
        Some(c) => format!(
            "SELECT count(*) AS records, max(\"{}\") AS latest FROM {{table}}",
            c.replace('"', "\"\"")
        ),
        None => "SELECT count(*) AS records FROM {table}".to_string(),
    }
}

/// Plans `query` (`{table}` stands for the table) over `table` `runs` times.
pub async fn measure(table: &Table, query: &str, runs: usize) -> Result<Planning> {
    let name = table.identifier().name().to_string();
    let query = query.replace("{table}", &format!("\"{}\"", name.replace('"', "\"\"")));
    let query = query.as_str();
    let schema = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
        .map_err(|e| Error::iceberg("the table's Arrow schema", e))?;
    let files = Arc::new(AtomicUsize::new(0));
    let provider = Arc::new(Planned {
        table: table.clone(),
        schema: Arc::new(schema),
        files: files.clone(),
    });
    let ctx = SessionContext::new();
    let df_err = |e: datafusion::error::DataFusionError| {
        Error::new(
            ErrorKind::Transform,
            format!("planning the baseline query `{query}`"),
        )
        .with_source(e)
    };
    ctx.register_table(
        datafusion::sql::TableReference::bare(name.as_str()),
        provider,
    )
    .map_err(df_err)?;
    let sql = query;
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        let df = ctx.sql(sql).await.map_err(df_err)?;
        df.create_physical_plan().await.map_err(df_err)?;
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(Planning {
        query: query.to_string(),
        runs: times.len(),
        median_ms: times[times.len() / 2],
        max_ms: times[times.len() - 1],
        files_planned: files.load(Ordering::Relaxed),
    })
}
