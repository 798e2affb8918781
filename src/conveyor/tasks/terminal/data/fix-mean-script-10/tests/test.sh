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

for _ in range(3):
    values = [RNG.randint(1, 99) for _ in range(RNG.randint(3, 7))]
    if sum(values) % len(values) == 0:
        values.append(1 if (sum(values) + 1) % (len(values) + 1) else 2)
    path = Path(tempfile.mkdtemp()) / "numbers.txt"
    path.write_text("\n".join(map(str, values)) + "\n")
    done = run(["python3", "/app/stats", str(path)])
    if done.stdout.strip() != f"{sum(values) / len(values):.2f}":
        fail(f"mean of {values} printed {done.stdout.strip()!r}")
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
