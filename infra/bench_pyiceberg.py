#!/usr/bin/env python3
"""PyIceberg side of `floe bench`: the serverless-Python baseline on the same input.

big <file.jsonl.gz> <workdir>     pyarrow JSON read + table.append (SQLite catalog, local warehouse)
small <dir> <workdir>             one table.append per small object, in name order
Prints one JSON line: secs (work), rows, rss_mb (peak), cpu_secs (user + system), and per-object latencies for `small`.
"""
import gzip
import json
import os
import resource
import sys
import time

import pyarrow as pa
import pyarrow.json as pj
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import (DoubleType, IntegerType, LongType, NestedField, StringType,
                             TimestamptzType)

mode, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
cat = SqlCatalog("bench", uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/warehouse")
cat.create_namespace_if_not_exists("bench")
schema = Schema(
    NestedField(1, "order_id", StringType(), required=True),
    NestedField(2, "customer_id", LongType(), required=True),
    NestedField(3, "region", StringType()),
    NestedField(4, "amount", DoubleType()),
    NestedField(5, "currency", StringType()),
    NestedField(6, "items", IntegerType()),
    NestedField(7, "status", StringType()),
    NestedField(8, "payment_method", StringType()),
    NestedField(9, "event_time", TimestamptzType(), required=True),
)
spec = PartitionSpec(PartitionField(source_id=9, field_id=1000, transform=DayTransform(), name="event_time_day"))
table = cat.create_table("bench.orders", schema=schema, partition_spec=spec)
arrow_schema = schema.as_arrow()
opts = pj.ParseOptions(explicit_schema=arrow_schema)


def read(path):
    t = pj.read_json(path, parse_options=opts)
    return t.cast(arrow_schema)


out = {}
if mode == "big":
    t0 = time.perf_counter()
    data = read(src)
    table.append(data)
    out = {"secs": time.perf_counter() - t0, "rows": data.num_rows}
else:
    lat = []
    rows = 0
    t0 = time.perf_counter()
    for name in sorted(os.listdir(src)):
        s = time.perf_counter()
        data = read(os.path.join(src, name))
        table.append(data)
        lat.append((time.perf_counter() - s) * 1000)
        rows += data.num_rows
    out = {"secs": time.perf_counter() - t0, "rows": rows, "latencies_ms": lat}
usage = resource.getrusage(resource.RUSAGE_SELF)
out["rss_mb"] = usage.ru_maxrss / 1024
out["cpu_secs"] = usage.ru_utime + usage.ru_stime
print(json.dumps(out))
