"""The terminal family's shipped tasks: shell and Python chores, written as Harbor task folders.

Each chore is a function of a seeded RNG returning one folder's files (the shared layout is in
`terminal_chores_layout`; the chores that run the agent's code are in `terminal_chores_code`):
`instruction.md`, `task.toml`, `environment/Dockerfile` with the starting files under
`environment/app/` (copied to `/app`), `tests/test.sh` (its checks a Python heredoc) with
`tests/expected.json` (the answers, computed here from the generated data, so a check never
trusts the workspace's copy of an input; code under test gets inputs drawn at verification time
instead) and `solution/solve.sh` (which solves any variant of the chore). No file of the data is
a Python module (so linters skip them). Variants differ in their data, file names and
parameters. Variant 00 of each chore ships in `data/` (readable examples of the format; a test
checks they are what this module writes); the other variants are written by this module into the
cache on first use (`conveyor.tasks.terminal.generated_dir`), not stored in the repository.
`python -m conveyor.tasks.terminal OUT [FIRST VARIANTS]` writes folders under `OUT`.
"""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from conveyor.tasks.terminal.chores_code import fix_backup_script, fix_mean_script, tiny_cli
from conveyor.tasks.terminal.chores_layout import (
    CITIES,
    PEOPLE,
    REGIONS,
    SERVICES,
    WORDS,
    Files,
    folder_files,
)

VARIANTS = 12
# Variants 0 .. SHIPPED_VARIANTS-1 of each chore are shipped in `data/`; the rest are generated.
SHIPPED_VARIANTS = 1


def log_error_counts(rng: random.Random) -> Files:
    """Count ERROR lines per service in a log, as JSON."""
    services = rng.sample(SERVICES, rng.randint(3, 5))
    out = rng.choice(["error_counts.json", "errors.json", "summary.json"])
    lines, counts = [], Counter[str]()
    for i in range(rng.randint(30, 60)):
        level = rng.choices(["INFO", "WARN", "ERROR", "DEBUG"], [5, 2, 2, 1])[0]
        service = rng.choice(services)
        message = rng.choice(["request done", "retrying", "timeout talking to db", "ERROR budget"])
        lines.append(
            f"2024-05-{1 + i // 24:02d}T{i % 24:02d}:{rng.randint(0, 59):02d}:00 "
            f"{level} {service}: {message}"
        )
        counts[service] += level == "ERROR"
    expected = {s: c for s, c in sorted(counts.items()) if c}
    instruction = f"""
The file `/app/app.log` has one event per line: a timestamp, a level (INFO, WARN, ERROR or
DEBUG), the service name followed by a colon, and a message. Count, for each service, the lines
whose level is ERROR (a message that merely contains the word does not count). Write the counts
to `/app/{out}` as a JSON object mapping service name to count; leave out services with no
ERROR lines.
"""
    check = f"""
got = json.loads(read("/app/{out}"))
if got != EXPECTED:
    fail(f"counts {{got}} != {{EXPECTED}}")
"""
    solve = f"""
python3 - <<'EOF'
import json
from collections import Counter
counts = Counter()
for line in open("app.log"):
    parts = line.split()
    if len(parts) >= 3 and parts[1] == "ERROR":
        counts[parts[2].rstrip(":")] += 1
json.dump(dict(counts), open("{out}", "w"))
EOF
"""
    return folder_files("log-parsing", instruction, {"app.log": "\n".join(lines) + "\n"}, check,
                   expected, solve)  # fmt: skip


