#!/usr/bin/env bash
# make test's integration tests, in two pytest processes side by side: modules that boot labs
# of their own and spend most of it waiting (Kubernetes: joins paced 20 s apart, pods and
# certificates; etcd: members stopped and started; the fleet Jobs) beside everything else,
# which shares the session lab. Which own-lab modules go beside is chosen from the last run's
# times (scripts/integration_split.py), so the two processes end about together. Labs of
# different names are made to coexist (lab.state.locked, their own subnets); the two processes
# share nothing else but the machine's package cache.
#
# The side process writes build/integration-own-labs.log, printed whole when both are done,
# then each process's seconds (the last lines CI keeps show which one set the run's length).
# Exit status: the first non-zero of the two.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST=${PYTEST:-.venv/bin/pytest}
PYTHON=${PYTHON:-$(dirname "$PYTEST")/python}
mapfile -t OWN_LABS < <("$PYTHON" scripts/integration_split.py)
LOG=build/integration-own-labs.log

mkdir -p build
if [ "${#OWN_LABS[@]}" -eq 0 ]; then
    echo "no module measured with a lab of its own: one process" >"$LOG"
    true &
else
    (
        GPUINFRA_INTEGRATION_PROCESS=side "$PYTEST" "${OWN_LABS[@]}" "$@" >"$LOG" 2>&1
        rc=$?
        echo "side process: $SECONDS s" >>"$LOG"
        exit "$rc"
    ) &
fi
side=$!
# A stop of make (Ctrl-C, CI's time limit) stops the side process too.
trap 'kill "$side" 2>/dev/null' EXIT

ignored=()
for module in "${OWN_LABS[@]}"; do
    ignored+=(--ignore "$module")
done
GPUINFRA_INTEGRATION_PROCESS=main "$PYTEST" tests/integration "${ignored[@]}" "$@"
main_rc=$?
main_s=$SECONDS

wait "$side"
side_rc=$?
trap - EXIT
echo
echo "=== ${OWN_LABS[*]} (side by side; $LOG) ==="
cat "$LOG"
echo "main process: $main_s s; both done after $SECONDS s; seconds per module, both processes:"
"$PYTHON" scripts/integration_split.py --last-run
echo "integration: shared-lab modules exit $main_rc, own-lab modules exit $side_rc"
if [ "$main_rc" -ne 0 ]; then
    exit "$main_rc"
fi
exit "$side_rc"
