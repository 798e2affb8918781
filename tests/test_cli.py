"""The command line: light imports, model errors, doctor's JSON contract, config show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chat_templates import TEMPLATES

HEAVY = ("torch", "vllm", "ray", "transformers")


def conveyor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_import_and_help_load_no_heavy_module() -> None:
    code = (
        "import sys, conveyor, conveyor.cli\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(conveyor.cli.app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "for sub in (['bench', '--help'], ['models', '--help'], ['eval', '--help']):\n"
        "    assert CliRunner().invoke(conveyor.cli.app, sub).exit_code == 0\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_missing_model_path_is_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    result = conveyor("doctor", str(missing))
    assert result.returncode == 2
    assert str(missing) in result.stderr and "conveyor models prepare" in result.stderr
    assert "Traceback" not in result.stderr


def test_broken_model_folder_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = conveyor("doctor", str(tmp_path))
    assert result.returncode == 2 and "no weights" in result.stderr


def test_doctor_json_contract(model_dir: Path) -> None:
    ok = conveyor("doctor", str(model_dir), "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout.strip().splitlines()[-1])
    assert report["consistent"] is True and report["splits"] == 0
    bad = conveyor(
        "doctor", str(model_dir), "--json", "--chat-template", str(TEMPLATES / "qwen3.jinja")
    )
    assert bad.returncode != 0
    report = json.loads(bad.stdout.strip().splitlines()[-1])
    assert report["consistent"] is False and report["splits"] > 0
    assert report["fix"] == "model.reasoning_history: keep"
    # in this process (a third interpreter start would cost ~12 s): the option's plumbing
    from typer.testing import CliRunner

    from conveyor.cli import app

    kept = CliRunner().invoke(
        app,
        [
            "doctor",
            str(model_dir),
            "--chat-template",
            str(TEMPLATES / "qwen3.jinja"),
            "--reasoning-history",
            "keep",
        ],
    )
    assert kept.exit_code == 0, kept.output
    assert "consistent; splits=0, samples=1" in kept.output


def test_models_prepare_is_idempotent_and_prints_the_path_last(model_dir: Path) -> None:
    result = conveyor("models", "prepare")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(model_dir)


def test_config_show_names_sources_and_rejects_unknown_keys(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("agent:\n  max_turns: 5\n")
    shown = conveyor("config", "show", str(config), "--set", "tasks.group_size=4")
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(x.split()) for x in shown.stdout.splitlines()]
    assert any("agent.max_turns = 5" in x and f"file:{config}" in x for x in lines)
    assert any("tasks.group_size = 4" in x and "--set" in x for x in lines)
    assert any("agent.max_completion_tokens" in x and "default" in x for x in lines)
    bad = conveyor("config", "show", str(config), "--set", "agent.max_turn=3")
    assert bad.returncode == 2 and "agent.max_turns" in bad.stderr


def test_incomplete_group_policy_is_a_config_key_with_a_checked_value(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("rl:\n  groups:\n    incomplete: refill\n")
    shown = conveyor("config", "show", str(config), "--set", "rl.groups.max_refills=2")
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(x.split()) for x in shown.stdout.splitlines()]
    assert any('rl.groups.incomplete = "refill"' in x for x in lines)
    assert any("rl.groups.max_refills = 2" in x and "--set" in x for x in lines)
    assert any('rl.groups.refill_fallback = "train_partial"' in x for x in lines)
    # The fallback after refilling cannot itself be refill.
    bad = conveyor("config", "show", str(config), "--set", "rl.groups.refill_fallback=refill")
    assert bad.returncode == 2 and "rl.groups.refill_fallback" in bad.stderr


def test_tasks_families_json_contract() -> None:
    result = conveyor("tasks", "families", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    by_name = {row["name"]: row for row in rows}
    assert {"search", "memory", "math", "code", "rg", "bfcl", "tau2", "terminal"} <= set(by_name)
    for row in rows:
        assert set(row) == {"name", "splits", "source", "version"}
    assert by_name["filenav"]["splits"] == ["train", "eval", "test"]


def test_tasks_check_runs_the_oracle_and_the_empty_policy_through_the_loop(
    model_dir: Path,
) -> None:
    ok = conveyor("tasks", "check", "filenav", "--n", "3")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout.strip().splitlines()[-1])
    assert report.pop("seconds") > 0  # the check's wall time
    assert report == {
        "family": "filenav",
        "split": "eval",
        "n": 3,
        "oracle_mean": 1.0,
        "empty_mean": 0.0,
        "problems": [],
        "ok": True,
        "by_category": {},
        "dropped": [],
        "infra_errors": [],
        "oracle_fits_budget": 3,  # the shipped budget fits the oracle on all 3
    }
    unknown = conveyor("tasks", "check", "filenavv")
    assert unknown.returncode == 2 and "did you mean 'filenav'" in unknown.stderr