def csv_semicolons(rng: random.Random) -> Files:
    """Turn a semicolon CSV with decimal commas into a plain CSV."""
    out = rng.choice(["clean.csv", "prices.csv", "fixed.csv"])
    rows = []
    for word in rng.sample(WORDS, rng.randint(5, 9)):
        price = f"{rng.randint(1, 400)},{rng.randint(0, 99):02d}"
        rows.append([word, price, str(rng.randint(1, 50))])
    text = "item;price;qty\n" + "".join(";".join(r) + "\n" for r in rows)
    expected = [[r[0], r[1].replace(",", "."), r[2]] for r in rows]
    instruction = f"""
`/app/data.csv` uses `;` between fields and a decimal comma in prices (`12,50`). Write
`/app/{out}`: the same header and rows in the same order, with `,` between fields and a decimal
point in prices (`12.50`).
"""
    check = f"""
rows = list(csv.reader(read("/app/{out}").splitlines()))
if not rows or rows[0] != ["item", "price", "qty"]:
    fail(f"bad header {{rows[:1]}}")
if rows[1:] != EXPECTED:
    fail(f"rows {{rows[1:]}} != {{EXPECTED}}")
"""
    solve = f"""
python3 - <<'EOF'
import csv
rows = [line.rstrip("\\n").split(";") for line in open("data.csv") if line.strip()]
with open("{out}", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\\n")
    w.writerow(rows[0])
    for item, price, qty in rows[1:]:
        w.writerow([item, price.replace(",", "."), qty])
EOF
"""
    return folder_files("csv", instruction, {"data.csv": text}, check, expected, solve)


def rename_extensions(rng: random.Random) -> Files:
    """Rename every file of one extension to another, keeping contents."""
    old, new = rng.choice([("txt", "md"), ("log", "txt"), ("jpeg", "jpg"), ("yml", "yaml")])
    folder = rng.choice(["notes", "docs", "inbox"])
    names = rng.sample(WORDS, rng.randint(4, 7))
    app = {f"{folder}/{n}.{old}": f"{n} {rng.randint(100, 999)}\n" for n in names}
    keep = f"{folder}/README.rst"
    app[keep] = "leave me alone\n"
    expected = {f"{folder}/{n}.{new}": app[f"{folder}/{n}.{old}"] for n in names}
    expected[keep] = app[keep]
    instruction = f"""
In `/app/{folder}`, rename every file ending in `.{old}` so it ends in `.{new}` instead
(`a.{old}` becomes `a.{new}`), keeping its contents. Leave other files as they are.
"""
    check = f"""
root = Path("/app")
found = {{str(p.relative_to(root)): p.read_text() for p in (root / "{folder}").rglob("*")
         if p.is_file()}}
if found != EXPECTED:
    fail(f"files {{sorted(found)}} != {{sorted(EXPECTED)}} (or contents changed)")
"""
    solve = f"""
for f in {folder}/*.{old}; do mv -- "$f" "${{f%.{old}}}.{new}"; done
"""
    return folder_files("files", instruction, app, check, expected, solve)


def json_group_by(rng: random.Random) -> Files:
    """Group records of a JSON list by a field."""
    cities = rng.sample(CITIES, rng.randint(3, 4))
    people = [{"name": n, "city": rng.choice(cities), "age": rng.randint(18, 80)}
              for n in rng.sample(PEOPLE, rng.randint(6, 10))]  # fmt: skip
    out = rng.choice(["by_city.json", "groups.json"])
    expected: dict[str, list[str]] = {}
    for p in people:
        expected.setdefault(str(p["city"]), []).append(str(p["name"]))
    expected = {c: sorted(n) for c, n in sorted(expected.items())}
    instruction = f"""
`/app/people.json` is a JSON list of people (`name`, `city`, `age`). Write `/app/{out}`: a JSON
object mapping each city to the alphabetically sorted list of the names of the people living
there.
"""
    check = f"""
got = json.loads(read("/app/{out}"))
if got != EXPECTED:
    fail(f"{{got}} != {{EXPECTED}}")
"""
    solve = f"""
python3 - <<'EOF'
import json
groups = {{}}
for p in json.load(open("people.json")):
    groups.setdefault(p["city"], []).append(p["name"])
json.dump({{c: sorted(n) for c, n in groups.items()}}, open("{out}", "w"))
EOF
"""
    return folder_files("json", instruction, {"people.json": json.dumps(people, indent=1)}, check,
                   expected, solve)  # fmt: skip


