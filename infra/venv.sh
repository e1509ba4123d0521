#!/usr/bin/env bash
# Creates target/venv with moto and PyIceberg (idempotent). Prints the python path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/venv
if ! "$VENV/bin/python" -c 'import moto, pyiceberg, pyarrow, werkzeug, cfnlint, samcli, duckdb, duckdb_extension_iceberg, duckdb_extension_avro, duckdb_extension_httpfs' >/dev/null 2>&1; then
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check -r infra/requirements-test.txt >&2
fi
echo "$PWD/$VENV/bin/python"
