#!/bin/bash
mkdir -p /logs/verifier
if python3 - <<'CHECK'
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

EXPECTED = json.loads(Path("/tests/expected.json").read_text())


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def read(path):
    p = Path(path)
    if not p.is_file():
        fail(f"{path} does not exist")
    return p.read_text()


def run(argv, stdin=""):
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        fail(f"{argv} timed out")

for case in EXPECTED:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(case["input"])
    done = run(["python3", "/app/stats.py", f.name])
    if done.stdout.strip() != case["output"]:
        fail(f"mean of {case['input'].split()} printed {done.stdout.strip()!r}")
CHECK
then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
