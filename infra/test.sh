#!/usr/bin/env bash
# The README's test command. On a fresh machine it installs moto and PyIceberg into target/venv,
# starts moto_server (S3 + SQS + Glue, VersionId enforced) on 127.0.0.1, and runs every test:
# unit tests of the library and the one integration-test binary.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash infra/venv.sh)
PORT_FILE=$(mktemp)
rm -f "$PORT_FILE"
"$PY" infra/moto_server.py --port 0 --port-file "$PORT_FILE" --parent-pid $$ 2>target/moto.log &
MOTO_PID=$!
trap 'kill $MOTO_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do [ -s "$PORT_FILE" ] && break; sleep 0.1; done
[ -s "$PORT_FILE" ] || { echo "moto_server did not start; see target/moto.log" >&2; exit 1; }
export FLOE_TEST_MOTO="http://127.0.0.1:$(cat "$PORT_FILE")"
export FLOE_TEST_PYTHON="$PY"
echo "moto_server at $FLOE_TEST_MOTO" >&2
cargo test --workspace --locked "$@"
