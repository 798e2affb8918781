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

base = Path(tempfile.mkdtemp())
src, dest = base / "src", base / "out" / "dest"
src.mkdir()
for name in EXPECTED["keep"] + EXPECTED["ignore"]:
    (src / name).write_text(name)
done = run(["bash", "/app/backup.sh", str(src), str(dest)])
got = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
if got != sorted(EXPECTED["keep"]):
    fail(f"copied {got}, expected {sorted(EXPECTED['keep'])}: {done.stderr}")
CHECK
then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
