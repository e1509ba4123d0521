//! Latest-state (upsert) pipelines: one sink row per key, the greatest version by the ordering
//! column, deletes kept as tombstones so that older versions arriving later cannot bring a key
//! back.
//!
//! The order of versions is total and independent of arrival: per key the winner is the row
//! with the greatest `(order_by, the whole row)` in Arrow's row format (so equal order values
//! are broken the same way by every run and by the batch). Merging is therefore a maximum —
//! idempotent, commutative and associative — and any split of the source into runs gives what
//! one batch over the whole source gives ([`Latest::reduce`] is that batch).
//!
//! The sink is partitioned by `bucket(N, <first key>)`. A run reduces its delta, and for each
//! bucket the delta touches merges on read: it reads the key and order columns of that bucket's
//! sink files (position deletes applied) and its tombstones of the delta's keys, merges
//! ([`Latest::merge_bucket`] over the committed rows of the touched keys only, stand-ins from
//! their key and order values where the order decides: [`Latest::stand_ins`], [`Latest::ties`]),
//! and writes position deletes for the rows no longer live plus the new rows, one bucket at a
//! time. Tombstones live in the companion table `<sink>_tombstones` (the delete rows with the
//! source sequence number of the run that wrote them, [`SEQ`]), bucketed like the sink and merged
//! the same way; readers of the sink (applying its position deletes) see exactly the live rows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, UInt32Array,
};
use arrow::row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use datafusion::physical_expr::PhysicalExpr;
use iceberg::spec::{
    Literal, PrimitiveLiteral, Transform, UnboundPartitionField, UnboundPartitionSpec,
};
use iceberg::transform::{create_transform_function, BoxedTransformFunction};

use super::transform;
use crate::config::PipelineConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::scan::LiveFile;

/// The tombstone table's extra column: the source sequence number of the run that wrote the
/// tombstone. A run standing at source sequence S applies only tombstones of runs at or before
/// S, so a tombstone written by a run that did not commit its sink (a crash, or a concurrent
/// run further ahead) never makes a sink run ahead of its checkpoint.
pub(crate) const SEQ: &str = "_floe_source_sequence";

/// How far past the commit time of the source snapshot a run reads up to an `order_by` value
/// may lie and still move the tombstone horizon ([`Latest::horizon`]).
pub(super) const CLOCK_SKEW_MICROS: i64 = 3_600_000_000;

/// A `latest` pipeline's keys, ordering, delete marker and buckets, checked against the SQL's
/// output schema.
pub(super) struct Latest {
    schema: SchemaRef,
    key_idx: Vec<usize>,
    order_idx: usize,
    delete: Option<Arc<dyn PhysicalExpr>>,
    bucket: BoxedTransformFunction,
    retention: Option<i64>,
}

/// A sink or tombstone bucket (None: the rows whose first key is null).
pub(super) type Bucket = Option<i32>;

