"""An index of a repository's Python definitions, the `search_code` tool's data.

`CodeIndex.build(root)` parses every Python file once (files that do not parse are skipped and
counted) and answers: where is a definition (exact, then case-insensitive, then fuzzy name match),
who references or calls it (across modules, with `import x as y`, `from .m import f as g`,
re-exports, `self.method` and inherited methods resolved), and which definitions a prose query
is about (BM25 over one chunk per definition, with `bm25s`). An index is immutable and
thread-safe to query; build it once per task instance and share it through `IndexCache`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from conveyor.tasks.swe.codesearch.rank import name_similarity, normalize_name, search_tokens
from conveyor.tasks.swe.codesearch.scan import Definition, Reference, scan_module

if TYPE_CHECKING:
    import bm25s

__all__ = ["Caller", "CodeIndex", "Definition", "IndexCache", "Match", "Reference"]

FORMAT_VERSION = 1
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", "build", "dist",
     "node_modules", "site-packages", ".eggs", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)  # fmt: skip
MAX_FILE_BYTES = 2_000_000
_TEST_DIRS = frozenset({"test", "tests", "testing"})
_MAX_HOPS = 12


@dataclass(frozen=True)
class Match:
    """A definition found by a search, with its score (1.0 = exact name; BM25 scores are raw)."""

    definition: Definition
    score: float


@dataclass(frozen=True)
class Caller:
    """A definition that calls the target, with the call sites inside it."""

    definition: Definition
    calls: tuple[Reference, ...]


@dataclass(frozen=True)
class _Module:
    path: str
    bindings: dict[str, str]
    star_imports: tuple[str, ...]


def python_files(root: Path) -> list[Path]:
    """The repository's `.py` files, sorted, without VCS, virtualenv, cache and build folders."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and not (Path(folder, d) / "pyvenv.cfg").exists()
        )
        found.extend(Path(folder, f) for f in sorted(files) if f.endswith(".py"))
    return found


