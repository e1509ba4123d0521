//! A version's metadata.json without re-serializing its history.
//!
//! iceberg 0.10.1 serializes table metadata by cloning all of it and then writing every snapshot
//! entry again, so a commit's cost grew with the table's history: at 300 snapshots a quarter of
//! a small object's CPU went to its metadata.json. A snapshot never changes once written, so the
//! JSON of each entry is kept from the version this process wrote before, and a version staged
//! on it serializes only what is new: its own snapshot and the small rest (schemas, specs, logs,
//! refs, properties).
//!
//! Only the plain case takes this path: format v2, no metadata compression, and a version whose
//! only updates are new snapshots and moved refs, staged on a version this process wrote or read
//! whole ([`remember_loaded`]: another writer's version, read when a commit lost a race), so its
//! refs are known (iceberg 0.10.1 has no accessor for them: they are read from its bytes). The
//! entries of a version read are the ones this process rendered for the same snapshots of a
//! version it descends from (a snapshot id is never reused within a table's lineage), the other
//! writer's new snapshots rendered once. Anything else — a version loaded through the
//! catalog, a schema change, an expiration — is written by iceberg's serializer, and the refs
//! are read back from those bytes for the next commit. The fast path also requires the new
//! version's metadata log to end at the remembered version and every remembered ref to still
//! name what the new version says. Debug builds check every fast version against iceberg's own
//! serialization of the same metadata.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use iceberg::spec::{
    FormatVersion, MetadataLog, PartitionSpec, PartitionStatisticsFile, Schema, Snapshot,
    SnapshotLog, SnapshotReference, SortOrder, StatisticsFile, Summary, TableMetadata,
};
use iceberg::TableUpdate;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// Versions remembered (a process commits to a few tables; the newest of each is what counts).
const REMEMBERED: usize = 16;

/// What a written version leaves for the next one: its refs and its snapshots' JSON entries.
struct Written {
    location: String,
    /// The table's uuid and location: a version read inherits the entries of a version of the
    /// same table (see [`remember_loaded`]).
    table: (uuid::Uuid, String),
    refs: BTreeMap<String, SnapshotReference>,
    /// Entries by snapshot id (empty after a version iceberg serialized: filled on the next
    /// fast write, once).
    snapshots: HashMap<i64, Arc<str>>,
}

static WRITTEN: Mutex<VecDeque<Arc<Written>>> = Mutex::new(VecDeque::new());

fn remembered(location: &str) -> Option<Arc<Written>> {
    let written = WRITTEN.lock().unwrap_or_else(|p| p.into_inner());
    written.iter().find(|w| w.location == location).cloned()
}

fn remember(w: Written) {
    let mut written = WRITTEN.lock().unwrap_or_else(|p| p.into_inner());
    written.retain(|x| x.location != w.location);
    if written.len() >= REMEMBERED {
        written.pop_front();
    }
    written.push_back(Arc::new(w));
}

/// The bytes of `metadata` — a version built on the one at `base` by `changes` — for
/// `location`, or `None` when the table compresses its metadata (iceberg writes those).
pub(crate) fn encode(
    metadata: &TableMetadata,
    base: &str,
    changes: &[TableUpdate],
    location: &str,
) -> Result<Option<Vec<u8>>> {
    let plain = matches!(
        metadata.metadata_compression_codec(),
        Ok(iceberg::compression::CompressionCodec::None)
    );
    if !plain {
        return Ok(None);
    }
    let prior = remembered(base).filter(|prior| {
        metadata.format_version() == FormatVersion::V2
            && changes.iter().all(|c| {
                matches!(
                    c,
                    TableUpdate::AddSnapshot { .. } | TableUpdate::SetSnapshotRef { .. }
                )
            })
            // Built on exactly that version (a builder made from another version's metadata
            // could hold refs the remembered one lacks)...
            && metadata.metadata_log().last().map(|l| l.metadata_file.as_str()) == Some(base)
            // ... and every remembered ref still names what the new version says it does.
            && prior.refs.iter().all(|(name, r)| {
                changes.iter().any(|c| {
                    matches!(c, TableUpdate::SetSnapshotRef { ref_name, .. } if ref_name == name)
                }) || metadata.snapshot_for_ref(name).map(|s| s.snapshot_id()) == Some(r.snapshot_id)
            })
    });
    tracing::debug!(fast = prior.is_some(), "metadata.json encoding");
    let Some(prior) = prior else {
        // iceberg's serializer; the refs read back for the next version.
        let bytes = serde_json::to_vec(metadata).map_err(json_error)?;
        let refs = serde_json::from_slice::<RefsOnly>(&bytes)
            .map_err(json_error)?
            .refs;
        remember(Written {
            location: location.to_string(),
            table: (metadata.uuid(), metadata.location().to_string()),
            refs,
            snapshots: HashMap::new(),
        });
        return Ok(Some(bytes));
    };
    let mut refs = prior.refs.clone();
    for c in changes {
        if let TableUpdate::SetSnapshotRef {
            ref_name,
            reference,
        } = c
        {
            refs.insert(ref_name.clone(), reference.clone());
        }
    }
    let mut snapshots = HashMap::with_capacity(metadata.snapshots().len());
    for s in metadata.snapshots() {
        let entry = match prior.snapshots.get(&s.snapshot_id()) {
            Some(e) => e.clone(),
            None => snapshot_entry(s)?,
        };
        snapshots.insert(s.snapshot_id(), entry);
    }
    let bytes = render(metadata, &refs, &snapshots)?;
    #[cfg(debug_assertions)]
    same_as_iceberg(metadata, &bytes)?;
    remember(Written {
        location: location.to_string(),
        table: (metadata.uuid(), metadata.location().to_string()),
        refs,
        snapshots,
    });
    Ok(Some(bytes))
}

