#!/usr/bin/env bash
# The whole suite: pytest on the newest versions in .venv (spread over CSL_TEST_PROCESSES
# processes, default 4), with the nox version-matrix sessions (oldest and middle Celery /
# kombu / redis-py, each in a venv of its own) and a short chaos soak (benchmarks/soak,
# CSL_SOAK_MINUTES, default 2; 0 skips it) running beside it: the tests mostly wait on real
# workers, so they share two cores well. The tests marked "alone" (CPU- and timing-bound)
# run last, by themselves. Fails when any fails; prints the matrix's versions and results
# and the soak's headline at the end. Arguments replace the main pytest run's selection.
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
soak_minutes="${CSL_SOAK_MINUTES:-2}"
soak_pid=""
rm -rf build/soak-ci
if [ "$soak_minutes" != "0" ]; then
  setsid .venv/bin/python -m benchmarks.soak --minutes "$soak_minutes" --run-dir build/soak-ci \
    --json build/soak-ci.json --markdown build/soak-ci.md >build/soak-ci.log 2>&1 &
  soak_pid=$!
  pids+=("$soak_pid")
fi
trap 'for pid in "${pids[@]}"; do kill -- -"$pid" 2>/dev/null; done' INT TERM EXIT

if [ "$#" -gt 0 ]; then
  .venv/bin/pytest "$@" 2>&1 | tee build/main.log
else
  .venv/bin/pytest -n "${CSL_TEST_PROCESSES:-4}" --dist loadfile -m "not alone" 2>&1 | tee build/main.log
fi
status=${PIPESTATUS[0]}

for index in "${!sessions[@]}"; do
  session=${sessions[$index]}
  log="build/$(echo "$session" | tr -d ")" | tr "(" "-").log"
  wait "${pids[$index]}"
  result=$?
  echo "---- nox session $session: exit $result (full log: $log) ----"
  grep -E "^(celery|kombu|redis|click)==|^nox > Session|[0-9]+ (passed|failed)" "$log" | tail -n 8
  [ "$result" -eq 0 ] || status=1
done
if [ -n "$soak_pid" ]; then
  wait "$soak_pid"
  result=$?
  echo "---- chaos soak, $soak_minutes min: exit $result (report: build/soak-ci.md, log: build/soak-ci.log) ----"
  sed -n '/^| soak |/,/^| lock Redis commands per task/p' build/soak-ci.md 2>/dev/null
  grep -E "^soak: (SAFETY|could not)" build/soak-ci.log
  if [ "$result" -ne 0 ]; then  # what a rerun needs: the seed, the targets missed, examples
    .venv/bin/python -m benchmarks.soak.failures build/soak-ci.json 2>/dev/null | cut -c1-400
    status=1
  fi
fi
if [ "$#" -eq 0 ]; then
  echo "---- the tests that run alone ----"
  .venv/bin/pytest -m alone 2>&1 | tee build/alone.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "$status" -ne 0 ]; then
  # The last lines are what a CI log shows first: name every failed test there.
  echo "---- what failed ----"
  grep -HE "^(FAILED|ERROR) |^soak: (SAFETY|could not)|^nox > Session .* failed" build/main.log build/alone.log build/matrix-*.log \
    build/soak-ci.log 2>/dev/null | cut -c1-300
fi
echo "---- whole suite took $((SECONDS - started)) s ----"
exit "$status"
