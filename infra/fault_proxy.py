#!/usr/bin/env python3
"""A fault-injecting HTTP proxy between floe and moto_server (S3 + Glue on one port).

floe's own fault tests wrap floe's code (a PointerSwap that pretends an answer was lost). This
proxy sits *below* floe's code, on the wire: the AWS SDK's retries, opendal's retries and the
iceberg crates all see the faults a real network and a real AWS show.

Faults (each with its own rate and request kinds; a kind is `s3:<METHOD>`, `s3:LIST` for a bucket
listing, or `glue:<Operation>` from the `X-Amz-Target` header, e.g. `glue:UpdateTable`):

  refuse        close the connection (RST) before forwarding: nothing reaches moto
  throttle      answer without forwarding: S3 `503 SlowDown` (XML), Glue `400 ThrottlingException`
  error500      answer without forwarding: S3 `500 InternalError`, Glue `500 InternalServiceException`
  reset_body    forward, send the headers and half the body, then reset the connection
  lost_answer   forward (the request TAKES EFFECT upstream), then drop the connection (mode
                `drop`), answer 500 (mode `500`), or either at random (mode `mixed`, default)
  stall         forward (the request TAKES EFFECT upstream), then send nothing for `seconds`
                (default 300) before resetting: a server that took the request and went silent

Kinds are shell patterns (`s3:*`, `glue:*Table`). A fault applies `rate` to the kinds matching
`kinds`; `rates` ({pattern: rate}, first match wins) overrides the rate per kind; `max` caps how
many times the fault is injected. Config (JSON, `POST /__faults`; omitted keys keep their value):

  {"enabled": true, "seed": 7,
   "faults": {"throttle":    {"rate": 0.05, "kinds": ["*"]},
              "lost_answer": {"rates": {"glue:UpdateTable": 0.3, "s3:PUT": 0.02},
                              "mode": "mixed", "max": 100}},
   "reset_counts": true}

The proxy starts disabled (everything forwarded, requests still counted) unless --config says
otherwise. Faults are decided in this order, at most one per request: refuse, throttle, error500,
reset_body, lost_answer, stall.

`GET /__faults` answers the config and the counts: requests by kind, faults by fault and kind,
and `effective`: lost answers whose request succeeded upstream (the commit landed, the answer did
not), by kind.

Usage: fault_proxy.py --upstream http://127.0.0.1:PORT [--host 127.0.0.1] [--port 0]
                      [--port-file FILE] [--parent-pid PID] [--config JSON]
With --parent-pid the proxy exits when that process is gone (test runs never leak it).
Standard library only.
"""
import argparse
import fnmatch
import http.client
import json
import os
import random
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("refuse", "throttle", "error500", "reset_body", "lost_answer", "stall")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}