/// Remembers a version this process read whole — `bytes` at `location`, parsed as `metadata` —
/// so a version staged on it takes the fast path: its refs are read from the bytes, and the
/// entries of its snapshots this process rendered for the same table are kept. Not remembered
/// (iceberg's serializer then writes the next version, as before) when the bytes' refs do not
/// say what the parsed metadata says (a file without `refs`, whose main iceberg derives from
/// `current-snapshot-id`) or the version is not a plain v2 one.
pub(crate) fn remember_loaded(location: &str, metadata: &TableMetadata, bytes: &[u8]) {
    if metadata.format_version() != FormatVersion::V2 {
        return;
    }
    let Ok(RefsOnly { refs }) = serde_json::from_slice::<RefsOnly>(bytes) else {
        return;
    };
    let main = refs.get(iceberg::spec::MAIN_BRANCH).map(|r| r.snapshot_id);
    let consistent = main == metadata.current_snapshot_id()
        && refs.iter().all(|(name, r)| {
            metadata.snapshot_for_ref(name).map(|s| s.snapshot_id()) == Some(r.snapshot_id)
        });
    if !consistent {
        return;
    }
    // Entries come from a version this one descends from (named in its metadata log) of the
    // same table at the same location: a copy of the table made with its paths rewritten
    // (Java's RewriteTablePath) keeps the uuid and the snapshot ids, not the manifest lists.
    let table = (metadata.uuid(), metadata.location().to_string());
    let log: std::collections::HashSet<&str> = metadata
        .metadata_log()
        .iter()
        .map(|l| l.metadata_file.as_str())
        .collect();
    let known = {
        let written = WRITTEN.lock().unwrap_or_else(|p| p.into_inner());
        written
            .iter()
            .rev()
            .find(|w| w.table == table && log.contains(w.location.as_str()))
            .cloned()
    };
    let snapshots = known
        .map(|w| {
            w.snapshots
                .iter()
                .filter(|(id, _)| metadata.snapshot_by_id(**id).is_some())
                .map(|(id, e)| (*id, e.clone()))
                .collect()
        })
        .unwrap_or_default();
    remember(Written {
        location: location.to_string(),
        table,
        refs,
        snapshots,
    });
}

