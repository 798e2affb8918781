"""Pinning the state of the grader's in-process checks; copied into each test env as
`conveyor_pins.py` (stand-alone).

The audit hook (`pytest_audit.py`) and the bootstrap's guard (`pytest_trust.py`) are closures.
Code of the project can find them (`gc.get_objects` stays allowed) and could swap what a cell
holds (`cell_contents` is writable, unaudited) or change a dict they read. So once they are
made, `pin` records every closure cell reachable from them with what it holds, and every dict
held in one with its items; the record goes into the checks' own `__defaults__` (setting those
is an audited event the hook refuses from the project's code) and `check_pins` compares it at
every entry. A cell or dict changed since is tampering, reported by `broken_writer`'s function,
which uses nothing but its own defaults.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def pin(functions: list[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(cell pins, dict pins): every closure cell reachable from `functions` with what it holds
    now, and every dict held in one with its items and size (but `sys.modules`, which the
    checks watch). What a cell holds must be immutable or pinned itself (a function, a dict); a
    list or a set could change unseen."""
    import types

    cells, dicts, seen = [], [], {id(sys.modules)}
    stack = list(functions)
    while stack:
        function = stack.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        for cell in function.__closure__ or ():
            held = cell.cell_contents
            cells.append((cell, held))
            if type(held) is types.FunctionType:
                stack.append(held)
            elif type(held) is dict and id(held) not in seen:
                # A dict of ours (its values are only compared: a dict it holds, such as
                # `sys.modules`, is watched, not pinned).
                seen.add(id(held))
                dicts.append((held, tuple(held.items()), len(held)))
                stack.extend(v for v in held.values() if type(v) is types.FunctionType)
            elif isinstance(held, (list, set, bytearray)):
                raise TypeError(f"a pinned closure holds a mutable {type(held).__name__}")
    return tuple(cells), tuple(dicts)


def check_pins(pins: Any) -> None:
    """Check `(cell pins, dict pins, a sentinel, broken)` made by `pin`; `broken()` (which
    raises) at the first cell or dict changed since. Uses nothing but its argument."""
    cell_pins, dict_pins, missing, broken = pins
    for cell, content in cell_pins:
        if cell.cell_contents is not content:
            broken()
    for space, items, size in dict_pins:
        if space.__len__() != size:
            broken()
        for key, value in items:
            if space.get(key, missing) is not value:
                broken()


def broken_writer(fd: int) -> Callable[[], None]:
    """What the hook does when its pins do not hold: using nothing but its own defaults, a
    tamper record and `RuntimeError`."""
    import posix

    write = posix.write

    def broken(
        _write: Any = write,
        _fd: int = fd,
        _line: bytes = b'{"kind": "tamper", "what": "the audit hook\'s state was changed"}\n',
        _error: type[Exception] = RuntimeError,
    ) -> None:
        try:
            _write(_fd, _line)
        finally:
            raise _error("conveyor: the grader's audit hook was tampered with")

    return broken
