"""Our trajectories as SkyRL's `GeneratorOutput`, judged by SkyRL's own validation.

The validation is SkyRL 0.4.0's `validate_generator_output` taken from the pinned wheel (fetched
from PyPI once into ~/.cache/conveyor/wheels) and executed here: its module imports torch and
ray, which SkyRL's Python 3.12 cannot get on this machine. The trajectories are hand-made token
records here; `test_skyrl_generator.py` makes real ones with the embedded model.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from conveyor.bridges.report import BridgeUnavailable, CheckReport
from conveyor.bridges.skyrl import SkyrlSpec, read_batch, to_generator_output
from conveyor.bridges.skyrl.bridge_check import add_field_checks
from conveyor.bridges.skyrl.generator import WRITTEN_KEYS, ConveyorGenerator
from conveyor.bridges.skyrl.sampling import to_sampling
from conveyor.bridges.skyrl.validation import (
    SkyrlSource,
    TrajectoryRef,
    load_validator,
    validate,
)
from conveyor.bridges.skyrl.wheel import parse_wheel, pinned_wheel
from conveyor.config import SamplingConfig
from conveyor.registry import BACKENDS
from conveyor.trainer.backend import BackendUnavailable
from conveyor.types import Status, Task, Trajectory, Turn

# GeneratorOutput fields SkyRL declares that our rollouts have nothing for: mixture-of-experts
# routes, timing splits, per-row env metrics, vision inputs.
NOT_WRITTEN = {
    "trajectory_generation_times",
    "trajectory_time_splits",
    "rollout_expert_indices",
    "rollout_sample_support",
    "env_metrics",
    "pixel_values",
    "image_grid_thw",
}


@pytest.fixture(scope="module")
def skyrl() -> SkyrlSource:
    try:
        return parse_wheel(pinned_wheel())
    except BridgeUnavailable as exc:
        pytest.skip(f"the pinned SkyRL wheel cannot be fetched here: {exc}")


def turn(prompt: list[int], completion: list[int], sample: int = 0) -> Turn:
    n = len(completion)
    return Turn(
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-0.5 - i for i in range(n)],
        loss_mask=[1] * n,
        sample_index=sample,
    )


def rollout(task_id: str, index: int = 0, *, split: bool = False, **fields: Any) -> Trajectory:
    """Two turns that keep the prefix property (one sample), or a split second turn."""
    turns = [turn([1, 2, 3], [4, 5]), turn([1, 2, 3, 4, 5, 6, 7], [8, 9, 10])]
    if split:
        turns[1] = turn([11, 12], [13], sample=1)
    return Trajectory(task_id=task_id, sample_index=index, turns=turns, reward=1.0, **fields)


def test_the_wheel_declares_every_key_we_write_and_we_write_all_but_side_channels(
    skyrl: SkyrlSource,
) -> None:
    fields = set(skyrl.generator_output)
    assert set(WRITTEN_KEYS) <= fields
    assert fields - set(WRITTEN_KEYS) == NOT_WRITTEN
    output = to_generator_output([rollout("a")], step_wise=False)
    assert set(output) == set(WRITTEN_KEYS)
    # What read_batch reads is what SkyRL's GeneratorInput holds.
    assert set(skyrl.generator_input) == {
        "prompts",
        "env_classes",
        "env_extras",
        "sampling_params",
        "trajectory_ids",
        "batch_metadata",
    }


def test_skyrls_validation_accepts_rollout_and_step_wise_rows(skyrl: SkyrlSource) -> None:
    validator = load_validator(skyrl)
    batch = [rollout("a"), rollout("a", 1, split=True), rollout("b")]
    plain = to_generator_output(batch, step_wise=False)
    assert validate(validator, 3, plain, step_wise=False) == ""
    # One row per rollout: the split rollout keeps its first sample, the other is counted.
    assert len(plain["response_ids"]) == 3
    assert plain["rollout_metrics"]["conveyor/dropped_samples"] == 1
    assert plain["is_last_step"] is None
    step_wise = to_generator_output(batch, step_wise=True)
    assert validate(validator, 3, step_wise, step_wise=True) == ""
    assert step_wise["is_last_step"] == [True, False, True, True]
    assert step_wise["rewards"] == [1.0, 0.0, 1.0, 1.0]  # the reward sits on the last step
    assert [r.to_string() for r in step_wise["trajectory_ids"]] == ["a_0", "a_1", "a_1", "b_0"]
    # Response ids, masks and logprobs are the sample's tail after its prompt.
    assert plain["prompt_token_ids"][0] == [1, 2, 3]
    assert plain["response_ids"][0] == [4, 5, 6, 7, 8, 9, 10]
    assert plain["loss_masks"][0] == [1, 1, 0, 0, 1, 1, 1]
    assert plain["rollout_logprobs"][0] == [-0.5, -1.5, 0.0, 0.0, -0.5, -1.5, -2.5]


def test_skyrls_validation_refuses_a_wrong_length_or_a_broken_step_order(
    skyrl: SkyrlSource,
) -> None:
    """The executed validation is a real judge: it fails outputs SkyRL's trainer would refuse."""
    validator = load_validator(skyrl)
    good = to_generator_output([rollout("a"), rollout("b")], step_wise=False)
    short_mask = {**good, "loss_masks": [good["loss_masks"][0][:-1], good["loss_masks"][1]]}
    assert "loss masks must have the same length" in validate(validator, 2, short_mask, False)
    missing_row = {**good, "rewards": good["rewards"][:1]}
    assert "rewards length must be equal" in validate(validator, 2, missing_row, False)
    assert "Mismatch between prompts" in validate(validator, 3, good, False)
    steps = to_generator_output([rollout("a", split=True)], step_wise=True)
    unordered = {**steps, "is_last_step": [True, True]}
    assert "is_last_step" in validate(validator, 1, unordered, True)