/// `bytes`, a version other writers committed on `prior` (the version at `prior_location`,
/// which this process wrote or read and so remembers), read as `prior` plus what those commits
/// added: the metadata a whole parse of `bytes` gives, for a fraction of its cost. iceberg 0.10.1
/// reads a metadata.json through an untagged enum, so serde buffers the whole document and then
/// decodes it again (20–50 ms for the 3 MB of a hot table's history); here the entries of the
/// snapshots `prior` holds are read borrowed and compared with them, and only the new ones are
/// parsed into snapshots.
///
/// `None` (read it whole) unless the version is a plain v2 one that holds every snapshot of
/// `prior` and was made from it by commits that each added one snapshot (the versions between
/// named in its metadata log, main moved to each), the last one also moving refs: replaying
/// those commits on `prior` must give metadata that serializes, snapshots aside, to what `bytes`
/// hold field for field (both logs, schemas, specs, properties, refs, sequence number and times).
/// A snapshot id is never reused within a table's lineage, and the metadata log ties the version
/// to `prior`, so the entries skipped are those of `prior`.
pub(crate) fn read_on(
    prior: &TableMetadata,
    prior_location: &str,
    bytes: &[u8],
) -> Option<TableMetadata> {
    if prior.format_version() != FormatVersion::V2 {
        return None;
    }
    let prior_refs = remembered(prior_location)?.refs.clone();
    let Outline { fields, snapshots } = serde_json::from_slice(bytes).ok()?;
    let field = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if field("format-version")?.get() != "2" {
        return None;
    }
    let refs: BTreeMap<String, SnapshotReference> =
        serde_json::from_str(field("refs")?.get()).ok()?;
    let mut ids = std::collections::HashSet::with_capacity(snapshots.len());
    let mut new = Vec::new();
    for entry in &snapshots {
        // Every entry read (borrowed), so an entry of a snapshot `prior` holds must be that
        // snapshot's, summary included.
        let head: EntryHead = serde_json::from_str(entry.get()).ok()?;
        let id = head.snapshot_id;
        if !ids.insert(id) {
            return None;
        }
        if let Some(known) = prior.snapshot_by_id(id) {
            let summary = known.summary();
            let same = known.parent_snapshot_id() == head.parent_snapshot_id
                && known.sequence_number() == head.sequence_number
                && known.timestamp_ms() == head.timestamp_ms
                && known.manifest_list() == head.manifest_list
                && known.schema_id() == head.schema_id
                && head.summary.len() == summary.additional_properties.len() + 1
                && head.summary.iter().all(|(k, v)| match k.as_ref() {
                    "operation" => v.as_ref() == summary.operation.as_str(),
                    k => summary.additional_properties.get(k).map(String::as_str) == Some(v),
                });
            if !same {
                return None;
            }
        } else {
            let e: EntryIn = serde_json::from_str(entry.get()).ok()?;
            // iceberg's builder subtracts times (debug builds check the overflow); a whole
            // parse takes any.
            if !(0..=i64::MAX / 2).contains(&e.timestamp_ms) {
                return None;
            }
            new.push(
                Snapshot::builder()
                    .with_snapshot_id(e.snapshot_id)
                    .with_parent_snapshot_id(e.parent_snapshot_id)
                    .with_sequence_number(e.sequence_number)
                    .with_timestamp_ms(e.timestamp_ms)
                    .with_manifest_list(e.manifest_list)
                    .with_summary(e.summary)
                    .schema_id_opt(e.schema_id)
                    .build(),
            );
        }
    }
    if new.is_empty()
        || prior.snapshots().any(|s| !ids.contains(&s.snapshot_id()))
        || prior_refs.keys().any(|name| !refs.contains_key(name))
    {
        return None;
    }
    new.sort_by_key(|s| s.sequence_number());
    // The versions between `prior` and this one, from its metadata log.
    let log: Vec<MetadataLog> = serde_json::from_str(field("metadata-log")?.get()).ok()?;
    let at = log
        .iter()
        .rposition(|l| l.metadata_file == prior_location)?;
    let between = &log[at + 1..];
    if between.len() + 1 != new.len() {
        return None;
    }
    let main = refs.get(iceberg::spec::MAIN_BRANCH)?;
    let mut md = prior.clone();
    let mut location = prior_location.to_string();
    let last = new.pop()?;
    for (s, next) in new.into_iter().zip(between) {
        let moved = SnapshotReference::new(s.snapshot_id(), main.retention.clone());
        md = md
            .into_builder(Some(location))
            .add_snapshot(s)
            .ok()?
            .set_ref(iceberg::spec::MAIN_BRANCH, moved)
            .ok()?
            .build()
            .ok()?
            .metadata;
        location = next.metadata_file.clone();
    }
    let mut builder = md.into_builder(Some(location)).add_snapshot(last).ok()?;
    for (name, r) in &refs {
        if name == iceberg::spec::MAIN_BRANCH || prior_refs.get(name) != Some(r) {
            builder = builder.set_ref(name, r.clone()).ok()?;
        }
    }
    let md = builder.build().ok()?.metadata;
    if md.snapshots().len() != snapshots.len()
        || refs.iter().any(|(name, r)| {
            md.snapshot_for_ref(name).map(|s| s.snapshot_id()) != Some(r.snapshot_id)
        })
    {
        return None;
    }
    let ours = comparable(serde_json::to_value(rest(&md, &refs)).ok()?);
    let theirs = comparable(serde_json::Value::Object(
        fields
            .iter()
            .map(|(k, v)| Ok((k.to_string(), serde_json::from_str(v.get())?)))
            .collect::<std::result::Result<_, serde_json::Error>>()
            .ok()?,
    ));
    (ours == theirs).then_some(md)
}

/// A metadata.json's top-level fields (snapshots aside) as one compares them: lists whose order
/// is not meaningful sorted, and empty optional fields left out (absent and empty read the same).
fn comparable(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(fields) = v.as_object_mut() {
        for key in [
            "schemas",
            "partition-specs",
            "sort-orders",
            "statistics",
            "partition-statistics",
        ] {
            if let Some(serde_json::Value::Array(items)) = fields.get_mut(key) {
                items.sort_by_cached_key(|item| item.to_string());
            }
        }
        for key in [
            "properties",
            "snapshot-log",
            "metadata-log",
            "statistics",
            "partition-statistics",
        ] {
            let empty = match fields.get(key) {
                Some(serde_json::Value::Array(a)) => a.is_empty(),
                Some(serde_json::Value::Object(o)) => o.is_empty(),
                _ => false,
            };
            if empty {
                fields.remove(key);
            }
        }
    }
    v
}

/// A metadata.json's top-level fields but its snapshots, their values unparsed, and its snapshot
/// entries unparsed; `None`-like (an error) when a key is given twice.
struct Outline<'a> {
    fields: Vec<(&'a str, &'a serde_json::value::RawValue)>,
    snapshots: Vec<&'a serde_json::value::RawValue>,
}

impl<'de> Deserialize<'de> for Outline<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Outline<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Outline<'de>, A::Error> {
                let mut fields: Vec<(&str, &serde_json::value::RawValue)> = Vec::new();
                let mut snapshots = None;
                while let Some(key) = map.next_key::<&str>()? {
                    let twice = if key == "snapshots" {
                        snapshots.replace(map.next_value()?).is_some()
                    } else {
                        let twice = fields.iter().any(|(k, _)| *k == key);
                        fields.push((key, map.next_value()?));
                        twice
                    };
                    if twice {
                        return Err(serde::de::Error::custom(format!("`{key}` given twice")));
                    }
                }
                Ok(Outline {
                    fields,
                    snapshots: snapshots.unwrap_or_default(),
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A v2 snapshot entry, its text borrowed where it has no escapes (no allocation per value).
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct EntryHead<'a> {
    snapshot_id: i64,
    parent_snapshot_id: Option<i64>,
    #[serde(default)]
    sequence_number: i64,
    timestamp_ms: i64,
    #[serde(borrow)]
    manifest_list: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    summary: HashMap<std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>>,
    schema_id: Option<i32>,
}

/// A v2 snapshot entry, read as iceberg reads it.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct EntryIn {
    snapshot_id: i64,
    parent_snapshot_id: Option<i64>,
    #[serde(default)]
    sequence_number: i64,
    timestamp_ms: i64,
    manifest_list: String,
    summary: Summary,
    schema_id: Option<i32>,
}

