"""Unified diffs: make them from two folder trees, split them per file, and apply them.

Diffs are git-style (`diff --git a/p b/p`, `new file mode`, `deleted file mode`, `old mode`/`new
mode`, `\\ No newline at end of file`, names quoted as git quotes them), so `git apply` takes
them, and they read like the patches of SWE-bench rows. They are byte-exact: a file's text is
its bytes decoded as UTF-8 (strictly, no newline translation) and split into lines at "\n" only,
so CRLF line ends, a lone "\r", form feeds, "\x1c".."\x1e", "\x85", U+2028/U+2029 and a missing
last newline all survive a round trip. A file that is not UTF-8 text (a binary file), a symlink
or any other non-regular file cannot be carried: `tree_diff` names each such changed path with
the reason in `TreeDiff.refused`, never skips one silently.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.tasks.swe.tree_changes import TreeEntry, entry_changed, scan_tree

# Never part of a diff: byte code, caches, our own grading folder, version control.
SKIPPED_PARTS = frozenset({"__pycache__", ".git", ".hg", ".pytest_cache", ".conveyor-grade"})
CONTEXT_LINES = 3
REGULAR_MODE = 0o100644
EXECUTABLE_MODE = 0o100755
BINARY_FILE = "binary file"
_GIT_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)")
_PLAIN_OLD = re.compile(r"^--- (?:a/)?(\S+)")
_PLAIN_NEW = re.compile(r"^\+\+\+ (?:b/)?(\S+)")
# git's C-style escapes in quoted names (`quote_c_style`); other bytes below 0x20, 0x7f and
# every byte above it become octal escapes.
_NAME_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x09: "\\t",
    0x0A: "\\n",
    0x0B: "\\v",
    0x0C: "\\f",
    0x0D: "\\r",
    0x22: '\\"',
    0x5C: "\\\\",
}


class PatchError(RuntimeError):
    """A patch did not apply; the message holds the tool's complaint."""


@dataclass(frozen=True)
class FilePatch:
    """The part of a diff that touches one file (`path` is the new path, or the old if deleted)."""

    path: str
    text: str


@dataclass(frozen=True)
class TreeDiff:
    """A diff taking one tree to another, and the changed paths it cannot carry (with why)."""

    patch: str
    refused: dict[str, str] = field(default_factory=dict)


def split_lines(text: str) -> list[str]:
    """`text` as lines split at "\n" only, each keeping its "\n" (the last may lack one).

    Unlike `str.splitlines`, no other character ends a line ("\r", "\f", "\x1c", "\x85",
    U+2028, ...), which is how git and Python's tokenizer read a file."""
    lines = text.split("\n")
    last = lines.pop()
    return [line + "\n" for line in lines] + ([last] if last else [])


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


def git_mode(mode: int) -> int:
    """The mode git records for a regular file of permission bits `mode`."""
    return EXECUTABLE_MODE if mode & stat.S_IXUSR else REGULAR_MODE


def file_diff(
    path: str,
    old: str | None,
    new: str | None,
    *,
    old_mode: int = REGULAR_MODE,
    new_mode: int = REGULAR_MODE,
) -> str:
    """A git-style diff of one text file; `None` means absent (created or deleted). The modes
    are git's (`REGULAR_MODE`, `EXECUTABLE_MODE`); a changed one is part of the diff."""
    mode_changed = old is not None and new is not None and old_mode != new_mode
    if old == new and not mode_changed:
        return ""
    old_lines = [] if old is None else split_lines(old)
    new_lines = [] if new is None else split_lines(new)
    old_name, new_name = _git_name("a/", path), _git_name("b/", path)
    head = [f"diff --git {old_name} {new_name}\n"]
    if old is None:
        head.append(f"new file mode {new_mode:o}\n")
    elif new is None:
        head.append(f"deleted file mode {old_mode:o}\n")
    elif mode_changed:
        head.append(f"old mode {old_mode:o}\nnew mode {new_mode:o}\n")
    if old == new:
        return "".join(head)
    # git ends a name holding a space with a tab on these lines (a plain diff's date field).
    tab = "\t" if " " in path and not old_name.startswith('"') else ""
    head.append("--- /dev/null\n" if old is None else f"--- {old_name}{tab}\n")
    head.append("+++ /dev/null\n" if new is None else f"+++ {new_name}{tab}\n")
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