def word_frequency(rng: random.Random) -> Files:
    """The N most frequent words of a text."""
    n = rng.randint(3, 5)
    vocabulary = rng.sample(WORDS, 10)
    weights = [rng.randint(1, 30) for _ in vocabulary]
    words = rng.choices(vocabulary, weights, k=rng.randint(120, 200))
    text = ""
    for i, w in enumerate(words):
        word = w.capitalize() if rng.random() < 0.2 else w
        separator = rng.choice([" ", " ", ", ", ". ", "\n"]) if i < len(words) - 1 else ""
        text += word + separator
    counts = Counter(words)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    expected = [f"{w} {c}" for w, c in top]
    instruction = f"""
Find the {n} most frequent words of `/app/text.txt` (words are runs of letters, compared in
lower case). Write them to `/app/top.txt`, one per line as `word count`, most frequent first;
break ties alphabetically.
"""
    check = """
got = [line.strip() for line in read("/app/top.txt").splitlines() if line.strip()]
if got != EXPECTED:
    fail(f"{got} != {EXPECTED}")
"""
    solve = f"""
tr -cs 'A-Za-z' '\\n' < text.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \\
  | sort -k1,1nr -k2,2 | head -n {n} | awk '{{print $2, $1}}' > top.txt
"""
    return folder_files("text", instruction, {"text.txt": text + "\n"}, check, expected, solve)


def dedupe_lines(rng: random.Random) -> Files:
    """Drop repeated lines, keeping the first of each."""
    pool = [f"{rng.choice(PEOPLE).lower()}.{w}@example.org" for w in rng.sample(WORDS, 8)]
    lines = [rng.choice(pool) for _ in range(rng.randint(20, 30))]
    src, out = rng.choice([("emails.txt", "unique.txt"), ("contacts.txt", "deduped.txt")])
    expected = list(dict.fromkeys(lines))
    instruction = f"""
`/app/{src}` has one address per line, with repeats. Write `/app/{out}` with each address once,
in the order of its first appearance.
"""
    check = f"""
got = read("/app/{out}").splitlines()
if got != EXPECTED:
    fail(f"{{got}} != {{EXPECTED}}")
"""
    solve = f"""
awk '!seen[$0]++' {src} > {out}
"""
    return folder_files("text", instruction, {src: "\n".join(lines) + "\n"}, check, expected, solve)


def env_merge(rng: random.Random) -> Files:
    """Merge two KEY=VALUE files, the second winning."""
    keys = [k.upper() for k in rng.sample(WORDS, 8)]
    defaults = {k: str(rng.randint(1, 999)) for k in keys[:6]}
    override = {k: str(rng.randint(1, 999)) for k in rng.sample(keys[:6], 2) + keys[6:]}
    merged = {**defaults, **override}
    expected = [f"{k}={merged[k]}" for k in sorted(merged)]

    def env_file(values: dict[str, str]) -> str:
        return "# settings\n" + "".join(f"{k}={v}\n" for k, v in values.items())

    instruction = """
`/app/defaults.env` and `/app/override.env` hold `KEY=VALUE` lines (and `#` comments). Write
`/app/final.env`: every key of either file once, with the value from `override.env` where it has
one, else from `defaults.env`; lines sorted by key, no comments, no blank lines.
"""
    check = """
got = read("/app/final.env").splitlines()
if got != EXPECTED:
    fail(f"{got} != {EXPECTED}")
"""
    solve = """
python3 - <<'EOF'
merged = {}
for name in ("defaults.env", "override.env"):
    for line in open(name):
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            merged[key] = value
open("final.env", "w").write("".join(f"{k}={merged[k]}\\n" for k in sorted(merged)))
EOF
"""
    app = {"defaults.env": env_file(defaults), "override.env": env_file(override)}
    return folder_files("config", instruction, app, check, expected, solve)


