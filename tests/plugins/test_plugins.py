"""Parts added from outside the package: a dispatch strategy and an engine (each with options of
its own), advantage estimators (one with options), a policy loss, a training backend and a
task family, each one file in tests/plugins/parts plus a registration, named in a YAML
config through `plugins:` and run by the real commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.config import ConfigError, load_config
from conveyor.dispatch.config import DispatchSettings
from conveyor.trainer.advantages import build_advantage

PARTS = Path(__file__).parent / "parts"
PLUGINS = ["serial_strategy", "centred_advantage", "counting_engine", "echo_family"]
CONFIG = f"""\
plugins: [{", ".join(PLUGINS)}]
engine:
  kind: counting_vllm
  options: {{tag: counted}}
  max_num_seqs: 8
  kv_cache_gib: 0.5
sampling:
  temperature: 1.0
  sampling_seed: 0
agent:
  max_turns: 2
  max_completion_tokens: 32
  max_prompt_tokens: 900
  max_context_tokens: 1024
tasks:
  families: [echo]
  num_tasks: 4
  group_size: 2
dispatch:
  strategy:
    name: serial
    options: {{label: one_by_one}}
  max_live_runtimes: 96
rl:
  steps: 1
  tasks_per_step: 2
  advantage: centred
  export_final: false
  eval:
    tasks: 2
  checkpoints:
    every: 0
trainer:
  lr: 1.0e-6
  micro_batch_tokens: 1024
"""


def conveyor(*args: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{PARTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if log is not None:
        env["CONVEYOR_PLUGIN_LOG"] = str(log)
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def test_config_names_plugin_parts_and_refuses_them_without_the_plugin(tmp_path: Path) -> None:
    config = tmp_path / "plugins.yaml"
    config.write_text(CONFIG)
    shown = conveyor("config", "show", str(config))
    assert shown.returncode == 0, shown.stderr
    for line in ("dispatch.strategy", "rl.advantage", "engine.kind", "tasks.families"):
        assert any(line in row for row in shown.stdout.splitlines())
    assert '"counting_vllm"' in shown.stdout and '"serial"' in shown.stdout
    # without the plugin list the names are unknown, and the error says how to make them known
    bare = tmp_path / "bare.yaml"
    bare.write_text(CONFIG.replace(f"plugins: [{', '.join(PLUGINS)}]\n", ""))
    refused = conveyor("config", "show", str(bare))
    assert refused.returncode == 2
    assert "unknown engine kind 'counting_vllm'" in refused.stderr
    assert "plugins:" in refused.stderr
    # a plugin module that does not import is named
    broken = tmp_path / "broken.yaml"
    broken.write_text(CONFIG.replace("echo_family]", "echo_family, no_such_module]"))
    failed = conveyor("config", "show", str(broken))
    assert failed.returncode == 2 and "'no_such_module' cannot be imported" in failed.stderr


def test_a_plugin_strategy_and_engine_get_typed_options_from_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dispatch.strategy` and `engine.options` are checked at load by the plugin part's own
    options model (nothing is built): the config holds that model's instance, and the built
    strategy reads it from its settings."""
    monkeypatch.syspath_prepend(str(PARTS))
    config = tmp_path / "plugins.yaml"
    config.write_text(CONFIG)
    loaded = load_config(config).config
    strategy = loaded.dispatch.strategy
    assert strategy.name == "serial"
    assert type(strategy.options).__name__ == "SerialOptions"
    assert strategy.options.model_dump() == {"label": "one_by_one"}
    assert type(loaded.engine.options).__name__ == "CountingOptions"
    assert loaded.engine.options.model_dump() == {"tag": "counted"}
    # the dispatcher's settings carry them to the strategy the factory builds
    settings = DispatchSettings.from_config(loaded)
    assert settings.strategy.options == strategy.options
    # overrides reach one option, as for a built-in part
    overridden = load_config(
        config, ["dispatch.strategy.options.label=other", "engine.options.tag=again"]
    ).config
    assert overridden.dispatch.strategy.options.model_dump() == {"label": "other"}
    assert overridden.engine.options.model_dump() == {"tag": "again"}
    # a plain name still works, with the part's default options
    plain = load_config(config, ["dispatch.strategy=serial"]).config
    assert plain.dispatch.strategy.options.model_dump() == {"label": "serial"}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("dispatch.strategy.options.lable=x", "dispatch.strategy.options.lable"),
        ("dispatch.strategy.options.label=3", "dispatch.strategy.options.label"),
        ("engine.options.tag=", "engine.options.tag"),
        ("engine.options.tags=x", "engine.options.tags"),
        ("dispatch.executor.options.workers=2", "dispatch.executor.options.workers"),
        ("runtime.options.size=2", "runtime.options"),
    ],
)
def test_bad_options_of_a_plugin_strategy_or_engine_are_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, override: str, key: str
) -> None:
    monkeypatch.syspath_prepend(str(PARTS))
    config = tmp_path / "plugins.yaml"
    config.write_text(CONFIG)
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(config, [override])