def test_field_checks_catch_a_key_skyrl_does_not_declare_and_a_wrong_type(
    skyrl: SkyrlSource,
) -> None:
    output = to_generator_output([rollout("a")], step_wise=False)
    report = CheckReport(backend="skyrl", version="test", samples=1)
    add_field_checks(report, "good", output, skyrl.generator_output)
    assert report.ok
    bad = {**output, "advantages": [[0.0]], "rewards": ["1.0"]}
    report = CheckReport(backend="skyrl", version="test", samples=1)
    add_field_checks(report, "bad", bad, skyrl.generator_output)
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert "advantages" in failed["keys are GeneratorOutput fields (bad)"]
    assert "rewards" in failed["values match GeneratorOutput annotations (bad)"]


def test_an_infra_error_row_trains_nothing_and_is_counted(skyrl: SkyrlSource) -> None:
    broken = rollout("b", status=Status.INFRA_ERROR).model_copy(update={"reward": None})
    output = to_generator_output([rollout("a"), broken], step_wise=False)
    assert output["loss_masks"][1] == [0] * len(output["response_ids"][1])
    assert output["rewards"][1] == 0.0
    assert output["rollout_metrics"]["conveyor/infra_errors"] == 1
    assert validate(load_validator(skyrl), 2, output, False) == ""
    empty = Trajectory(task_id="c", status=Status.INFRA_ERROR)
    output = to_generator_output([empty], step_wise=True)
    assert output["response_ids"] == [[]] and output["is_last_step"] == [True]


TASK = Task(id="filenav-1", family="filenav", prompt=[{"role": "user", "content": "find it"}])


def batch(**override: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "prompts": [TASK.prompt, TASK.prompt],
        "env_classes": ["conveyor", "filenav"],
        "env_extras": [{"task": TASK.model_dump_json()}, {"task": TASK.model_dump()}],
        "sampling_params": None,
        "trajectory_ids": [TrajectoryRef(TASK.id, 1), TrajectoryRef(TASK.id, 0)],
        "batch_metadata": None,
    }
    data.update(override)
    return data


