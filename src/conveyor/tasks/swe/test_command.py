"""A task row's test command, checked and split into how Python starts and the pytest flags.

A row says how its tests run: `python -m pytest` (or `pytest`), a wrapper such as `python -m
coverage run ... -m pytest`, and (as SWE-bench rows do) pytest flags after it: `python -m pytest
-rA -p no:xdist`.
The grader never runs the command as written: it starts its own bootstrap under `python -I` in
place of `-m pytest`, passes the row's flags to pytest, then its own flags (`-p no:cacheprovider
--continue-on-collection-errors -q --rootdir=...`) and the test files it selected, so on a flag
given twice the grader's comes last.

Only flags that change what pytest prints, or switch a plugin off, are accepted
(`ACCEPTED_FLAGS`); a flag that would load code, move the root or configuration, select or
deselect tests, or run them in other processes would let the row's command, not the grader,
decide what is run and how, so it is refused with a `ValueError` naming it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

PYTHONS = ("python", "python3")
# Flags without a value (short ones may be bundled: `-vs`).
_BARE = frozenset(
    {
        "--verbose",
        "--quiet",
        "--showlocals",
        "--no-header",
        "--no-summary",
        "--disable-warnings",
        "--disable-pytest-warnings",
        "--strict-markers",
        "--strict-config",
        "--continue-on-collection-errors",
    }
)
_BARE_SHORT = frozenset("vqsl")
# Flags with a value (`--tb=short`, `--tb short`, `-rA`, `-r A`, `-pno:x`, `-p no:x`).
_VALUED = frozenset({"--tb", "--color", "--code-highlight", "--capture", "--durations"})
_VALUED_SHORT = frozenset("rp")
# Why a refused flag is refused, where there is more to say than "not accepted".
_REFUSED: dict[str, str] = {
    "--rootdir": "the grader sets the root directory",
    "-c": "it chooses the configuration file pytest reads",
    "--config-file": "it chooses the configuration file pytest reads",
    "--inifile": "it chooses the configuration file pytest reads",
    "--confcutdir": "it changes which conftest.py files load",
    "-o": "it overrides the project's pytest configuration",
    "--override-ini": "it overrides the project's pytest configuration",
    "--pyargs": "it imports test paths as packages from sys.path",
    "--import-mode": "it changes how test modules are imported and what sys.path holds",
    "-k": "it selects tests (the grader selects them)",
    "-m": "it selects tests (the grader selects them)",
    "--deselect": "it selects tests (the grader selects them)",
    "--ignore": "it selects tests (the grader selects them)",
    "--ignore-glob": "it selects tests (the grader selects them)",
    "-x": "it stops the run early (the grader reports every selected test)",
    "--exitfirst": "it stops the run early (the grader reports every selected test)",
    "--maxfail": "it stops the run early (the grader reports every selected test)",
    "-n": "it runs tests in other processes, out of the grader's sight",
    "--numprocesses": "it runs tests in other processes, out of the grader's sight",
    "--dist": "it runs tests in other processes, out of the grader's sight",
    "-W": "it imports warning categories and changes which warnings fail a test",
    "--pythonwarnings": "it imports warning categories and changes which warnings fail a test",
}
ACCEPTED_FLAGS = (
    "-v/-q/-s/-l (and bundles such as -vs), -r<chars>, --tb=<style>, -p no:<plugin>, "
    "--color, --code-highlight, --capture, --durations, " + ", ".join(sorted(_BARE))
)


@dataclass(frozen=True)
class TestCommand:
    """A checked test command: the Python options and wrapper between `python` and `-m pytest`
    (e.g. `-m coverage run ...`), and the pytest flags after it."""

    wrapper: tuple[str, ...]
    pytest_flags: tuple[str, ...]

    __test__ = False


def parse_test_command(test_cmd: str) -> TestCommand:
    """`test_cmd` checked (see the module doc); `ValueError` naming what is wrong."""
    words, at = _pytest_at(shlex.split(test_cmd))
    if at is None:
        raise ValueError(
            f"test command {test_cmd!r}: expected 'python [-m wrapper ...] -m pytest [flags]' "
            "(the grader starts pytest through its own bootstrap)"
        )
    flags = words[at + 2 :]
    _check_flags(test_cmd, flags)
    return TestCommand(tuple(words[1:at]), tuple(flags))


def _pytest_at(words: list[str]) -> tuple[list[str], int | None]:
    """(`words` with a leading `pytest` read as `python -m pytest`, as SWE-bench writes it; the
    index of their `-m pytest`, or None when they are not `python [...] -m pytest ...`)."""
    if words[:1] == ["pytest"]:
        words = ["python", "-m", *words]
    at = next((i for i in range(1, len(words) - 1) if words[i : i + 2] == ["-m", "pytest"]), None)
    if not words or words[0] not in PYTHONS:
        return words, None
    return words, at


def _check_flags(test_cmd: str, flags: list[str]) -> None:
    index = 0
    while index < len(flags):
        flag = flags[index]
        name, value, takes_next = _split(flag)
        why = _refusal(name, value)
        if why is not None:
            raise ValueError(
                f"test command {test_cmd!r}: pytest flag {flag!r} is refused: {why}. Accepted "
                f"after '-m pytest': {ACCEPTED_FLAGS}"
            )
        if takes_next:
            if index + 1 >= len(flags):
                raise ValueError(f"test command {test_cmd!r}: pytest flag {flag!r} needs a value")
            value = flags[index + 1]
            why = _refusal(name, value)
            if why is not None:
                raise ValueError(
                    f"test command {test_cmd!r}: pytest flag {flag} {value!r} is refused: {why}. "
                    f"Accepted after '-m pytest': {ACCEPTED_FLAGS}"
                )
            index += 1
        index += 1


def _split(flag: str) -> tuple[str, str | None, bool]:
    """(flag name, its attached value, whether its value is the next word)."""
    if flag.startswith("--"):
        name, eq, value = flag.partition("=")
        if name in _VALUED:
            return name, (value if eq else None), not eq
        return name, (value if eq else None), False
    if flag.startswith("-") and len(flag) > 1:
        letter = flag[1]
        if letter in _VALUED_SHORT:
            return f"-{letter}", flag[2:] or None, len(flag) == 2
        if all(c in _BARE_SHORT for c in flag[1:]):
            return "-v", None, False  # a bundle of bare short flags
        return f"-{letter}", flag[2:] or None, False
    return flag, None, False


def _refusal(name: str, value: str | None) -> str | None:
    """Why `name` (with `value`) is refused, or None if it is accepted."""
    if not name.startswith("-"):
        return "a test path or argument (the grader chooses the tests)"
    if name == "-p":
        if value is None:
            return None  # the value is checked when it is read
        if not value.startswith("no:"):
            return "it loads a plugin (only '-p no:<plugin>', switching one off, is accepted)"
        if value[3:].startswith("conveyor"):
            return "it switches the grader's own plugin off"
        return None
    if name == "-v":  # a bundle of -v/-q/-s/-l
        return None
    if name in _BARE:
        return None if value is None else f"{name} takes no value"
    if name in _VALUED or name == "-r":
        return None
    return _REFUSED.get(name, "not a flag the grader accepts")


def pytest_invocation(command: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(wrapper, arguments) of `command` when it is one plain pytest run, `python [wrapper]
    -m pytest ARGS` or `pytest ARGS` on one line with no shell syntax, whose flags are all
    accepted ones (`parse_test_command`'s rules; test paths are let through here): how the
    log grader (`log_grading`) runs a SWE-bench-format row's own test command through our
    bootstrap, its arguments unchanged. None for any other command (it then runs as written)."""
    if any(char in command for char in "\n;&|<>$`()\\"):
        return None
    try:
        words, at = _pytest_at(shlex.split(command))
    except ValueError:
        return None
    if at is None:
        return None
    rest = words[at + 2 :]
    flags: list[str] = []
    index = 0
    while index < len(rest):
        word = rest[index]
        if word.startswith("-"):
            flags.append(word)
            if _split(word)[2] and index + 1 < len(rest):
                index += 1
                flags.append(rest[index])
        index += 1
    try:
        _check_flags(command, flags)
    except ValueError:
        return None
    return tuple(words[1:at]), tuple(rest)
