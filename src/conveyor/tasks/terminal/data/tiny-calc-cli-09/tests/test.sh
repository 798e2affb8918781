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

ops = dict(zip(EXPECTED["ops"], (int.__add__, int.__sub__, int.__mul__)))
cases = [(op, RNG.randint(-99, 99), RNG.randint(-99, 99)) for op in ops for _ in range(2)]
for op, a, b in cases:
    done = run(["python3", "/app/arith.py", op, str(a), str(b)])
    if done.returncode != 0 or done.stdout.strip() != str(ops[op](a, b)):
        fail(f"{op} {a} {b} printed {done.stdout.strip()!r} (exit {done.returncode})")
done = run(["python3", "/app/arith.py", "pow", "2", "3"])
if done.returncode != 2:
    fail(f"an unknown operation exited {done.returncode}, expected 2")
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
