"""The VeRL bridge: our samples as VeRL's one sequence per rollout, checked by VeRL's own
agent-loop post-processing in .venv-verl; the backend spec; the exported dataset's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.bridges.drivers import EXTERNAL_DRIVERS
from conveyor.bridges.report import BridgeUnavailable
from conveyor.bridges.verl import VENV_ENV, VerlSpec, check
from conveyor.bridges.verl.dataset import AGENT_NAME, rows
from conveyor.bridges.verl.sequence import VerlSequence
from conveyor.config import ConveyorConfig
from conveyor.registry import BACKENDS
from conveyor.trainer.backend import BackendUnavailable
from conveyor.types import Task, TrainingSample, Trajectory, Turn

SRC = Path(__file__).parents[3] / "src"


def test_sequence_splits_a_sample_at_its_first_prompt() -> None:
    sample = TrainingSample(
        input_ids=[1, 2, 3, 10, 11, 20, 21, 12],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0],
        prompt_length=3,
    )
    seq = VerlSequence.from_sample(sample, reward=1.0, num_turns=5)
    assert seq.prompt_ids == [1, 2, 3]
    assert seq.response_ids == [10, 11, 20, 21, 12]
    assert seq.response_mask == [1, 1, 0, 0, 1]
    assert seq.response_logprobs == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert (seq.reward_score, seq.num_turns, seq.dropped_samples) == (1.0, 5, 0)


def test_sequence_refuses_a_logprob_on_an_untrained_token() -> None:
    sample = TrainingSample(
        input_ids=[1, 2, 3], loss_mask=[0, 1, 0], logprobs=[0.0, -0.5, -0.1], prompt_length=1
    )
    with pytest.raises(ValueError, match="nonzero logprob"):
        VerlSequence.from_sample(sample, reward=0.0, num_turns=2)


def test_sequence_keeps_the_first_sample_and_counts_the_dropped_ones() -> None:
    turns = [
        Turn(prompt_ids=[1, 2], completion_ids=[3], completion_logprobs=[-0.1], loss_mask=[1]),
        # the template broke the prefix: a new sample starts
        Turn(
            prompt_ids=[1, 9, 3, 4],
            completion_ids=[5],
            completion_logprobs=[-0.2],
            loss_mask=[1],
            sample_index=1,
        ),
    ]
    messages = [{"role": "user", "content": "q"}, {"role": "answer", "content": "a", "_meta": True}]
    trajectory = Trajectory(task_id="t", turns=turns, messages=messages, reward=0.0)
    seq = VerlSequence.from_trajectory(trajectory)
    assert seq is not None
    assert (seq.prompt_ids, seq.response_ids, seq.dropped_samples) == ([1, 2], [3], 1)
    assert seq.num_turns == 1  # the answer record is bookkeeping, not a chat message
    assert VerlSequence.from_trajectory(Trajectory(task_id="t")) is None


def test_spec_says_vERL_drives_training_and_build_says_how() -> None:
    assert "verl" not in BACKENDS  # an external driver (`conveyor.bridges.drivers`)
    spec = VerlSpec()
    info = spec.info()
    assert (info.name, info.train, info.eval) == ("verl", False, False)
    assert "FSDP" in info.sync and "CUDA GPU" in info.reason
    with pytest.raises(BackendUnavailable, match=r"export-dataset.*main_ppo"):
        spec.build(ConveyorConfig(), Path("."), ConveyorConfig().trainer)
    assert "conveyor train" in (spec.refusal(ConveyorConfig(), object()) or "")


def test_check_is_unavailable_without_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VENV_ENV, str(tmp_path / "nowhere"))
    assert EXTERNAL_DRIVERS["verl"]().version is None
    with pytest.raises(BridgeUnavailable, match=r"venv-verl\.sh"):
        check(tmp_path / "t.jsonl")


def test_dataset_rows_carry_the_task_and_the_resolved_config(
    verl_config: ConveyorConfig,
) -> None:
    config = verl_config
    assert config.tasks.families == ["arithmetic", "filenav"]
    out = rows(config, split="eval", n=2)
    assert len(out) == 4
    assert [r["extra_info"]["index"] for r in out] == [0, 1, 2, 3]
    for row in out:
        task = Task.model_validate_json(row["extra_info"]["task"])
        assert row["agent_name"] == AGENT_NAME
        assert row["data_source"] == f"conveyor/{task.family}"
        assert task.split == "eval" and row["extra_info"]["family"] == task.family
        assert row["prompt"] == [{"role": m["role"], "content": m["content"]} for m in task.prompt]
        again = ConveyorConfig.model_validate_json(row["extra_info"]["conveyor_config"])
        assert again == config and again.agent.max_turns == 5
    with pytest.raises(ValueError, match="unknown split"):
        rows(config, split="dev", n=1)
    with pytest.raises(ValueError, match="at least 1"):
        rows(config, split="eval", n=0)


@pytest.mark.slow
def test_bridge_check_verl_on_real_rollouts(trajectories_file: Path, verl_python: Path) -> None:
    """`conveyor bridge check --backend verl` on real oracle and HFEngine rollouts: VeRL's
    _agent_loop_postprocess + _postprocess give back exactly our samples."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "conveyor.cli", "bridge", "check", "--backend", "verl"),
            *("--trajectories", str(trajectories_file), "--json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] is True and report["backend"] == "verl"
    assert report["version"] == "0.9.1"
    assert report["samples"] == len(trajectories_file.read_text().splitlines())
    names = {c["name"] for c in report["checks"]}
    assert {"sequence", "mask", "logprobs", "score", "input_ids"} <= names


@pytest.mark.slow
def test_check_counts_the_dropped_samples_of_a_handmade_split(
    trajectories_file: Path, verl_python: Path, tmp_path: Path
) -> None:
    """A real oracle rollout whose later turns are relabelled as a second sample (a split made
    by hand: the quickstart template never splits) keeps its first sample and counts one."""
    real = [Trajectory.from_json(line) for line in trajectories_file.read_text().splitlines()]
    source = next(t for t in real if len(t.turns) >= 2 and t.reward == 1.0)
    turns = [source.turns[0]] + [t.model_copy(update={"sample_index": 1}) for t in source.turns[1:]]
    split = source.model_copy(update={"turns": turns})
    path = tmp_path / "split.jsonl"
    path.write_text(split.to_json() + "\n" + source.to_json() + "\n")
    report = check(path)
    assert report.ok, report.dumps()
    counted = next(c for c in report.checks if c.name == "dropped_samples_counted")
    assert counted.detail.startswith("1 split samples dropped"), counted.detail


def test_export_dataset_command_refuses_bad_input_clearly(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from conveyor.bridges.verl.dataset import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a group of two, so the command is named
    config = Path(__file__).parents[3] / "configs" / "quickstart-eval.yaml"
    out = tmp_path / "t.parquet"
    base = ["export-dataset", "--config", str(config), "--out", str(out)]
    for extra, message in (
        (["--split", "dev"], "unknown split"),
        (["--n", "0"], "at least 1"),
        (["--set", "agent.nope=1"], "nope"),
    ):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2, result.output
        assert message in result.output
    assert not out.exists()


@pytest.mark.slow
def test_export_dataset_command_writes_the_parquet(verl_python: Path, tmp_path: Path) -> None:
    """The command in .venv-verl (which has pyarrow), read back with pyarrow."""
    script = """
import sys, typer, pyarrow.parquet as pq
from typer.testing import CliRunner
from conveyor.bridges.verl.dataset import register
app = typer.Typer(); register(app); app.command("noop")(lambda: None)
r = CliRunner().invoke(app, ["export-dataset", "--config", sys.argv[1], "--out", sys.argv[2],
    "--split", "eval", "--n", "3", "--set", "agent.max_turns=7"])
assert r.exit_code == 0, r.output
print(r.output.strip().splitlines()[-1])
t = pq.read_table(sys.argv[2]).to_pylist()
import json; print(json.dumps(t))
"""
    config = Path(__file__).parents[3] / "configs" / "quickstart-eval.yaml"
    out = tmp_path / "eval.parquet"
    done = subprocess.run(
        [str(verl_python), "-c", script, str(config), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary, table = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert summary == {"rows": 6, "out": str(out), "split": "eval"}
    assert [r["extra_info"]["index"] for r in table] == list(range(6))
    for row in table:
        assert row["agent_name"] == "conveyor"
        config_of_row = ConveyorConfig.model_validate_json(row["extra_info"]["conveyor_config"])
        assert config_of_row.agent.max_turns == 7  # --set overrides travel with the row
        assert Task.model_validate_json(row["extra_info"]["task"]).split == "eval"