def sales_totals(rng: random.Random) -> Files:
    """Sum a CSV column per group."""
    regions = rng.sample(REGIONS, rng.randint(3, 5))
    rows = [(rng.choice(regions), rng.randint(100, 99999)) for _ in range(rng.randint(15, 30))]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["date", "region", "amount"])
    for i, (region, cents) in enumerate(rows):
        writer.writerow([f"2024-03-{1 + i % 28:02d}", region, f"{cents / 100:.2f}"])
    totals: Counter[str] = Counter()
    for region, cents in rows:
        totals[region] += cents
    expected = [[r, f"{totals[r] / 100:.2f}"] for r in sorted(totals)]
    instruction = """
`/app/sales.csv` has columns `date,region,amount`. Write `/app/totals.csv` with the header
`region,total` and one row per region: the sum of its amounts with two decimals, rows sorted by
region.
"""
    check = """
rows = list(csv.reader(read("/app/totals.csv").splitlines()))
if not rows or rows[0] != ["region", "total"]:
    fail(f"bad header {rows[:1]}")
if rows[1:] != EXPECTED:
    fail(f"{rows[1:]} != {EXPECTED}")
"""
    solve = """
python3 - <<'EOF'
import csv
from decimal import Decimal
totals = {}
for row in csv.DictReader(open("sales.csv")):
    totals[row["region"]] = totals.get(row["region"], Decimal(0)) + Decimal(row["amount"])
with open("totals.csv", "w") as f:
    f.write("region,total\\n")
    for region in sorted(totals):
        f.write(f"{region},{totals[region]:.2f}\\n")
EOF
"""
    return folder_files(
        "csv", instruction, {"sales.csv": buffer.getvalue()}, check, expected, solve
    )


def largest_file(rng: random.Random) -> Files:
    """Find the largest file in a tree."""
    app: Files = {}
    sizes = rng.sample(range(10, 4000), 9)
    for size in sizes:
        folder = "/".join(rng.sample(WORDS, rng.randint(1, 3)))
        app[f"files/{folder}/{rng.choice(WORDS)}{size}.dat"] = "x" * size
    largest = max(app, key=lambda p: len(app[p]))
    expected = largest.removeprefix("files/")
    instruction = """
Find the largest file (in bytes) anywhere under `/app/files`. Write its path relative to
`/app/files` (like `a/b/c.dat`) to `/app/largest.txt`, on one line.
"""
    check = """
got = read("/app/largest.txt").strip()
if got != EXPECTED:
    fail(f"{got!r} != {EXPECTED!r}")
"""
    solve = """
cd files && find . -type f -printf '%s %P\\n' | sort -n | tail -1 | cut -d' ' -f2- > ../largest.txt
"""
    return folder_files("files", instruction, app, check, expected, solve)


CHORES: dict[str, Callable[[random.Random], Files]] = {
    "log-error-counts": log_error_counts,
    "csv-semicolons": csv_semicolons,
    "fix-mean-script": fix_mean_script,
    "rename-extensions": rename_extensions,
    "json-group-by": json_group_by,
    "tiny-calc-cli": tiny_cli,
    "word-frequency": word_frequency,
    "dedupe-lines": dedupe_lines,
    "env-merge": env_merge,
    "sales-totals": sales_totals,
    "largest-file": largest_file,
    "fix-backup-script": fix_backup_script,
}


def all_folders(variants: int = VARIANTS, first: int = 0) -> dict[str, Files]:
    """The files of variants `first` .. `variants - 1` of every chore by folder name
    (`<chore>-<variant>`), deterministic."""
    out: dict[str, Files] = {}
    for chore, make in CHORES.items():
        for variant in range(first, variants):
            out[f"{chore}-{variant:02d}"] = make(random.Random(f"{chore}/{variant}"))
    return out


def write_folders(root: Path, variants: int = VARIANTS, first: int = 0) -> list[Path]:
    """Write the folders of `all_folders(variants, first)` under `root` (each replaced whole);
    shell scripts executable."""
    written = []
    for name, files in all_folders(variants, first).items():
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)
        for relative, text in files.items():
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if relative.endswith(".sh"):
                path.chmod(0o755)
        written.append(folder)
    return written
