#!/usr/bin/env bash
# The whole suite: pytest on the newest versions in .venv, with the nox version matrix
# (oldest and middle Celery / kombu / redis-py, each in a venv of its own) running beside
# it, since both mostly wait on real workers. Fails when either fails; prints the matrix's
# versions and results at the end. Arguments go to the main pytest run.
set -uo pipefail
cd "$(dirname "$0")/.."

log=build/matrix.log
mkdir -p build
started=$SECONDS
setsid .venv/bin/nox -s "matrix(oldest)" "matrix(middle)" >"$log" 2>&1 &
matrix=$!
trap 'kill -- -"$matrix" 2>/dev/null' INT TERM

.venv/bin/pytest "$@"
main=$?

wait "$matrix"
status=$?
echo "---- version matrix (full log: $log) ----"
grep -E "^nox > (Running session|Session )|^(celery|kombu|redis|click)==|passed|failed|error" "$log" \
  | grep -v "WARNING" | tail -n 40
echo "---- whole suite took $((SECONDS - started)) s; main pytest exit $main, matrix exit $status ----"
[ "$main" -eq 0 ] && [ "$status" -eq 0 ]
