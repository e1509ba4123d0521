#!/usr/bin/env python3
"""Reads a floe table with PyIceberg (an independent Iceberg implementation) and prints JSON:
row count, schema, current snapshot summary and snapshot count. Used by the integration tests to
prove floe writes valid Iceberg.

Usage: pyiceberg_check.py --catalog sqlite|glue --table ns.name --endpoint URL
                          [--uri sqlite:///path] [--warehouse s3://b/p] [--catalog-name floe]
"""
import argparse
import json

p = argparse.ArgumentParser()
p.add_argument("--catalog", required=True, choices=["sqlite", "glue"])
p.add_argument("--table", required=True)
p.add_argument("--endpoint")
p.add_argument("--uri")
p.add_argument("--warehouse")
p.add_argument("--catalog-name", default="floe")
p.add_argument("--rows", action="store_true", help="also print every row (values as text), sorted")
a = p.parse_args()

s3 = {}
if a.endpoint:
    s3 = {
        "s3.endpoint": a.endpoint,
        "s3.access-key-id": "test",
        "s3.secret-access-key": "test",
        "s3.region": "us-east-1",
    }
if a.catalog == "sqlite":
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog(a.catalog_name, uri=a.uri, warehouse=a.warehouse, **s3)
else:
    from pyiceberg.catalog.glue import GlueCatalog

    cat = GlueCatalog(
        a.catalog_name,
        **{
            "glue.endpoint": a.endpoint,
            "glue.region": "us-east-1",
            "glue.access-key-id": "test",
            "glue.secret-access-key": "test",
            **s3,
        },
    )
t = cat.load_table(a.table)
arrow = t.scan().to_arrow()
snap = t.current_snapshot()
out = {
    "rows": arrow.num_rows,
    "columns": [f.name for f in t.schema().fields],
    "required": [f.name for f in t.schema().fields if f.required],
    "snapshots": len(t.metadata.snapshots),
    "summary": dict(snap.summary.additional_properties) if snap else {},
    "operation": str(snap.summary.operation.value) if snap else None,
    "partition_fields": [f.name for f in t.spec().fields],
}
if "order_id" in arrow.column_names:
    ids = arrow.column("order_id").to_pylist()
    out["distinct_order_ids"] = len(set(ids))
if a.rows:
    out["data"] = sorted(
        [[None if v is None else str(v) for v in r.values()] for r in arrow.to_pylist()],
        key=lambda r: [x or "" for x in r],
    )
print(json.dumps(out))
