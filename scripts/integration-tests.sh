#!/usr/bin/env bash
# make test's integration tests, in two pytest processes side by side: the modules that boot a
# lab of their own and spend most of it waiting (Kubernetes: joins paced 20 s apart, pods and
# certificates; etcd: members stopped and started) beside everything else, which shares the
# session lab. In one process the machine's two cores sat about a third idle (2026-11-26,
# docs/development.md). Labs of different names are made to coexist (lab.state.locked, their
# own subnets); the two processes share nothing else but the machine's package cache.
#
# The side process writes build/integration-own-labs.log, printed whole when both are done.
# Exit status: the first non-zero of the two.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST=${PYTEST:-.venv/bin/pytest}
OWN_LABS=(tests/integration/test_kubernetes.py tests/integration/test_role_etcd.py)
LOG=build/integration-own-labs.log

mkdir -p build
"$PYTEST" "${OWN_LABS[@]}" "$@" >"$LOG" 2>&1 &
side=$!
# A stop of make (Ctrl-C, CI's time limit) stops the side process too.
trap 'kill "$side" 2>/dev/null' EXIT

ignored=()
for module in "${OWN_LABS[@]}"; do
    ignored+=(--ignore "$module")
done
"$PYTEST" tests/integration "${ignored[@]}" "$@"
main_rc=$?

wait "$side"
side_rc=$?
trap - EXIT
echo
echo "=== ${OWN_LABS[*]} (side by side; $LOG) ==="
cat "$LOG"
echo "integration: shared-lab modules exit $main_rc, own-lab modules exit $side_rc"
if [ "$main_rc" -ne 0 ]; then
    exit "$main_rc"
fi
exit "$side_rc"