def test_an_advantage_without_options_named_in_yaml_is_what_the_rl_loop_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rl.advantage: centred` (a plugin estimator with no options of its own), built as the RL
    loop builds it (`build_advantage` of the loaded config's choice) and called on a step's
    groups. The training run below names the estimator with options instead: one run covers
    every other plugin part, and this estimator's own code runs here."""
    monkeypatch.syspath_prepend(str(PARTS))
    log = tmp_path / "plugin.log"
    monkeypatch.setenv("CONVEYOR_PLUGIN_LOG", str(log))
    config = tmp_path / "plugins.yaml"
    config.write_text(CONFIG)
    choice = load_config(config).config.rl.advantage
    assert choice.name == "centred"
    estimator = build_advantage(choice.name, choice.options)
    assert estimator([[1.0, 0.0], [0.5, 0.5]]) == [[0.5, -0.5], [0.0, 0.0]]
    assert log.read_text().splitlines() == ["advantage centred 2 groups"]


# Parts that take options of their own: an advantage estimator, a policy loss and a training
# backend, each one file in tests/plugins/parts, named with typed options in YAML.
OPTION_PLUGINS = ["shifted_advantage", "reinforce_loss", "counting_backend", "echo_family"]


ADVANTAGE_WITH_OPTIONS = (
    "  advantage:\n    name: shifted\n    options: {baseline: 0.25, scale: 2.0}\n"
)


def trainer_with_options(backend_log: Path) -> str:
    """The `trainer:` line of CONFIG with a plugin loss and backend, each with options."""
    return (
        "trainer:\n  loss:\n    name: reinforce\n    options: {coef: 0.5}\n"
        f"  backend:\n    name: counting\n    options: {{log: {backend_log}}}\n"
    )


def options_config(backend_log: Path) -> str:
    return (
        CONFIG.replace(
            f"plugins: [{', '.join(PLUGINS)}]", f"plugins: [{', '.join(OPTION_PLUGINS)}]"
        )
        .replace("  kind: counting_vllm\n  options: {tag: counted}\n", "  kind: vllm\n")
        .replace(
            "  strategy:\n    name: serial\n    options: {label: one_by_one}\n",
            "  strategy: pipeline\n",
        )
        .replace("  advantage: centred\n", ADVANTAGE_WITH_OPTIONS)
        .replace("trainer:\n", trainer_with_options(backend_log))
    )


def test_plugin_parts_get_typed_options_from_yaml(tmp_path: Path) -> None:
    config = tmp_path / "options.yaml"
    config.write_text(options_config(tmp_path / "backend.log"))
    shown = conveyor("config", "show", str(config))
    assert shown.returncode == 0, shown.stderr
    rows = {row.split()[0]: row for row in shown.stdout.splitlines() if " = " in row}
    assert '"name": "shifted"' in rows["rl.advantage"]
    assert '"baseline": 0.25, "scale": 2.0' in rows["rl.advantage"]
    assert '{"name": "reinforce", "options": {"coef": 0.5}}' in rows["trainer.loss"]
    assert '"name": "counting"' in rows["trainer.backend"]
    # an option of a plugin part set from the command line, like a built-in's
    overridden = conveyor("config", "show", str(config), "--set", "rl.advantage.options.scale=3.0")
    assert overridden.returncode == 0, overridden.stderr
    assert '"scale": 3.0' in overridden.stdout


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        (
            "options: {baseline: 0.25, scale: 2.0}",
            "options: {baseline: 0.25, scale: -1.0}",
            "rl.advantage.options.scale",
        ),
        (
            "options: {baseline: 0.25, scale: 2.0}",
            "options: {basline: 0.25}",
            "rl.advantage.options.basline",
        ),
        ("options: {coef: 0.5}", "options: {coef: fast}", "trainer.loss.options.coef"),
        ("    options: {log:", "    options: {path:", "trainer.backend.options.path"),
    ],
)
def test_bad_options_of_a_plugin_part_are_refused_naming_the_key(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    config = tmp_path / "bad.yaml"
    text = options_config(tmp_path / "backend.log")
    assert old in text
    config.write_text(text.replace(old, new))
    refused = conveyor("config", "show", str(config))
    assert refused.returncode == 2 and key in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def every_part_config(backend_log: Path) -> str:
    """CONFIG (a plugin strategy and engine with their options, the echo family) with the
    parts of `options_config` (advantage, loss and backend with their options) added: what one
    training run names."""
    plugins = ["serial_strategy", "counting_engine", *OPTION_PLUGINS]
    return (
        CONFIG.replace(f"plugins: [{', '.join(PLUGINS)}]", f"plugins: [{', '.join(plugins)}]")
        .replace("  advantage: centred\n", ADVANTAGE_WITH_OPTIONS)
        .replace("trainer:\n", trainer_with_options(backend_log))
    )


@pytest.mark.slow
def test_a_training_run_uses_every_plugin_part_with_its_options(
    tmp_path: Path, model_dir: Path
) -> None:
    """One `conveyor train` names a plugin strategy, engine, advantage, loss, backend and
    family, each with options from YAML (the advantage without options is the test above)."""
    config = tmp_path / "plugins.yaml"
    backend_log = tmp_path / "backend.log"
    config.write_text(every_part_config(backend_log))
    log = tmp_path / "plugin.log"
    run_dir = tmp_path / "run"
    done = conveyor("train", str(config), "--set", f"run.dir={run_dir}", log=log)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = log.read_text().splitlines()
    # the strategy ran the evaluation before, the step's 4 rollouts and the evaluation after,
    # and the strategy and the engine each logged under the label their YAML options gave
    assert lines.count("strategy one_by_one 2 rollouts") == 2
    assert "strategy one_by_one 4 rollouts" in lines
    assert sum(1 for line in lines if line == "engine counted request") >= 8
    assert "advantage shifted baseline=0.25 scale=2.0" in lines
    assert "loss reinforce coef=0.5" in lines
    assert backend_log.read_text().splitlines()[0].startswith("backend counting update 1 ")
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 and all(r["task_id"].startswith("echo-train-") for r in rollouts)
    (metrics,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics["step"] == 1
