"""The grader's pytest entry point inside the sandbox; copied into each test env as
`conveyor_pytest.py` and run as `python -I conveyor_pytest.py RUN_JSON [pytest args]`.

Stand-alone (no conveyor imports). The order is the rule that keeps start-up hooks out:
1. `python -I` ignores `PYTHON*` variables and the user site, and puts neither the script's
   folder nor the working directory on `sys.path`: at start-up only the standard library and the
   read-only test venv are importable, so no `sitecustomize`/`usercustomize`/`.pth`/shadowing
   module of the project can run before us;
2. pytest, all of `_pytest`, pluggy, our plugin and the venv's own `pytest11` plugins are imported
   now; entry-point autoloading is then switched off, so a `pytest11` entry point of the project
   (its code is the policy's) never loads;
3. a snapshot of the code of those modules (functions, methods, classes) is taken;
4. only then are the project's folder and its metadata folder put on `sys.path`, after the
   standard library and before the venv's site-packages (`_add_project`);
5. `pytest.main` runs; after every test and at the end the snapshot is compared (code that
   patched pytest, pluggy or our plugin is reported as tampering), and plugins registered from
   project files other than conftest files are reported;
6. the last record, `{"kind": "session", "exit", "tampered", "nonce"}` (the secret read from
   `nonce_fd` at start, before the project could look), is written and the outcome file
   descriptor closed; the process leaves with `os._exit(exit)`, so `atexit` hooks of the project
   cannot write after it.

RUN_JSON: `{"outcomes_fd", "nonce_fd", "select" (node ids or null), "timeout_s", "paths" (put
on `sys.path`), "plugin_dir"}`.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
import sysconfig
import types
from typing import Any

_GUARDED = ("pytest", "_pytest", "pluggy", "conveyor_outcomes")
_METHODS = (types.FunctionType, classmethod, staticmethod, property)
_SESSION_ERROR = 3


def _load(config: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Import the test runner and the trusted plugins before any project path exists."""
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import _pytest
    import pluggy  # noqa: F401
    import pytest  # noqa: F401

    for info in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        try:
            importlib.import_module(info.name)
        except Exception:  # optional parts (e.g. needing twisted) may not import; fine
            pass
    sys.path.append(config["plugin_dir"])
    plugin = importlib.import_module("conveyor_outcomes")
    from importlib.metadata import entry_points

    trusted = []
    for entry in entry_points(group="pytest11"):
        try:
            trusted.append(entry.load())
        except Exception as exc:  # a broken venv plugin must not hide the tests
            print(f"conveyor: pytest plugin {entry.name} did not load: {exc}", file=sys.stderr)
    return plugin, trusted


def _snapshot() -> dict[str, Any]:
    """Identity of every function (and its code), method and class of the guarded modules."""
    found: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in _GUARDED:
            continue
        found[name] = module
        for attr, value in list(vars(module).items()):
            key = f"{name}.{attr}"
            if isinstance(value, types.FunctionType):
                found[key] = (value, value.__code__)
            elif isinstance(value, type):
                found[key] = value
                if value.__module__ == name:
                    for member, item in list(vars(value).items()):
                        if isinstance(item, _METHODS):
                            code = getattr(item, "__code__", None)
                            found[f"{key}.{member}"] = (item, code)
    return found


Quick = tuple[list[tuple[Any, str, Any, Any]], list[tuple[type, int]]]


def _quick_view() -> Quick:
    """What `_snapshot` sees, as (namespace, name, object, code) to re-read cheaply after each
    test (a full snapshot costs tens of milliseconds; this well under one), plus the size of
    each guarded class's namespace, which grows when a member is added."""
    entries: list[tuple[Any, str, Any, Any]] = []
    sizes: list[tuple[type, int]] = []
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in _GUARDED:
            continue
        entries.append((sys.modules, name, module, None))
        space = vars(module)
        for attr, value in list(space.items()):
            if isinstance(value, types.FunctionType):
                entries.append((space, attr, value, value.__code__))
            elif isinstance(value, type):
                entries.append((space, attr, value, None))
                if value.__module__ == name:
                    sizes.append((value, len(vars(value))))
                    for member, item in list(vars(value).items()):
                        if isinstance(item, _METHODS):
                            code = getattr(item, "__code__", None)
                            entries.append((vars(value), member, item, code))
    return entries, sizes


def _quick_same(view: Quick) -> bool:
    entries, sizes = view
    for space, name, item, code in entries:
        now = space.get(name)
        if now is not item or (code is not None and getattr(now, "__code__", None) is not code):
            return False
    return all(len(vars(cls)) == size for cls, size in sizes)


def _changed(before: dict[str, Any], after: dict[str, Any], roots: list[str]) -> list[str]:
    """Entries that differ, or members added to a guarded class, whose new code does not come
    from a trusted file (pytest's own `legacypath` plugin, for one, adds and replaces methods
    of `Config`, `Node`, ... when it is configured; a project's file never may)."""
    changed = [k for k, v in before.items() if not _same(v, after.get(k))]
    added = [k for k in after if k not in before and _is_method(k, before)]
    return sorted(k for k in changed + added if not _trusted_code(after.get(k), roots))[:20]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] is b[0] and a[1] is b[1]
    return a is b