impl Latest {
    /// Checks `p`'s keys, `order_by` and `delete_when` against the SQL's output `schema`: each
    /// error names the pipeline key and the output columns.
    pub(super) fn new(p: &PipelineConfig, schema: &SchemaRef) -> Result<Self> {
        let columns = || {
            schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let find = |what: &str, name: &str| {
            schema.index_of(name).map_err(|_| {
                Error::new(
                    ErrorKind::Config,
                    format!(
                        "pipeline `{}`: {what} `{name}` is not an output column of its SQL (it outputs: {})",
                        p.name,
                        columns()
                    ),
                )
            })
        };
        let key_idx = p
            .keys
            .iter()
            .map(|k| find("key", k))
            .collect::<Result<Vec<_>>>()?;
        let order_by = p.order_by.as_deref().unwrap_or_default();
        let order_idx = find("order_by", order_by)?;
        let first = key_idx.first().copied().ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("pipeline `{}`: a latest pipeline needs `keys`", p.name),
            )
        })?;
        let bucket = create_transform_function(&Transform::Bucket(p.key_buckets()))
            .map_err(|e| Error::iceberg("the bucket transform", e))?;
        let key_type = schema.field(first).data_type();
        if !bucketable(key_type) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "pipeline `{}`: the first key `{}` is {key_type}, which cannot be bucketed \
                     (use a string, integer, date, timestamp or decimal key first)",
                    p.name,
                    schema.field(first).name()
                ),
            ));
        }
        let delete = match &p.delete_when {
            None => None,
            Some(expr) => Some(
                crate::config::contract::sql_predicate(expr, schema).map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        format!(
                            "pipeline `{}`: delete_when over the SQL's output ({}): {e}",
                            p.name,
                            columns()
                        ),
                    )
                })?,
            ),
        };
        let order_type = schema.field(order_idx).data_type();
        let timestamp = matches!(order_type, DataType::Timestamp(_, _));
        // A retention is a time behind the newest order value: meaningless for another type.
        if !timestamp && p.tombstone_retention_micros().is_some() && p.tombstone_retention.is_some()
        {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "pipeline `{}`: tombstone_retention needs a timestamp `order_by`, and \
                     `{order_by}` is {order_type} in the SQL's output; without a timestamp \
                     order tombstones are kept forever: remove tombstone_retention (or set it \
                     to \"none\"), or order by a timestamp column",
                    p.name
                ),
            ));
        }
        Ok(Self {
            schema: schema.clone(),
            key_idx,
            order_idx,
            delete,
            bucket,
            retention: p.tombstone_retention_micros().filter(|_| timestamp),
        })
    }

    /// The output schema the pipeline's rows have.
    pub(super) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The tombstone table's schema: the output's and [`SEQ`].
    pub(super) fn tombstone_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(SEQ, DataType::Int64, true));
        Arc::new(ArrowSchema::new(fields))
    }

    fn converters(&self) -> Result<(RowConverter, RowConverter)> {
        let keys = self
            .key_idx
            .iter()
            .map(|&i| SortField::new(self.schema.field(i).data_type().clone()))
            .collect();
        // Rank: the order column, then every column (the deterministic tie-break).
        let rank = std::iter::once(self.order_idx)
            .chain(0..self.schema.fields().len())
            .map(|i| SortField::new(self.schema.field(i).data_type().clone()))
            .collect();
        Ok((
            RowConverter::new(keys).map_err(internal)?,
            RowConverter::new(rank).map_err(internal)?,
        ))
    }

    /// The columns a merge-on-read run reads of the sink's files: the keys, then the order
    /// column (unless it is a key), as indices of the output schema.
    pub(super) fn probe_columns(&self) -> Vec<usize> {
        let mut cols = self.key_idx.clone();
        if !cols.contains(&self.order_idx) {
            cols.push(self.order_idx);
        }
        cols
    }

    /// The output schema's fields [`Latest::probe_columns`].
    pub(super) fn probe_schema(&self) -> SchemaRef {
        Arc::new(
            self.schema
                .project(&self.probe_columns())
                .unwrap_or_else(|_| ArrowSchema::empty()),
        )
    }

    /// The columns a merge-on-read run reads of the tombstone table's files: the probe
    /// columns and [`SEQ`].
    pub(super) fn tombstone_probe_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .probe_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(SEQ, DataType::Int64, true));
        Arc::new(ArrowSchema::new(fields))
    }

    /// The key and order values of `batch` (any schema holding those columns by name) in row
    /// format.
    fn key_order(&self, batch: &RecordBatch) -> Result<(Rows, Rows)> {
        let b = transform::conform(batch, &self.probe_schema())?;
        let (kc, _) = self.converters()?;
        let oc = self.order_converter()?;
        let n = self.key_idx.len();
        let keys: Vec<ArrayRef> = (0..n).map(|j| b.column(j).clone()).collect();
        let order_at = self
            .probe_columns()
            .iter()
            .position(|&i| i == self.order_idx)
            .unwrap_or_default();
        Ok((
            kc.convert_columns(&keys).map_err(internal)?,
            oc.convert_columns(&[b.column(order_at).clone()])
                .map_err(internal)?,
        ))
    }

    fn order_converter(&self) -> Result<RowConverter> {
        let field = self.schema.field(self.order_idx);
        RowConverter::new(vec![SortField::new(field.data_type().clone())]).map_err(internal)
    }

    /// Tombstones standing in for committed ones (tombstone schema) from their key, order and
    /// sequence values only (`tombs`, tombstone probe schema): the other columns are those of
    /// the delta's row of the key, as [`Latest::stand_ins`].
    pub(super) fn tombstone_stand_ins(
        &self,
        delta: &RecordBatch,
        tombs: &RecordBatch,
        delta_rows: &[usize],
    ) -> Result<RecordBatch> {
        let rows = self.stand_ins(delta, tombs, delta_rows)?;
        let seq = tombs
            .column_by_name(SEQ)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "tombstone sequence column"))?;
        let mut cols = rows.columns().to_vec();
        cols.push(seq);
        RecordBatch::try_new(self.tombstone_schema(), cols).map_err(internal)
    }

    /// The delta's winners of a bucket by key (row format), for probing the bucket's files.
    pub(super) fn key_index(&self, delta: &RecordBatch) -> Result<KeyIndex> {
        let (kc, _) = self.converters()?;
        let delta = transform::conform(delta, &self.schema)?;
        let cols: Vec<ArrayRef> = self
            .key_idx
            .iter()
            .map(|&i| delta.column(i).clone())
            .collect();
        let rows = kc.convert_columns(&cols).map_err(internal)?;
        let mut map = FastMap::with_capacity_and_hasher(rows.num_rows(), Default::default());
        map.extend((0..rows.num_rows()).map(|r| (rows.row(r).data().to_vec(), r)));
        Ok(KeyIndex { conv: kc, map })
    }

    /// For each row of `batch` (any schema holding the key columns by name, conformed to
    /// the output's types), the delta row of its key, if the delta has that key.
    pub(super) fn probe(
        &self,
        index: &KeyIndex,
        batch: &RecordBatch,
    ) -> Result<Vec<Option<usize>>> {
        let cols: Vec<ArrayRef> = self
            .key_idx
            .iter()
            .map(|&i| {
                let name = self.schema.field(i).name();
                batch.column_by_name(name).cloned().ok_or_else(|| {
                    Error::new(ErrorKind::Internal, format!("probe: no key `{name}`"))
                })
            })
            .collect::<Result<_>>()?;
        let rows = index.conv.convert_columns(&cols).map_err(internal)?;
        Ok((0..rows.num_rows())
            .map(|r| index.map.get(rows.row(r).data()).copied())
            .collect())
    }

    /// Sink rows standing in for committed rows a merge compares with the delta, from their
    /// key and order values only (`probe`, probe schema): the other columns are those of the
    /// delta's row of the key (`delta_rows`). Whenever the order values differ, a rank is
    /// decided by the order column, so the rest of the row never counts; where a committed
    /// row's order value equals the delta's or a tombstone's of its key ([`Latest::ties`]), the
    /// caller uses the committed row itself.
    pub(super) fn stand_ins(
        &self,
        delta: &RecordBatch,
        probe: &RecordBatch,
        delta_rows: &[usize],
    ) -> Result<RecordBatch> {
        let delta = transform::conform(delta, &self.schema)?;
        let base = take(&delta, delta_rows.iter().map(|&r| r as u32))?;
        let probe = transform::conform(probe, &self.probe_schema())?;
        let mut cols = base.columns().to_vec();
        for (j, &i) in self.probe_columns().iter().enumerate() {
            cols[i] = probe.column(j).clone();
        }
        RecordBatch::try_new(self.schema.clone(), cols).map_err(internal)
    }

    /// Which of `rows` (committed rows or tombstones: any schema holding the key and order
    /// columns; `delta_rows` the delta row of each one's key) have an order value equal to
    /// another candidate's of their key — the delta's, another of `rows`', or one of `others`'
    /// (the other table's candidates): their rank (and whether two tombstones are the same)
    /// needs the whole row.
    pub(super) fn ties(
        &self,
        delta: &RecordBatch,
        rows: &RecordBatch,
        delta_rows: &[usize],
        others: &[RecordBatch],
    ) -> Result<Vec<bool>> {
        let (_, delta_order) = self.key_order(&transform::conform(delta, &self.schema)?)?;
        let (pk, po) = self.key_order(rows)?;
        let others: Vec<(Rows, Rows)> = others
            .iter()
            .map(|b| self.key_order(b))
            .collect::<Result<_>>()?;
        // (key, order) pairs: each of `rows` counts 1, each of `others` 2, so a count over 1 is
        // a tie with another table's candidate or with another of `rows` (two tombstones, or
        // a sink holding two rows of a key, which only a writer breaking the layout leaves).
        let mut seen: FastMap<(&[u8], &[u8]), usize> = FastMap::default();
        for r in 0..pk.num_rows() {
            *seen
                .entry((pk.row(r).data(), po.row(r).data()))
                .or_default() += 1;
        }
        for (k, o) in &others {
            for r in 0..k.num_rows() {
                *seen.entry((k.row(r).data(), o.row(r).data())).or_default() += 2;
            }
        }
        Ok(delta_rows
            .iter()
            .enumerate()
            .map(|(j, &d)| {
                po.row(j) == delta_order.row(d)
                    || seen
                        .get(&(pk.row(j).data(), po.row(j).data()))
                        .is_some_and(|&n| n > 1)
            })
            .collect())
    }

    /// The key of every row of the pool, per batch.
    fn keys(&self, pool: &Pool) -> Result<Vec<Rows>> {
        let (kc, _) = self.converters()?;
        pool.batches
            .iter()
            .map(|b| {
                let cols: Vec<ArrayRef> =
                    self.key_idx.iter().map(|&i| b.column(i).clone()).collect();
                kc.convert_columns(&cols).map_err(internal)
            })
            .collect()
    }

    /// The rank (order column, then the whole row) of the pool's rows, looked up by row
    /// index: only rows whose key has competitors (`groups`: the pool's rows by key) are
    /// encoded (a key seen once needs no comparison), which keeps a merge over a bucket about
    /// its touched keys; and of those, only rows whose order value another row of their key
    /// shares are encoded whole (the order value decides the rest).
    fn ranks(&self, pool: &Pool, groups: &[&[(&[u8], usize)]]) -> Result<Ranks> {
        let idx = contested(groups);
        let oc = self.order_converter()?;
        let order = oc
            .convert_columns(&[pool.take_column(
                self.order_idx,
                self.schema.field(self.order_idx).data_type(),
                idx.iter().copied(),
            )?])
            .map_err(internal)?;
        let mut at = vec![u32::MAX; pool.len()];
        for (p, &i) in idx.iter().enumerate() {
            at[i] = p as u32;
        }
        // Rows tied on the order value with another row of their key.
        let mut tied: Vec<usize> = Vec::new();
        for g in groups.iter().filter(|g| g.len() > 1) {
            let mut members: Vec<(&[u8], usize)> = g
                .iter()
                .map(|x| (order.row(at[x.1] as usize).data(), x.1))
                .collect();
            members.sort_unstable();
            for run in members.chunk_by(|a, b| a.0 == b.0).filter(|r| r.len() > 1) {
                tied.extend(run.iter().map(|x| x.1));
            }
        }
        tied.sort_unstable();
        let (_, rc) = self.converters()?;
        let sub = pool.take(&self.schema, tied.iter().copied())?;
        let cols: Vec<ArrayRef> = std::iter::once(self.order_idx)
            .chain(0..sub.num_columns())
            .map(|i| sub.column(i).clone())
            .collect();
        let whole = rc.convert_columns(&cols).map_err(internal)?;
        drop(sub);
        let mut whole_at: FastMap<usize, u32> =
            FastMap::with_capacity_and_hasher(tied.len(), Default::default());
        for (p, &i) in tied.iter().enumerate() {
            whole_at.insert(i, p as u32);
        }
        Ok(Ranks {
            order,
            at,
            whole,
            whole_at,
        })
    }

    /// The latest version per key among `batches` (deletes included), sorted by key: what a
    /// batch over the whole source computes, and what a run reduces its delta to. The winners
    /// are taken from the batches directly (no concatenated copy).
    pub(super) fn reduce(&self, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let pool = Pool::new(
            batches
                .iter()
                .map(|b| transform::conform(b, &self.schema))
                .collect::<Result<Vec<_>>>()?,
        );
        let keys = self.keys(&pool)?;
        let sorted = by_key(&pool, &keys);
        let groups: Vec<&[(&[u8], usize)]> = sorted.chunk_by(|a, b| a.0 == b.0).collect();
        let ranks = self.ranks(&pool, &groups)?;
        let winners: Vec<usize> = groups
            .iter()
            .map(|g| ranks.max(g.iter().map(|x| x.1)))
            .collect();
        pool.take(&self.schema, winners.into_iter())
    }

    /// Which rows of `batch` (output schema) are deletes (null counts as not).
    pub(super) fn deletes(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        let Some(expr) = &self.delete else {
            return Ok(BooleanArray::from(vec![false; batch.num_rows()]));
        };
        let value = expr
            .evaluate(batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(|e| Error::new(ErrorKind::Transform, format!("delete_when: {e}")))?;
        let b = value
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "delete_when is not boolean"))?;
        Ok(b.iter().map(|v| Some(v.unwrap_or(false))).collect())
    }

    /// `batch`'s live rows and its deletes.
    pub(super) fn split_deletes(&self, batch: &RecordBatch) -> Result<(RecordBatch, RecordBatch)> {
        let del = self.deletes(batch)?;
        let live = arrow::compute::not(&del).map_err(internal)?;
        Ok((
            arrow::compute::filter_record_batch(batch, &live).map_err(internal)?,
            arrow::compute::filter_record_batch(batch, &del).map_err(internal)?,
        ))
    }

    /// The bucket of each row of `batch` (the sink's partition value).
    fn buckets_of(&self, batch: &RecordBatch) -> Result<Int32Array> {
        let first = batch.column(self.key_idx[0]).clone();
        let b = self
            .bucket
            .transform(first)
            .map_err(|e| Error::iceberg("bucketing the keys", e))?;
        b.as_any()
            .downcast_ref::<Int32Array>()
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "bucket transform result"))
    }

    /// `batch`'s rows by bucket.
    pub(super) fn by_bucket(&self, batch: &RecordBatch) -> Result<BTreeMap<Bucket, RecordBatch>> {
        let buckets = self.buckets_of(batch)?;
        let mut rows: BTreeMap<Bucket, Vec<u32>> = BTreeMap::new();
        for (i, b) in buckets.iter().enumerate() {
            rows.entry(b).or_default().push(i as u32);
        }
        rows.into_iter()
            .map(|(b, idx)| Ok((b, take(batch, idx.into_iter())?)))
            .collect()
    }

    /// The tombstone horizon of a run whose delta winners are `delta`: tombstones ordered
    /// before the newest version in it minus the retention may be dropped (None: keep all).
    /// Only a timestamp `order_by` has one; taking the delta's newest (not the table's) only
    /// ever keeps more. The newest counts at most `latest_micros` (the commit time of the
    /// source snapshot the run reads up to, plus [`CLOCK_SKEW_MICROS`]): a far-future value
    /// (a producer's clock, a typo) never drops tombstones younger than the retention.
    pub(super) fn horizon(&self, delta: &RecordBatch, latest_micros: i64) -> Option<i64> {
        let retention = self.retention?;
        let max = micros(delta.column(self.order_idx))?
            .iter()
            .flatten()
            .max()?;
        Some(max.min(latest_micros).saturating_sub(retention))
    }

    /// Merges one bucket: its committed sink rows, its tombstones (tombstone schema) and the
    /// delta's winners in it, for a run standing at source sequence `seq`.
    ///
    /// Memory: the bucket's decoded rows once (taken by value, never concatenated: the rows
    /// are addressed across the batches and the kept ones taken from them), its keys in row
    /// format, and the new rows.
    pub(super) fn merge_bucket(
        &self,
        sink: Vec<RecordBatch>,
        tombstones: Vec<RecordBatch>,
        delta: &RecordBatch,
        seq: i64,
        horizon: Option<i64>,
    ) -> Result<Merged> {
        let tomb_schema = self.tombstone_schema();
        let width = self.schema.fields().len();
        // One pool: sink rows, then tombstones, then the delta.
        let mut batches = Vec::with_capacity(sink.len() + tombstones.len() + 1);
        let mut ns = 0;
        for b in sink {
            let b = transform::conform(&b, &self.schema)?;
            ns += b.num_rows();
            batches.push(b);
        }
        let mut seqs: Vec<i64> = Vec::new();
        for b in tombstones {
            let b = transform::conform(&b, &tomb_schema)?;
            let col = b
                .column(width)
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| Error::new(ErrorKind::Internal, "tombstone sequence column"))?;
            seqs.extend(col.iter().map(|v| v.unwrap_or(0)));
            batches.push(
                b.project(&(0..width).collect::<Vec<_>>())
                    .map_err(internal)?,
            );
        }
        let nt = seqs.len();
        batches.push(transform::conform(delta, &self.schema)?);
        let pool = Pool::new(batches);
        let is_sink = |i: usize| i < ns;
        let tomb = |i: usize| (ns..ns + nt).contains(&i).then(|| i - ns);
        let seq_of = |t: usize| seqs[t];
        let applies = |i: usize| tomb(i).is_none_or(|t| seq_of(t) <= seq);
        // `delete_when` is evaluated on the delta only: committed rows are live and tombstones
        // deletes whatever their columns hold (stand-ins carry the delta's other columns).
        let del: Vec<BooleanArray> = pool
            .batches
            .iter()
            .enumerate()
            .map(|(i, b)| match pool.starts[i] >= ns + nt {
                true => self.deletes(b),
                false => Ok(BooleanArray::from(vec![false; b.num_rows()])),
            })
            .collect::<Result<_>>()?;
        // A committed sink row is live by construction (the sink holds no deletes): a probe
        // row of a merge-on-read run carries the delta's other columns, not its own.
        // A tombstone is a delete whatever its other columns hold (a merge-on-read run's
        // stand-ins carry the delta's).
        let is_del = |i: usize| {
            let (b, r) = pool.loc(i);
            tomb(i).is_some() || (!is_sink(i) && del[b].value(r))
        };
        let keys = self.keys(&pool)?;
        let sorted = by_key(&pool, &keys);
        let groups: Vec<&[(&[u8], usize)]> = sorted.chunk_by(|a, b| a.0 == b.0).collect();
        let ranks = self.ranks(&pool, &groups)?;

        // The winner per key, in key order (tombstones of runs after `seq` do not compete).
        let winners: Vec<(&[u8], usize)> = groups
            .iter()
            .filter_map(|g| {
                let cands = g.iter().map(|x| x.1).filter(|&i| applies(i));
                cands.clone().next().map(|_| (g[0].0, ranks.max(cands)))
            })
            .collect();
        let live_idx: Vec<usize> = winners
            .iter()
            .map(|w| w.1)
            .filter(|&i| !is_del(i))
            .collect();
        let sink_changed = live_idx.len() != ns || live_idx.iter().any(|&i| !is_sink(i));
        let mut kept_sink = vec![false; ns];
        for &i in live_idx.iter().filter(|&&i| is_sink(i)) {
            kept_sink[i] = true;
        }
        let sink_dropped: Vec<usize> = (0..ns).filter(|&i| !kept_sink[i]).collect();
        let added_live = pool.take(
            &self.schema,
            live_idx.iter().copied().filter(|&i| !is_sink(i)),
        )?;
        let live = pool.take(&self.schema, live_idx.into_iter())?;
        let new_deletes: HashMap<&[u8], usize> = winners
            .iter()
            .filter(|(_, i)| is_del(*i) && tomb(*i).is_none() && !is_sink(*i))
            .map(|&(k, i)| (k, i))
            .collect();
        drop(winners);

        // The tombstones to keep: the old ones still meaningful, and this run's deletes (only
        // those rows are candidates: the sink batches' order values are not needed).
        let order: Vec<Option<Int64Array>> = pool
            .batches
            .iter()
            .enumerate()
            .map(|(b, batch)| {
                if pool.starts[b] + batch.num_rows() <= ns {
                    None
                } else {
                    micros(batch.column(self.order_idx))
                }
            })
            .collect();
        let pruned = |i: usize| {
            let (b, r) = pool.loc(i);
            match (horizon, &order[b]) {
                (Some(h), Some(o)) => o.is_valid(r) && o.value(r) < h,
                _ => false,
            }
        };
        let mut kept: Vec<(&[u8], usize, i64)> = Vec::new();
        let mut tombstones_changed = false;
        for g in &groups {
            let k = g[0].0;
            // (pool index, sequence) of the key's tombstones, old and new.
            let mut cands: Vec<(usize, i64)> = g
                .iter()
                .filter_map(|&(_, i)| tomb(i).map(|t| (i, seq_of(t))))
                .collect();
            let old = cands.len();
            if let Some(&i) = new_deletes.get(k) {
                cands.push((i, seq));
            }
            if cands.is_empty() {
                continue;
            }
            // A committed sink row above it: the key's state has passed it for good.
            let sink_top = g
                .iter()
                .map(|x| x.1)
                .filter(|&i| is_sink(i))
                .max_by(|&a, &b| ranks.cmp(a, b));
            // Identical tombstones: keep the earliest sequence.
            cands.sort_by(|a, b| ranks.cmp(a.0, b.0).then(a.1.cmp(&b.1)));
            cands.dedup_by(|later, first| ranks.cmp(later.0, first.0).is_eq());
            let alive: Vec<(usize, i64)> = cands
                .into_iter()
                .filter(|&(i, _)| !pruned(i))
                .filter(|&(i, _)| sink_top.is_none_or(|s| ranks.cmp(s, i).is_lt()))
                .collect();
            let before = kept.len();
            for &(i, s) in &alive {
                // Dominated by a greater tombstone known at or before it: never needed again.
                let dominated = alive
                    .iter()
                    .any(|&(j, t)| j != i && ranks.cmp(j, i).is_gt() && t <= s);
                if !dominated {
                    kept.push((k, i, s));
                }
            }
            let same = kept.len() - before == old
                && kept[before..]
                    .iter()
                    .all(|&(_, i, s)| tomb(i).is_some_and(|t| seq_of(t) == s));
            tombstones_changed |= !same;
        }
        kept.sort_by(|a, b| a.0.cmp(b.0).then(ranks.cmp(a.1, b.1)));
        let with_seq = |kept: &[(&[u8], usize, i64)]| -> Result<RecordBatch> {
            let rows = pool.take(&self.schema, kept.iter().map(|&(_, i, _)| i))?;
            let mut cols = rows.columns().to_vec();
            cols.push(Arc::new(Int64Array::from_iter_values(
                kept.iter().map(|&(_, _, s)| s),
            )) as ArrayRef);
            RecordBatch::try_new(tomb_schema.clone(), cols).map_err(internal)
        };
        // A kept old tombstone keeps its sequence: unchanged. The rest are new.
        let mut kept_tomb = vec![false; nt];
        for &(_, i, _) in &kept {
            if let Some(t) = tomb(i) {
                kept_tomb[t] = true;
            }
        }
        let tombstones_dropped: Vec<usize> = (0..nt).filter(|&t| !kept_tomb[t]).collect();
        let new: Vec<(&[u8], usize, i64)> = kept
            .iter()
            .copied()
            .filter(|&(_, i, _)| tomb(i).is_none())
            .collect();
        let added_tombstones = with_seq(&new)?;
        let tombstones = with_seq(&kept)?;
        Ok(Merged {
            live,
            tombstones,
            sink_changed,
            tombstones_changed,
            sink_dropped,
            added_live,
            tombstones_dropped,
            added_tombstones,
        })
    }
}

