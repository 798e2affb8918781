"""Unified diffs: make them from two folder trees, split them per file, and apply them.

Diffs are git-style (`diff --git a/p b/p`, `new file mode`, `deleted file mode`, `\\ No newline
at end of file`), so `git apply` and GNU `patch -p1` both take them, and they read like the
patches of SWE-bench rows.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Never part of a diff: byte code, caches, our own grading folder, version control.
SKIPPED_PARTS = frozenset({"__pycache__", ".git", ".hg", ".pytest_cache", ".conveyor-grade"})
CONTEXT_LINES = 3
_GIT_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)")
_PLAIN_OLD = re.compile(r"^--- (?:a/)?(\S+)")
_PLAIN_NEW = re.compile(r"^\+\+\+ (?:b/)?(\S+)")


class PatchError(RuntimeError):
    """A patch did not apply; the message holds the tool's complaint."""


@dataclass(frozen=True)
class FilePatch:
    """The part of a diff that touches one file (`path` is the new path, or the old if deleted)."""

    path: str
    text: str


def iter_files(root: Path) -> Iterator[str]:
    """Relative paths of the regular files under `root`, sorted, skipping `SKIPPED_PARTS`.

    Symlinks are not followed and not listed: a diff never carries them.
    """
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_PARTS)
        base = Path(folder)
        for name in files:
            full = base / name
            if name.endswith((".pyc", ".pyo")) or full.is_symlink() or not full.is_file():
                continue
            found.append(full.relative_to(root).as_posix())
    yield from sorted(found)


def file_diff(path: str, old: str | None, new: str | None) -> str:
    """A git-style diff of one text file; `None` means absent (created or deleted)."""
    if old == new:
        return ""
    old_lines = [] if old is None else old.splitlines(keepends=True)
    new_lines = [] if new is None else new.splitlines(keepends=True)
    head = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        head.append("new file mode 100644\n")
    elif new is None:
        head.append("deleted file mode 100644\n")
    head.append("--- /dev/null\n" if old is None else f"--- a/{path}\n")
    head.append("+++ /dev/null\n" if new is None else f"+++ b/{path}\n")
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    body: list[str] = []
    for group in matcher.get_grouped_opcodes(CONTEXT_LINES):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        body.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                body += [_line(" ", x) for x in old_lines[a1:a2]]
                continue
            body += [_line("-", x) for x in old_lines[a1:a2]]
            body += [_line("+", x) for x in new_lines[b1:b2]]
    return "".join(head + body)


def _range(start: int, end: int) -> str:
    length = end - start
    if length == 0:
        return f"{start},0"
    return f"{start + 1}" if length == 1 else f"{start + 1},{length}"


def _line(sign: str, text: str) -> str:
    if text.endswith("\n"):
        return sign + text
    return f"{sign}{text}\n\\ No newline at end of file\n"


def read_text(path: Path) -> str | None:
    """A file's UTF-8 text, or None when it is not text (binary files are not diffed)."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def diff_trees(
    old_root: Path, new_root: Path, include: Callable[[str], bool] = lambda _path: True
) -> str:
    """A diff taking `old_root` to `new_root` over text files whose path `include` accepts."""
    old_files, new_files = set(iter_files(old_root)), set(iter_files(new_root))
    parts: list[str] = []
    for path in sorted(old_files | new_files):
        if not include(path):
            continue
        old = read_text(old_root / path) if path in old_files else None
        new = read_text(new_root / path) if path in new_files else None
        if (path in old_files and old is None) or (path in new_files and new is None):
            continue  # binary on one side: not expressible as a text diff
        parts.append(file_diff(path, old, new))
    return "".join(parts)


def split_patch(patch: str) -> list[FilePatch]:
    """The per-file sections of a unified diff (git-style or plain `---`/`+++` headers).

    A diff with any `diff --git` header is split only at those headers (a removed line starting
    with `--` inside a hunk must not start a section); a plain diff at `---`/`+++` pairs.
    """
    lines = patch.splitlines(keepends=True)
    git_style = any(line.startswith("diff --git ") for line in lines)
    sections: list[list[str]] = []
    for index, line in enumerate(lines):
        if git_style:
            starts = line.startswith("diff --git ")
        else:
            following = lines[index + 1] if index + 1 < len(lines) else ""
            starts = line.startswith("--- ") and following.startswith("+++ ")
        if starts or not sections:
            sections.append([line])
        else:
            sections[-1].append(line)
    out = []
    for section in sections:
        path = _section_path(section)
        if path is not None:
            out.append(FilePatch(path, "".join(section)))
    return out


def _section_path(section: list[str]) -> str | None:
    old = new = None
    for line in section:
        if match := _GIT_HEADER.match(line):
            old, new = match.group(1), match.group(2)
        elif line.startswith("--- ") and (match := _PLAIN_OLD.match(line)):
            old = match.group(1) if match.group(1) != "/dev/null" else old
        elif line.startswith("+++ ") and (match := _PLAIN_NEW.match(line)):
            new = match.group(1) if match.group(1) != "/dev/null" else new
        elif line.startswith("@@"):
            break
    if new is None and old is None:
        return None
    if "+++ /dev/null" in "".join(section[:6]):
        return old
    return new or old


def apply_patch(root: Path, patch: str) -> None:
    """Apply `patch` to the folder `root` with `git apply`; `PatchError` if any hunk fails.

    An empty patch is a no-op. `git apply` refuses paths outside `root` and beyond symlinks.
    """
    if not patch.strip():
        return
    if not patch.endswith("\n"):
        patch += "\n"
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(Path(root).resolve().parent)}
    done = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", "--recount", "-"],
        input=patch.encode(),
        cwd=root,
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise PatchError(done.stderr.decode(errors="replace").strip() or "git apply failed")
