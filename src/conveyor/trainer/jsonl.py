"""Append-only JSONL files of a training run that survive `kill -9` without a torn line.

Writers append whole lines with one `os.write` each on an `O_APPEND` descriptor and fsync, so a
kill leaves at most one partial line at the very end (a write interrupted by a full disk, say).
`repair` is what a resume runs first: it drops that partial tail and every record of a step
after the checkpoint the resume starts from, and hands back what it dropped, so the caller can
count it and keep it aside.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def append_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append each record as one JSON line (one `os.write` per line), then fsync once."""
    lines = [(json.dumps(record) + "\n").encode() for record in records]
    if not lines:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for line in lines:
            _write_all(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    # A regular file takes the whole line in one call; a short write (a full disk) loops, and a
    # kill between the calls leaves the torn tail that `repair` drops.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass(frozen=True)
class Repair:
    """What `repair` removed from one file."""

    torn: int = 0  # a trailing partial line (0 or 1)
    dropped: list[dict[str, Any]] = field(default_factory=list)  # whole records of later steps


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a JSONL file; a trailing partial line is left out.

    A line that does not parse anywhere but at the end is corruption no writer here produces:
    a `ValueError` naming the line, not a silent skip.
    """
    records, _ = _parse(path)
    return records


def repair(path: Path, last_step: int) -> Repair:
    """Keep only complete records with `step <= last_step`; rewrite the file atomically.

    A missing file is nothing to repair.
    """
    if not path.is_file():
        return Repair()
    records, torn = _parse(path)
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("step"), int):
            raise ValueError(
                f"{path}: record {number} has no integer 'step' field, so it cannot be cut back "
                "to a checkpoint (written by an older conveyor?)"
            )
    kept = [r for r in records if r["step"] <= last_step]
    dropped = [r for r in records if r["step"] > last_step]
    if torn or dropped:
        tmp = path.with_name(f".tmp-{path.name}")
        with open(tmp, "w") as sink:
            sink.writelines(json.dumps(r) + "\n" for r in kept)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(tmp, path)
    return Repair(torn=torn, dropped=dropped)


def _parse(path: Path) -> tuple[list[dict[str, Any]], int]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    # After the last newline: empty for a clean file, a torn partial line after a kill.
    tail = lines.pop()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not a JSON record: {error}") from error
    return records, int(bool(tail.strip()))
