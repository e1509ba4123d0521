#!/usr/bin/env python3
"""Reads an Iceberg table with DuckDB's iceberg extension (`iceberg_scan` over a metadata.json,
the pip-installed extensions, no network) and prints JSON: row count and the rows (values as
text, sorted). Another independent reader beside PyIceberg, for the integration tests.

Usage: duckdb_check.py --metadata s3://bucket/.../metadata/00003-....metadata.json
                       [--endpoint http://127.0.0.1:PORT] [--columns a,b,c]
"""
import argparse
import json
import os
from urllib.parse import urlparse

import duckdb

p = argparse.ArgumentParser()
p.add_argument("--metadata", required=True)
p.add_argument("--endpoint")
p.add_argument("--columns", default="*")
a = p.parse_args()


def extension(module, name):
    mod = __import__(module)
    return os.path.join(
        os.path.dirname(mod.__file__), "extensions", f"v{duckdb.__version__}", f"{name}.duckdb_extension"
    )


con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
for module, name in [
    ("duckdb_extension_avro", "avro"),
    ("duckdb_extension_httpfs", "httpfs"),
    ("duckdb_extension_iceberg", "iceberg"),
]:
    con.execute(f"LOAD '{extension(module, name)}'")
if a.endpoint:
    e = urlparse(a.endpoint)
    con.execute(
        f"""CREATE SECRET s3 (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1',
            ENDPOINT '{e.netloc}', URL_STYLE 'path', USE_SSL {str(e.scheme == 'https').lower()})"""
    )
rows = con.execute(f"SELECT {a.columns} FROM iceberg_scan('{a.metadata}')").fetchall()
data = sorted([[None if v is None else str(v) for v in r] for r in rows], key=lambda r: [x or "" for x in r])
print(json.dumps({"rows": len(rows), "data": data}))