#[derive(Deserialize)]
struct RefsOnly {
    #[serde(default)]
    refs: BTreeMap<String, SnapshotReference>,
}

/// A v2 snapshot entry, as iceberg writes it.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct SnapshotEntry<'a> {
    snapshot_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_snapshot_id: Option<i64>,
    sequence_number: i64,
    timestamp_ms: i64,
    manifest_list: &'a str,
    summary: &'a Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_id: Option<i32>,
}

fn snapshot_entry(s: &Snapshot) -> Result<Arc<str>> {
    let entry = SnapshotEntry {
        snapshot_id: s.snapshot_id(),
        parent_snapshot_id: s.parent_snapshot_id(),
        sequence_number: s.sequence_number(),
        timestamp_ms: s.timestamp_ms(),
        manifest_list: s.manifest_list(),
        summary: s.summary(),
        schema_id: s.schema_id(),
    };
    Ok(serde_json::to_string(&entry).map_err(json_error)?.into())
}

/// Everything of a v2 metadata.json but its snapshots, as iceberg writes it.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Rest<'a> {
    format_version: u8,
    table_uuid: uuid::Uuid,
    location: &'a str,
    last_sequence_number: i64,
    last_updated_ms: i64,
    last_column_id: i32,
    schemas: Vec<&'a Schema>,
    current_schema_id: i32,
    partition_specs: Vec<&'a PartitionSpec>,
    default_spec_id: i32,
    last_partition_id: i32,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    properties: &'a HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_snapshot_id: Option<i64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    snapshot_log: &'a [SnapshotLog],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    metadata_log: &'a [MetadataLog],
    sort_orders: Vec<&'a SortOrder>,
    default_sort_order_id: i64,
    refs: &'a BTreeMap<String, SnapshotReference>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statistics: Vec<&'a StatisticsFile>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partition_statistics: Vec<&'a PartitionStatisticsFile>,
}

/// Everything of `md` but its snapshots, with `refs` as its refs.
fn rest<'a>(md: &'a TableMetadata, refs: &'a BTreeMap<String, SnapshotReference>) -> Rest<'a> {
    Rest {
        format_version: 2,
        table_uuid: md.uuid(),
        location: md.location(),
        last_sequence_number: md.last_sequence_number(),
        last_updated_ms: md.last_updated_ms(),
        last_column_id: md.last_column_id(),
        schemas: md.schemas_iter().map(|s| s.as_ref()).collect(),
        current_schema_id: md.current_schema_id(),
        partition_specs: md.partition_specs_iter().map(|s| s.as_ref()).collect(),
        default_spec_id: md.default_partition_spec_id(),
        last_partition_id: md.last_partition_id(),
        properties: md.properties(),
        current_snapshot_id: md.current_snapshot_id(),
        snapshot_log: md.history(),
        metadata_log: md.metadata_log(),
        sort_orders: md.sort_orders_iter().map(|s| s.as_ref()).collect(),
        default_sort_order_id: md.default_sort_order_id(),
        refs,
        statistics: md.statistics_iter().collect(),
        partition_statistics: md.partition_statistics_iter().collect(),
    }
}

