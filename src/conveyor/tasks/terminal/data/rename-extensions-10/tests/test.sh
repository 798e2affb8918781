#!/bin/bash
mkdir -p /logs/verifier
python3 -I - <<'CHECK'
import csv
import ctypes
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

EXPECTED = json.loads(Path("/tests/expected.json").read_text())
RNG = random.SystemRandom()  # inputs for code under test: drawn now, stored nowhere
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: code under test cannot ptrace us


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def read(path):
    p = Path(path)
    if p.is_symlink():
        fail(f"{path} is a symbolic link, not a file")
    if not p.is_file():
        fail(f"{path} does not exist")
    return p.read_text()


def run(argv, stdin=""):
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        fail(f"{argv} timed out")

root = Path("/app")
found = {str(p.relative_to(root)): p.read_text() for p in (root / "inbox").rglob("*")
         if p.is_file()}
if found != EXPECTED:
    fail(f"files {sorted(found)} != {sorted(EXPECTED)} (or contents changed)")
CHECK
status=$?
# Nothing the checks ran (code under test, or what it left running) outlives them to touch
# the reward file.
kill -9 -1 2>/dev/null
if [ "$status" -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
