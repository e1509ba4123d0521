#!/usr/bin/env bash
# Builds the three arm64 Lambda functions with `sam build` on a machine without Docker:
# aws-sam-cli (PyPI) + cargo-lambda (crates.io) + zig (the PyPI package `ziglang`) + the
# aarch64-unknown-linux-gnu target. Prints each bootstrap's size (Lambda's limit: 250 MB unzipped).
# First run: ~12 min to install cargo-lambda, then a release cross-build of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash infra/venv.sh)
VENV_BIN=$(dirname "$PY")
"$PY" -c 'import ziglang' 2>/dev/null || "$VENV_BIN/pip" install -q --disable-pip-version-check ziglang==0.17.1
command -v cargo-lambda >/dev/null || cargo install cargo-lambda --locked
rustup target add aarch64-unknown-linux-gnu >/dev/null
ZIG_DIR=$("$PY" -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))')
export PATH="$ZIG_DIR:$VENV_BIN:$PATH"
SAM_CLI_TELEMETRY=0 sam build --region us-east-1 "$@"
for f in .aws-sam/build/*/bootstrap; do
  printf '%-40s %6.1f MB  %s\n' "$f" "$(echo "$(stat -c %s "$f") / 1048576" | bc -l)" "$(file -b "$f" | cut -d, -f1-2)"
done
