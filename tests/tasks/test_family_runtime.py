"""Families take the `runtime` settings when built: `auto` is their default kind, a kind they
cannot use is refused then, a registered runtime builds their rollouts' runtimes, and the agent
stages build each family once."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from conveyor.agent.chat import ChatRenderer
from conveyor.config import AgentConfig, RuntimeConfig, SamplingConfig
from conveyor.engines.simulated import SimulatedEngine
from conveyor.registry import FAMILIES, RUNTIMES, RuntimeSpec
from conveyor.rollout import AgentStages
from conveyor.runtime.selection import RuntimeRequest
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks import ArithmeticFamily, FileNavFamily
from conveyor.tasks.family import build_families, family_spec, get_family
from conveyor.types import Trajectory


@pytest.mark.parametrize("name", ["arithmetic", "filenav"])
@pytest.mark.parametrize("kind", ["auto", "simulated"])
def test_builtin_families_run_in_the_simulated_runtime(name: str, kind: str) -> None:
    family = get_family(name, RuntimeConfig(kind=kind))
    task = family.make_tasks(1, 0, "eval")[0]

    async def files() -> tuple[object, dict[str, str]]:
        runtime = await family.make_runtime(task)
        assert runtime.alive()
        await runtime.close()
        return runtime, runtime.files  # type: ignore[attr-defined]

    runtime, tree = asyncio.run(files())
    assert isinstance(runtime, SimulatedRuntime)
    assert tree == task.data.get("files", {})


@pytest.mark.parametrize("family", [ArithmeticFamily, FileNavFamily])
@pytest.mark.parametrize("kind", ["bubblewrap", "local"])
def test_a_family_refuses_at_start_a_runtime_kind_it_cannot_use(
    family: type[ArithmeticFamily], kind: str
) -> None:
    with pytest.raises(ValueError) as caught:
        get_family(family.name, RuntimeConfig(kind=kind))
    message = str(caught.value)
    assert f"runtime.kind {kind!r}" in message
    assert f"task family {family.name!r}" in message and "supports simulated" in message


class _Recording:
    """A user-registered runtime builder: a simulated runtime that remembers its request."""

    requests: ClassVar[list[RuntimeRequest]] = []

    def __call__(self, request: RuntimeRequest, settings: RuntimeConfig) -> SimulatedRuntime:
        self.requests.append(request)
        return SimulatedRuntime({**(request.files or {}), "/workspace/marker": settings.kind})


class _RecordingFileNav(FileNavFamily):
    name = "filenav_recording"
    runtimes = ("simulated", "recording")


def test_a_runtime_registered_by_a_user_builds_a_family_s_runtimes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        RUNTIMES._parts, "recording", RuntimeSpec(name="recording", build=_Recording())
    )
    monkeypatch.setitem(FAMILIES._parts, _RecordingFileNav.name, family_spec(_RecordingFileNav))
    _Recording.requests = []
    family = get_family(_RecordingFileNav.name, RuntimeConfig(kind="recording"))
    task = family.make_tasks(1, 0, "eval")[0]
    runtime = asyncio.run(family.make_runtime(task))
    assert [r.files for r in _Recording.requests] == [task.data["files"]]
    assert asyncio.run(runtime.read_file("/workspace/marker")) == "recording"


class _NoSettings(ArithmeticFamily):
    """A family written before families took runtime settings."""

    name = "arithmetic_no_settings"

    def __init__(self) -> None:
        super().__init__()


def test_a_family_without_runtime_settings_runs_only_with_auto(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(FAMILIES._parts, _NoSettings.name, family_spec(_NoSettings))
    assert isinstance(get_family(_NoSettings.name), _NoSettings)
    assert isinstance(get_family(_NoSettings.name, RuntimeConfig()), _NoSettings)
    with pytest.raises(ValueError, match=r"takes no runtime settings.*'auto', not 'simulated'"):
        get_family(_NoSettings.name, RuntimeConfig(kind="simulated"))


def test_build_families_builds_each_named_family_once() -> None:
    families = build_families(["arithmetic", "filenav", "arithmetic"], RuntimeConfig())
    assert list(families) == ["arithmetic", "filenav"]
    assert isinstance(families["filenav"], FileNavFamily)


class _Counted(ArithmeticFamily):
    name = "arithmetic_counted"
    built: ClassVar[list[RuntimeConfig]] = []

    def __init__(self, runtime: RuntimeConfig | None = None) -> None:
        super().__init__(runtime)
        self.built.append(self.runtime)


class _Tok:
    chat_template = "{{ messages }}"
    eos_token = "</s>"


def _stages(**kwargs: Any) -> AgentStages:
    return AgentStages(
        SimulatedEngine(),
        lambda schemas: ChatRenderer(_Tok(), schemas),  # type: ignore[arg-type]
        AgentConfig(),
        SamplingConfig(),
        rollout_timeout_s=10,
        **kwargs,
    )


def test_agent_stages_build_each_family_once_with_the_runtime_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(FAMILIES._parts, _Counted.name, family_spec(_Counted))
    _Counted.built = []
    settings = RuntimeConfig(kind="simulated")
    stages = _stages(runtime=settings)
    task = _Counted().make_tasks(1, 0, "eval")[0]
    _Counted.built = []

    async def twice() -> None:
        for sample in range(2):
            runtime = await stages.init(task, sample, 0)
            stages.loop_for(task)
            await stages.reward(task, Trajectory(task_id=task.id, sample_index=sample), runtime)
            await runtime.close()

    asyncio.run(twice())
    assert _Counted.built == [settings]


def test_agent_stages_use_the_families_they_are_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = ArithmeticFamily()

    def no_lookup(name: str, runtime: RuntimeConfig | None = None) -> None:
        raise AssertionError(f"family {name} looked up again")

    monkeypatch.setattr("conveyor.rollout.get_family", no_lookup)
    stages = _stages(families={"arithmetic": handed})
    task = handed.make_tasks(1, 0, "eval")[0]
    runtime = asyncio.run(stages.init(task, 0, 0))
    assert isinstance(runtime, SimulatedRuntime)
    assert stages.family("arithmetic") is handed
