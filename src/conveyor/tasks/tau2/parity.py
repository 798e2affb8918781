"""Parity of our tau2 grading with inspect-evals' own scorers, on gold and perturbed answers.

`conveyor tasks parity tau2` runs it (docs/benchmarks-bfcl-tau2.md has the numbers). An answer is
what an agent did (a sequence of tool calls) and what it said to the customer. Gold is each
task's reference actions and its required information said plainly; perturbations drop, repeat,
swap or alter actions, add another task's action, and drop, truncate, re-case or re-punctuate
what was said. Both sides judge each answer:

- ours: the actions through our ported tools (`replay`, the tool registry as a model's calls go)
  and the family's grader (`Tau2Family.judge`, with tau2-bench's rules: no foreign-info rule);
- upstream: inspect-evals' `db_match` (its `testing_mock_predicted_db` is the original tools
  after the same actions) and `score_communicated_info` on the same text, run in the side venv
  `.venv-inspect` (scripts/venv-inspect.sh: inspect-ai's dependencies stay out of ours) by
  scripts/tau2_upstream_verdicts.py.

A pair agrees when the database verdicts and the information verdicts are equal.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

from conveyor.tasks.family import FamilyServices
from conveyor.tasks.tau2 import data
from conveyor.tasks.tau2.common import Tau2Runtime
from conveyor.tasks.tau2.family import Tau2Family, replay, sources
from conveyor.types import Task

ROOT = Path(__file__).resolve().parents[4]
UPSTREAM_SCRIPT = ROOT / "scripts" / "tau2_upstream_verdicts.py"


def _venv_python() -> Path:
    venv = Path(os.environ.get("CONVEYOR_INSPECT_VENV", ROOT / ".venv-inspect"))
    return venv / "bin" / "python"


def _changed(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1])
    if isinstance(value, float):
        return round(value + 1.5, 2)
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1") if value else "x"
    if isinstance(value, list):
        return value[:-1]
    return value


def _said(info: list[str]) -> str:
    return "Here is what you asked about: " + "; ".join(info) + "." if info else "All done."


def _perturb(
    record: dict[str, Any], pool: list[dict[str, Any]], rng: random.Random, kind: str
) -> tuple[list[dict[str, Any]], str] | None:
    criteria = record["evaluation_criteria"]
    actions = [dict(a) for a in criteria.get("actions") or []]
    info = [str(i) for i in criteria.get("communicate_info") or []]
    text = _said(info)
    if kind == "drop_action" and actions:
        del actions[rng.randrange(len(actions))]
    elif kind == "repeat_action" and actions:
        i = rng.randrange(len(actions))
        actions.insert(i, actions[i])
    elif kind == "swap_actions" and len(actions) > 1:
        i = rng.randrange(len(actions) - 1)
        actions[i], actions[i + 1] = actions[i + 1], actions[i]
    elif kind == "mutate_argument" and any(a.get("arguments") for a in actions):
        i = rng.choice([n for n, a in enumerate(actions) if a.get("arguments")])
        arguments = dict(actions[i]["arguments"])
        key = rng.choice(sorted(arguments))
        arguments[key] = _changed(arguments[key], rng)
        actions[i] = {**actions[i], "arguments": arguments}
    elif kind == "foreign_action" and pool:
        other = rng.choice(pool)
        actions.insert(rng.randrange(len(actions) + 1), dict(other))
    elif kind == "drop_info" and info:
        text = _said([i for n, i in enumerate(info) if n != rng.randrange(len(info))])
    elif kind == "truncate_info" and info:
        n = rng.randrange(len(info))
        text = _said([i[: max(1, len(i) // 2)] if k == n else i for k, i in enumerate(info)])
    elif kind == "recase_info" and info:
        text = _said(info).upper()
    elif kind == "comma_info" and any(any(c.isdigit() for c in i) for i in info):
        text = _said([_commas(i) for i in info])
    elif kind == "nothing":
        actions, text = [], ""
    else:
        return None
    return actions, text


def _commas(text: str) -> str:
    """Thousands separators in every run of 4+ digits ("1234" -> "1,234")."""
    out, digits = [], ""
    for char in text + " ":
        if char.isdigit():
            digits += char
            continue
        if len(digits) >= 4:
            digits = f"{int(digits):,}" if not digits.startswith("0") else digits
        out.append(digits + char)
        digits = ""
    return "".join(out)[:-1]


KINDS = (
    "drop_action",
    "repeat_action",
    "swap_actions",
    "mutate_argument",
    "foreign_action",
    "drop_info",
    "truncate_info",
    "recase_info",
    "comma_info",
    "nothing",
)


def cases(n_perturbed: int, seed: int = 0, gold: bool = True) -> list[dict[str, Any]]:
    """Every task's gold answer (with `gold`) and `n_perturbed` perturbed answers, tasks and
    kinds taken in turn in an order fixed by `seed`: `{domain, task_id, kind, actions, said}`."""
    rng = random.Random(seed)
    records = [(d, s.record) for d in data.DOMAINS for s in sources(d)]
    pools = {
        d: [
            a
            for domain, r in records
            if domain == d
            for a in r["evaluation_criteria"].get("actions") or []
        ]
        for d in data.DOMAINS
    }
    out: list[dict[str, Any]] = []
    if gold:
        for domain, record in records:
            criteria = record["evaluation_criteria"]
            out.append(
                {
                    "domain": domain,
                    "task_id": str(record["id"]),
                    "kind": "gold",
                    "actions": criteria.get("actions") or [],
                    "said": _said([str(i) for i in criteria.get("communicate_info") or []]),
                }
            )
    order = records[:]
    rng.shuffle(order)
    made = attempt = 0
    while made < n_perturbed and attempt < n_perturbed * 20:
        domain, record = order[attempt % len(order)]
        kind = KINDS[attempt % len(KINDS)]
        attempt += 1
        perturbed = _perturb(record, pools[domain], rng, kind)
        if perturbed is None:
            continue
        actions, said = perturbed
        out.append(
            {
                "domain": domain,
                "task_id": str(record["id"]),
                "kind": kind,
                "actions": actions,
                "said": said,
            }
        )
        made += 1
    return out


async def ours(case: dict[str, Any]) -> dict[str, bool]:
    """Our grader's verdicts: the actions through our tools, the family's `judge`."""
    family = Tau2Family(
        services=FamilyServices(options={"include_unverifiable": True, "max_foreign_info": None})
    )
    task: Task = family.task_of(case["domain"], case["task_id"])
    world = Tau2Runtime(case["domain"], await replay(case["domain"], case["actions"]))
    world.heard.append(case["said"])
    grade = await family.judge(task, world, [])
    return {"db": bool(grade.breakdown["db"]), "info": bool(grade.breakdown["info"])}


def upstream(chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """inspect-evals' verdicts, from the side venv (`RuntimeError` when it is not built)."""
    python = _venv_python()
    if not python.exists():
        raise RuntimeError(
            f"no {python}: build the side venv with scripts/venv-inspect.sh (inspect-ai and "
            "inspect-evals, kept out of the main venv)"
        )
    done = subprocess.run(
        [str(python), str(UPSTREAM_SCRIPT)],
        input=json.dumps(chosen),
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{UPSTREAM_SCRIPT.name} failed: {done.stderr[-2000:]}")
    verdicts: list[dict[str, Any]] = json.loads(done.stdout)
    return verdicts


def compare(chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """Both sides' verdicts on every case; a JSON-ready report with the disagreements."""
    theirs = upstream(chosen)
    mine = asyncio.run(_all_ours(chosen))
    by_kind: dict[str, dict[str, int]] = {}
    mismatches: list[dict[str, Any]] = []
    agree = 0
    for case, a, b in zip(chosen, mine, theirs, strict=True):
        same = a["db"] == b["db"] and a["info"] == b["info"]
        row = by_kind.setdefault(case["kind"], {"n": 0, "agree": 0, "upstream_pass": 0})
        row["n"] += 1
        row["agree"] += int(same)
        row["upstream_pass"] += int(b["db"] and b["info"])
        agree += int(same)
        if not same:
            mismatches.append(
                {k: case[k] for k in ("domain", "task_id", "kind")} | {"ours": a, "upstream": b}
            )
    return {
        "scorer": "inspect-evals tau2 db_match + score_communicated_info",
        "cases": len(chosen),
        "agree": agree,
        "by_kind": by_kind,
        "mismatches": mismatches[:50],
        "ok": agree == len(chosen),
    }


async def _all_ours(chosen: list[dict[str, Any]]) -> list[dict[str, bool]]:
    return [await ours(case) for case in chosen]


def run_parity(n_perturbed: int, seed: int = 0) -> dict[str, Any]:
    """`conveyor tasks parity tau2`: every task's gold answer and `n_perturbed` perturbed."""
    return compare(cases(n_perturbed, seed))
