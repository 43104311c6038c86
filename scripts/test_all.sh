#!/usr/bin/env bash
# The whole suite: pytest on the newest versions in .venv, with the nox version-matrix
# sessions (oldest and middle Celery / kombu / redis-py, each in a venv of its own) running
# beside it — all three mostly wait on real workers, so they share two cores well. Fails
# when any fails; prints the matrix's versions and results at the end. Arguments go to the
# main pytest run.
set -uo pipefail
cd "$(dirname "$0")/.."

mkdir -p build
started=$SECONDS
sessions=("matrix(oldest)" "matrix(middle)")
pids=()
for session in "${sessions[@]}"; do
  log="build/$(echo "$session" | tr -d ")" | tr "(" "-").log"
  setsid .venv/bin/nox -s "$session" >"$log" 2>&1 &
  pids+=($!)
done
trap 'for pid in "${pids[@]}"; do kill -- -"$pid" 2>/dev/null; done' INT TERM EXIT

.venv/bin/pytest "$@"
status=$?

for index in "${!sessions[@]}"; do
  session=${sessions[$index]}
  log="build/$(echo "$session" | tr -d ")" | tr "(" "-").log"
  wait "${pids[$index]}"
  result=$?
  echo "---- nox session $session: exit $result (full log: $log) ----"
  grep -E "^(celery|kombu|redis|click)==|^nox > Session|[0-9]+ (passed|failed)" "$log" | tail -n 8
  [ "$result" -eq 0 ] || status=1
done
echo "---- whole suite took $((SECONDS - started)) s ----"
exit "$status"
