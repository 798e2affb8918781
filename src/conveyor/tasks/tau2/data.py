"""The tau2-bench data as `inspect-evals` ships it, and the canonical hash of a domain database.

`inspect-evals==0.26.0` (MIT, installed with --no-deps) carries tau2-bench's airline and retail
domains under ``inspect_evals/tau2/data/domains/<domain>/``: ``db.json.gz`` (the database),
``tasks.json`` (scenarios and evaluation criteria), ``split_tasks.json`` (tau2's own train/test
split) and ``policy.txt`` (the agent's policy), plus the user simulator's guidelines. The files
are read from the installed package without importing it (its modules need `inspect_ai`).

This module uses the standard library only, so the script that records the original tools'
expected databases (tests/fixtures/tau2/record_expected.py, run in a side environment with
`inspect_ai`) loads it by path and hashes exactly as the family does.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

DOMAINS = ("airline", "retail")
PACKAGE = "inspect_evals"
PACKAGE_VERSION = "0.26.0"


def data_dir() -> Path:
    """The tau2 data folder of the installed `inspect_evals` package.

    Raises `FileNotFoundError` naming the install command when the package is missing.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the tau2 family reads its data from the '{PACKAGE}' package, which is not "
            f"installed: pip install --no-deps inspect-evals=={PACKAGE_VERSION}"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "tau2" / "data"
    if not folder.is_dir():
        raise FileNotFoundError(f"no tau2 data in the installed {PACKAGE} package ({folder})")
    return folder


def domain_file(domain: str, name: str) -> Path:
    """A file of one domain's folder; `ValueError` for an unknown domain."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; expected one of {', '.join(DOMAINS)}")
    return data_dir() / "domains" / domain / name


@functools.cache
def db_text(domain: str) -> str:
    """The domain's initial database as JSON text (each rollout parses its own copy)."""
    with gzip.open(domain_file(domain, "db.json.gz"), "rt", encoding="utf-8") as handle:
        return handle.read()


def load_db(domain: str) -> dict[str, Any]:
    """A fresh, private copy of the domain's initial database."""
    data: dict[str, Any] = json.loads(db_text(domain))
    return data


@functools.cache
def base_db(domain: str) -> dict[str, Any]:
    """The initial database, parsed once and shared: never to be changed (compare only)."""
    return load_db(domain)


def changes(db: dict[str, Any], domain: str) -> dict[str, dict[str, Any]]:
    """The records of `db` that differ from the initial database: table -> key -> record
    (None where the record is gone). Two databases grown from the initial one by the same
    tools are equal exactly when their changes are."""
    base = base_db(domain)
    out: dict[str, dict[str, Any]] = {}
    for table in sorted(set(db) | set(base)):
        now, then = db.get(table, {}), base.get(table, {})
        changed = {
            key: now.get(key) for key in set(now) | set(then) if now.get(key) != then.get(key)
        }
        if changed:
            out[table] = changed
    return out


def state_digest(db: dict[str, Any], domain: str) -> str:
    """SHA-256 of the canonical JSON of `changes(db)`: equal for equal database states (the
    fast form of `db_hash` for databases of one domain)."""
    text = json.dumps(canonical(changes(db, domain)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def raw_tasks(domain: str) -> tuple[dict[str, Any], ...]:
    """The domain's tasks as tasks.json holds them, in file order."""
    records = json.loads(domain_file(domain, "tasks.json").read_text(encoding="utf-8"))
    return tuple(records)


@functools.cache
def source_splits(domain: str) -> dict[str, str]:
    """tau2-bench's own split of the domain: task id -> 'train' or 'test'."""
    splits = json.loads(domain_file(domain, "split_tasks.json").read_text(encoding="utf-8"))
    return {
        **{task_id: "train" for task_id in splits["train"]},
        **{task_id: "test" for task_id in splits["test"]},
    }


@functools.cache
def policy(domain: str) -> str:
    """The agent policy of the domain."""
    return domain_file(domain, "policy.txt").read_text(encoding="utf-8")


@functools.cache
def user_guidelines() -> str:
    """tau2-bench's guidelines for the simulated user."""
    path = data_dir() / "user_simulator" / "simulation_guidelines.txt"
    return path.read_text(encoding="utf-8")


def canonical(value: Any) -> Any:
    """`value` with None-valued keys dropped and integral floats as ints.

    The original tools keep the database as pydantic models, whose dumps carry optional fields as
    None and numbers as the model's type (a gift card's 100 as 100.0); ours keep the JSON as
    loaded. Both sides hash this form, so equal states hash equal.
    """
    if isinstance(value, dict):
        return {key: canonical(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [canonical(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def db_hash(db: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a database (keys sorted)."""
    text = json.dumps(canonical(db), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
