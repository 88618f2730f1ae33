#!/usr/bin/env bash
# `make test-long`: the integration suites that do not fit make test's 45 minutes, run by hand
# on a change's final commit (not in CI: .ci/run says why): faults injected into applies of
# every role (test_faults.py, a lab of five hosts booted bare for each fault) beside the
# Kubernetes upgrade by one minor (test_kubernetes_upgrade.py, a 13-host lab of its own and the
# newer release built here).
# Side by side, as make test's two processes: the upgrade spends most of its time waiting
# (joins paced, nodes drained, pods restarted), the faults suite on its applies.
#
# The upgrade's output is kept in build/long-tests-upgrade.log and printed when both are done.
# Exit status: the first non-zero of the two.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST=${PYTEST:-.venv/bin/pytest}
LOG=build/long-tests-upgrade.log
mkdir -p build
(
    GPUINFRA_INTEGRATION_PROCESS=upgrade "$PYTEST" -m upgrade \
        tests/integration/test_kubernetes_upgrade.py "$@" >"$LOG" 2>&1
    rc=$?
    echo "upgrade process: $SECONDS s" >>"$LOG"
    exit "$rc"
) &
upgrade=$!
# A stop of make (Ctrl-C, CI's time limit) stops the upgrade too.
trap 'kill "$upgrade" 2>/dev/null' EXIT

GPUINFRA_INTEGRATION_PROCESS=faults "$PYTEST" -m faults tests/integration/test_faults.py "$@"
faults_rc=$?
faults_s=$SECONDS

wait "$upgrade"
upgrade_rc=$?
trap - EXIT
echo
echo "=== tests/integration/test_kubernetes_upgrade.py (side by side; $LOG) ==="
cat "$LOG"
echo "faults process: $faults_s s; both done after $SECONDS s"
echo "long suites: faults exit $faults_rc, upgrade exit $upgrade_rc"
if [ "$faults_rc" -ne 0 ]; then
    exit "$faults_rc"
fi
exit "$upgrade_rc"