class State:
    """Config and counters, shared by all handler threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.enabled = False
        self.seed = 0
        self.rng = random.Random(0)
        self.faults = {f: {"rate": 0.0, "kinds": ["*"]} for f in FAULTS}
        self.faults["lost_answer"]["mode"] = "mixed"
        self.faults["stall"]["seconds"] = 300.0
        self.reset_counts()

    def reset_counts(self):
        self.requests = {}
        self.injected = {f: {} for f in FAULTS}
        self.effective = {}
        self.upstream_errors = 0

    def configure(self, cfg):
        with self.lock:
            if cfg.get("reset_counts"):
                self.reset_counts()
            if "enabled" in cfg:
                self.enabled = bool(cfg["enabled"])
            if "seed" in cfg:
                self.seed = int(cfg["seed"])
                self.rng = random.Random(self.seed)
            for name, f in (cfg.get("faults") or {}).items():
                if name not in FAULTS:
                    raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
                cur = self.faults[name]
                if "rate" in f:
                    rate = float(f["rate"])
                    if not 0.0 <= rate <= 1.0:
                        raise ValueError(f"{name}.rate must be within [0, 1]")
                    cur["rate"] = rate
                if "kinds" in f:
                    kinds = f["kinds"]
                    cur["kinds"] = [kinds] if isinstance(kinds, str) else list(kinds)
                if "rates" in f:
                    rates = {str(k): float(v) for k, v in (f["rates"] or {}).items()}
                    if any(not 0.0 <= r <= 1.0 for r in rates.values()):
                        raise ValueError(f"{name}.rates must be within [0, 1]")
                    cur["rates"] = rates
                if "max" in f:
                    cur["max"] = None if f["max"] is None else int(f["max"])
                if "seconds" in f:
                    seconds = float(f["seconds"])
                    if seconds < 0:
                        raise ValueError(f"{name}.seconds must not be negative")
                    cur["seconds"] = seconds
                if "mode" in f:
                    if f["mode"] not in ("drop", "500", "mixed"):
                        raise ValueError("lost_answer.mode is drop, 500 or mixed")
                    cur["mode"] = f["mode"]

    def snapshot(self):
        with self.lock:
            totals = {f: sum(k.values()) for f, k in self.injected.items()}
            return {
                "enabled": self.enabled,
                "seed": self.seed,
                "faults": self.faults,
                "requests": dict(self.requests),
                "requests_total": sum(self.requests.values()),
                "injected": {f: dict(k) for f, k in self.injected.items()},
                "injected_totals": totals,
                "effective": dict(self.effective),
                "upstream_errors": self.upstream_errors,
            }

    def decide(self, kind):
        """Counts the request; returns the fault to inject (or None) and the lost-answer mode."""
        with self.lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1
            if not self.enabled:
                return None, None
            for name in FAULTS:
                f = self.faults[name]
                rate = next(
                    (r for p, r in (f.get("rates") or {}).items() if fnmatch.fnmatchcase(kind, p)),
                    None,
                )
                if rate is None:
                    matched = any(fnmatch.fnmatchcase(kind, p) for p in f["kinds"])
                    rate = f["rate"] if matched else 0.0
                if rate <= 0:
                    continue
                done = sum(self.injected[name].values())
                if f.get("max") is not None and done >= f["max"]:
                    continue
                if self.rng.random() < rate:
                    self.injected[name][kind] = self.injected[name].get(kind, 0) + 1
                    mode = None
                    if name == "lost_answer":
                        mode = f.get("mode", "mixed")
                        if mode == "mixed":
                            mode = self.rng.choice(("drop", "500"))
                    elif name == "stall":
                        mode = f.get("seconds", 300.0)
                    return name, mode
            return None, None

    def count_effective(self, kind):
        with self.lock:
            self.effective[kind] = self.effective.get(kind, 0) + 1


STATE = State()
UPSTREAM = None  # (host, port)


def request_kind(method, path, headers):
    target = headers.get("X-Amz-Target")
    if target:
        # "AWSGlue.UpdateTable" -> glue:UpdateTable; other JSON services keep their prefix.
        svc, _, op = target.partition(".")
        svc = "glue" if svc == "AWSGlue" else svc.lower()
        return f"{svc}:{op}"
    p = urllib.parse.urlsplit(path).path.lstrip("/")
    if method == "GET" and "/" not in p.rstrip("/"):
        return "s3:LIST"
    return f"s3:{method}"


def error_answer(kind, fault):
    """(status, headers, body) of an AWS error the SDK classifies as retryable."""
    rid = uuid.uuid4().hex
    if kind.startswith("s3:"):
        if fault == "throttle":
            status, code, msg = 503, "SlowDown", "Please reduce your request rate."
        else:
            status, code, msg = 500, "InternalError", "We encountered an internal error. Please try again."
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{msg}</Message>"
            f"<RequestId>{rid}</RequestId><HostId>fault-proxy</HostId></Error>"
        ).encode()
        return status, [("Content-Type", "application/xml"), ("x-amz-request-id", rid)], body
    if fault == "throttle":
        status, code, msg = 400, "ThrottlingException", "Rate exceeded"
    else:
        status, code, msg = 500, "InternalServiceException", "Internal service error (injected)"
    body = json.dumps({"__type": code, "message": msg}).encode()
    return (
        status,
        [
            ("Content-Type", "application/x-amz-json-1.1"),
            ("x-amzn-RequestId", rid),
            ("x-amzn-ErrorType", code),
        ],
        body,
    )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120  # idle keep-alive connections end eventually
    server_version = "floe-fault-proxy"

    def log_message(self, fmt, *args):  # quiet: the counts tell the story
        pass

    # --- body handling -------------------------------------------------------------------------
    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            out = bytearray()
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise ConnectionError("client closed inside a chunked body")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while True:
                        t = self.rfile.readline(65537)
                        if t in (b"\r\n", b"\n", b""):
                            break
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(65537)  # CRLF after the chunk
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # --- faults --------------------------------------------------------------------------------
    def reset(self):
        """Closes the connection with a TCP RST (SO_LINGER 0): the client sees a reset."""
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    def send(self, status, headers, body, head=False):
        self.send_response_only(status)
        have_len = False
        for k, v in headers:
            if k.lower() in HOP_BY_HOP:
                continue
            if k.lower() == "content-length":
                if head:
                    self.send_header(k, v)
                    have_len = True
                continue
            self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(body)))
        elif not have_len:
            self.send_header("Content-Length", "0")
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
        self.wfile.flush()

    # --- admin ---------------------------------------------------------------------------------
    def admin(self, body):
        try:
            if self.command == "POST":
                STATE.configure(json.loads(body or b"{}"))
            out = json.dumps(STATE.snapshot()).encode()
            self.send(200, [("Content-Type", "application/json")], out)
        except (ValueError, TypeError) as e:
            self.send(400, [("Content-Type", "text/plain")], str(e).encode())

    # --- forwarding ----------------------------------------------------------------------------
    def forward(self, body):
        conn = http.client.HTTPConnection(UPSTREAM[0], UPSTREAM[1], timeout=120)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", f"{UPSTREAM[0]}:{UPSTREAM[1]}")
            for k, v in self.headers.items():
                kl = k.lower()
                if kl in HOP_BY_HOP or kl in ("host", "content-length"):
                    continue
                conn.putheader(k, v)
            if body or self.command in ("PUT", "POST") or self.headers.get("Content-Length"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def handle_any(self):
        try:
            body = self.read_body()
        except (ConnectionError, ValueError, OSError):
            self.close_connection = True
            return
        if self.path.startswith("/__faults"):
            return self.admin(body)
        kind = request_kind(self.command, self.path, self.headers)
        head = self.command == "HEAD"
        fault, mode = STATE.decide(kind)
        if fault == "refuse":
            return self.reset()
        if fault in ("throttle", "error500"):
            status, headers, data = error_answer(kind, fault)
            return self.send(status, headers, data, head=head)
        try:
            status, headers, data = self.forward(body)
        except (OSError, http.client.HTTPException) as e:
            with STATE.lock:
                STATE.upstream_errors += 1
            print(f"fault_proxy: upstream failed for {kind}: {e}", file=sys.stderr, flush=True)
            return self.reset()
        if fault == "stall":
            if 200 <= status < 300:
                STATE.count_effective(kind)
            # Silence: the client gives up (its timeout) or the stall ends in a reset.
            deadline = time.monotonic() + mode
            while time.monotonic() < deadline:
                time.sleep(0.2)
            return self.reset()
        if fault == "lost_answer":
            if 200 <= status < 300:
                STATE.count_effective(kind)
            if mode == "drop":
                return self.reset()
            status, headers, data = error_answer(kind, "error500")
            return self.send(status, headers, data, head=head)
        if fault == "reset_body" and not head and len(data) >= 2:
            self.send_response_only(status)
            for k, v in headers:
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            return self.reset()
        self.send(status, headers, data, head=head)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        # Clients that vanish mid-answer are part of the game; other errors are printed.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, BrokenPipeError, socket.timeout, TimeoutError)):
            return
        super().handle_error(request, client_address)


def _watch_parent(pid):
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)
        time.sleep(1)


def main():
    global UPSTREAM
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT (moto_server)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    p.add_argument("--parent-pid", type=int)
    p.add_argument("--config", help="initial config JSON (as POST /__faults)")
    a = p.parse_args()
    u = urllib.parse.urlsplit(a.upstream)
    if u.scheme != "http" or not u.hostname:
        p.error("--upstream must be http://HOST:PORT")
    UPSTREAM = (u.hostname, u.port or 80)
    if a.config:
        STATE.configure(json.loads(a.config))
    if a.parent_pid:
        threading.Thread(target=_watch_parent, args=(a.parent_pid,), daemon=True).start()
    server = Server((a.host, a.port), Handler)
    port = server.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, a.port_file)
    print(f"fault_proxy on http://{a.host}:{port} -> {a.upstream}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
