"""The audit hook's rules for files (`pytest_audit.py`); copied into each test env as
`conveyor_audit_files.py`. Stand-alone; closures bound at install time, pinned with the hook.

With untrusted code on the stack (the project's), refused and reported as tampering:
- opening `/proc/*/mem` (also through a link: the target's inode is compared), listing a
  `/proc/*/fd` folder (how a forger finds the outcome channel), opening the grader's `run.json`;
- writing (open for writing, truncating, renaming or linking onto, removing) a declared test
  file or `conftest.py`, or anything inside a declared test file's folder: the hidden tests, the
  data they read, their byte-code cache (a test rewritten on disk before pytest imports it
  would pass whatever the library does); renaming or removing a folder above one. Paths are
  resolved by `stat` of the path and of its parents walked up with `..`, so `..`, links and
  relative paths lead to the same inodes. An operation relative to a folder descriptor
  (`dir_fd`) on such a path cannot be followed and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[[str, tuple[Any, ...], Any], None]


def file_rules(
    refuse: Callable[..., None],
    untrusted: Callable[[Any], str | None],
    test_files: list[str],
    run_json: str,
    keep_clear: list[str],
) -> dict[str, Handler]:
    """The handlers of the file events, by event name."""
    import os
    import posix
    import stat as stat_module

    os_stat, os_fspath, s_isdir = posix.stat, os.fspath, stat_module.S_ISDIR
    _type, _len, _isinstance, _str, _bytes, _int = type, len, isinstance, str, bytes, int
    _any, _range, _enumerate, _frozenset = any, range, enumerate, frozenset
    _path_errors = (OSError, ValueError, TypeError)
    pathlike = os.PathLike
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def key_of(path: Any, follow: bool = True) -> tuple[int, int] | None:
        try:
            found = os_stat(path, follow_symlinks=follow)
        except _path_errors:
            return None
        return (found.st_dev, found.st_ino)

    proc_dev = os_stat("/proc").st_dev
    own_mem_key = key_of("/proc/self/mem")
    run_json_key = key_of(run_json)
    clear = _frozenset({key_of(p) for p in keep_clear} | {key_of("/")})
    protected_files = _frozenset({key_of(p) for p in test_files} - {None})
    test_dirs, above = set(), set()
    for path in test_files:
        folder = path.rpartition("/")[0] or "/"
        if path.rpartition("/")[2] != "conftest.py":
            test_dirs.add(key_of(folder))
        while folder:
            above.add(key_of(folder))
            folder = folder.rpartition("/")[0]
    protected_dirs = _frozenset(test_dirs - clear - {None})
    pinned_dirs = _frozenset(above - {None})

    def plain_path(path: Any) -> Any:
        """`path` as an exact str or bytes (a subclass's methods are never called), or None."""
        if _type(path) is _str or _type(path) is _bytes:
            return path
        if _isinstance(path, _str):
            return "".join((path, ""))
        if _isinstance(path, _bytes):
            return b"".join((path, b""))
        if _isinstance(path, pathlike):
            return plain_path(os_fspath(path))
        return None

    def inside_protected(path: Any) -> bool:
        """Whether `path` (existing or not) is a protected file or lies in a protected folder
        (its parents are walked up with `..`, so links and `..` in `path` are resolved)."""
        if key_of(path) in protected_files:
            return True
        slash: Any
        dot: Any
        up: Any
        if _type(path) is _str:
            slash, dot, up = "/", ".", "/.."
        else:
            slash, dot, up = b"/", b".", b"/.."
        folder = path.rpartition(slash)[0] if slash in path else dot
        folder = folder or slash
        for _ in _range(64):
            folder_key = key_of(folder)
            if folder_key is None or folder_key in clear:
                return False
            if folder_key in protected_dirs:
                return True
            folder = folder + up
        return True

    def pinned(path: Any) -> bool:
        found = key_of(path, follow=False)
        return found is not None and (found in pinned_dirs or found in protected_dirs)

    def on_open(event: str, args: tuple[Any, ...], caller: Any) -> None:
        path = plain_path(args[0]) if args else None
        if path is None:
            return
        mode: Any = args[1] if _len(args) > 2 else None
        flags: Any = args[2] if _len(args) > 2 else 0
        writes = (_type(flags) is _int and flags & write_flags) or (
            _type(mode) is _str and _any(c in mode for c in "wax+")
        )
        name = path.rpartition("/" if _type(path) is _str else b"/")[2]
        target = key_of(path)
        suspicious = name in ("mem", b"mem") or (
            target is not None and (target == own_mem_key or target == run_json_key)
        )
        if not suspicious and not writes:
            return
        where = untrusted(caller)
        if where is None:
            return
        if suspicious:
            refuse(f"opening {path!r:.200} from {where}")
        if inside_protected(path):
            refuse(f"writing {path!r:.200} from {where}")

    def on_listdir(event: str, args: tuple[Any, ...], caller: Any) -> None:
        path = plain_path(args[0]) if args else None
        if path is None:
            return
        try:
            found = os_stat(path)
        except _path_errors:
            return
        slash = "/" if _type(path) is _str else b"/"
        name = path.rstrip(slash).rpartition(slash)[2]
        if found.st_dev == proc_dev and name in ("fd", b"fd") and s_isdir(found.st_mode):
            where = untrusted(caller)
            if where is not None:
                refuse(f"listing {path!r:.200} from {where}")

    def on_move(event: str, args: tuple[Any, ...], caller: Any) -> None:
        paths = [plain_path(a) for a in args[:2] if _type(a) is not _int]
        relative_fd = _any(_type(a) is _int and a != -1 for a in args[2:])
        for index, path in _enumerate(paths):
            if path is None or (event == "os.symlink" and index == 0):
                continue  # a link's target text is not a path being changed
            hit = relative_fd or inside_protected(path)
            if not hit and index == 0 and event != "os.link":
                hit = pinned(path)
            if hit:
                where = untrusted(caller)
                if where is not None:
                    refuse(f"{event} of {path!r:.200} from {where}")

    return {
        "open": on_open,
        "os.listdir": on_listdir,
        "os.scandir": on_listdir,
        "os.rename": on_move,
        "os.remove": on_move,
        "os.rmdir": on_move,
        "os.truncate": on_move,
        "os.link": on_move,
        "os.symlink": on_move,
        "shutil.rmtree": on_move,
    }
