"""The SWE hint: paging through files with `view` without searching suggests `search_code`."""

from __future__ import annotations

import json

from conveyor.agent.hints import TurnObservation
from conveyor.config import HintsConfig
from conveyor.tasks.swe.hints import SEARCH_HINT, VIEW_WITHOUT_SEARCH, SweHintPolicy


def _turn(index: int, *calls: tuple[str, dict[str, object]]) -> TurnObservation:
    key = json.dumps([{"name": n, "arguments": a, "id": ""} for n, a in calls], sort_keys=True)
    return TurnObservation(index, 20, [n for n, _ in calls], key, [], [], None)


def _view(line: int) -> tuple[str, dict[str, object]]:
    return "str_replace_editor", {
        "command": "view",
        "path": "/workspace/a.py",
        "view_range": [line, line + 40],
    }


def test_views_without_search_fire_once_per_run_of_views() -> None:
    policy = SweHintPolicy(HintsConfig())
    fired = [SEARCH_HINT in policy.hints_for(_turn(i, _view(40 * i))) for i in range(8)]
    assert fired == [False, False, False, True, False, False, False, True]
    assert policy.counts[VIEW_WITHOUT_SEARCH] == 2


def test_a_search_resets_the_count_and_other_tools_do_not_count() -> None:
    policy = SweHintPolicy(HintsConfig())
    turns = [
        _view(1),
        _view(50),
        _view(90),
        ("search_code", {"query": "parse"}),
        _view(1),
        ("bash", {"command": "ls"}),
        _view(2),
        _view(3),
    ]
    fired = [SEARCH_HINT in policy.hints_for(_turn(i, call)) for i, call in enumerate(turns)]
    assert not any(fired)
    assert SEARCH_HINT in policy.hints_for(_turn(9, _view(4)))


def test_hints_off_means_no_search_hint() -> None:
    policy = SweHintPolicy(HintsConfig(enabled=False))
    assert all(policy.hints_for(_turn(i, _view(i))) == [] for i in range(6))
    assert not policy.counts


def test_the_swe_family_brings_its_hint_policy_into_the_agent_loop() -> None:
    from conveyor.agent.chat import ChatRenderer
    from conveyor.config import AgentConfig, SamplingConfig
    from conveyor.engines.simulated import SimulatedEngine
    from conveyor.rollout import AgentStages
    from conveyor.tasks.swe.hints import SweHintPolicy
    from conveyor.types import Task

    class _Tok:
        chat_template = "{{ messages }}"
        eos_token = "</s>"

    stages = AgentStages(
        SimulatedEngine(),
        lambda schemas: ChatRenderer(_Tok(), schemas),  # type: ignore[arg-type]
        AgentConfig(),
        SamplingConfig(),
        rollout_timeout_s=10,
    )
    loop = stages.loop_for(Task(id="swe-x", family="swe", prompt=[]))
    assert loop.hint_policy is SweHintPolicy
    assert "search_code" in loop.tools and "str_replace_editor" in loop.tools
