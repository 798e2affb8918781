"""Our reading of Harbor task folders against the `harbor` package's own (0.25.0), and the
published layouts it covers: Terminal-Bench 2's (canary lines, `allow_internet`, a verifier
that installs uv) and Harbor's current schema (`[task]`, per-phase `network_mode`,
`[verifier.env]`, `reward.json`).

The parity check runs the real `harbor` package in its own venv (`scripts/venv-harbor.sh`: it
needs Python >= 3.12); it skips, saying so, where that venv is not built. The rest needs none.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.tasks.terminal.harbor import HarborFormatError, load_task
from conveyor.tasks.terminal.parity import harbor_python
from conveyor.tasks.terminal.sandbox import (
    VerifierResult,
    fetch_hosts,
    network_failure,
    reward_from_json,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "terminal"
PUBLISHED = FIXTURES / "published"


@pytest.mark.skipif(
    not harbor_python().exists(), reason="no .venv-harbor (bash scripts/venv-harbor.sh builds it)"
)
def test_every_shipped_and_published_folder_reads_as_harbor_reads_it() -> None:
    folders = [PUBLISHED, FIXTURES / "tb2", FIXTURES / "needs-docker", FIXTURES / "attacks"]
    done = CliRunner().invoke(app, ["tasks", "harbor-parity", *map(str, folders), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output.strip().splitlines()[-1])
    # 12 shipped + 4 published + 3 others; the folder both refuse counts as agreeing.
    assert report == {"folders": 19, "agree": 19, "mismatches": {}, "ok": True}


@pytest.mark.skipif(
    not harbor_python().exists(), reason="no .venv-harbor (bash scripts/venv-harbor.sh builds it)"
)
def test_a_difference_from_harbor_fails_the_check_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conveyor.tasks.terminal.harbor as reader

    # Our reader as it was before it dropped canary lines, as Harbor does.
    monkeypatch.setattr(reader, "strip_canary", lambda text: text)
    folder = PUBLISHED / "tb2-uv-pytest"
    done = CliRunner().invoke(app, ["tasks", "harbor-parity", "--no-shipped", str(folder)])
    assert done.exit_code == 1
    assert "instruction: ours '<!-- BENCHMARK DATA" in done.output
    assert "harbor 'Write the sum" in done.output
    assert "0 of 1 task folders read as harbor reads them" in done.output


def test_published_layouts_are_read_as_harbor_defines_them() -> None:
    tb2 = load_task(PUBLISHED / "tb2-uv-pytest")
    assert tb2.instruction.startswith("Write the sum")  # the canary lines are dropped
    assert (tb2.agent_timeout_s, tb2.verifier_timeout_s, tb2.build_timeout_s) == (
        1800.0,
        900.0,
        600.0,
    )
    assert tb2.verifier_network_mode == "public"  # allow_internet = true
    assert [line.split(": ")[0] for line in tb2.network_fetches] == [
        "tests/test.sh:3",
        "tests/test.sh:4",
        "tests/test.sh:5",
        "tests/test.sh:7",
    ]  # apt-get update / install, curl of astral.sh, uvx; not the comment, not `source`
    current = load_task(PUBLISHED / "policies-and-reward-json")
    assert current.verifier_network_mode == "public"  # [verifier] overrides the environment
    assert current.verifier_env == {"MODE": "strict", "GREETING": "hello"}
    assert (current.verifier_timeout_s, current.build_timeout_s) == (45.0, 120.0)
    assert current.network_fetches == ()
    legacy = load_task(PUBLISHED / "no-internet-legacy")
    assert legacy.verifier_network_mode == "no-network"
    with pytest.raises(HarborFormatError, match="network_mode 'sometimes' is not one of"):
        load_task(PUBLISHED / "bad-network-mode")


@pytest.mark.parametrize(
    ("text", "reward", "source"),
    [
        ('{"reward": 1}', 1.0, "reward_json"),
        ('{"reward": 0.25, "style": 1}', 0.25, "reward_json"),  # `reward` among others
        ('{"accuracy": 0.5}', 0.5, "reward_json"),  # the only entry
        ('{"a": 1, "b": 1}', 0.0, "bad_reward_file"),  # which one? none
        ('{"reward": 2}', 0.0, "bad_reward_file"),
        ('{"reward": NaN}', 0.0, "bad_reward_file"),
        ('{"reward": true}', 0.0, "bad_reward_file"),
        ("1", 1.0, "reward_json"),
        ("not json", 0.0, "bad_reward_file"),
    ],
)
def test_reward_json_is_harbor_s_rewards_object(text: str, reward: float, source: str) -> None:
    result = reward_from_json(text, 0, "")
    assert (result.reward, result.source) == (reward, source)


def test_a_network_failure_is_named_only_where_the_verifier_needed_network() -> None:
    tb2 = load_task(PUBLISHED / "tb2-uv-pytest")
    legacy = load_task(PUBLISHED / "no-internet-legacy")
    failed = VerifierResult(0.0, "reward_file", 1, "pytest: 1 failed")
    passed = VerifierResult(1.0, "reward_file", 0, "")
    assert "tests/test.sh:3: apt-get update" in str(network_failure(tb2, failed))
    assert network_failure(legacy, failed) is None  # its own policy: no network, ever
    assert network_failure(tb2, passed) is None  # a full reward stands
    assert network_failure(load_task(FIXTURES / "tb2" / "count-words"), failed) is None
    # with network: only where a host the scripts fetch from does not answer this host's probe
    hosts = fetch_hosts(tb2.network_fetches)
    assert ("astral.sh", 443) in hosts and ("deb.debian.org", 80) in hosts
    nowhere = dataclasses.replace(
        tb2, network_fetches=("tests/test.sh:1: curl -O https://pkgs.example.invalid/tool",)
    )  # .invalid never resolves (RFC 6761)
    reason = network_failure(nowhere, failed, network=True)
    assert reason is not None and "pkgs.example.invalid:443" in reason


def test_the_verifier_s_output_never_makes_an_infrastructure_error() -> None:
    """The attack: the policy's code, run by the tests, prints a failed fetch so that its
    failure would be kept out of learning. Only the task's own scripts and Conveyor's probe
    decide; a task whose scripts fetch nothing fails as the policy's result, network or not."""
    task = load_task(FIXTURES / "tb2" / "count-words")
    assert task.network_fetches == ()
    forged = VerifierResult(
        0.0, "exit_status", 6, "curl: (6) Could not resolve host: x.org\nNetwork is unreachable"
    )
    assert network_failure(task, forged) is None
    assert network_failure(task, forged, network=True) is None