def _git_name(prefix: str, path: str) -> str:
    """`prefix + path` as git writes a name in a diff: quoted, C-style, where it must be."""
    raw = (prefix + path).encode("utf-8", "surrogateescape")
    if not any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C) for b in raw):
        return raw.decode("ascii")
    out = [_NAME_ESCAPES.get(b) or (chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}") for b in raw]
    return '"' + "".join(out) + '"'


def _range(start: int, end: int) -> str:
    length = end - start
    if length == 0:
        return f"{start},0"
    return f"{start + 1}" if length == 1 else f"{start + 1},{length}"


def _line(sign: str, text: str) -> str:
    if text.endswith("\n"):
        return sign + text
    return f"{sign}{text}\n\\ No newline at end of file\n"


def decode_text(data: bytes) -> str | None:
    """`data` as text: strict UTF-8 without a NUL byte (as git judges text), else None."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_text(path: Path) -> str | None:
    """A file's text, byte-exact (no newline translation), or None when it is not text."""
    try:
        return decode_text(path.read_bytes())
    except OSError:
        return None


def tree_diff(
    old_root: Path, new_root: Path, include: Callable[[str], bool] = lambda _path: True
) -> TreeDiff:
    """The diff taking `old_root` to `new_root` over the paths `include` accepts, and every
    changed path it cannot carry: a binary file, a symlink, a fifo or device (see the module
    doc). Byte code and `SKIPPED_PARTS` are left out."""
    old_tree, new_tree = _diffable(old_root), _diffable(new_root)
    parts: list[str] = []
    refused: dict[str, str] = {}
    for path in sorted(old_tree.keys() | new_tree.keys()):
        old, new = old_tree.get(path), new_tree.get(path)
        if not include(path) or not entry_changed(path, old_root, new_root, old, new):
            continue
        for entry in (new, old):
            if entry is not None and entry.kind != "file":
                refused[path] = "symlink" if entry.kind == "symlink" else "not a regular file"
        if path in refused:
            continue
        old_text = read_text(old_root / path) if old is not None else None
        new_text = read_text(new_root / path) if new is not None else None
        if (old is not None and old_text is None) or (new is not None and new_text is None):
            refused[path] = BINARY_FILE
            continue
        modes = {"old_mode": git_mode(old.mode) if old else REGULAR_MODE}
        modes["new_mode"] = git_mode(new.mode) if new else REGULAR_MODE
        parts.append(file_diff(path, old_text, new_text, **modes))
    return TreeDiff("".join(parts), refused)


def _diffable(root: Path) -> dict[str, TreeEntry]:
    """The entries of `root` a diff may carry or refuse: folders, byte code and
    `SKIPPED_PARTS` are left out."""
    return {
        path: entry
        for path, entry in scan_tree(root, SKIPPED_PARTS).items()
        if entry.kind != "dir" and not path.endswith((".pyc", ".pyo"))
    }


def diff_trees(
    old_root: Path, new_root: Path, include: Callable[[str], bool] = lambda _path: True
) -> str:
    """The patch of `tree_diff` (for callers that only carry text files, such as the factory's
    release pairs; the grader uses `tree_diff` to report what was refused)."""
    return tree_diff(old_root, new_root, include).patch


def split_patch(patch: str) -> list[FilePatch]:
    """The per-file sections of a unified diff (git-style or plain `---`/`+++` headers), for
    reading a patch; the grader never decides what a patch changes from this (it applies the
    patch and reads the tree).

    A diff with any `diff --git` header is split only at those headers (a removed line starting
    with `--` inside a hunk must not start a section); a plain diff at `---`/`+++` pairs.
    """
    lines = split_lines(patch)
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


def _git_env(root: Path) -> dict[str, str]:
    """Outside any repository, and blind to the host's git configuration (`core.autocrlf`
    would rewrite line ends): the bytes of a patch are the bytes written."""
    return {
        **os.environ,
        "GIT_CEILING_DIRECTORIES": str(Path(root).resolve().parent),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def _git_apply(root: Path, patch: str, *options: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "apply", *options, "-"],
        input=patch.encode("utf-8", "surrogateescape"),
        cwd=root,
        env=_git_env(root),
        capture_output=True,
        check=False,
        timeout=120,
    )


def apply_patch(root: Path, patch: str) -> None:
    """Apply `patch` to the folder `root` with `git apply`; `PatchError` if any hunk fails.

    An empty patch is a no-op. `git apply` refuses paths outside `root` and beyond symlinks.
    """
    if not patch.strip():
        return
    if not patch.endswith("\n"):
        patch += "\n"
    done = _git_apply(root, patch, "--whitespace=nowarn", "--recount")
    if done.returncode != 0:
        raise PatchError(done.stderr.decode(errors="replace").strip() or "git apply failed")


def patch_paths(patch: str) -> set[str]:
    """Every path `patch` touches, old and new names of renames and copies, as git itself
    reads them (`git apply --numstat`, forwards and reversed); `PatchError` for text git
    does not read as a patch. An empty patch touches nothing."""
    if not patch.strip():
        return set()
    if not patch.endswith("\n"):
        patch += "\n"
    paths: set[str] = set()
    with tempfile.TemporaryDirectory() as empty:  # numstat reads no file; no repository here
        for options in (("--numstat", "-z"), ("--numstat", "-z", "-R")):
            done = _git_apply(Path(empty), patch, *options)
            if done.returncode != 0:
                raise PatchError(done.stderr.decode(errors="replace").strip() or "not a patch")
            for record in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
                if record:
                    paths.add(record.split("\t", 2)[2])
    return paths
