#!/usr/bin/env python3
"""moto_server for floe's tests and local stack, with Glue's optimistic locking.

moto's Glue `UpdateTable` ignores `VersionId`, so two concurrent commits would both "win" and one
would be silently lost. Real Glue rejects a stale VersionId with ConcurrentModificationException;
this wrapper patches moto to do the same (compare-and-swap under a lock).

Usage: moto_server.py [--host 127.0.0.1] [--port 5000] [--port-file FILE] [--parent-pid PID]
With --parent-pid the server exits when that process is gone (so test runs never leak servers).
"""
import argparse
import functools
import os
import sys
import threading
import time

from moto.glue import models as glue_models
from moto.glue import responses as glue_responses
from moto.glue.exceptions import GlueClientError
from moto.sqs import models as sqs_models
import moto.backends as moto_backends
import jsonpath_ng.ext as jsonpath_ext


class ConcurrentModificationException(GlueClientError):
    def __init__(self, msg):
        super().__init__("ConcurrentModificationException", msg)


_lock = threading.Lock()
_orig_update = glue_responses.GlueResponse.update_table


def _update_table(self):
    database_name = self.parameters.get("DatabaseName")
    table_input = self.parameters.get("TableInput") or {}
    expected = self.parameters.get("VersionId")
    with _lock:
        if expected is not None:
            table = self.glue_backend.get_table(database_name, table_input.get("Name"))
            current = str(table._current_version)
            if str(expected) != current:
                raise ConcurrentModificationException(
                    f"Table {database_name}.{table_input.get('Name')} was modified: "
                    f"expected version {expected}, current {current}"
                )
        return _orig_update(self)


glue_responses.GlueResponse.update_table = _update_table


# moto's SQS asks the clock through datetime arithmetic (utcnow() - utcfromtimestamp(0)) for every
# message on every send and receive: a send computes the queue's attributes, whose approximate
# counts test each queued message's visibility and delay. With a backlog of a few thousand
# messages (50 objects/s in `floe bench --freshness`) py-spy showed 92 % of the server's one core
# in those clock reads, and the emulator, not floe, set the ceiling. time.time() is the same
# value (seconds since the epoch, UTC) at a fraction of the cost; a datetime argument still goes
# through moto's own conversion.
_orig_unix_time = sqs_models.unix_time
_orig_unix_time_millis = sqs_models.unix_time_millis


def _unix_time(dt=None):
    return time.time() if dt is None else _orig_unix_time(dt)


def _unix_time_millis(dt=None):
    return time.time() * 1000.0 if dt is None else _orig_unix_time_millis(dt)


sqs_models.unix_time = _unix_time
sqs_models.unix_time_millis = _unix_time_millis


# Receiving a message checked its retention through get_queue_attributes, which builds the whole
# attribute dict (the approximate counts above: a pass over the queue) three times per message
# received. The retention period is one attribute of the queue.
def _retained(self, queue_name, message):
    retention = int(self.get_queue(queue_name).message_retention_period)
    return retention + message.sent_timestamp / 1000 > time.time()


sqs_models.SQSBackend.is_message_valid_based_on_retention_period = _retained

# Every request listed moto's package directory (listdir + isdir per entry) to tell a service
# name from a host; the directory does not change while the server runs.
_modules = tuple(moto_backends.list_of_moto_modules())
moto_backends.list_of_moto_modules = lambda: _modules

# EventBridge built a JSONPath parser (ply tables read anew) for each path of each event it
# routed; a parsed path is a pure value, so one per distinct path is kept.
jsonpath_ext.parse = functools.lru_cache(maxsize=256)(jsonpath_ext.parse)


def _watch_parent(pid):
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)
        time.sleep(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--port-file")
    p.add_argument("--parent-pid", type=int)
    a = p.parse_args()
    if a.parent_pid:
        threading.Thread(target=_watch_parent, args=(a.parent_pid,), daemon=True).start()
    from werkzeug.serving import make_server
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(a.host, a.port, app, threaded=True)
    port = server.socket.getsockname()[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, a.port_file)
    print(f"moto_server (Glue VersionId enforced) on http://{a.host}:{port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
