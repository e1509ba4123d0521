#!/usr/bin/env python3
"""A small Iceberg REST catalog for floe's tests: the REST endpoints floe uses, served by Flask,
with PyIceberg's SQL catalog (SQLite) behind them. Commits are validated by PyIceberg (requirements
such as assert-ref-snapshot-id) and installed with its compare-and-swap, so concurrent commits
conflict exactly as on a real REST catalog.

Usage: rest_catalog.py --db FILE --warehouse s3://bucket/prefix --s3-endpoint URL
                       [--port 0] [--port-file FILE] [--parent-pid PID]
"""
import argparse
import json
import os
import threading
import time

from flask import Flask, Response, request
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (CommitFailedException, NamespaceAlreadyExistsError,
                                  NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableRequest
from pyiceberg.table.sorting import SortOrder
from pyiceberg.transforms import parse_transform

p = argparse.ArgumentParser()
p.add_argument("--db", required=True)
p.add_argument("--warehouse", required=True)
p.add_argument("--s3-endpoint")
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, default=0)
p.add_argument("--port-file")
p.add_argument("--parent-pid", type=int)
a = p.parse_args()

props = {"warehouse": a.warehouse}
if a.s3_endpoint:
    props.update({
        "s3.endpoint": a.s3_endpoint,
        "s3.access-key-id": "test",
        "s3.secret-access-key": "test",
        "s3.region": "us-east-1",
    })
catalog = SqlCatalog("rest", uri=f"sqlite:///{a.db}", **props)
app = Flask(__name__)
lock = threading.Lock()


def error(status, kind, message):
    body = {"error": {"message": message, "type": kind, "code": status}}
    return Response(json.dumps(body), status=status, mimetype="application/json")


def ok(body, status=200):
    return Response(json.dumps(body), status=status, mimetype="application/json")


def ns_tuple(ns):
    return tuple(ns.split("\x1f"))


def load_result(table):
    return {
        "metadata-location": table.metadata_location,
        "metadata": json.loads(table.metadata.model_dump_json()),
        "config": {},
    }


@app.get("/v1/config")
def config():
    return ok({"defaults": {}, "overrides": {}})


@app.get("/v1/namespaces")
def list_namespaces():
    return ok({"namespaces": [list(n) for n in catalog.list_namespaces()]})


@app.post("/v1/namespaces")
def create_namespace():
    body = request.get_json()
    try:
        catalog.create_namespace(tuple(body["namespace"]), body.get("properties") or {})
    except NamespaceAlreadyExistsError as e:
        return error(409, "AlreadyExistsException", str(e))
    return ok({"namespace": body["namespace"], "properties": body.get("properties") or {}})


@app.route("/v1/namespaces/<ns>", methods=["GET", "HEAD"])
def get_namespace(ns):
    try:
        p = catalog.load_namespace_properties(ns_tuple(ns))
    except NoSuchNamespaceError as e:
        return error(404, "NoSuchNamespaceException", str(e))
    if request.method == "HEAD":
        return Response(status=204)
    return ok({"namespace": list(ns_tuple(ns)), "properties": p})


@app.get("/v1/namespaces/<ns>/tables")
def list_tables(ns):
    ids = [{"namespace": list(t[:-1]), "name": t[-1]} for t in catalog.list_tables(ns_tuple(ns))]
    return ok({"identifiers": ids})


@app.post("/v1/namespaces/<ns>/tables")
def create_table(ns):
    body = request.get_json()
    schema = Schema.model_validate(body["schema"])
    fields = []
    for i, f in enumerate((body.get("partition-spec") or {}).get("fields", [])):
        fields.append(PartitionField(
            source_id=f["source-id"],
            field_id=f.get("field-id") or 1000 + i,
            transform=parse_transform(f["transform"]),
            name=f["name"],
        ))
    try:
        t = catalog.create_table(
            ns_tuple(ns) + (body["name"],),
            schema=schema,
            location=body.get("location"),
            partition_spec=PartitionSpec(*fields),
            sort_order=SortOrder(),
            properties=body.get("properties") or {},
        )
    except TableAlreadyExistsError as e:
        return error(409, "AlreadyExistsException", str(e))
    return ok(load_result(t))


@app.route("/v1/namespaces/<ns>/tables/<name>", methods=["GET", "HEAD"])
def load_table(ns, name):
    try:
        t = catalog.load_table(ns_tuple(ns) + (name,))
    except NoSuchTableError as e:
        return error(404, "NoSuchTableException", str(e))
    if request.method == "HEAD":
        return Response(status=204)
    return ok(load_result(t))


@app.post("/v1/namespaces/<ns>/tables/<name>")
def commit(ns, name):
    req = CommitTableRequest.model_validate(request.get_json())
    try:
        t = catalog.load_table(ns_tuple(ns) + (name,))
        resp = catalog.commit_table(t, req.requirements, req.updates)
    except NoSuchTableError as e:
        return error(404, "NoSuchTableException", str(e))
    except CommitFailedException as e:
        return error(409, "CommitFailedException", str(e))
    return ok({"metadata-location": resp.metadata_location, "metadata": json.loads(resp.metadata.model_dump_json())})


def watch_parent(pid):
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)
        time.sleep(1)


if __name__ == "__main__":
    if a.parent_pid:
        threading.Thread(target=watch_parent, args=(a.parent_pid,), daemon=True).start()
    from werkzeug.serving import make_server

    server = make_server(a.host, a.port, app, threaded=True)
    port = server.socket.getsockname()[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, a.port_file)
    server.serve_forever()
