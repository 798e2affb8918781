"""The layout every shipped terminal chore shares: `task.toml`, the Dockerfile, the verifier's
`test.sh` around a chore's checks, and the word lists chores draw their data from."""

from __future__ import annotations

import json

Files = dict[str, str]

_TOML = """version = "1.0"

[metadata]
author_name = "Conveyor"
difficulty = "easy"
category = "{category}"
tags = {tags}

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 1024
storage_mb = 1024
"""

_DOCKERFILE = """FROM python:3.11-slim
WORKDIR /app
COPY app/ /app/
"""

# The verifier: the checks (a Python heredoc, so the data holds no module for linters to read;
# `-I`: isolated, so modules the agent leaves in the working folder cannot shadow the stdlib),
# reward 1 when every one passes, else 0.
_TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
python3 -I - <<'CHECK'
{check}
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
"""

# The head of every check: expected values, and a failure that says what is wrong.
_CHECK_HEAD = """import csv
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

"""

WORDS = [
    "alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "iris", "jade",
    "kilo", "lumen", "maple", "nova", "onyx", "pixel", "quartz", "river", "sierra", "tango",
]  # fmt: skip
SERVICES = ["auth", "billing", "search", "gateway", "mailer", "storage", "reports", "queue"]
CITIES = ["Lisbon", "Osaka", "Quito", "Tallinn", "Accra", "Perth", "Bergen", "Cusco"]
PEOPLE = ["Ana", "Ben", "Chloe", "Dev", "Eli", "Farah", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
REGIONS = ["north", "south", "east", "west", "central"]


def folder_files(
    category: str, instruction: str, app: Files, check: str, expected: object, solve: str
) -> Files:
    files = {
        "instruction.md": instruction.strip() + "\n",
        "task.toml": _TOML.format(category=category, tags=json.dumps(["chore", category])),
        "environment/Dockerfile": _DOCKERFILE,
        "tests/test.sh": _TEST_SH.format(check=_CHECK_HEAD + check.strip()),
        "tests/expected.json": json.dumps(expected, indent=1, sort_keys=True) + "\n",
        "solution/solve.sh": "#!/bin/bash\nset -euo pipefail\ncd /app\n" + solve.strip() + "\n",
    }
    files.update({f"environment/app/{name}": text for name, text in app.items()})
    return files
