"""inspect-evals' own tau2 verdicts on answers given as JSON (run in .venv-inspect).

Reads a JSON list of `{domain, task_id, actions, said}` on stdin and writes, per answer, the
verdicts of inspect-evals' `db_match` (the original tools after `actions`, through its
`testing_mock_predicted_db` hook) and `score_communicated_info` (on `said` as the agent's one
message to the customer): `[{"db": bool, "info": bool}, ...]` on stdout. Used by
`conveyor tasks parity tau2` (src/conveyor/tasks/tau2/parity.py); build the venv with
scripts/venv-inspect.sh.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import sys
import uuid
from types import SimpleNamespace
from typing import Any

import inspect_evals.tau2.common.scorer as scorer_module
from inspect_ai.model import ChatMessageUser
from inspect_ai.scorer import CORRECT, Target
from inspect_ai.tool import ToolError
from inspect_evals.tau2.airline.AirlineAgentTools import AirlineAgentTools
from inspect_evals.tau2.common.metadata import Tau2MetaData
from inspect_evals.tau2.common.scorer import db_match, score_communicated_info
from inspect_evals.tau2.data_model.tasks import Task
from inspect_evals.tau2.retail.RetailAgentTools import RetailAgentTools

# Tools that are not methods of the domain's tool class and touch no database (as
# inspect-evals' get_expected_db skips them).
NO_DATABASE = {"calculate", "transfer_to_human_agents"}


def records(domain: str) -> dict[str, dict[str, Any]]:
    spec = importlib.util.find_spec("inspect_evals")
    assert spec is not None and spec.submodule_search_locations
    folder = next(iter(spec.submodule_search_locations))
    path = f"{folder}/tau2/data/domains/{domain}/tasks.json"
    with open(path, encoding="utf-8") as handle:
        return {str(r["id"]): r for r in json.load(handle)}


# Speed only, verdicts unchanged: the initial database is parsed once per domain and each
# answer's tools get a deep copy of it; `db_match`'s expected database (the reference actions
# replayed by inspect-evals' own `get_expected_db`) is computed once per task.
_INITIAL: dict[str, Any] = {}
_EXPECTED: dict[tuple[str, str], Any] = {}
_original_expected = scorer_module.get_expected_db


def _fresh(domain: str) -> Any:
    cls = AirlineAgentTools if domain == "airline" else RetailAgentTools
    if domain not in _INITIAL:
        tools = cls(instance=f"parity_initial_{domain}")
        tools.initialize()
        _INITIAL[domain] = tools.db
    tools = cls(instance=f"parity_{uuid.uuid4().hex}")
    tools.initialized = True
    tools.db = copy.deepcopy(_INITIAL[domain])
    return tools


async def verdict(case: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> dict[str, bool]:
    domain = case["domain"]
    key = (domain, case["task_id"])
    if key not in _EXPECTED:
        _EXPECTED[key] = _original_expected(
            domain, Task.model_validate(tasks[case["task_id"]]).evaluation_criteria.actions or []
        )
    scorer_module.get_expected_db = lambda _domain, _actions: _EXPECTED[key]
    tools = _fresh(domain)
    for action in case["actions"]:
        if action["name"] in NO_DATABASE:
            continue
        try:
            getattr(tools, action["name"])(**action["arguments"])
        except (ToolError, TypeError, ValueError, KeyError):
            pass  # a failed call leaves what it left, as for an agent
    task = Task.model_validate(tasks[case["task_id"]])
    metadata = Tau2MetaData(instance=f"parity_{uuid.uuid4().hex}", task=task)
    state = SimpleNamespace(
        metadata=metadata.model_dump(), messages=[ChatMessageUser(content=case["said"])]
    )
    db = await db_match(domain=domain, testing_mock_predicted_db=tools)(state, Target(""))
    info = await score_communicated_info()(state, Target(""))
    return {"db": db.value == CORRECT, "info": info.value == CORRECT}


async def main() -> None:
    cases = json.load(sys.stdin)
    tasks = {d: records(d) for d in ("airline", "retail")}
    out = [await verdict(case, tasks[case["domain"]]) for case in cases]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