def test_read_batch_takes_the_task_from_env_extras_and_the_repetition_id() -> None:
    tasks, indices = read_batch(batch())
    assert [t.id for t in tasks] == [TASK.id, TASK.id] and indices == [1, 0]
    tasks, indices = read_batch(batch(trajectory_ids=None))
    assert indices == [0, 1]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"env_extras": [{}, {}]}, 'no "task"'),
        ({"env_classes": ["gsm8k", "conveyor"]}, "env_class 'gsm8k'"),
        ({"prompts": [[{"role": "user", "content": "x"}], TASK.prompt]}, "prompt differs"),
        ({"trajectory_ids": [TrajectoryRef(TASK.id, 0)] * 2}, "same task and repetition"),
        ({"env_extras": None}, "must carry each row's task"),
        ({"env_classes": ["conveyor"]}, "1 rows for 2 prompts"),
    ],
)
def test_read_batch_refuses_rows_it_cannot_run(override: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_batch(batch(**override))


def test_a_fixed_dispatcher_refuses_sampling_params_it_cannot_honour() -> None:
    generator = ConveyorGenerator.from_dispatcher(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"from_composition.*\['temperature'\]"):
        asyncio.run(generator.generate(batch(sampling_params={"temperature": 0.0})))
    assert generator.sampling({"logprobs": 1, "top_k": -1}) is None  # changes nothing


# What SkyRL-train 0.4.0 sends by default (`get_vllm_sampling_params` of its generator config).
SKYRL_DEFAULTS: dict[str, Any] = {
    "min_tokens": 1,
    "skip_special_tokens": True,
    "include_stop_str_in_output": True,
    "max_tokens": 1024,
    "temperature": 0.0,
    "top_p": 0.9,
    "top_k": -1,
    "min_p": 0.0,
    "logprobs": 1,
    "stop": None,
}


def test_skyrls_default_sampling_params_map_onto_ours_and_others_are_refused() -> None:
    base = SamplingConfig(temperature=1.0, top_p=1.0)
    ours = to_sampling(SKYRL_DEFAULTS, base, max_completion_tokens=256)
    assert ours == SamplingConfig(temperature=0.0, top_p=0.9)
    assert to_sampling({**SKYRL_DEFAULTS, "seed": 7}, base, 256).sampling_seed == 7  # type: ignore[union-attr]
    for key, value, message in [
        ("top_k", 20, "top_k=20"),
        ("min_p", 0.05, "min_p=0.05"),
        ("stop", ["</s>"], "stop="),
        ("max_tokens", 64, "below agent.max_completion_tokens=256"),
        ("repetition_penalty", 1.1, "repetition_penalty=1.1 (unknown)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            to_sampling({**SKYRL_DEFAULTS, key: value}, base, 256)


def test_the_spec_is_registered_describes_itself_and_refuses_to_build(tmp_path: Path) -> None:
    assert "skyrl" not in BACKENDS  # an external driver (`conveyor.bridges.drivers`)
    spec = SkyrlSpec()
    info = spec.info()
    assert info.name == "skyrl" and not info.train and not info.eval
    assert "Python >= 3.12" in info.reason and "GPU" in info.reason
    with pytest.raises(BackendUnavailable, match=r"venv-skyrl\.sh"):
        spec.build(None, tmp_path, None)  # type: ignore[arg-type]
    assert "conveyor train" in (spec.refusal(None, None) or "")  # type: ignore[arg-type]


def wrong_key(output: dict[str, Any]) -> dict[str, Any]:
    return {("loss_mask" if k == "loss_masks" else k): v for k, v in output.items()}


def wrong_length(output: dict[str, Any]) -> dict[str, Any]:
    return {**output, "rollout_logprobs": [row[:-1] for row in output["rollout_logprobs"]]}


@pytest.mark.parametrize(
    ("corrupt", "failing"),
    [
        (wrong_key, "keys are GeneratorOutput fields (rollout)"),
        (wrong_length, "skyrl validate_generator_output (rollout)"),
    ],
)
def test_bridge_check_exits_1_when_the_encoding_is_wrong(
    skyrl: SkyrlSource,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    corrupt: Any,
    failing: str,
) -> None:
    """`conveyor bridge check --backend skyrl` (fallback path) on hand-made rollouts: exit 0 as
    encoded, exit 1 naming the failed check when the encoder writes a wrong key or length."""
    from typer.testing import CliRunner

    from conveyor.bridges.skyrl import bridge_check as check_module
    from conveyor.cli import app

    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in (rollout("a"), rollout("b", split=True))))
    monkeypatch.setenv("CONVEYOR_SKYRL_VENV", str(tmp_path / "no-venv"))
    args = ["bridge", "check", "--backend", "skyrl", "--trajectories", str(path), "--json"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    real = check_module.to_generator_output
    monkeypatch.setattr(check_module, "to_generator_output", lambda *a, **k: corrupt(real(*a, **k)))
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 1, done.output
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["ok"]
    assert failing in {c["name"] for c in report["checks"] if not c["ok"]}


def test_bridge_check_exits_3_when_neither_venv_nor_wheel_can_be_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `.venv-skyrl`, an empty wheel cache and pip kept off PyPI (PIP_NO_INDEX, as with no
    network): unavailable, with pip's reason, not a failed or passed check."""
    from typer.testing import CliRunner

    from conveyor.cli import app

    path = tmp_path / "trajectories.jsonl"
    path.write_text(rollout("a").to_json() + "\n")
    monkeypatch.setenv("CONVEYOR_SKYRL_VENV", str(tmp_path / "no-venv"))
    monkeypatch.setenv("CONVEYOR_WHEEL_CACHE", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    args = ["bridge", "check", "--backend", "skyrl", "--trajectories", str(path), "--json"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 3, done.output
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["ok"] is False and "cannot download skyrl==0.4.0" in line["unavailable"]