/// The rows of several batches of one schema under one index (0.. over the batches in order),
/// so a merge needs no concatenated copy: the rows it keeps are taken from the batches directly.
struct Pool {
    batches: Vec<RecordBatch>,
    /// The index of each batch's first row.
    starts: Vec<usize>,
    len: usize,
}

impl Pool {
    fn new(batches: Vec<RecordBatch>) -> Self {
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let mut starts = Vec::with_capacity(batches.len());
        let mut len = 0;
        for b in &batches {
            starts.push(len);
            len += b.num_rows();
        }
        Self {
            batches,
            starts,
            len,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// (batch, row) of row `i`.
    fn loc(&self, i: usize) -> (usize, usize) {
        let b = self.starts.partition_point(|&s| s <= i).saturating_sub(1);
        (b, i - self.starts.get(b).copied().unwrap_or(0))
    }

    /// Column `col` (of type `t`) of the rows `idx`, in that order.
    fn take_column(
        &self,
        col: usize,
        t: &DataType,
        idx: impl Iterator<Item = usize>,
    ) -> Result<ArrayRef> {
        let locs: Vec<(usize, usize)> = idx.map(|i| self.loc(i)).collect();
        if locs.is_empty() {
            return Ok(arrow::array::new_empty_array(t));
        }
        let arrays: Vec<&dyn Array> = self
            .batches
            .iter()
            .map(|b| b.column(col).as_ref())
            .collect();
        arrow::compute::interleave(&arrays, &locs).map_err(internal)
    }

    /// The rows `idx`, in that order, as one batch of `schema`.
    fn take(&self, schema: &SchemaRef, idx: impl Iterator<Item = usize>) -> Result<RecordBatch> {
        let locs: Vec<(usize, usize)> = idx.map(|i| self.loc(i)).collect();
        if locs.is_empty() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let refs: Vec<&RecordBatch> = self.batches.iter().collect();
        arrow::compute::interleave_record_batch(&refs, &locs).map_err(internal)
    }
}

/// A bucket's delta winners by key (row format): what a merge-on-read run probes the
/// bucket's committed rows with.
pub(super) struct KeyIndex {
    conv: RowConverter,
    map: FastMap<Vec<u8>, usize>,
}

/// A hash map with a fast hasher: a run probes every committed row's key of the buckets it
/// touches (about a million in `floe bench --latest`); keys come from tables, not requests.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Ranks of the rows of a batch whose key has competitors.
struct Ranks {
    /// The order values of the rows whose key has competitors.
    order: Rows,
    /// Row index → position in `order` (`u32::MAX`: not encoded, the key's only row).
    at: Vec<u32>,
    /// The whole rank (order value, then every column) of the rows whose order value another
    /// row of their key shares.
    whole: Rows,
    /// Row index → position in `whole`.
    whole_at: FastMap<usize, u32>,
}

impl Ranks {
    /// Compares rows `a` and `b` of one key (both encoded whenever the key has two rows, and
    /// whole whenever their order values are equal).
    fn cmp(&self, a: usize, b: usize) -> std::cmp::Ordering {
        match (self.at[a], self.at[b]) {
            (x, y) if x != u32::MAX && y != u32::MAX => {
                let by_order = self.order.row(x as usize).cmp(&self.order.row(y as usize));
                if by_order.is_ne() {
                    return by_order;
                }
                match (self.whole_at.get(&a), self.whole_at.get(&b)) {
                    (Some(&x), Some(&y)) => {
                        self.whole.row(x as usize).cmp(&self.whole.row(y as usize))
                    }
                    _ => a.cmp(&b),
                }
            }
            _ => a.cmp(&b),
        }
    }

    /// The greatest of `idx` (one key's rows; the first for a single row).
    fn max(&self, idx: impl Iterator<Item = usize>) -> usize {
        idx.reduce(|best, i| if self.cmp(i, best).is_gt() { i } else { best })
            .unwrap_or_default()
    }
}

/// Every row of the pool as (key, index), sorted: each key's rows are one run, in key order.
/// (A sort, not a map of vectors: 24 bytes a row and no allocation per key.)
fn by_key<'a>(pool: &Pool, keys: &'a [Rows]) -> Vec<(&'a [u8], usize)> {
    let mut v = Vec::with_capacity(pool.len());
    for (b, rows) in keys.iter().enumerate() {
        let start = pool.starts[b];
        v.extend((0..rows.num_rows()).map(|r| (rows.row(r).data(), start + r)));
    }
    v.sort_unstable();
    v
}

/// The rows of keys with more than one row (those a merge compares), ascending.
fn contested(groups: &[&[(&[u8], usize)]]) -> Vec<usize> {
    let mut idx: Vec<usize> = groups
        .iter()
        .filter(|g| g.len() > 1)
        .flat_map(|g| g.iter().map(|x| x.1))
        .collect();
    idx.sort_unstable();
    idx
}

/// One merged bucket.
#[cfg_attr(not(test), allow(dead_code))]
pub(super) struct Merged {
    /// The bucket's new sink rows (sorted by key). A merge-on-read run's stand-ins among them
    /// carry the delta's other columns: never written (a run writes `added_live`).
    pub(super) live: RecordBatch,
    /// The bucket's new tombstones (tombstone schema); stand-ins as in `live`.
    pub(super) tombstones: RecordBatch,
    /// Whether the sink rows differ from the committed ones (else the bucket is not rewritten).
    pub(super) sink_changed: bool,
    /// Whether the tombstones differ from the committed ones.
    pub(super) tombstones_changed: bool,
    /// The merge as a change (merge-on-read): the sink rows given (by index, in order across
    /// the sink batches) that are no longer live: each gets a position delete.
    pub(super) sink_dropped: Vec<usize>,
    /// The live rows that are not committed sink rows: appended.
    pub(super) added_live: RecordBatch,
    /// The tombstones given (by index) that are not kept: each gets a position delete.
    pub(super) tombstones_dropped: Vec<usize>,
    /// The kept tombstones that are not committed ones (tombstone schema): appended.
    pub(super) added_tombstones: RecordBatch,
}

/// The bucket a sink or tombstone file holds (its partition value); an error for a file not
/// partitioned by the key bucket (another engine changed the spec): the run cannot tell which
/// keys it holds.
pub(super) fn file_bucket(f: &LiveFile, spec_id: i32, table: &str) -> Result<Bucket> {
    let wrong = || {
        Error::new(
            ErrorKind::Stale,
            format!(
                "`{table}`: data file {} is not partitioned by the key bucket (spec {}); \
                 rebuild the sink with `floe process refresh`",
                f.file.file_path(),
                f.spec_id
            ),
        )
    };
    if f.spec_id != spec_id {
        return Err(wrong());
    }
    match f.file.partition().fields().first() {
        Some(Some(Literal::Primitive(PrimitiveLiteral::Int(b)))) => Ok(Some(*b)),
        Some(None) => Ok(None),
        _ => Err(wrong()),
    }
}

/// The partition spec of a `latest` sink (and its tombstone table): `bucket(n, <first key>)`.
pub(super) fn partition_spec(
    schema: &iceberg::spec::Schema,
    first_key: &str,
    n: u32,
) -> Result<UnboundPartitionSpec> {
    bucket_spec(schema, first_key, n, &format!("{first_key}_bucket"), None)
}

fn bucket_spec(
    schema: &iceberg::spec::Schema,
    first_key: &str,
    n: u32,
    name: &str,
    field_id: Option<i32>,
) -> Result<UnboundPartitionSpec> {
    let field = schema.field_by_name(first_key).ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            format!("the sink has no key column `{first_key}`"),
        )
    })?;
    UnboundPartitionSpec::builder()
        .with_spec_id(0)
        .add_partition_fields([UnboundPartitionField {
            source_id: field.id,
            field_id,
            name: name.to_string(),
            transform: Transform::Bucket(n),
        }])
        .map_err(|e| Error::iceberg("the sink's partition spec", e))
        .map(|b| b.build())
}

