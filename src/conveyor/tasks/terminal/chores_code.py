"""Terminal chores whose checks run the agent's code (a script to repair, a CLI to write): the
inputs are drawn when the verifier runs, so no file holds answers that code could read."""

from __future__ import annotations

import random

from conveyor.tasks.terminal.chores_layout import Files, folder_files

_MEAN_BUGS = [
    ("return sum(values) / (len(values) + 1)", "off by one in the count"),
    ("return sum(values) // len(values)", "integer division"),
    ("return sum(values[1:]) / len(values)", "skips the first value"),
]


def fix_mean_script(rng: random.Random) -> Files:
    """Repair a script that prints the wrong mean."""
    bug, _ = rng.choice(_MEAN_BUGS)
    script = f'''"""Print the mean of the numbers in a file (one per line), with two decimals."""
import sys


def mean(values):
    {bug}


def main(path):
    values = [float(line) for line in open(path) if line.strip()]
    print(f"{{mean(values):.2f}}")


if __name__ == "__main__":
    main(sys.argv[1])
'''
    sample = "\n".join(str(rng.randint(1, 9)) for _ in range(4)) + "\n"
    instruction = """
`python3 /app/stats FILE` should print the mean of the numbers in FILE (one per line) with
two decimals, but its answers are wrong. Fix the bug in `/app/stats` (keep its interface:
the file name as the only argument, the mean on standard output). `/app/sample.txt` is an example
input.
"""
    check = """
for _ in range(3):
    values = [RNG.randint(1, 99) for _ in range(RNG.randint(3, 7))]
    if sum(values) % len(values) == 0:
        values.append(1 if (sum(values) + 1) % (len(values) + 1) else 2)
    path = Path(tempfile.mkdtemp()) / "numbers.txt"
    path.write_text("\\n".join(map(str, values)) + "\\n")
    done = run(["python3", "/app/stats", str(path)])
    if done.stdout.strip() != f"{sum(values) / len(values):.2f}":
        fail(f"mean of {values} printed {done.stdout.strip()!r}")
"""
    solve = """
python3 - <<'EOF'
import re
text = open("stats").read()
fixed = re.sub(r"(def mean\\(values\\):\\n)    return .*\\n",
               r"\\1    return sum(values) / len(values)\\n", text)
open("stats", "w").write(fixed)
EOF
"""
    app = {"stats": script, "sample.txt": sample}
    return folder_files("debugging", instruction, app, check, {"bug": bug}, solve)


def tiny_cli(rng: random.Random) -> Files:
    """Write a small command-line calculator."""
    names = rng.choice([("add", "sub", "mul"), ("plus", "minus", "times"), ("sum", "diff", "prod")])
    script = rng.choice(["calc.py", "arith.py"])
    instruction = f"""
Write `/app/{script}`, a command-line calculator: `python3 /app/{script} OP A B` takes two
integers and prints one integer, where OP is `{names[0]}` (A + B), `{names[1]}` (A - B) or
`{names[2]}` (A * B). For any other OP it prints an error to standard error and exits with
status 2.
"""
    check = f"""
ops = dict(zip(EXPECTED["ops"], (int.__add__, int.__sub__, int.__mul__)))
cases = [(op, RNG.randint(-99, 99), RNG.randint(-99, 99)) for op in ops for _ in range(2)]
for op, a, b in cases:
    done = run(["python3", "/app/{script}", op, str(a), str(b)])
    if done.returncode != 0 or done.stdout.strip() != str(ops[op](a, b)):
        fail(f"{{op}} {{a}} {{b}} printed {{done.stdout.strip()!r}} (exit {{done.returncode}})")
done = run(["python3", "/app/{script}", "pow", "2", "3"])
if done.returncode != 2:
    fail(f"an unknown operation exited {{done.returncode}}, expected 2")
"""
    solve = f"""
cat > {script} <<'EOF'
import sys
OPS = {{"{names[0]}": lambda a, b: a + b, "{names[1]}": lambda a, b: a - b,
        "{names[2]}": lambda a, b: a * b}}
if len(sys.argv) != 4 or sys.argv[1] not in OPS:
    print("usage: OP A B", file=sys.stderr)
    sys.exit(2)
print(OPS[sys.argv[1]](int(sys.argv[2]), int(sys.argv[3])))
EOF
"""
    app = {"README.txt": "Put the calculator here.\n"}
    return folder_files("cli", instruction, app, check, {"ops": list(names)}, solve)


def fix_backup_script(rng: random.Random) -> Files:
    """Repair a shell script that copies the wrong files."""
    ext = rng.choice(["conf", "ini", "cfg"])
    wrong = {"conf": "cnf", "ini": "inf", "cfg": "cgf"}[ext]
    script = f"""#!/bin/bash
# Copy every *.{ext} file of SRC (not its sub-folders) into DEST, creating DEST if needed.
set -e
SRC="$1"
DEST="$2"
cp "$SRC"/*.{wrong} "$DEST"/
"""
    expected = {"ext": ext}
    instruction = f"""
`bash /app/backup.sh SRC DEST` should copy every `*.{ext}` file directly in folder SRC into
folder DEST (creating DEST when it does not exist) and nothing else, but it does not work. Fix
`/app/backup.sh`.
"""
    check = """
base = Path(tempfile.mkdtemp())
src, dest = base / "src", base / "out" / "dest"
(src / "sub").mkdir(parents=True)
names = RNG.sample(["a", "b", "c", "d", "e", "f", "g", "h"], 5)
keep = [f"{n}.{EXPECTED['ext']}" for n in names[:3]]
for name in [*keep, f"{names[3]}.txt", f"sub/{names[4]}.{EXPECTED['ext']}"]:
    (src / name).write_text(name)
done = run(["bash", "/app/backup.sh", str(src), str(dest)])
got = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
if got != sorted(keep):
    fail(f"copied {got}, expected {sorted(keep)}: {done.stderr}")
"""
    solve = f"""
cat > backup.sh <<'EOF'
#!/bin/bash
set -e
mkdir -p "$2"
cp "$1"/*.{ext} "$2"/
EOF
"""
    return folder_files("debugging", instruction, {"backup.sh": script}, check, expected, solve)