def _is_method(key: str, before: dict[str, Any]) -> bool:
    # A member added to a guarded class (e.g. a property replacing an attribute).
    return isinstance(before.get(key.rsplit(".", 1)[0]), type)


def _trusted_code(entry: Any, roots: list[str]) -> bool:
    """Whether a snapshot entry is a function (or property, class- or static method) whose
    code lives in a trusted file; anything else that changed counts as tampering."""
    item = entry[0] if isinstance(entry, tuple) else entry
    if isinstance(item, property):
        item = item.fget
    elif isinstance(item, (classmethod, staticmethod)):
        item = item.__func__
    code = getattr(item, "__code__", None)
    if not isinstance(item, types.FunctionType) or code is None:
        return False
    path = os.path.realpath(code.co_filename)
    return any(path.startswith(root + os.sep) for root in roots)


def _trusted_roots(plugin_dir: str) -> list[str]:
    """Where trusted code lives: the standard library, the venv, our plugin folder."""
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return sorted({os.path.realpath(paths[k]) for k in keys} | {os.path.realpath(plugin_dir)})


def _untrusted_plugins(config: Any, roots: list[str]) -> list[str]:
    """Registered plugins defined in files outside the trusted roots, other than conftests."""
    found = []
    for name, plugin in config.pluginmanager.list_name_plugin():
        module = plugin if isinstance(plugin, types.ModuleType) else None
        if module is None and plugin is not None:
            module = sys.modules.get(type(plugin).__module__)
        path = getattr(module, "__file__", None)
        if not path:
            continue
        path = os.path.realpath(path)
        if any(path.startswith(root) for root in roots) or os.path.basename(path) == "conftest.py":
            continue
        found.append(f"plugin {name} from {path}")
    return found


def _add_project(paths: list[str]) -> None:
    """Put the project before the venv's site-packages (the venv may hold another copy of it,
    e.g. attrs as a dependency of hypothesis) and after the standard library. Whatever was
    imported already (the runner, the stdlib modules in use) cannot be shadowed any more; the
    guard drops project files named like the venv's other modules or the standard library."""
    sites = [i for i, p in enumerate(sys.path) if p.rstrip("/").endswith("-packages")]
    at = sites[0] if sites else len(sys.path)
    sys.path[at:at] = paths


def main(argv: list[str]) -> None:
    """Run pytest as the module doc says; never returns."""
    with open(argv[1], encoding="utf-8") as handle:
        config = json.load(handle)
    fd = int(config["outcomes_fd"])
    os.set_inheritable(fd, False)  # test subprocesses do not get the channel
    nonce = _read_nonce(config.get("nonce_fd"))

    def write(line: str) -> None:
        os.write(fd, line.encode("utf-8"))

    plugin, trusted = _load(config)
    roots = _trusted_roots(config["plugin_dir"])
    before = _snapshot()
    quick = [_quick_view()]
    tampered: list[str] = []

    def check(final: bool = False) -> None:
        if tampered or (not final and _quick_same(quick[0])):
            return
        tampered.extend(_changed(before, _snapshot(), roots))
        # Trusted changes only (pytest configuring itself): watch the new state from now on.
        quick[0] = _quick_view()

    plugin.configure(write, config.get("select"), float(config.get("timeout_s") or 0))
    _add_project(config["paths"])
    seen: dict[str, Any] = {}

    class _Watch:
        def pytest_configure(self, config: Any) -> None:
            seen["config"] = config

        def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
            check()

    code = _SESSION_ERROR
    try:
        code = int(pytest_main(argv[2:], [plugin, *trusted, _Watch()]))
    except BaseException as exc:  # whatever ended the session is reported, not raised
        print(f"conveyor: the test session raised {exc!r}", file=sys.stderr)
    check(final=True)
    if "config" in seen:
        tampered.extend(_untrusted_plugins(seen["config"], roots))
    session = {"kind": "session", "exit": code, "tampered": tampered, "nonce": nonce}
    write(json.dumps(session) + "\n")
    os.close(fd)
    _save_coverage()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _read_nonce(fd: int | None) -> str | None:
    """The grader's secret, read whole and the pipe closed before any project code runs."""
    if fd is None:
        return None
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def _save_coverage() -> None:
    """Under `coverage run` (the factory's baseline), save its data: `os._exit` skips the
    `atexit` hook that would."""
    if "coverage" not in sys.modules:
        return
    import coverage

    current = coverage.Coverage.current()
    if current is not None:
        current.stop()
        current.save()


def pytest_main(args: list[str], plugins: list[Any]) -> int:
    """`pytest.main` (a seam for reading; nothing replaces it)."""
    import pytest

    return int(pytest.main(args, plugins=plugins))


if __name__ == "__main__":
    main(sys.argv)