def content_hash(root: Path) -> str:
    """A digest of the Python files' paths and bytes: equal for copies of one checkout."""
    digest = hashlib.sha256(f"conveyor-code-index-{FORMAT_VERSION}".encode())
    for file in python_files(root):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def module_name(root: Path, file: Path) -> tuple[str, bool]:
    """Dotted module name of `file` (package folders are those with `__init__.py`; `src/` and
    other plain folders are not part of the name) and whether it is a package's `__init__`."""
    is_package = file.name == "__init__.py"
    parts = [] if is_package else [file.stem]
    folder = file.parent
    while folder != root.parent and (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        if folder == root:
            break
        folder = folder.parent
    return ".".join(parts) or file.stem, is_package


def is_test_path(rel_path: str) -> bool:
    """Whether a repository-relative path is test code (a tests folder, test_*.py, conftest)."""
    *folders, name = rel_path.split("/")
    return (
        any(f in _TEST_DIRS for f in folders)
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


class CodeIndex:
    """Definitions, references and a BM25 index of one repository; build with `CodeIndex.build`."""

    def __init__(
        self,
        root: Path,
        definitions: list[Definition],
        references: list[Reference],
        modules: dict[str, _Module],
        failed: list[str],
        retriever: bm25s.BM25 | None,
        build_seconds: float = 0.0,
    ) -> None:
        self.root = root
        self.definitions = definitions
        self.references = references
        self.failed = failed
        self.build_seconds = build_seconds
        self._modules = modules
        self._retriever = retriever
        self._resolved: dict[str, str | None] = {}
        self._by_qualname: dict[str, Definition] = {}
        self._by_path: dict[str, list[Definition]] = {}
        for d in definitions:
            known = self._by_qualname.get(d.qualname)
            if known is None or (known.is_test and not d.is_test):
                self._by_qualname[d.qualname] = d
            self._by_path.setdefault(d.path, []).append(d)
        self._refs_by_target: dict[str, list[Reference]] = {}
        for ref in references:
            self._refs_by_target.setdefault(ref.target, []).append(ref)

    # Building ------------------------------------------------------------------------------

    @classmethod
    def build(cls, root: Path | str) -> CodeIndex:
        """Parse every Python file under `root` and index it; unparsable files are counted."""
        start = time.perf_counter()
        root = Path(root).resolve()
        if not root.is_dir():
            raise NotADirectoryError(f"cannot index {root}: not a folder")
        definitions: list[Definition] = []
        chunks: list[str] = []
        raw_refs: list[Reference] = []
        modules: dict[str, _Module] = {}
        failed: list[str] = []
        for file in python_files(root):
            rel = file.relative_to(root).as_posix()
            module, is_package = module_name(root, file)
            try:
                if file.stat().st_size > MAX_FILE_BYTES:
                    raise ValueError("file too large")
                source = file.read_text(encoding="utf-8", errors="replace")
                scan = scan_module(
                    source, module, rel, is_package=is_package, is_test=is_test_path(rel)
                )
            except (SyntaxError, ValueError, RecursionError, OSError):
                failed.append(rel)
                continue
            if module not in modules or modules[module].path.count("/") > rel.count("/"):
                modules[module] = _Module(rel, scan.bindings, tuple(scan.star_imports))
            definitions.extend(scan.definitions)
            chunks.extend(scan.chunks)
            raw_refs.extend(scan.references)
        index = cls(root, definitions, [], modules, failed, None)
        references = [replace(r, target=index._canonical(r.target)) for r in raw_refs]
        documents = [
            search_tokens(f"{d.qualname.replace('.', ' ')} {d.name} {chunk}")
            for d, chunk in zip(definitions, chunks, strict=True)
        ]
        retriever = _build_bm25(documents)
        return cls(
            root, definitions, references, modules, failed, retriever, time.perf_counter() - start
        )

    def _canonical(self, dotted: str) -> str:
        return self.resolve(dotted) or dotted

    # Name resolution -----------------------------------------------------------------------

    def resolve(self, dotted: str) -> str | None:
        """The qualname of the definition a dotted path names, following re-exports, import
        aliases and base classes (`pkg.parse` -> `pkg.core.parse_shape`); None if unknown."""
        if dotted not in self._resolved:
            self._resolved[dotted] = self._resolve(dotted, 0)
        return self._resolved[dotted]

    def _resolve(self, dotted: str, hops: int) -> str | None:
        if hops > _MAX_HOPS:
            return None
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            current: str | None = ".".join(parts[:cut])
            if current in self._modules:
                break
        else:
            return None
        for part in parts[cut:]:
            assert current is not None
            current = self._member(current, part, hops + 1)
            if current is None:
                return None
        return current

    def _member(self, owner: str, name: str, hops: int) -> str | None:
        candidate = f"{owner}.{name}"
        if candidate in self._by_qualname or hops > _MAX_HOPS:
            return candidate if candidate in self._by_qualname else None
        module = self._modules.get(owner)
        if module is not None:
            target = module.bindings.get(name)
            if target is not None and target != candidate:
                return self._resolve(target, hops + 1)
            for star in module.star_imports:
                found = self._member(star, name, hops + 1)
                if found is not None:
                    return found
            return None
        definition = self._by_qualname.get(owner)
        if definition is not None and definition.kind == "class":
            for base in definition.bases:
                base_qualname = self._resolve(base, hops + 1)
                if base_qualname is not None and base_qualname != owner:
                    found = self._member(base_qualname, name, hops + 1)
                    if found is not None:
                        return found
        return None

    # Queries -------------------------------------------------------------------------------

    def definition(self, qualname: str) -> Definition | None:
        """The definition with this qualname (aliases and re-exports resolved), if any."""
        found = self._by_qualname.get(qualname)
        if found is None:
            resolved = self.resolve(qualname)
            found = self._by_qualname.get(resolved) if resolved else None
        return found

    def definition_at(self, path: str, line: int) -> Definition | None:
        """The innermost definition in `path` whose span holds `line` (the module at worst)."""
        best: Definition | None = None
        for d in self._by_path.get(path, ()):
            if d.line <= line <= d.end_line and (best is None or d.line >= best.line):
                best = d
        return best

    def find_definition(self, name: str, limit: int = 20, min_score: float = 0.5) -> list[Match]:
        """Definitions named like `name` (`parse`, `Shape.area`, `pkg.mod.f`), best first.

        Scores: 1.0 full qualname or exact name, 0.95 case-insensitive, 0.9 same words
        (`parseString` ~ `parse_string`), below that fuzzy (typos, partial names, shared words).
        """
        query = name.strip().removesuffix("()").strip(".")
        if not query:
            return []
        resolved = self.definition(query) if "." in query else None
        if resolved is not None:  # a full or re-exported dotted name: `pkg.parse`
            return [Match(resolved, 1.0)]
        depth = query.count(".") + 1
        lowered, normal = query.lower(), normalize_name(query)
        matches: list[Match] = []
        for d in self.definitions:
            tail = d.name if depth == 1 else ".".join(d.qualname.split(".")[-depth:])
            if d.qualname == query or tail == query:
                score = 1.0
            elif tail.lower() == lowered:
                score = 0.95
            elif normalize_name(tail) == normal:
                score = 0.9
            elif min_score >= 0.85:
                continue  # only exact-ish names wanted: skip the fuzzy part
            else:
                score = 0.85 * name_similarity(query, tail, floor=min_score / 0.85)
            if score > min_score or score >= 0.9:
                penalty = 0.02 * d.is_test + 0.01 * (d.name.startswith("_") and query[0] != "_")
                matches.append(Match(d, round(score - penalty, 4)))
        matches.sort(
            key=lambda m: (-m.score, m.definition.qualname.count("."), m.definition.qualname)
        )
        return matches[:limit]

    def find_references(self, qualname: str, include_imports: bool = True) -> list[Reference]:
        """Every use of a definition across the repository; for a module or class also the uses
        of its members (`mod.f`, `Class.method`), but not `self.x` inside the class."""
        target = self.resolve(qualname) or qualname
        found = list(self._refs_by_target.get(target, ()))
        definition = self._by_qualname.get(target)
        if definition is not None and definition.kind in ("module", "class"):
            prefix = target + "."
            for key, refs in self._refs_by_target.items():
                if key.startswith(prefix):
                    found.extend(r for r in refs if r.via != "self")
        if not include_imports:
            found = [r for r in found if r.via != "import"]
        return sorted(found, key=lambda r: (is_test_path(r.path), r.path, r.line, r.column))

    def find_callers(self, qualname: str) -> list[Caller]:
        """The definitions that call `qualname` (a class: that construct it), with call sites."""
        target = self.resolve(qualname) or qualname
        grouped: dict[str, list[Reference]] = {}
        for ref in self._refs_by_target.get(target, ()):
            if ref.is_call:
                grouped.setdefault(ref.scope, []).append(ref)
        callers = [
            Caller(self._by_qualname[scope], tuple(refs))
            for scope, refs in grouped.items()
            if scope in self._by_qualname
        ]
        return sorted(
            callers, key=lambda c: (c.definition.is_test, c.definition.path, c.calls[0].line)
        )

    def search_text(self, query: str, limit: int = 20) -> list[Match]:
        """BM25 over definition chunks (name words, signature, docstring, body identifiers)."""
        if self._retriever is None:
            return []
        import numpy as np

        vocab = self._retriever.vocab_dict
        tokens = [t for t in search_tokens(query) if t in vocab]
        if not tokens:
            return []
        scores = np.asarray(self._retriever.get_scores(tokens))
        count = min(limit, len(scores))
        top = np.argpartition(-scores, count - 1)[:count]
        ranked = sorted(top.tolist(), key=lambda i: (-float(scores[i]), i))
        return [Match(self.definitions[i], float(scores[i])) for i in ranked if scores[i] > 0]

    @property
    def stats(self) -> dict[str, Any]:
        """Counts for logs and benchmarks."""
        return {
            "files": len({d.path for d in self.definitions}),
            "failed_files": len(self.failed),
            "modules": len(self._modules),
            "definitions": len(self.definitions),
            "references": len(self.references),
            "build_seconds": round(self.build_seconds, 4),
        }

    # Persistence ---------------------------------------------------------------------------

    def save(self, directory: Path | str) -> None:
        """Write the index to a folder: `index.json` plus the BM25 index in bm25s's format."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = {
            "format": FORMAT_VERSION,
            "root": str(self.root),
            "build_seconds": self.build_seconds,
            "failed": self.failed,
            "modules": {
                k: [m.path, m.bindings, list(m.star_imports)] for k, m in self._modules.items()
            },
            "definitions": [[*astuple(d)[:-1], list(d.bases)] for d in self.definitions],
            "references": [astuple(r) for r in self.references],
        }
        (directory / "index.json").write_text(json.dumps(data, separators=(",", ":")))
        if self._retriever is not None:
            self._retriever.save(str(directory / "bm25"), show_progress=False)

    @classmethod
    def load(cls, directory: Path | str) -> CodeIndex:
        """Read an index written by `save`."""
        directory = Path(directory)
        data = json.loads((directory / "index.json").read_text())
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"{directory}: index format {data.get('format')}, expected 1")
        modules = {
            k: _Module(path, bindings, tuple(star))
            for k, (path, bindings, star) in data["modules"].items()
        }
        definitions = [_definition_from_row(row) for row in data["definitions"]]
        references = [Reference(*row) for row in data["references"]]
        retriever = None
        if (directory / "bm25").is_dir():
            import bm25s

            retriever = bm25s.BM25.load(str(directory / "bm25"), show_progress=False)
        return cls(
            Path(data["root"]),
            definitions,
            references,
            modules,
            list(data["failed"]),
            retriever,
            float(data["build_seconds"]),
        )


def _definition_from_row(row: list[Any]) -> Definition:
    qualname, name, kind, path, line, end_line, signature, doc, is_test, bases = row
    return Definition(
        qualname, name, kind, path, line, end_line, signature, doc, is_test, tuple(bases)
    )


def _build_bm25(documents: list[list[str]]) -> bm25s.BM25 | None:
    if not any(documents):
        return None
    import bm25s

    retriever = bm25s.BM25(backend="numpy")
    retriever.index(documents, show_progress=False)
    return retriever


class IndexCache:
    """Indexes shared by every rollout of a task instance, keyed by the Python files' content.

    Paths inside an index are relative, so one built from an instance's template serves every
    workspace copied from it. With `directory` the indexes are also saved there (one folder per
    content hash) and survive the process. Concurrent `get`s of one key build it once.
    """

    # every cache alive, so a benchmark can start each contender cold (`clear_all`)
    _alive: ClassVar[weakref.WeakSet[IndexCache]] = weakref.WeakSet()

    def __init__(self, directory: Path | str | None = None, max_entries: int = 8) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_entries = max_entries
        self._entries: OrderedDict[str, CodeIndex] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self.builds = 0
        IndexCache._alive.add(self)

    def clear(self) -> int:
        """Forget the indexes held in memory (the next `get` of each builds it again, or loads
        it from `directory`, which is kept); return how many were dropped."""
        with self._lock:
            dropped = len(self._entries)
            self._entries.clear()
        return dropped

    @classmethod
    def clear_all(cls) -> int:
        """`clear` every cache of this process; return how many indexes were dropped."""
        return sum(cache.clear() for cache in list(cls._alive))

    def get(self, root: Path | str) -> CodeIndex:
        """The index of `root`'s current content, built (or loaded from disk) on first use."""
        root = Path(root).resolve()
        key = content_hash(root)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._entries:
                    return self._entries[key]
            stored = self.directory / key if self.directory is not None else None
            if stored is not None and (stored / "index.json").exists():
                index = CodeIndex.load(stored)
            else:
                index = CodeIndex.build(root)
                self.builds += 1
                if stored is not None:
                    index.save(stored)
            with self._lock:
                self._entries[key] = index
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
                self._key_locks.pop(key, None)
        return index
