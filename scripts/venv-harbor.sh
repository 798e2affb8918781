#!/usr/bin/env bash
# Build ./.venv-harbor: the `harbor` package (0.25.0) for the task-folder parity check
# (`conveyor tasks harbor-parity`, docs/terminal.md). Idempotent.
# harbor requires Python >= 3.12: the interpreter is $PYTHON312, else the first python3.13 or
# python3.12 that runs (PATH, then pyenv's versions). With none, this exits 3.
# The check runs this venv's Python on conveyor/tasks/terminal/harbor_view.py by path, so
# Conveyor itself is not installed in it. harbor is installed with --no-deps plus what its task
# model imports (pydantic, toml, pathspec, at harbor's own lower bounds): its full dependency set
# (litellm, supabase, fastapi, ...) takes minutes and plays no part in reading task folders.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${CONVEYOR_HARBOR_VENV:-.venv-harbor}
HARBOR="harbor==0.25.0"

runs_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

PY=""
for candidate in ${PYTHON312:-} python3.13 python3.12 \
  "$HOME"/.pyenv/versions/3.13*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
  if [ -n "$candidate" ] && runs_312 "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
  echo "no Python >= 3.12 found (set PYTHON312=/path/to/python3.12): harbor needs one" >&2
  exit 3
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet --no-deps "$HARBOR"
$PIP install --quiet "pydantic>=2.12.0" "toml>=0.10.2" "pathspec>=1.0.3"
echo "$VENV: $("$VENV/bin/python" --version), harbor $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("harbor"))')"
