"""`conveyor bench search`: does code search find what a task is about? search_code vs BM25 vs grep.

For each task (a problem statement and the gold patch's files and functions) three rankers see
the problem statement: `search_code` (its `auto` ranking), BM25 alone over the same definition
chunks, and a grep baseline that ranks files (and the functions in them) by how often the
statement's keywords occur. Reported: how often a gold file / gold function is in the top k, the
index build time and the median lookup latency. Without real tasks, `synthetic_tasks` makes
pseudo-tasks from a project's own docstrings (the function's name removed from the statement).
"""

from __future__ import annotations

import ast
import bisect
import json
import random
import re
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.models import cache_dir
from conveyor.tasks.swe.codesearch.index import CodeIndex, Definition, IndexCache, python_files
from conveyor.tasks.swe.codesearch.rank import STOP_WORDS
from conveyor.tasks.swe.codesearch.tool import rank_definitions

KS = (1, 5, 10)
METHODS = ("search_code", "bm25", "grep")
SYNTHETIC_VERSIONS = {"pyparsing": "3.1.2", "boltons": "24.0.0"}
_PIP_DOWNLOAD = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary"]
_DEPTH = 50  # definitions ranked per query, enough for 10 distinct files
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
_KEYWORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)`'\"])[.!?](?:\s|$)")
_SYNONYMS = {
    "return": "give back", "returns": "gives back", "get": "fetch", "gets": "fetches",
    "create": "make", "creates": "makes", "convert": "turn", "converts": "turns",
    "check": "test", "checks": "tests", "remove": "drop", "removes": "drops",
    "function": "routine", "method": "routine", "given": "supplied", "specified": "requested",
}  # fmt: skip
_TEMPLATES = (
    "Where is this implemented: {s}",
    "I need to change the code that does this: {s}",
    "Bug report: the following misbehaves for some inputs. {s}",
    "{s} Which part of the code is responsible?",
)


@dataclass(frozen=True)
class SearchTask:
    """One query with what should be found: gold file paths and gold definition qualnames."""

    instance_id: str
    query: str
    root: Path
    gold_files: tuple[str, ...]
    gold_functions: tuple[str, ...]


def touched_lines(patch: str) -> dict[str, list[int]]:
    """Old-side lines each `.py` file's hunks change: removed lines, and for an insertion the
    line it follows. New files are left out (no definition of the base can hold them)."""
    touched: dict[str, list[int]] = {}
    path: str | None = None
    line = 0
    for text in patch.splitlines():
        if text.startswith("--- "):
            name = text[4:].split("\t")[0].strip()
            path = name[2:] if name.startswith(("a/", "b/")) else name
            path = path if path.endswith(".py") and name != "/dev/null" else None
        elif text.startswith("+++ "):
            continue
        elif (hunk := _HUNK.match(text)) is not None:
            line = int(hunk.group(1))
        elif path is not None and text.startswith("-"):
            touched.setdefault(path, []).append(line)
            line += 1
        elif path is not None and text.startswith("+"):
            touched.setdefault(path, []).append(max(line - 1, 1))
        elif text.startswith(" "):
            line += 1
    return touched


def gold_of_patch(index: CodeIndex, patch: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Gold files and gold definitions (the innermost non-module definitions the hunks touch)."""
    touched = touched_lines(patch)
    functions: set[str] = set()
    for path, lines in touched.items():
        for line in lines:
            found = index.definition_at(path, line)
            if found is not None and found.kind != "module":
                functions.add(found.qualname)
    return tuple(sorted(touched)), tuple(sorted(functions))


def load_rows(tasks_file: Path, repo_root: Path | None) -> list[tuple[dict[str, Any], Path]]:
    """SWE-bench-style JSONL rows with their checkouts: `repo_root/<instance_id>` when that folder
    exists, else `repo_root` itself (one checkout for every row); without `repo_root`, rows of
    the task factory (`repo: pypi:NAME`) use their starting state (the sdist plus the row's
    `setup_patch`: the mutated code, failing tests hidden), as an agent sees it."""
    pairs: list[tuple[dict[str, Any], Path]] = []
    for number, text in enumerate(tasks_file.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        row = json.loads(text)
        missing = {"instance_id", "problem_statement", "patch"} - set(row)
        if missing:
            raise ValueError(f"{tasks_file}:{number}: row lacks {sorted(missing)}")
        if repo_root is None:
            pairs.append((row, _starting_state(row, f"{tasks_file}:{number}")))
            continue
        own = repo_root / str(row["instance_id"])
        pairs.append((row, own if own.is_dir() else repo_root))
    return pairs


def _starting_state(row: dict[str, Any], where: str) -> Path:
    from conveyor.tasks.swe.dataset import SweRow
    from conveyor.tasks.swe.grading import row_template

    if not str(row.get("repo", "")).startswith("pypi:"):
        raise ValueError(f"{where}: a row of {row.get('repo')!r} needs --repo-root (a checkout)")
    return row_template(SweRow.model_validate(row))


def tasks_from_rows(
    pairs: Iterable[tuple[dict[str, Any], Path]], cache: IndexCache
) -> list[SearchTask]:
    """Search tasks from (row, checkout) pairs; the gold comes from each row's `patch`."""
    tasks = []
    for row, root in pairs:
        files, functions = gold_of_patch(cache.get(root), row["patch"])
        if files:
            tasks.append(
                SearchTask(row["instance_id"], row["problem_statement"], root, files, functions)
            )
    return tasks


def first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def paraphrase(definition: Definition, sentence: str, rng: random.Random) -> str | None:
    """A problem statement from a docstring's first sentence, without the definition's own name
    and with a few words swapped for synonyms; None if too little is left."""
    names = {definition.name, definition.name.strip("_")}
    names.add(re.sub(r"_([a-z])", lambda m: m.group(1).upper(), definition.name.strip("_")))
    names.add(re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", definition.name).lower())
    sentence = _ROLE.sub(r"`\1`", sentence)
    pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True) if n)
    sentence = re.sub(rf"`?\b(?:{pattern})\b(?:\(\))?`?", " ", sentence, flags=re.IGNORECASE)
    words = [_SYNONYMS.get(w.lower(), w) for w in sentence.split()]
    if sum(1 for w in words if w.isalpha() and w.lower() not in STOP_WORDS) < 3:
        return None
    return rng.choice(_TEMPLATES).format(s=" ".join(words).rstrip(".:,") + ".")


def synthetic_tasks(
    index: CodeIndex, package: str, count: int = 50, seed: int = 0
) -> list[SearchTask]:
    """Pseudo-tasks from `package`'s own functions with docstrings: the statement paraphrases the
    docstring's first sentence (name removed), the gold is that function and its file."""
    rng = random.Random(seed)
    candidates = [
        d
        for d in index.definitions
        if d.kind in ("function", "method")
        and not d.is_test
        and d.doc
        and not d.name.startswith("__")
        and d.qualname.split(".")[0] == package
    ]
    rng.shuffle(candidates)
    tasks: list[SearchTask] = []
    docstrings: dict[str, dict[int, str]] = {}
    for definition in candidates:
        if definition.path not in docstrings:
            docstrings[definition.path] = _docstrings(index.root / definition.path)
        docstring = docstrings[definition.path].get(definition.line, definition.doc)
        statement = paraphrase(definition, first_sentence(docstring), rng)
        if statement is None:
            continue
        instance = f"synthetic:{definition.qualname}"
        tasks.append(
            SearchTask(instance, statement, index.root, (definition.path,), (definition.qualname,))
        )
        if len(tasks) == count:
            break
    return tasks


def _docstrings(file: Path) -> dict[int, str]:
    """Full docstrings of a file's functions by the line of their `def`."""
    tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
    return {
        node.lineno: ast.get_docstring(node) or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


class GrepBaseline:
    """Rank files by keyword occurrences (case-insensitive whole words), and the functions in
    them by the occurrences inside their spans: what `grep -ciw` plus reading would give."""

    def __init__(self, index: CodeIndex) -> None:
        self.files: dict[str, str] = {}
        self.line_starts: dict[str, list[int]] = {}
        for file in python_files(index.root):
            rel = file.relative_to(index.root).as_posix()
            text = file.read_text(encoding="utf-8", errors="replace").lower()
            self.files[rel] = text
            self.line_starts[rel] = [0, *(m.end() for m in re.finditer("\n", text))]
        self.functions: dict[str, list[Definition]] = {}
        for d in index.definitions:
            if d.kind in ("function", "method"):
                self.functions.setdefault(d.path, []).append(d)

    def rank(self, query: str) -> tuple[list[str], list[Definition]]:
        """Files by keyword count, and functions by keyword count in their spans (ties: order)."""
        keywords = {w.lower() for w in _KEYWORD.findall(query)} - STOP_WORDS
        if not keywords:
            return [], []
        pattern = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, keywords))) + r")\b")
        file_counts: dict[str, int] = {}
        function_counts: list[tuple[int, Definition]] = []
        for path, text in self.files.items():
            positions = [m.start() for m in pattern.finditer(text)]
            if not positions:
                continue
            file_counts[path] = len(positions)
            starts = self.line_starts[path]
            lines = [bisect.bisect_right(starts, p) for p in positions]
            for d in self.functions.get(path, ()):
                hits = bisect.bisect_right(lines, d.end_line) - bisect.bisect_left(lines, d.line)
                if hits:
                    function_counts.append((hits, d))
        files = sorted(file_counts, key=lambda p: -file_counts[p])
        function_counts.sort(key=lambda item: -item[0])
        return files, [d for _, d in function_counts[:_DEPTH]]


def _distinct_files(definitions: Sequence[Definition]) -> list[str]:
    return list(dict.fromkeys(d.path for d in definitions))


def _hit(ranked: Sequence[str], gold: Sequence[str], k: int) -> bool:
    return any(item in gold for item in ranked[:k])


def _function_names(definitions: Sequence[Definition], gold: Sequence[str]) -> list[str]:
    """Qualnames, counting a hit on a function that encloses a nested gold function."""
    names = []
    for d in definitions:
        inner = [g for g in gold if g.startswith(d.qualname + ".") and d.kind != "class"]
        names.append(inner[0] if inner else d.qualname)
    return names


def evaluate(tasks: Sequence[SearchTask], index: CodeIndex) -> dict[str, Any]:
    """Top-k hit rates of the gold file and gold function, and lookup latency, per method."""
    scores = Scores()
    scores.add(tasks, index)
    return scores.report()


class Scores:
    """Hits and latencies accumulated over groups of tasks, each group with its own index (a
    factory task's starting state differs per task: its own index, as the agent would see)."""

    def __init__(self) -> None:
        self.tasks = 0
        self.hits = {
            m: {f"{lv}_top{k}": 0 for lv in ("file", "function") for k in KS} for m in METHODS
        }
        self.latencies: dict[str, list[float]] = {m: [] for m in METHODS}
        self.grep_prepare: list[float] = []

    def add(self, tasks: Sequence[SearchTask], index: CodeIndex) -> None:
        """Score `tasks` against `index` with every method."""
        grep_start = time.perf_counter()
        grep = GrepBaseline(index)
        self.grep_prepare.append(time.perf_counter() - grep_start)
        rankers: dict[str, Callable[[str], tuple[list[str], list[Definition]]]] = {
            "search_code": lambda q: _as_lists(rank_definitions(index, q, "auto", _DEPTH)[0]),
            "bm25": lambda q: _as_lists(index.search_text(q, _DEPTH)),
            "grep": grep.rank,
        }
        self.tasks += len(tasks)
        for method, rank in rankers.items():
            hits = self.hits[method]
            for task in tasks:
                start = time.perf_counter()
                files, definitions = rank(task.query)
                self.latencies[method].append(time.perf_counter() - start)
                functions = _function_names(definitions, task.gold_functions)
                for k in KS:
                    hits[f"file_top{k}"] += _hit(files, task.gold_files, k)
                    hits[f"function_top{k}"] += _hit(functions, task.gold_functions, k)

    def report(self) -> dict[str, Any]:
        """Hit rates and latency (median, p90) per method."""
        report: dict[str, Any] = {}
        scored = max(1, self.tasks)
        for method in METHODS:
            latencies = self.latencies[method]
            report[method] = {n: round(c / scored, 3) for n, c in self.hits[method].items()}
            report[method]["latency_ms_median"] = round(
                1000 * statistics.median(latencies or [0]), 3
            )
            report[method]["latency_ms_p90"] = round(1000 * _quantile(latencies, 0.9), 3)
        prepare = statistics.median(self.grep_prepare or [0])
        report["grep"]["prepare_seconds"] = round(prepare, 4)
        return report


def evaluate_names(tasks: Sequence[SearchTask], index: CodeIndex, seed: int = 0) -> dict[str, Any]:
    """Name lookups for the gold functions: the bare name and a one-letter typo (top-1/top-5 hit
    rates; names shared by several classes cap top-1), and the lookup latencies."""
    rng = random.Random(seed)
    rates = {"exact_top1": 0, "exact_top5": 0, "typo_top1": 0, "typo_top5": 0}
    latencies: dict[str, list[float]] = {"definition": [], "references": [], "callers": []}
    for task in tasks:
        gold = task.gold_functions[0]
        name = gold.rsplit(".", 1)[1]
        cut = rng.randrange(len(name))
        typo = name[:cut] + name[cut + 1 :] if len(name) > 4 else name
        for key, query in (("exact", name), ("typo", typo)):
            start = time.perf_counter()
            top = [m.definition.qualname for m in index.find_definition(query, limit=5)]
            latencies["definition"].append(time.perf_counter() - start)
            rates[f"{key}_top1"] += top[:1] == [gold]
            rates[f"{key}_top5"] += gold in top
        for kind, lookup in (
            ("references", index.find_references),
            ("callers", index.find_callers),
        ):
            start = time.perf_counter()
            lookup(gold)
            latencies[kind].append(time.perf_counter() - start)
    scored = max(1, len(tasks))
    report: dict[str, Any] = {key: round(count / scored, 3) for key, count in rates.items()}
    for kind, values in latencies.items():
        report[f"{kind}_latency_ms_median"] = round(1000 * statistics.median(values or [0]), 3)
    return report


def _as_lists(matches: Sequence[Any]) -> tuple[list[str], list[Definition]]:
    definitions = [m.definition for m in matches]
    return _distinct_files(definitions), definitions


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_index(root: Path, repeats: int = 3) -> dict[str, Any]:
    """Median build, save and load times of a repository's index (bm25s imported beforehand)."""
    import tempfile

    import bm25s  # noqa: F401  (its import, ~0.3 s, is paid once per process, not per build)

    builds, saves, loads = [], [], []
    index = CodeIndex.build(root)
    for _ in range(repeats):
        start = time.perf_counter()
        index = CodeIndex.build(root)
        builds.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            index.save(folder)
            saves.append(time.perf_counter() - start)
            start = time.perf_counter()
            CodeIndex.load(folder)
            loads.append(time.perf_counter() - start)
    return {
        **index.stats,
        "build_seconds": round(statistics.median(builds), 4),
        "save_seconds": round(statistics.median(saves), 4),
        "load_seconds": round(statistics.median(loads), 4),
    }


def fetch_sdist(project: str, version: str | None = None, cache: Path | None = None) -> Path:
    """Download (once) and unpack a project's source distribution; returns the unpacked folder."""
    version = version or SYNTHETIC_VERSIONS.get(project)
    if version is None:
        raise ValueError(f"no default version for {project!r}; pass one explicitly")
    folder = cache or cache_dir() / "sdists"
    unpacked = folder / f"{project}-{version}"
    if unpacked.is_dir():
        return unpacked
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [*_PIP_DOWNLOAD, ":all:", f"{project}=={version}", "-d", str(folder)],
        check=True,
    )
    archives = sorted(folder.glob(f"{project.replace('-', '_')}-{version}.tar.gz"))
    archives += sorted(folder.glob(f"{project}-{version}.tar.gz"))
    if not archives:
        raise FileNotFoundError(f"pip left no {project}-{version}.tar.gz in {folder}")
    with tarfile.open(archives[0]) as archive:
        top = archive.getnames()[0].split("/")[0]
        archive.extractall(folder, filter="data")
    if (folder / top) != unpacked:
        (folder / top).rename(unpacked)
    return unpacked


def bench_synthetic(project: str, count: int = 50, seed: int = 0) -> dict[str, Any]:
    """The benchmark on pseudo-tasks from one project's sdist."""
    root = fetch_sdist(project)
    timing = time_index(root)
    index = CodeIndex.build(root)
    tasks = synthetic_tasks(index, project, count, seed)
    return {
        "project": project,
        "version": SYNTHETIC_VERSIONS.get(project),
        "tasks": len(tasks),
        "index": timing,
        "methods": evaluate(tasks, index),
        "name_lookup": evaluate_names(tasks, index, seed),
        "examples": [{"query": t.query, "gold": t.gold_functions[0]} for t in tasks[:3]],
    }


def bench_rows(pairs: Sequence[tuple[dict[str, Any], Path]]) -> dict[str, Any]:
    """The benchmark on SWE-bench-style rows: one group per checkout, or per project for rows of
    the task factory (each row searched in its own starting state); hit rates pooled."""
    groups: dict[str, dict[Path, list[tuple[dict[str, Any], Path]]]] = {}
    for row, root in pairs:
        repo = str(row.get("repo", ""))
        name = repo if repo.startswith("pypi:") else str(root)
        groups.setdefault(name, {}).setdefault(root, []).append((row, root))
    reports = []
    total = 0
    for name, by_root in groups.items():
        scores = Scores()
        for root, group in by_root.items():
            cache = IndexCache(max_entries=1)
            tasks = tasks_from_rows(group, cache)
            scores.add(tasks, cache.get(root))
        total += scores.tasks
        first_root = next(iter(by_root))
        reports.append(
            {
                "group": name,
                "root": str(first_root),
                "checkouts": len(by_root),
                "tasks": scores.tasks,
                "index": time_index(first_root, repeats=1 if len(groups) > 1 else 3),
                "methods": scores.report(),
            }
        )
    return {
        "tasks": total,
        "skipped_rows": len(pairs) - total,
        "methods": _pooled(reports),
        "groups": reports,
    }


def _pooled(groups: Sequence[dict[str, Any]]) -> dict[str, Any]:
    total = sum(g["tasks"] for g in groups) or 1
    pooled: dict[str, Any] = {}
    for method in METHODS:
        keys = [k for k in groups[0]["methods"][method] if "top" in k] if groups else []
        pooled[method] = {
            key: round(sum(g["methods"][method][key] * g["tasks"] for g in groups) / total, 3)
            for key in keys
        }
    return pooled