fn render(
    md: &TableMetadata,
    refs: &BTreeMap<String, SnapshotReference>,
    snapshots: &HashMap<i64, Arc<str>>,
) -> Result<Vec<u8>> {
    let rest = rest(md, refs);
    let mut out = serde_json::to_vec(&rest).map_err(json_error)?;
    if snapshots.is_empty() {
        return Ok(out);
    }
    // `{…}` becomes `{…,"snapshots":[…]}`.
    out.pop();
    out.extend_from_slice(b",\"snapshots\":[");
    for (i, entry) in snapshots.values().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(entry.as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// Debug builds: the fast bytes read back as exactly what iceberg's own bytes read back as.
#[cfg(debug_assertions)]
fn same_as_iceberg(md: &TableMetadata, bytes: &[u8]) -> Result<()> {
    let ours: TableMetadata = serde_json::from_slice(bytes).map_err(json_error)?;
    let theirs: TableMetadata =
        serde_json::from_slice(&serde_json::to_vec(md).map_err(json_error)?).map_err(json_error)?;
    if ours != theirs {
        return Err(Error::new(
            ErrorKind::Internal,
            format!(
                "metadata.json written without iceberg's serializer differs from it:\nours   {ours:?}\niceberg {theirs:?}"
            ),
        ));
    }
    Ok(())
}

fn json_error(e: serde_json::Error) -> Error {
    Error::new(ErrorKind::Internal, format!("table metadata JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 table with two schemas, a spec, a sort order, properties, a branch and a tag beside
    /// main, statistics, both logs and three snapshots.
    fn fixture() -> TableMetadata {
        serde_json::from_value(serde_json::json!({
            "format-version": 2,
            "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "s3://b/t",
            "last-sequence-number": 3,
            "last-updated-ms": 1_700_000_003_000i64,
            "last-column-id": 3,
            "current-schema-id": 1,
            "schemas": [
                {"type": "struct", "schema-id": 0, "fields": [
                    {"id": 1, "name": "x", "required": true, "type": "long"}]},
                {"type": "struct", "schema-id": 1, "identifier-field-ids": [1], "fields": [
                    {"id": 1, "name": "x", "required": true, "type": "long"},
                    {"id": 2, "name": "t", "required": false, "type": "timestamptz"},
                    {"id": 3, "name": "s", "required": false, "type": "string", "doc": "a \"quoted\" doc"}]}
            ],
            "default-spec-id": 1,
            "partition-specs": [
                {"spec-id": 0, "fields": []},
                {"spec-id": 1, "fields": [
                    {"name": "t_day", "transform": "day", "source-id": 2, "field-id": 1000}]}
            ],
            "last-partition-id": 1000,
            "default-sort-order-id": 1,
            "sort-orders": [
                {"order-id": 0, "fields": []},
                {"order-id": 1, "fields": [
                    {"transform": "identity", "source-id": 1, "direction": "asc", "null-order": "nulls-first"}]}
            ],
            "properties": {"write.format.default": "parquet", "owner": "data"},
            "current-snapshot-id": 3,
            "refs": {
                "main": {"snapshot-id": 3, "type": "branch"},
                "audit": {"snapshot-id": 2, "type": "branch", "min-snapshots-to-keep": 2, "max-snapshot-age-ms": 3600000},
                "v1": {"snapshot-id": 1, "type": "tag", "max-ref-age-ms": 86400000}
            },
            "snapshots": [
                {"snapshot-id": 1, "timestamp-ms": 1_700_000_001_000i64, "sequence-number": 1,
                 "manifest-list": "s3://b/t/metadata/snap-1.avro", "schema-id": 0,
                 "summary": {"operation": "append", "floe.source-objects": "[\"s3://l/a#1\"]"}},
                {"snapshot-id": 2, "parent-snapshot-id": 1, "timestamp-ms": 1_700_000_002_000i64,
                 "sequence-number": 2, "manifest-list": "s3://b/t/metadata/snap-2.avro",
                 "schema-id": 1, "summary": {"operation": "overwrite", "a\\b": "é\n"}},
                {"snapshot-id": 3, "parent-snapshot-id": 2, "timestamp-ms": 1_700_000_003_000i64,
                 "sequence-number": 3, "manifest-list": "s3://b/t/metadata/snap-3.avro",
                 "schema-id": 1, "summary": {"operation": "append"}}
            ],
            "snapshot-log": [
                {"snapshot-id": 1, "timestamp-ms": 1_700_000_001_000i64},
                {"snapshot-id": 2, "timestamp-ms": 1_700_000_002_000i64},
                {"snapshot-id": 3, "timestamp-ms": 1_700_000_003_000i64}
            ],
            "metadata-log": [
                {"metadata-file": "s3://b/t/metadata/00000-a.metadata.json", "timestamp-ms": 1_700_000_000_000i64}
            ],
            "statistics": [
                {"snapshot-id": 3, "statistics-path": "s3://b/t/metadata/3.stats",
                 "file-size-in-bytes": 10, "file-footer-size-in-bytes": 5, "blob-metadata": []}
            ]
        }))
        .unwrap()
    }

    /// main as a branch at `id`.
    fn main_at(id: i64) -> SnapshotReference {
        SnapshotReference::new(
            id,
            iceberg::spec::SnapshotRetention::branch(None, None, None),
        )
    }

    /// `md` (whose file is at `at`) with snapshot `id` appended on the fixture's current one
    /// and main moved to it.
    fn appended(
        md: TableMetadata,
        at: &str,
        id: i64,
        summary: HashMap<String, String>,
    ) -> iceberg::spec::TableMetadataBuildResult {
        let snapshot = Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(md.current_snapshot_id())
            .with_sequence_number(md.next_sequence_number())
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis() + 1000)
            .with_manifest_list(format!("s3://b/t/metadata/snap-{id}.avro"))
            .with_schema_id(1)
            .with_summary(Summary {
                operation: iceberg::spec::Operation::Append,
                additional_properties: summary,
            })
            .build();
        md.into_builder(Some(at.into()))
            .add_snapshot(snapshot)
            .unwrap()
            .set_ref("main", main_at(id))
            .unwrap()
            .build()
            .unwrap()
    }

    fn read(bytes: &[u8]) -> TableMetadata {
        serde_json::from_slice(bytes).unwrap()
    }

    /// The fixture's JSON as another table's (its own uuid: entries are shared by table).
    fn fixture_json(uuid: &str) -> serde_json::Value {
        let mut v = serde_json::to_value(fixture()).unwrap();
        v["table-uuid"] = uuid.into();
        v
    }

    /// [`read_on`], checked against the whole parse whenever it reads.
    fn read_on_checked(prior: &TableMetadata, at: &str, bytes: &[u8]) -> Option<TableMetadata> {
        let md = read_on(prior, at, bytes);
        if let Some(md) = &md {
            assert_eq!(
                md,
                &read(bytes),
                "read on the prior version differs from the file"
            );
        }
        md
    }

    #[test]
    fn another_writer_s_version_on_the_cached_one_is_read_on_it() {
        let prior: TableMetadata =
            serde_json::from_value(fixture_json("0b0a5f3e-57a4-4d0e-9b0c-0d1c5b1a0011")).unwrap();
        encode(&prior, "base-o", &[], "loc-o1").unwrap();
        let theirs = appended(
            prior.clone(),
            "loc-o1",
            4,
            HashMap::from([("floe.source-objects".into(), "[\"s3://l/b#2\"]".into())]),
        );
        // As iceberg's serializer writes it, and as the fast path writes it.
        let iceberg_bytes = serde_json::to_vec(&theirs.metadata).unwrap();
        let md = read_on_checked(&prior, "loc-o1", &iceberg_bytes).expect("read on the prior");
        assert_eq!(md.current_snapshot_id(), Some(4));
        let fast_bytes = encode(&theirs.metadata, "loc-o1", &theirs.changes, "loc-o2")
            .unwrap()
            .unwrap();
        assert!(read_on_checked(&prior, "loc-o1", &fast_bytes).is_some());
        // A new snapshot on a branch beside main, main unchanged.
        let on_audit = Snapshot::builder()
            .with_snapshot_id(7)
            .with_parent_snapshot_id(Some(2))
            .with_sequence_number(prior.next_sequence_number())
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list("s3://b/t/metadata/snap-7.avro")
            .with_schema_id(1)
            .with_summary(Summary {
                operation: iceberg::spec::Operation::Append,
                additional_properties: HashMap::new(),
            })
            .build();
        let moved = prior
            .clone()
            .into_builder(Some("loc-o1".into()))
            .add_snapshot(on_audit)
            .unwrap()
            .set_ref(
                "audit",
                SnapshotReference::new(
                    7,
                    iceberg::spec::SnapshotRetention::branch(Some(2), Some(3_600_000), None),
                ),
            )
            .unwrap()
            .build()
            .unwrap();
        let bytes = serde_json::to_vec(&moved.metadata).unwrap();
        assert!(read_on_checked(&prior, "loc-o1", &bytes).is_some());
        // A ref moved with no new snapshot takes its time from the writer's clock, which this
        // reader cannot know: read whole.
        let tagged = prior
            .clone()
            .into_builder(Some("loc-o1".into()))
            .set_ref(
                "v2",
                SnapshotReference::new(
                    2,
                    iceberg::spec::SnapshotRetention::Tag {
                        max_ref_age_ms: None,
                    },
                ),
            )
            .unwrap()
            .build()
            .unwrap();
        let mut bytes = serde_json::to_value(&tagged.metadata).unwrap();
        bytes["last-updated-ms"] = (prior.last_updated_ms() + 5).into();
        assert!(read_on_checked(&prior, "loc-o1", &serde_json::to_vec(&bytes).unwrap()).is_none());
    }

    #[test]
    fn a_version_that_is_more_than_new_snapshots_on_the_cached_one_is_read_whole() {
        let prior: TableMetadata =
            serde_json::from_value(fixture_json("0b0a5f3e-57a4-4d0e-9b0c-0d1c5b1a0012")).unwrap();
        encode(&prior, "base-p", &[], "loc-p1").unwrap();
        let first = appended(prior.clone(), "loc-p1", 4, HashMap::new());
        // Two commits on it, the version between named in the metadata log: replayed.
        let second = appended(first.metadata.clone(), "loc-p2", 5, HashMap::new());
        let bytes = serde_json::to_vec(&second.metadata).unwrap();
        assert!(read_on_checked(&prior, "loc-p1", &bytes).is_some());
        // ... but not when the log does not tie it to the prior version.
        encode(&prior, "base-p", &[], "loc-p9").unwrap();
        assert!(read_on_checked(&prior, "loc-p9", &bytes).is_none());
        // A commit between that added no snapshot (a property set): its time is unknown.
        let between = first
            .metadata
            .clone()
            .into_builder(Some("loc-p2".into()))
            .set_properties(HashMap::from([("a".into(), "b".into())]))
            .unwrap()
            .build()
            .unwrap();
        let third = appended(between.metadata, "loc-p3", 6, HashMap::new());
        let bytes = serde_json::to_vec(&third.metadata).unwrap();
        assert!(read_on_checked(&prior, "loc-p1", &bytes).is_none());
        // A property changed beside the new snapshot.
        let props = first
            .metadata
            .clone()
            .into_builder(None)
            .set_properties(HashMap::from([("a".into(), "b".into())]))
            .unwrap()
            .build()
            .unwrap();
        let bytes = serde_json::to_vec(&props.metadata).unwrap();
        assert!(read_on_checked(&prior, "loc-p1", &bytes).is_none());
        // A snapshot expired.
        let expired = first
            .metadata
            .clone()
            .into_builder(None)
            .remove_snapshots(&[1])
            .build()
            .unwrap();
        let bytes = serde_json::to_vec(&expired.metadata).unwrap();
        assert!(read_on_checked(&prior, "loc-p1", &bytes).is_none());
        // A copy of the table at another location (Java's RewriteTablePath keeps the ids).
        let mut copy = serde_json::to_value(&first.metadata).unwrap();
        copy["location"] = "s3://elsewhere/t".into();
        let bytes = serde_json::to_vec(&copy).unwrap();
        assert!(read_on_checked(&prior, "loc-p1", &bytes).is_none());
        // Review helper-41: an entry of a snapshot the prior version holds, changed in the file
        // (another manifest list), or cut to its id, was skipped unread and taken as the prior's.
        let mut changed = serde_json::to_value(&first.metadata).unwrap();
        for entry in changed["snapshots"].as_array_mut().unwrap() {
            if entry["snapshot-id"] == 2 {
                entry["manifest-list"] = "s3://b/t/metadata/snap-2-rewritten.avro".into();
            }
        }
        let bytes = serde_json::to_vec(&changed).unwrap();
        assert!(read_on_checked(&prior, "loc-p1", &bytes).is_none());
        let mut cut = serde_json::to_value(&first.metadata).unwrap();
        for entry in cut["snapshots"].as_array_mut().unwrap() {
            if entry["snapshot-id"] == 1 {
                *entry = serde_json::json!({"snapshot-id": 1});
            }
        }
        let bytes = serde_json::to_vec(&cut).unwrap();
        assert!(serde_json::from_slice::<TableMetadata>(&bytes).is_err());
        assert!(read_on(&prior, "loc-p1", &bytes).is_none());
        // Review helper-42: a known entry's summary was skipped unread (null, changed).
        for summary in [
            serde_json::Value::Null,
            serde_json::json!({"operation": "append"}),
            serde_json::json!({"operation": "overwrite", "a\\b": "é\n", "n": 1}),
        ] {
            let mut v = serde_json::to_value(&first.metadata).unwrap();
            for entry in v["snapshots"].as_array_mut().unwrap() {
                if entry["snapshot-id"] == 2 {
                    entry["summary"] = summary.clone();
                }
            }
            let bytes = serde_json::to_vec(&v).unwrap();
            assert!(read_on(&prior, "loc-p1", &bytes).is_none(), "{summary}");
        }
        // ... and a new snapshot timed at the end of time.
        let mut v = serde_json::to_value(&first.metadata).unwrap();
        for entry in v["snapshots"].as_array_mut().unwrap() {
            if entry["snapshot-id"] == 4 {
                entry["timestamp-ms"] = i64::MIN.into();
            }
        }
        assert!(read_on(&prior, "loc-p1", &serde_json::to_vec(&v).unwrap()).is_none());
        // A prior version this process does not remember (its refs are unknown).
        let bytes = serde_json::to_vec(&first.metadata).unwrap();
        assert!(read_on_checked(&prior, "loc-never-seen", &bytes).is_none());
        // A key given twice, and a format other than v2.
        let text = String::from_utf8(bytes).unwrap();
        let twice = text.replacen('{', "{\"location\":\"s3://b/t\",", 1);
        assert!(read_on_checked(&prior, "loc-p1", twice.as_bytes()).is_none());
        let mut v3 = serde_json::to_value(&first.metadata).unwrap();
        v3["format-version"] = 3.into();
        assert!(read_on(&prior, "loc-p1", &serde_json::to_vec(&v3).unwrap()).is_none());
    }

    #[test]
    fn a_version_another_writer_committed_is_read_and_staged_on_by_the_fast_path() {
        // Before: a version read after a lost race (the other writer's) was not remembered, so
        // the next version staged on it went through iceberg's serializer, which writes every
        // snapshot of the history again.
        let md: TableMetadata =
            serde_json::from_value(fixture_json("0b0a5f3e-57a4-4d0e-9b0c-0d1c5b1a0001")).unwrap();
        encode(&md, "base-r", &[], "loc-r1").unwrap();
        let mine = appended(md, "loc-r1", 4, HashMap::new());
        encode(&mine.metadata, "loc-r1", &mine.changes, "loc-r2").unwrap();
        // The other writer's version on it, with snapshot 5, read whole from the store.
        let theirs = appended(
            mine.metadata,
            "loc-r2",
            5,
            HashMap::from([("by".into(), "the other writer".into())]),
        );
        let bytes = serde_json::to_vec(&theirs.metadata).unwrap();
        remember_loaded("loc-r3", &read(&bytes), &bytes);
        let w = remembered("loc-r3").unwrap();
        assert_eq!(w.refs.len(), 3);
        assert_eq!(w.refs["main"], main_at(5));
        assert_eq!(
            w.snapshots.len(),
            4,
            "1-4 rendered before; 5 is the other writer's"
        );
        // This writer's next version on it: the fast path, read back as iceberg writes it.
        let next = appended(read(&bytes), "loc-r3", 6, HashMap::new());
        let out = encode(&next.metadata, "loc-r3", &next.changes, "loc-r4")
            .unwrap()
            .unwrap();
        assert_eq!(read(&out), next.metadata);
        assert_eq!(
            read(&out)
                .snapshot_by_id(5)
                .unwrap()
                .summary()
                .additional_properties["by"],
            "the other writer"
        );
        assert_eq!(remembered("loc-r4").unwrap().snapshots.len(), 6);
    }

    #[test]
    fn a_copy_of_the_table_with_its_paths_rewritten_does_not_inherit_the_original_s_entries() {
        // Review helper-39: entries were inherited by table uuid alone, and a copy made with
        // its paths rewritten (Java's RewriteTablePath) keeps the uuid and the snapshot ids: the
        // copy's next version listed the original's manifest lists.
        let md: TableMetadata =
            serde_json::from_value(fixture_json("0b0a5f3e-57a4-4d0e-9b0c-0d1c5b1a0003")).unwrap();
        encode(&md, "base-p", &[], "s3://b/t/metadata/p1.json").unwrap();
        let mine = appended(md, "s3://b/t/metadata/p1.json", 4, HashMap::new());
        encode(
            &mine.metadata,
            "s3://b/t/metadata/p1.json",
            &mine.changes,
            "s3://b/t/metadata/p2.json",
        )
        .unwrap();
        let text = serde_json::to_string(&mine.metadata)
            .unwrap()
            .replace("s3://b/", "s3://c/");
        let copy_at = "s3://c/t/metadata/p3.json";
        remember_loaded(copy_at, &read(text.as_bytes()), text.as_bytes());
        let next = appended(read(text.as_bytes()), copy_at, 6, HashMap::new());
        let out = encode(
            &next.metadata,
            copy_at,
            &next.changes,
            "s3://c/t/metadata/p4.json",
        )
        .unwrap()
        .unwrap();
        let back = read(&out);
        assert_eq!(back, next.metadata);
        // (Snapshot 6, this writer's own, names its list as `appended` does.)
        assert!(back
            .snapshots()
            .filter(|s| s.snapshot_id() != 6)
            .all(|s| s.manifest_list().starts_with("s3://c/")));
    }

    #[test]
    fn a_version_read_whose_refs_iceberg_derives_is_left_to_iceberg() {
        // A metadata.json without `refs`: iceberg makes main from `current-snapshot-id`, which
        // the bytes' refs do not hold; the fast path would write the refs without main.
        let mut v = fixture_json("0b0a5f3e-57a4-4d0e-9b0c-0d1c5b1a0002");
        v.as_object_mut().unwrap().remove("refs");
        let md: TableMetadata = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(md.snapshot_for_ref("main").unwrap().snapshot_id(), 3);
        remember_loaded("loc-n1", &md, &serde_json::to_vec(&v).unwrap());
        assert!(remembered("loc-n1").is_none());
    }

    #[test]
    fn a_version_on_a_written_one_reads_back_as_iceberg_writes_it_with_every_ref() {
        let md = fixture();
        // The first version (as loaded from a catalog) goes through iceberg and leaves its refs.
        let first = encode(&md, "s3://b/t/metadata/00000-a.metadata.json", &[], "loc-1")
            .unwrap()
            .unwrap();
        assert_eq!(read(&first), md);
        // A version staged on it: a new snapshot, main moved.
        let built = appended(
            md,
            "loc-1",
            4,
            HashMap::from([("k".into(), "v \"w\"".into())]),
        );
        let next = built.metadata;
        let bytes = encode(&next, "loc-1", &built.changes, "loc-2")
            .unwrap()
            .unwrap();
        let back = read(&bytes);
        assert_eq!(back, next);
        assert_eq!(back.snapshots().len(), 4);
        assert_eq!(back.snapshot_for_ref("audit").unwrap().snapshot_id(), 2);
        assert_eq!(back.snapshot_for_ref("v1").unwrap().snapshot_id(), 1);
        assert_eq!(back.current_snapshot_id(), Some(4));
        // It was the fast path: the entries are remembered by id for the version after.
        let w = remembered("loc-2").unwrap();
        assert_eq!(w.snapshots.len(), 4);
        assert_eq!(w.refs["main"], main_at(4));
        assert_eq!(w.refs.len(), 3);
    }

    #[test]
    fn a_version_not_built_on_the_remembered_one_goes_through_iceberg() {
        // Remembered "loc-a" (the fixture's refs); the new version is built on other metadata
        // that has a tag more (another engine's commit in between), yet named as built on
        // "loc-a": its tag must survive.
        let md = fixture();
        encode(&md, "base-a", &[], "loc-a").unwrap();
        let other = md
            .clone()
            .into_builder(Some("loc-b".into()))
            .set_ref(
                "extra",
                SnapshotReference::new(
                    2,
                    iceberg::spec::SnapshotRetention::Tag {
                        max_ref_age_ms: None,
                    },
                ),
            )
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        let built = appended(other, "loc-c", 5, HashMap::new());
        let bytes = encode(&built.metadata, "loc-a", &built.changes, "loc-d")
            .unwrap()
            .unwrap();
        let back = read(&bytes);
        assert_eq!(back.snapshot_for_ref("extra").unwrap().snapshot_id(), 2);
        assert_eq!(back, built.metadata);
        assert!(
            remembered("loc-d").unwrap().snapshots.is_empty(),
            "iceberg's path"
        );
    }

    #[test]
    fn anything_but_new_snapshots_and_refs_goes_through_iceberg() {
        let md = fixture();
        encode(&md, "base-x", &[], "loc-x").unwrap();
        let built = md
            .clone()
            .into_builder(Some("loc-x".into()))
            .set_properties(HashMap::from([("a".into(), "b".into())]))
            .unwrap()
            .build()
            .unwrap();
        let bytes = encode(&built.metadata, "loc-x", &built.changes, "loc-y")
            .unwrap()
            .unwrap();
        assert_eq!(read(&bytes), built.metadata);
        // iceberg wrote it: no entries kept, the refs read back from its bytes.
        let w = remembered("loc-y").unwrap();
        assert!(w.snapshots.is_empty());
        assert_eq!(w.refs.len(), 3);
        // A compressed table's metadata is left to iceberg's writer.
        let gz = md
            .into_builder(Some("loc-y".into()))
            .set_properties(HashMap::from([(
                "write.metadata.compression-codec".into(),
                "gzip".into(),
            )]))
            .unwrap()
            .build()
            .unwrap();
        assert!(encode(&gz.metadata, "loc-y", &gz.changes, "loc-z")
            .unwrap()
            .is_none());
    }
}
