#!/usr/bin/env bash
# Property-based fuzzing of the HTTP API against the OpenAPI document it serves: schemathesis
# (pinned, installed into a venv under target/ on first use) generates valid and invalid requests
# for every operation of `/openapi.json` and checks every response against the document (status
# codes, bodies, content types, no 5xx, valid data accepted, invalid data refused, routes refused
# without the key). The daemon under test is `hindsight serve` on a loopback port with a
# temporary data directory and a test key. Exits non-zero on any failure.
#
#   scripts/api-fuzz.sh [PATH_TO_HINDSIGHT_BINARY]     # default: target/debug/hindsight
#
# Bounds: ST_MAX_EXAMPLES examples per operation and phase (default 40), ST_MAX_TIME seconds in
# all (default 420), ST_SEED (default 56) for a reproducible run.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
BIN=${1:-target/debug/hindsight}
VENV=target/schemathesis-venv
MAX_EXAMPLES=${ST_MAX_EXAMPLES:-40}
MAX_TIME=${ST_MAX_TIME:-420}
SEED=${ST_SEED:-56}

if [[ ! -x "$BIN" ]]; then
    echo "api-fuzz: no binary at $BIN (cargo build -p hindsight-actors --bin hindsight)" >&2
    exit 2
fi
if ! "$VENV/bin/st" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
fi

WORK=$(mktemp -d)
DAEMON_PID=
cleanup() {
    if [[ -n "$DAEMON_PID" ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID"
        wait "$DAEMON_PID" || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

TOKEN="fuzz-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
KEY_SHA=$("$BIN" config hash-key "$TOKEN")
# The fuzzing key has the `policy_update` right so that /policy/update and /policy/suggest are
# fuzzed past the refusal a plain tenant key gets (403).
cat >"$WORK/hindsight.toml" <<EOF
data_dir = "$WORK/data"

[store]
durability = "none"

[api]
listen = "127.0.0.1:0"
shutdown_grace_secs = 5
request_timeout_secs = 60

[[api.tenants]]
name = "fuzz"
key_sha256 = "$KEY_SHA"
policy_update = true

[log]
level = "error"
EOF

"$BIN" serve --config "$WORK/hindsight.toml" >"$WORK/stdout" 2>"$WORK/daemon.log" &
DAEMON_PID=$!
BASE=
for _ in $(seq 1 600); do
    if read -r first <"$WORK/stdout" 2>/dev/null && [[ "$first" == listening\ on\ * ]]; then
        BASE=${first#listening on }
        break
    fi
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
        echo "api-fuzz: the daemon exited before listening:" >&2
        cat "$WORK/daemon.log" >&2
        exit 2
    fi
    sleep 0.1
done
if [[ -z "$BASE" ]]; then
    echo "api-fuzz: the daemon printed no address" >&2
    exit 2
fi
case "$BASE" in
http://127.0.0.1:*) ;;
*)
    echo "api-fuzz: refusing to fuzz a non-loopback address: $BASE" >&2
    exit 2
    ;;
esac

# /feedback is limited per key (429 is documented); the rest runs at full speed.
set +e
# Run from the scratch folder: schemathesis keeps its cache (.schemathesis/) in the working one.
ROOT=$PWD
(cd "$WORK" && "$ROOT/$VENV/bin/st" run "$BASE/openapi.json" \
    --url "$BASE" \
    --header "Authorization: Bearer $TOKEN" \
    --max-examples "$MAX_EXAMPLES" \
    --max-time "$MAX_TIME" \
    --seed "$SEED" \
    --request-timeout 60 \
    --workers 1 \
    --report junit --report-dir "$WORK/report" \
    --no-color)
STATUS=$?
set -e
mkdir -p target/api-fuzz
cp "$WORK"/report/*.xml target/api-fuzz/ 2>/dev/null || true
cp "$WORK/daemon.log" target/api-fuzz/daemon.log
if [[ $STATUS -ne 0 ]]; then
    echo "api-fuzz: schemathesis found failures (exit $STATUS); the daemon's log is target/api-fuzz/daemon.log" >&2
    exit "$STATUS"
fi
if grep -q "panicked" "$WORK/daemon.log"; then
    echo "api-fuzz: the daemon panicked; see target/api-fuzz/daemon.log" >&2
    exit 1
fi
echo "api-fuzz: no failures"
