"""The grader's pytest entry point inside the sandbox; copied into each test env as
`conveyor_pytest.py` and run as `python -I conveyor_pytest.py RUN_JSON [pytest args]`.

Stand-alone (no conveyor imports; its helpers `conveyor_audit.py` and `conveyor_trust.py` lie
beside it in the read-only plugin folder). The order is the rule that keeps start-up hooks out:
1. `python -I` ignores `PYTHON*` variables and the user site, and puts neither the script's
   folder nor the working directory on `sys.path`: at start-up only the standard library and the
   read-only test venv are importable, so no `sitecustomize`/`usercustomize`/`.pth`/shadowing
   module of the project can run before us;
2. the audit hook is installed, idle (`pytest_audit.py`), before pytest is imported; the process
   makes itself non-dumpable (no other process of the sandbox user, e.g. a child it starts, can
   open its memory, and neither can its own code through `/proc/self/mem`); byte code is not
   written (`sys.dont_write_bytecode`);
3. pytest, all of `_pytest`, pluggy, our plugin and the venv's own `pytest11` plugins are imported
   now; entry-point autoloading is then switched off, so a `pytest11` entry point of the project
   (its code is the policy's) never loads;
4. the reporter is configured (its writer bound), the snapshot of the runner's code and the
   reporter's data is taken (`pytest_trust.py`) and the audit hook armed;
5. only then are the project's folder and its metadata folder put on `sys.path`, after the
   standard library and before the venv's site-packages (`_add_project`);
6. `pytest.main` runs; at every plugin registration, after every test and at the end the
   snapshot and the plugins are checked, and as each test's call starts the test about to run
   (`check_item`); whatever is found is written at once as a `{"kind": "tamper", "what"}`
   record;
7. the last record, `{"kind": "session", "exit"}`, is written and the outcome file descriptor
   closed; the process leaves with `os._exit(exit)`, so `atexit` hooks of the project cannot
   write after it.
No secret is held: code of the project runs in this process and could read any. What these
checks cannot stop is for the grader's canary tests to catch, or stays possible
(docs/sandbox.md).

RUN_JSON: `{"outcomes_fd", "select" (node ids or null), "timeout_s", "paths" (put on
`sys.path`), "plugin_dir", "test_files" (the task's declared test files and conftests, absolute),
"hardening" ({"audit_hook", "plugin_check", "snapshot", "item_check", "undumpable"}: each on
unless false)}`.
"""

from __future__ import annotations

import _json
import importlib
import json
import os
import pkgutil
import sys
import sysconfig
from typing import Any

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
    plugin = importlib.import_module("conveyor_outcomes")
    from importlib.metadata import entry_points

    trusted = []
    for entry in entry_points(group="pytest11"):
        try:
            trusted.append(entry.load())
        except Exception as exc:  # a broken venv plugin must not hide the tests
            print(f"conveyor: pytest plugin {entry.name} did not load: {exc}", file=sys.stderr)
    return plugin, trusted


def _trusted_roots(plugin_dir: str) -> list[str]:
    """Where trusted code lives: the standard library, the venv, our plugin folder."""
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return sorted({os.path.realpath(paths[k]) for k in keys} | {os.path.realpath(plugin_dir)})


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
    global _CHANNEL_FD
    fd = _CHANNEL_FD = int(config["outcomes_fd"])
    os.set_inheritable(fd, False)  # test subprocesses do not get the channel
    hardening = {**HARDENING, **(config.get("hardening") or {})}
    sys.path.append(config["plugin_dir"])
    roots = _trusted_roots(config["plugin_dir"])
    declared = [str(p) for p in config.get("test_files") or []]
    arm = None
    if hardening["audit_hook"]:
        import conveyor_audit

        keep_clear = [os.getcwd(), *config["paths"]]
        arm = conveyor_audit.install(fd, roots, declared, argv[1], keep_clear)
    if hardening["undumpable"]:
        _make_undumpable()
    sys.dont_write_bytecode = True
    report = _tamper_writer(fd)

    plugin, trusted = _load(config)
    from pytest import hookimpl as pytest_hookimpl

    plugin.configure(_write_channel, config.get("select"), float(config.get("timeout_s") or 0))
    import conveyor_trust

    class _Watch:
        def pytest_plugin_registered(
            self, plugin: Any, manager: Any, _watch: Any = None, _check: Any = None
        ) -> None:
            _watch(manager)
            _check(plugin)

        def pytest_runtest_logfinish(self, nodeid: str, location: Any, _check: Any = None) -> None:
            _check()

        @pytest_hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item: Any, _check_item: Any = None) -> Any:
            _check_item(item)
            yield

    check, check_plugin, watch, check_item = conveyor_trust.make_guard(
        fd,
        report,
        roots,
        declared,
        _Watch,
        snapshot=hardening["snapshot"],
        plugin_check=hardening["plugin_check"],
        item_check=hardening["item_check"],
    )
    # Bound as defaults: changing them sets `__defaults__`, which the audit hook refuses.
    _Watch.pytest_plugin_registered.__defaults__ = (watch, check_plugin)
    _Watch.pytest_runtest_logfinish.__defaults__ = (check,)
    _Watch.pytest_runtest_call.__defaults__ = (check_item,)
    if arm is not None:
        arm(_Watch)
    del arm
    _add_project(config["paths"])

    code = _SESSION_ERROR
    try:
        code = int(pytest_main(argv[2:], [plugin, *trusted, _Watch()]))
    except BaseException as exc:  # whatever ended the session is reported, not raised
        print(f"conveyor: the test session raised {exc!r}", file=sys.stderr)
    check(final=True)
    _finish(fd, code)


HARDENING = {
    "audit_hook": True,
    "plugin_check": True,
    "snapshot": True,
    "item_check": True,
    "undumpable": True,
}
_CHANNEL_FD = -1
_os_write, _os_exit, _json_dumps = os.write, os._exit, json.dumps


def _write_channel(line: str) -> None:
    """The reporter's writer: one line to the outcome channel. It and the functions it calls
    are globals of `__main__`, which the snapshot holds by identity."""
    _os_write(_CHANNEL_FD, line.encode("utf-8"))


def _tamper_writer(fd: int) -> Any:
    """`report(what)`: a tamper record to the channel at once, through functions bound now."""

    def report(
        what: str, _write: Any = os.write, _encode: Any = _json.encode_basestring_ascii
    ) -> None:
        _write(fd, ('{"kind": "tamper", "what": ' + _encode(what[:300]) + "}\n").encode())

    return report


def _finish(fd: int, code: int) -> None:
    """The session record, then leave (no `atexit` hook of the project runs)."""
    _write_channel(_json_dumps({"kind": "session", "exit": code}) + "\n")
    os.close(fd)
    _save_coverage()
    sys.stdout.flush()
    sys.stderr.flush()
    _os_exit(code)


def _make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: `/proc/<pid>/mem` of this process belongs to root from now on."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)


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
