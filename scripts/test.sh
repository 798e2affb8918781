#!/usr/bin/env bash
# Install, then lint, type-check and run the whole test suite (slow end-to-end tests included).
# Fast tests only, for development: .venv/bin/python -m pytest -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
# Byte-code caches on: a machine that sets PYTHONDONTWRITEBYTECODE (ours do) otherwise compiles
# Conveyor's sources in every `conveyor` subprocess the tests start, and pytest rewrites every
# test module's asserts again in each parallel worker it starts (the sandboxes set their own).
unset PYTHONDONTWRITEBYTECODE
bash scripts/bootstrap.sh
# mypy (single-threaded, ~3.5 min without a cache) runs beside everything else at the lowest CPU
# priority: first beside the bridge venvs' installs (mostly downloads and disk), then on the
# cycles the tests leave idle (servers starting, subprocesses waiting). Waiting for it before the
# tests left a core idle for ~2 minutes; at nice 19 it takes ~1.5% of a busy core, so the tests'
# timings do not move. Its verdict is read after the tests and fails the script as before.
MYPY_LOG=$(mktemp)
nice -n 19 .venv/bin/mypy > "$MYPY_LOG" 2>&1 &
MYPY_PID=$!
# SkyRL needs Python >= 3.12: its venv is built where one exists (exit 3 where none does; the
# bridge check then runs SkyRL's validation from the pinned wheel on 3.11).
# harbor (the terminal tasks' parity check) needs Python >= 3.12 too: its lean venv installs
# beside SkyRL's (both mostly downloads); exit 3 where no such Python exists (the check skips).
(bash scripts/venv-harbor.sh || [ $? -eq 3 ]) &
HARBOR_PID=$!
bash scripts/venv-skyrl.sh || [ $? -eq 3 ]
wait "$HARBOR_PID"
# VeRL pins transformers < 5.11 and tensordict <= 0.10: its own lean venv for the bridge check.
# It builds (~2.5 minutes on two cores: a second torch wheel unpacked) beside the tests instead of
# before them; the VeRL tests wait for it (tests/bridges/verl/conftest.py reads the status file
# below) and its exit status is checked at the end, tests run or not.
VERL_LOG=$(mktemp)
export CONVEYOR_VERL_BUILD_LOG=$VERL_LOG
export CONVEYOR_VERL_BUILD_DONE=$VERL_LOG.status
(status=0; bash scripts/venv-verl.sh > "$VERL_LOG" 2>&1 || status=$?
 echo "$status" > "$CONVEYOR_VERL_BUILD_DONE.tmp" && mv "$CONVEYOR_VERL_BUILD_DONE.tmp" \
   "$CONVEYOR_VERL_BUILD_DONE") &
VERL_PID=$!
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
# Two workers (pytest-xdist): most tests hold one core (OMP_NUM_THREADS=1, a one-thread vLLM
# engine, a subprocess that waits), so two at once roughly halve the wall time on two cores.
# Each file stays on one worker and the Ray files share one (tests/conftest.py). A worker past
# CONVEYOR_TEST_WORKER_RETIRE_MB of memory between two files exits and a fresh one takes over
# (each counts as a restart for xdist, hence the high --max-worker-restart). Serial:
# scripts/test.sh -n 0. pytest exits 5 when it collected no test: that fails this script too.
tests_status=0
.venv/bin/python -m pytest -q --durations=30 -n "${PYTEST_WORKERS:-2}" --dist loadgroup \
  --max-worker-restart 100 "$@" || tests_status=$?
wait "$VERL_PID" || true
verl_status=$(cat "$CONVEYOR_VERL_BUILD_DONE" 2>/dev/null || echo "no status")
if [ "$verl_status" != 0 ]; then
  cat "$VERL_LOG" >&2
  echo "scripts/venv-verl.sh failed (exit $verl_status)" >&2
  exit 1
fi
rm -f "$VERL_LOG" "$CONVEYOR_VERL_BUILD_DONE"
mypy_status=0
wait "$MYPY_PID" || mypy_status=$?
cat "$MYPY_LOG"
rm -f "$MYPY_LOG"
[ "$mypy_status" -eq 0 ] || { echo "mypy failed (exit $mypy_status)" >&2; exit "$mypy_status"; }
exit "$tests_status"