/// The key-bucket layout of a `latest` pipeline: `bucket(key_buckets, keys[0])`, which the
/// sink's and the tombstone table's default partition spec must be (the run groups the delta's
/// keys by it and reads the files of each bucket by partition value).
pub(super) struct Layout {
    key: String,
    buckets: u32,
    pipeline: String,
}

impl Layout {
    pub(super) fn of(p: &PipelineConfig) -> Result<Self> {
        let key = p.keys.first().cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("pipeline `{}`: a latest pipeline needs `keys`", p.name),
            )
        })?;
        Ok(Self {
            key,
            buckets: p.key_buckets(),
            pipeline: p.name.clone(),
        })
    }

    fn wanted(&self) -> String {
        format!("bucket({}, {})", self.buckets, self.key)
    }

    /// What `table`'s default spec is instead of the layout (None: it is the layout).
    pub(super) fn mismatch(&self, table: &iceberg::table::Table) -> Option<String> {
        let md = table.metadata();
        let schema = md.current_schema();
        let spec = md.default_partition_spec();
        let source = schema.field_by_name(&self.key).map(|f| f.id);
        let ok = match spec.fields() {
            [f] => Some(f.source_id) == source && f.transform == Transform::Bucket(self.buckets),
            _ => false,
        };
        if ok {
            return None;
        }
        if spec.fields().is_empty() {
            return Some("nothing (unpartitioned)".into());
        }
        Some(
            spec.fields()
                .iter()
                .map(|f| {
                    let col = schema.name_by_field_id(f.source_id).unwrap_or("?");
                    match f.transform {
                        Transform::Bucket(n) => format!("bucket({n}, {col})"),
                        t => format!("{t}({col})"),
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        )
    }

    /// `Stale` unless `table` has the layout: a run cannot tell which of its files hold a key.
    pub(super) fn check(&self, table: &iceberg::table::Table) -> Result<()> {
        match self.mismatch(table) {
            None => Ok(()),
            Some(is) => Err(Error::new(
                ErrorKind::Stale,
                format!(
                    "pipeline `{}`: `{}` is partitioned by {is}, not by the pipeline's key \
                     buckets {} (key_buckets = {}), so the run cannot find a key's files; \
                     nothing was processed. Move both tables to the layout with \
                     `floe process refresh --pipeline {}`",
                    self.pipeline,
                    table.identifier(),
                    self.wanted(),
                    self.buckets,
                    self.pipeline
                ),
            )),
        }
    }

    /// The spec that gives `table` the layout (a field name of its own when an older spec
    /// already uses `<key>_bucket` for another transform).
    pub(super) fn spec(&self, table: &iceberg::table::Table) -> Result<UnboundPartitionSpec> {
        let md = table.metadata();
        let plain = format!("{}_bucket", self.key);
        let taken = md.partition_specs_iter().any(|s| {
            s.fields()
                .iter()
                .any(|f| f.name == plain && f.transform != Transform::Bucket(self.buckets))
        });
        let name = if taken {
            format!("{plain}_{}", self.buckets)
        } else {
            plain
        };
        // An explicit field id (above every spec's): REST servers may require one.
        let id = md.last_partition_id().max(999) + 1;
        bucket_spec(
            md.current_schema(),
            &self.key,
            self.buckets,
            &name,
            Some(id),
        )
    }
}

fn bucketable(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int32
            | DataType::Int64
            | DataType::Decimal128(_, _)
            | DataType::Date32
            | DataType::Timestamp(TimeUnit::Microsecond, _)
            | DataType::Utf8
            | DataType::Binary
    )
}

/// A timestamp column in microseconds (None for other types).
fn micros(col: &ArrayRef) -> Option<Int64Array> {
    if !matches!(col.data_type(), DataType::Timestamp(_, _)) {
        return None;
    }
    let us = arrow::compute::cast(col, &DataType::Timestamp(TimeUnit::Microsecond, None)).ok()?;
    let ints = arrow::compute::cast(&us, &DataType::Int64).ok()?;
    ints.as_any().downcast_ref::<Int64Array>().cloned()
}

fn take(batch: &RecordBatch, idx: impl Iterator<Item = u32>) -> Result<RecordBatch> {
    let idx = UInt32Array::from_iter_values(idx);
    arrow::compute::take_record_batch(batch, &idx).map_err(internal)
}

fn internal(e: arrow_schema::ArrowError) -> Error {
    Error::new(ErrorKind::Internal, format!("latest state: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    fn pipeline(delete: Option<&str>) -> PipelineConfig {
        let toml =
            format!(
            "name = \"p\"\nsource = \"o\"\nsink = \"s\"\nmode = \"latest\"\nsql = \"SELECT 1\"\n\
             keys = [\"k\"]\norder_by = \"v\"\nkey_buckets = 4\n{}",
            delete.map(|d| format!("delete_when = \"{d}\"")).unwrap_or_default()
        );
        toml::from_str(&toml).unwrap()
    }

    fn schema() -> SchemaRef {
        Arc::new(ArrowSchema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
            Field::new("op", DataType::Utf8, true),
        ]))
    }

    fn rows(r: &[(i64, i64, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.0))),
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.1))),
                Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.2))),
            ],
        )
        .unwrap()
    }

    fn content(b: &RecordBatch) -> Vec<(i64, i64, String)> {
        let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        let o = b.column(2).as_any().downcast_ref::<StringArray>().unwrap();
        (0..b.num_rows())
            .map(|i| (k.value(i), v.value(i), o.value(i).to_string()))
            .collect()
    }

    #[test]
    fn the_latest_version_wins_whatever_the_arrival_order() {
        let l = Latest::new(&pipeline(None), &schema()).unwrap();
        let versions = [
            (1, 3, "c"),
            (1, 1, "a"),
            (2, 5, "x"),
            (1, 2, "b"),
            (2, 5, "w"),
            // Ties below the greatest order value do not count; three tied at it do.
            (3, 4, "p"),
            (3, 6, "a"),
            (3, 4, "q"),
            (3, 6, "c"),
            (4, 1, "z"),
            (3, 6, "b"),
            (4, 1, "y"),
            (4, 2, "a"),
        ];
        let want = vec![
            (1, 3, "c".to_string()),
            (2, 5, "x".to_string()),
            (3, 6, "c".to_string()),
            (4, 2, "a".to_string()),
        ];
        // Every rotation and split of the versions gives the same result (ties: the greater row).
        for r in 0..versions.len() {
            let mut v = versions.to_vec();
            v.rotate_left(r);
            let (a, b) = v.split_at(r);
            let parts: Vec<RecordBatch> = [a, b]
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| rows(p))
                .collect();
            let once = l.reduce(&parts).unwrap();
            assert_eq!(content(&once), want, "rotation {r}");
            let twice = l.reduce(&[l.reduce(&parts[..1]).unwrap(), once]).unwrap();
            assert_eq!(content(&twice), want, "idempotent, rotation {r}");
        }
    }

    #[test]
    fn committed_rows_tied_on_the_order_value_are_read_whole() {
        let l = Latest::new(&pipeline(None), &schema()).unwrap();
        let delta = rows(&[(1, 3, "x"), (2, 9, "y"), (3, 4, "z")]);
        let probe = transform::conform(
            &rows(&[
                (1, 5, "a"),
                (1, 5, "b"),
                (2, 9, "c"),
                (3, 1, "d"),
                (3, 2, "e"),
            ]),
            &l.probe_schema(),
        )
        .unwrap();
        let tomb = transform::conform(&rows(&[(3, 2, "t")]), &l.tombstone_probe_schema()).unwrap();
        let ties = l.ties(&delta, &probe, &[0, 0, 1, 2, 2], &[tomb]).unwrap();
        // Two committed rows of key 1 at 5; key 2's ties with the delta; key 3's second with a
        // tombstone, its first with nothing.
        assert_eq!(ties, [true, true, true, false, true]);
    }

    #[test]
    fn late_versions_and_deletes_merge_into_a_bucket() {
        let l = Latest::new(&pipeline(Some("op = 'D'")), &schema()).unwrap();
        let none: Vec<RecordBatch> = Vec::new();
        // The sink holds k1@5; a late k1@3 changes nothing (the bucket is not rewritten).
        let m = l
            .merge_bucket(
                vec![rows(&[(1, 5, "u")])],
                none.clone(),
                &rows(&[(1, 3, "u")]),
                10,
                None,
            )
            .unwrap();
        assert!(!m.sink_changed && !m.tombstones_changed);
        assert_eq!(content(&m.live), vec![(1, 5, "u".into())]);
        // A delete at 7 removes it and leaves a tombstone at the run's sequence.
        let m = l
            .merge_bucket(
                vec![rows(&[(1, 5, "u")])],
                none.clone(),
                &rows(&[(1, 7, "D")]),
                11,
                None,
            )
            .unwrap();
        assert!(m.sink_changed && m.tombstones_changed && m.live.num_rows() == 0);
        assert_eq!(content(&m.tombstones), vec![(1, 7, "D".into())]);
        let seq = m
            .tombstones
            .column(3)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(seq, 11);
        let tombs = vec![m.tombstones];
        // A late older version after the delete stays deleted; a newer one comes back.
        let m = l
            .merge_bucket(none.clone(), tombs.clone(), &rows(&[(1, 6, "u")]), 12, None)
            .unwrap();
        assert!(m.live.num_rows() == 0 && !m.sink_changed && !m.tombstones_changed);
        let m = l
            .merge_bucket(none.clone(), tombs.clone(), &rows(&[(1, 8, "u")]), 12, None)
            .unwrap();
        assert_eq!(content(&m.live), vec![(1, 8, "u".into())]);
        // The tombstone stays until the sink has committed the newer row.
        assert!(!m.tombstones_changed);
        let m = l
            .merge_bucket(vec![m.live], tombs.clone(), &rows(&[(2, 1, "u")]), 13, None)
            .unwrap();
        assert!(m.tombstones_changed && m.tombstones.num_rows() == 0);
        // A run at an earlier source sequence ignores the tombstone (and keeps it).
        let m = l
            .merge_bucket(
                vec![rows(&[(1, 5, "u")])],
                tombs.clone(),
                &rows(&[(2, 1, "u")]),
                10,
                None,
            )
            .unwrap();
        assert_eq!(
            content(&m.live),
            vec![(1, 5, "u".into()), (2, 1, "u".into())]
        );
        assert!(!m.tombstones_changed);
    }

    #[test]
    fn a_bucket_in_many_batches_merges_as_in_one() {
        let l = Latest::new(&pipeline(Some("op = 'D'")), &schema()).unwrap();
        let sink = [(1, 5, "u"), (2, 5, "u"), (3, 5, "u"), (4, 5, "u")];
        let delta = rows(&[(2, 7, "u"), (3, 9, "D"), (5, 1, "u")]);
        let one = l
            .merge_bucket(vec![rows(&sink)], vec![], &delta, 3, None)
            .unwrap();
        let parts = vec![
            rows(&sink[..1]),
            rows(&[]),
            rows(&sink[1..3]),
            rows(&sink[3..]),
        ];
        let many = l.merge_bucket(parts, vec![], &delta, 3, None).unwrap();
        assert_eq!(content(&one.live), content(&many.live));
        assert_eq!(
            content(&many.live),
            vec![
                (1, 5, "u".into()),
                (2, 7, "u".into()),
                (4, 5, "u".into()),
                (5, 1, "u".into())
            ]
        );
        assert_eq!(content(&one.tombstones), content(&many.tombstones));
        // Reduced in parts (an empty one among them) as in one.
        let all = [(1, 3, "a"), (1, 4, "b"), (2, 1, "c"), (1, 4, "a")];
        let whole = l.reduce(&[rows(&all)]).unwrap();
        let split = l
            .reduce(&[rows(&all[..2]), rows(&[]), rows(&all[2..])])
            .unwrap();
        assert_eq!(content(&whole), content(&split));
        assert_eq!(
            content(&split),
            vec![(1, 4, "b".into()), (2, 1, "c".into())]
        );
    }

    #[test]
    fn rows_whose_keys_are_all_null_are_one_key() {
        let l = Latest::new(&pipeline(None), &schema()).unwrap();
        let b = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![None, None, Some(1)])),
                Arc::new(Int64Array::from(vec![2, 5, 1])),
                Arc::new(StringArray::from(vec!["a", "b", "c"])),
            ],
        )
        .unwrap();
        let r = l.reduce(&[b]).unwrap();
        assert_eq!(r.num_rows(), 2, "the null key's latest version and key 1");
        assert!(r.column(0).is_null(0), "nulls sort first");
        let v = r.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(v.value(0), 5);
        // Their bucket is the null partition value.
        let buckets = l.by_bucket(&r).unwrap();
        assert!(buckets.contains_key(&None));
    }

    #[test]
    fn tombstones_past_the_horizon_are_dropped() {
        let ts = Arc::new(ArrowSchema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new(
                "v",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
            Field::new("op", DataType::Utf8, true),
        ]));
        let l = Latest::new(&pipeline(Some("op = 'D'")), &ts).unwrap();
        let day = 86_400_000_000i64;
        let batch = |r: &[(i64, i64, &str)]| {
            let b = rows(r);
            let v =
                arrow::array::TimestampMicrosecondArray::from_iter_values(r.iter().map(|x| x.1))
                    .with_timezone("+00:00");
            RecordBatch::try_new(
                ts.clone(),
                vec![b.column(0).clone(), Arc::new(v), b.column(2).clone()],
            )
            .unwrap()
        };
        let m = l
            .merge_bucket(
                vec![],
                vec![],
                &batch(&[(1, day, "D"), (2, 10 * day, "D")]),
                1,
                None,
            )
            .unwrap();
        assert_eq!(m.tombstones.num_rows(), 2);
        let delta = batch(&[(3, 12 * day, "u")]);
        let horizon = l.horizon(&delta, i64::MAX);
        assert_eq!(horizon, Some(5 * day), "7 days by default");
        // A far-future value counts as the cap (the source commit time plus the skew).
        let far = batch(&[(3, 40_000 * day, "u")]);
        assert_eq!(l.horizon(&far, 12 * day), Some(5 * day));
        let m = l
            .merge_bucket(vec![], vec![m.tombstones], &delta, 2, horizon)
            .unwrap();
        assert!(
            m.tombstones_changed && m.tombstones.num_rows() == 1,
            "the one 11 days back goes"
        );
    }

    #[test]
    fn terms_are_checked_against_the_output() {
        let mut p = pipeline(None);
        p.order_by = Some("nope".into());
        let e = Latest::new(&p, &schema()).err().unwrap().to_string();
        assert!(
            e.contains("order_by `nope`") && e.contains("k, v, op"),
            "{e}"
        );
        let e = Latest::new(&pipeline(Some("missing = 1")), &schema())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("delete_when"), "{e}");
        let e = Latest::new(&pipeline(Some("v + 1")), &schema())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not boolean"), "{e}");
        // A retention over a non-timestamp order is an error naming the type ("none" is not).
        let mut p = pipeline(Some("op = 'D'"));
        p.tombstone_retention = Some("2d".into());
        let e = Latest::new(&p, &schema()).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Config);
        let e = e.to_string();
        assert!(
            e.contains("tombstone_retention") && e.contains("`v` is Int64"),
            "{e}"
        );
        p.tombstone_retention = Some("none".into());
        assert!(Latest::new(&p, &schema()).is_ok());
    }
}
