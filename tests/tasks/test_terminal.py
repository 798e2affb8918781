"""The terminal family: Harbor folders read natively, run in bubblewrap, graded after the rollout.

Everything here runs the real pieces: the shipped folders, bubblewrap sandboxes, the tasks' own
`tests/test.sh`. Only the docker engine is faked (`FakeDockerEngine`, a script answering
`docker info`), since no daemon runs here.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext, ToolOutcome
from conveyor.config import RuntimeConfig
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.family import FamilyServices, split_of
from conveyor.tasks.terminal import TerminalFamily, generated_dir, shipped_dir
from conveyor.tasks.terminal.chores import (
    CHORES,
    SHIPPED_VARIANTS,
    VARIANTS,
    all_folders,
)
from conveyor.tasks.terminal.harbor import HarborFormatError, load_task, plan_environment
from conveyor.tasks.terminal.sandbox import reward_from
from conveyor.types import Task, ToolCall

T = TypeVar("T")
FIXTURES = Path(__file__).parents[1] / "fixtures" / "terminal"
needs_bwrap = pytest.mark.skipif(
    not bubblewrap_available()[0], reason=f"bubblewrap: {bubblewrap_available()[1]}"
)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def family(**options: Any) -> TerminalFamily:
    return TerminalFamily(services=FamilyServices(options=options))


FAMILY = family()


def task_named(fam: TerminalFamily, name: str) -> Task:
    split = split_of(name)
    count = sum(split_of(other) == split for other in fam.tasks)
    return next(t for t in fam.make_tasks(count, 0, split) if t.data["name"] == name)


async def rollout(
    fam: TerminalFamily, task: Task, calls: list[ToolCall]
) -> tuple[float, list[ToolOutcome], str]:
    """Run `calls` through the family's tools in a fresh runtime, then grade: (reward, outcomes,
    the verifier's record)."""
    runtime = await fam.make_runtime(task)
    try:
        registry, ctx = fam.tools(), ToolContext(task=task, runtime=runtime)
        outcomes = [
            await registry.execute(c, ctx, timeout_s=60, max_output_chars=8000) for c in calls
        ]
        grade = await fam.grade(task, None, runtime)  # type: ignore[arg-type]
        return grade.reward, outcomes, str(grade.records[0]["content"])
    finally:
        await runtime.close()


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


# --- the shipped data and the task format -------------------------------------------------


def test_shipped_folders_are_what_the_generator_writes() -> None:
    shipped = all_folders(SHIPPED_VARIANTS)
    assert len(shipped) >= 10 and len(CHORES) >= 10
    on_disk = sorted(p.name for p in shipped_dir().iterdir() if p.is_dir())
    assert on_disk == sorted(shipped)
    for name in ("log-error-counts-00", "fix-mean-script-00", "tiny-calc-cli-00"):
        for relative, text in shipped[name].items():
            assert (shipped_dir() / name / relative).read_text() == text, (name, relative)
    # the other variants are written into the cache, whole, and the family serves them all
    generated = all_folders(VARIANTS, SHIPPED_VARIANTS)
    assert sorted(p.name for p in generated_dir().iterdir()) == sorted(generated)
    for name in ("fix-mean-script-07", "tiny-calc-cli-11"):
        for relative, text in generated[name].items():
            assert (generated_dir() / name / relative).read_text() == text, (name, relative)
    assert sorted(FAMILY.tasks) == sorted(all_folders())


def test_every_shipped_folder_is_harbor_shaped_and_runs_in_bubblewrap() -> None:
    assert len(FAMILY.tasks) == len(all_folders()) and not FAMILY.skipped
    for task in FAMILY.tasks.values():
        for part in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh"):
            assert (task.path / part).is_file()
        assert (task.solution_dir / "solve.sh").is_file()
        assert task.environment.docker_reason is None and task.environment.workdir == "/app"
        assert FAMILY.kinds[task.name] == "bubblewrap"
        assert task.verifier_timeout_s == 60.0 and task.agent_timeout_s == 120.0


def test_make_tasks_is_deterministic_and_the_splits_are_disjoint() -> None:
    first = FAMILY.make_tasks(10, 3, "eval")
    assert [t.id for t in first] == [t.id for t in FAMILY.make_tasks(10, 3, "eval")]
    assert first[0].id.startswith("terminal-eval-0000-")
    names = {
        s: {t.data["name"] for t in FAMILY.make_tasks(n, 0, s)}
        for s, n in (("train", 60), ("eval", 10), ("test", 10))
    }
    assert not names["train"] & names["eval"] and not names["eval"] & names["test"]
    assert not names["train"] & names["test"]
    assert all(split_of(n) == "eval" for n in names["eval"])
    with pytest.raises(ValueError, match=r"only .* 'eval' task folders"):
        FAMILY.make_tasks(1000, 0, "eval")
    with pytest.raises(ValueError, match="unknown split"):
        FAMILY.make_tasks(1, 0, "dev")


def test_prompt_holds_the_instruction_and_the_tool_call_format() -> None:
    task = FAMILY.make_tasks(1, 0, "eval")[0]
    system, user = task.prompt[0]["content"], task.prompt[1]["content"]
    assert "<tool_call>" in system and '"name": "bash"' in system and "finish" in system
    assert FAMILY.tasks[task.data["name"]].instruction.strip() in user
    assert "/app" in user


def write_task(root: Path, dockerfile: str, name: str = "t") -> Path:
    folder = root / name
    (folder / "environment" / "src").mkdir(parents=True)
    (folder / "environment" / "src" / "a.txt").write_text("a")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("exit 0\n")
    (folder / "instruction.md").write_text("do it")
    (folder / "task.toml").write_text("[verifier]\ntimeout_sec = 5\n[agent]\ntimeout_sec = 7\n")
    return folder


@pytest.mark.parametrize(
    ("dockerfile", "reason"),
    [
        ("FROM python:3.11-slim\nWORKDIR /app\nCOPY src/ /app/\n", None),
        ("FROM debian:bookworm-slim\nWORKDIR /srv/x\nENV A=1 B=2\nCOPY src/a.txt .\n", None),
        ("FROM python:3.11-slim\nWORKDIR /app\nRUN pip install numpy\n", "RUN instruction"),
        ("FROM nvidia/cuda:12.4\nWORKDIR /app\n", "not a plain base"),
        ("FROM python:3.11-slim\nWORKDIR /app\nCOPY src/a.txt /etc/a.txt\n", "outside WORKDIR"),
        ("FROM python:3.11-slim\nCOPY src/ /app/\n", "no WORKDIR"),
        ("FROM python:3.11-slim\nWORKDIR /app\nCOPY --from=build /x /app/\n", "--from"),
        ("FROM python:3.11-slim\nWORKDIR /app\nCOPY ../../etc/passwd /app/\n", "build context"),
        ("FROM python:3.11-slim AS base\nWORKDIR /app\n", "not a plain base"),
    ],
)
def test_the_dockerfile_decides_bubblewrap_or_docker(
    tmp_path: Path, dockerfile: str, reason: str | None
) -> None:
    plan = plan_environment(write_task(tmp_path, dockerfile) / "environment")
    if reason is None:
        assert plan.docker_reason is None
    else:
        assert plan.docker_reason is not None and reason in plan.docker_reason


def test_task_toml_and_dockerfile_values_are_read(tmp_path: Path) -> None:
    folder = write_task(
        tmp_path, "FROM debian:bookworm\nWORKDIR /srv\nWORKDIR x\nENV K v w\nCOPY src/a.txt .\n"
    )
    task = load_task(folder)
    assert (task.verifier_timeout_s, task.agent_timeout_s) == (5.0, 7.0)
    assert task.environment.workdir == "/srv/x" and task.environment.env == {"K": "v w"}
    assert task.environment.copies == (("src/a.txt", "/srv/x"),)


def test_broken_folders_are_clear_errors(tmp_path: Path) -> None:
    folder = write_task(tmp_path, "FROM debian:bookworm\nWORKDIR /app\n")
    (folder / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n")
    with pytest.raises(HarborFormatError, match="timeout_sec"):
        load_task(folder)
    (folder / "task.toml").write_text("[verifier\n")
    with pytest.raises(HarborFormatError, match=r"task.toml"):
        load_task(folder)
    (folder / "tests" / "test.sh").unlink()
    with pytest.raises(HarborFormatError, match=r"missing tests/test.sh"):
        load_task(folder)


# --- runtime selection ---------------------------------------------------------------------


def test_a_folder_needing_docker_without_an_engine_is_an_early_clear_error() -> None:
    with pytest.raises(
        ValueError,
        match=r"apt-task cannot run here: it needs docker \(the "
        r"Dockerfile has a RUN instruction\).*on_unrunnable: skip",
    ):
        family(dirs=[str(FIXTURES / "needs-docker")], shipped=False, docker="/nonexistent/docker")


def test_a_folder_needing_docker_can_be_skipped_and_is_counted() -> None:
    fam = family(
        dirs=[str(FIXTURES / "needs-docker"), str(FIXTURES / "tb2")],
        shipped=False,
        on_unrunnable="skip",
        docker="/nonexistent/docker",
    )
    assert list(fam.skipped) == ["apt-task"] and "RUN instruction" in fam.skipped["apt-task"]
    assert sorted(fam.tasks) == ["count-words"]
    forced = TerminalFamily(
        runtime=RuntimeConfig(kind="bubblewrap"),
        services=FamilyServices(
            options={
                "dirs": [str(FIXTURES / "needs-docker")],
                "shipped": False,
                "on_unrunnable": "skip",
            }
        ),
    )
    assert "runtime.kind is bubblewrap" in forced.skipped["apt-task"]


def write_fake_docker_engine(folder: Path) -> Path:
    """A stand-in for the docker client whose engine always answers `docker info`."""
    engine = folder / "FakeDockerEngine"
    engine.write_text('#!/bin/sh\n[ "$1" = info ] && echo 27.0-fake && exit 0\nexit 1\n')
    engine.chmod(0o755)
    return engine


def test_with_an_engine_docker_folders_run_in_docker_and_plain_ones_in_bubblewrap(
    tmp_path: Path,
) -> None:
    engine = str(write_fake_docker_engine(tmp_path))
    folders = [str(FIXTURES / "needs-docker"), str(FIXTURES / "tb2")]
    # ubuntu:24.04 is in no store here (the fake answers no `image inspect`) and no registry
    # is used: the folder is refused, naming the option that maps it to a local image.
    with pytest.raises(ValueError, match=r"base image 'ubuntu:24.04' is not in .*base_images"):
        family(dirs=folders, shipped=False, docker=engine)
    fam = family(dirs=folders, shipped=False, docker=engine, base_images=UBUNTU_ON_BASE)
    assert fam.kinds == {"apt-task": "docker", "count-words": "bubblewrap"}
    everything = TerminalFamily(
        # The family builds each folder's image; the config's docker_image goes unused.
        runtime=RuntimeConfig(kind="docker", docker_image="unused"),
        services=FamilyServices(
            options={"dirs": [str(FIXTURES / "tb2")], "shipped": False, "docker": engine}
        ),
    )
    assert everything.kinds == {"count-words": "docker"}


UBUNTU_ON_BASE = {"ubuntu:24.04": "conveyor-base"}
CALLS = ("build", "run", "exec", "commit", "rm", "rmi")


def write_recording_docker_engine(folder: Path, reward: str, test_exit: int) -> Path:
    """A fake docker engine (client and daemon in one script): it records every call in
    `calls.log`, builds and runs nothing, holds every image but the task's own (so `build`
    runs once), and answers the verifier's run (`bash /tests/test.sh` as the container's
    command): it writes `reward` to the reward file of the folder mounted at /logs and exits
    with `test_exit`."""
    log = folder / "calls.log"
    engine = folder / "FakeDockerEngine"
    engine.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {log}\n'
        'case "$1" in\n'
        "  info) echo 27.0-fake ;;\n"
        '  image) case "$*" in *conveyor-terminal-*) exit 1 ;; esac; echo sha256:fake ;;\n'
        "  build|commit) echo sha256:fake ;;\n"
        '  run) case "$*" in\n'
        "    *'bash /tests/test.sh') for a in \"$@\"; do case $a in\n"
        "      *,target=/logs) d=${a#*source=}; d=${d%%,*}; echo %s > $d/verifier/reward.txt ;;\n"
        "      esac; done; exit %d ;;\n"
        "    *) echo sha256:fake ;;\n"
        "  esac ;;\n"
        "esac\n" % (reward, test_exit)
    )
    engine.chmod(0o755)
    return engine


@pytest.mark.parametrize(
    ("reward", "test_exit", "expected", "source"),
    [("1", 0, 1.0, "reward_file"), ("1", 137, 0.0, "killed"), ("2", 0, 0.0, "bad_reward_file")],
)
def test_docker_runtime_builds_runs_and_verifies_in_order(
    tmp_path: Path, reward: str, test_exit: int, expected: float, source: str
) -> None:
    from conveyor.tasks.terminal.docker_env import DockerTaskRuntime

    engine = write_recording_docker_engine(tmp_path, reward, test_exit)
    fam = family(
        dirs=[str(FIXTURES / "needs-docker")],
        shipped=False,
        docker=str(engine),
        base_images=UBUNTU_ON_BASE,
    )
    task = fam.make_tasks(1, 0, split_of("apt-task"))[0]
    runtime = run(fam.make_runtime(task))
    assert isinstance(runtime, DockerTaskRuntime) and runtime.root == "/app"
    grade = run(fam.grade(task, None, runtime))  # type: ignore[arg-type]
    run(runtime.close())
    assert grade.reward == expected and f"from {source}" in str(grade.records[0]["content"])
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # `ps` and `inspect`: the sweep of containers left by killed runs, at the first start;
    # `image inspect`: whether the task's image (and the base) are there.
    # (An exec's script spans lines: only the lines that start a call count.)
    verbs = [c.split()[0] for c in calls if c.split() and c.split()[0] in CALLS]
    build = next(c for c in calls if c.startswith("build "))
    assert " -f " in build and build.endswith(str(FIXTURES / "needs-docker/apt-task/environment"))
    assert verbs[:3] == ["build", "run", "exec"]  # built, started, then the agent's calls
    # Grading: leftovers killed, the container committed, the tests run in a container of
    # that image (`--rm`), then its image and the rollout's container go.
    assert verbs[-5:] == ["exec", "commit", "run", "rmi", "rm"]
    text = "\n".join(calls)
    assert "kill -9 -1" in text[text.rindex("\nexec ") : text.index("\ncommit ")]
    verify = next(c for c in calls if c.endswith("bash /tests/test.sh"))
    assert "--network none" in verify and "--cap-drop ALL" in verify and " --rm " in verify
    assert ",target=/tests,readonly" in verify and ",target=/logs " in verify
    run_call = next(c for c in calls if c.startswith("run "))
    assert "--network none" in run_call and "--cap-drop ALL" in run_call


def test_options_and_runtime_kinds_are_checked() -> None:
    with pytest.raises(ValueError, match=r"tasks.options.terminal: colour"):
        family(colour="red")
    with pytest.raises(ValueError, match=r"cannot use runtime.kind 'simulated'"):
        TerminalFamily(runtime=RuntimeConfig(kind="simulated"))
    with pytest.raises(ValueError, match="two task folders are named 'count-words'"):
        family(dirs=[str(FIXTURES / "tb2"), str(FIXTURES / "tb2" / "count-words")])


# --- tools, oracle, verifier ------------------------------------------------------------------


@needs_bwrap
def test_bash_runs_in_the_working_folder_and_reports_errors_as_the_policys() -> None:
    task = FAMILY.make_tasks(1, 0, "eval")[0]
    task = task.model_copy(
        update={"data": {**task.data, "command_timeout_s": 1.0, "output_chars": 300}}
    )
    calls = [
        bash("pwd; ls /tests /logs /solution 2>&1; exit 3"),
        bash("yes | head -c 100000"),
        bash("sleep 30"),
        ToolCall(name="bash", arguments={}),
        ToolCall(name="finish", arguments={}),
    ]
    reward, outcomes, _ = run(rollout(FAMILY, task, calls))
    assert outcomes[0].output.startswith("/app\n") and "[exit code: 3]" in outcomes[0].output
    assert outcomes[0].output.count("No such file or directory") == 3
    assert "characters truncated" in outcomes[1].output and len(outcomes[1].output) < 500
    assert outcomes[2].kind == "raised" and "timed out after 1 s" in outcomes[2].output
    assert outcomes[3].kind == "invalid_arguments"
    assert outcomes[4].kind == "ok" and reward == 0.0


@needs_bwrap
def test_a_third_party_folder_runs_unchanged() -> None:
    fam = family(dirs=[str(FIXTURES / "tb2")], shipped=False)
    task = task_named(fam, "count-words")
    assert run(rollout(fam, task, []))[0] == 0.0
    reward, outcomes, record = run(rollout(fam, task, fam.oracle_calls(task)))
    assert reward == 1.0, (outcomes, record)
    assert "from reward_file" in record


@needs_bwrap
def test_oracle_scores_one_and_doing_nothing_zero() -> None:
    task = task_named(FAMILY, "fix-mean-script-00")
    assert run(rollout(FAMILY, task, []))[0] == 0.0
    reward, outcomes, record = run(rollout(FAMILY, task, FAMILY.oracle_calls(task)))
    assert reward == 1.0, (outcomes, record)


@needs_bwrap
@pytest.mark.slow
def test_tasks_check_through_the_real_loop(model_dir: Path) -> None:
    from conveyor.app.families import check_family
    from conveyor.config import load_config

    config = load_config(None, ["tasks.families=[terminal]"]).config
    report = run(check_family(config, "terminal", n=2, say=lambda _: None))
    assert report["ok"] is True, report
    assert (report["oracle_mean"], report["empty_mean"], report["n"]) == (1.0, 0.0, 2)


def test_every_oracle_call_fits_one_turns_completion_budget(tokenizer: Any) -> None:
    from conveyor.agent.parsing import format_tool_call
    from conveyor.config.sections import AgentConfig

    budget = AgentConfig().max_completion_tokens
    longest = 0
    for name in FAMILY.tasks:
        for call in FAMILY.oracle_calls(task_named(FAMILY, name)):
            tokens = len(tokenizer.encode(format_tool_call(call, "hermes")))
            longest = max(longest, tokens)
    assert longest < budget


# --- reward attacks: each must score 0 ----------------------------------------------------------


ATTACKS = {
    "writes the reward file in advance": [
        bash("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"),
        bash("mkdir -p logs/verifier && echo 1 > logs/verifier/reward.txt"),
    ],
    "creates a fake tests folder": [
        bash(
            "mkdir -p /tests; mkdir -p tests && printf 'echo 1 > /logs/verifier/reward.txt\\n'"
            " > tests/test.sh"
        ),
    ],
    "replaces python and bash with shims that pass": [
        bash(
            "mkdir -p bin /tmp/bin && for d in bin /tmp/bin .; do "
            "printf '#!/bin/sh\\nexit 0\\n' > $d/python3; cp $d/python3 $d/bash; "
            "chmod +x $d/python3 $d/bash; done"
        ),
        bash(
            "mkdir -p $HOME/.local/lib/python3.11/site-packages && "
            "printf 'import os\\nos._exit(0)\\n' > "
            "$HOME/.local/lib/python3.11/site-packages/usercustomize.py && "
            "printf 'import os\\nos._exit(0)\\n' > sitecustomize.py"
        ),
        bash("cp /usr/bin/python3 python3 2>&1; rm -f /usr/bin/python3 2>&1; true"),
    ],
    "shadows the checks' stdlib modules from the working folder": [
        bash(
            "for m in json csv random subprocess tempfile pathlib ctypes sys; do "
            "printf 'import os\\nos._exit(0)\\n' > $m.py; done"
        ),
    ],
    "kills what it can and leaves a process behind": [
        bash("(sleep 100; echo 1 > /logs/verifier/reward.txt) & kill -9 -1; true"),
    ],
}


@needs_bwrap
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_reward_attacks_score_zero(attack: str) -> None:
    task = task_named(FAMILY, "tiny-calc-cli-01")
    reward, outcomes, record = run(rollout(FAMILY, task, ATTACKS[attack]))
    assert reward == 0.0, (outcomes, record)
    assert "FAIL" in record  # the real checks ran and said why


# code the agent leaves as the calculator -> how the verifier's record says it scored 0
CALC_CHEATS = {
    "writes a reward, then kills its judge": (
        "import os\nopen('/logs/verifier/reward.txt', 'w').write('1')\nos.kill(-1, 9)\n",
        "from killed",
    ),
    "leaves a process rewriting the reward file": (
        "import subprocess\nsubprocess.Popen(['sh', '-c', 'while :; do echo 1 > "
        "/logs/verifier/reward.txt; done'], start_new_session=True, stdin=subprocess.DEVNULL, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(0)\n",
        "from reward_file",
    ),
    "reads the answer key": ("print(open('/tests/expected.json').read())\n", "FAIL"),
}


@needs_bwrap
@pytest.mark.parametrize("cheat", list(CALC_CHEATS))
def test_code_under_test_cannot_forge_the_reward(cheat: str) -> None:
    task = task_named(FAMILY, "tiny-calc-cli-01")
    script = FAMILY.tasks["tiny-calc-cli-01"].instruction.split("`/app/")[1].split("`")[0]
    code, why = CALC_CHEATS[cheat]
    write = bash(f"cat > {script} <<'EOF'\n{code}EOF")
    reward, outcomes, record = run(rollout(FAMILY, task, [write]))
    assert reward == 0.0 and why in record, (outcomes, record)


@needs_bwrap
@pytest.mark.parametrize("target", ["/tests/expected.json", "../tests/expected.json"])
def test_an_output_linked_to_the_answer_key_scores_zero(target: str) -> None:
    task = task_named(FAMILY, "json-group-by-00")
    link = bash(f"for f in by_city.json groups.json; do ln -s {target} $f; done")
    reward, _, record = run(rollout(FAMILY, task, [link]))
    assert reward == 0.0 and "link_into_verifier" in record and "/tests/expected.json" in record


@needs_bwrap
def test_code_that_hangs_the_verifier_scores_zero_at_the_verifier_timeout() -> None:
    fam = family(dirs=[str(FIXTURES / "attacks")], shipped=False)
    task = task_named(fam, "slow-verifier")
    loop = bash("printf '#!/bin/bash\\nwhile true; do :; done\\n' > /app/run.sh")
    reward, _, record = run(rollout(fam, task, [loop]))
    assert reward == 0.0 and "from timeout" in record
    assert run(rollout(fam, task, fam.oracle_calls(task)))[0] == 1.0


@pytest.mark.parametrize(
    ("text", "exit_code", "reward"),
    [
        ("1", 1, 1.0),
        ("0.5\n", 0, 0.5),
        ("1.5", 0, 0.0),
        ("nan", 0, 0.0),
        ("yes", 0, 0.0),
        ("", 0, 0.0),
        (None, 0, 1.0),
        (None, 2, 0.0),
    ],
)
def test_only_a_number_in_range_or_the_exit_status_is_a_reward(
    text: str | None, exit_code: int, reward: float
) -> None:
    assert reward_from(text, exit_code, "").reward == reward


@needs_bwrap
@pytest.mark.slow
def test_every_chore_fails_untouched_and_passes_after_its_solution() -> None:
    # the shipped variant and the last generated one of every chore (24 of 144 folders: one
    # solve.sh solves every variant of its chore; the data differ)
    names = [f"{chore}-{v:02d}" for chore in CHORES for v in (0, VARIANTS - 1)]
    for name in names:
        task = task_named(FAMILY, name)
        assert run(rollout(FAMILY, task, []))[0] == 0.0, name
        reward, outcomes, record = run(rollout(FAMILY, task, FAMILY.oracle_calls(task)))
        assert reward == 1.0, (name, outcomes, record)


def test_the_generator_writes_the_folders(tmp_path: Path) -> None:
    from conveyor.tasks.terminal.chores import write_folders

    written = write_folders(tmp_path, variants=1)
    assert len(written) == len(CHORES)
    solve = written[0] / "solution" / "solve.sh"
    assert solve.stat().st_mode & 0o111
    shutil.rmtree(tmp_path)


def test_config_counts_the_verifier_timeout_of_a_folder_added_by_options(tmp_path: Path) -> None:
    from conveyor.config import load_config

    folder = tmp_path / "tasks" / "slow-verifier"
    shutil.copytree(FIXTURES / "tb2" / "count-words", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 30.0", "timeout_sec = 1800.0", 1))
    options = f"tasks.options={{terminal: {{dirs: [{tmp_path / 'tasks'}]}}}}"
    with pytest.raises(Exception, match="grading budget"):
        load_config(None, ["tasks.families=[terminal]", options])
    assert load_config(
        None, ["tasks.families=[terminal]", options, "dispatch.reward_timeout_s=2000"]
    ).config.tasks.options["terminal"]["dirs"]


def test_a_kind_that_runs_images_by_its_build_hosts_every_folder_in_its_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind like `container` (the docker runtime on the task's own image: its spec needs no
    `runtime.docker_image`, its build makes a `DockerRuntime`) is found by that capability, not
    by its name. Only the engine is faked (`FakeDockerEngine`)."""
    from conveyor.registry import RUNTIMES, RuntimeSpec
    from conveyor.runtime.docker import DockerRuntime

    def build_own_image(request: object, settings: object) -> DockerRuntime:
        raise AssertionError("the family builds its own runtime")

    build_own_image.__annotations__["return"] = DockerRuntime
    name = "images-by-build"
    monkeypatch.setitem(RUNTIMES._parts, name, RuntimeSpec(name=name, build=build_own_image))
    engine = str(write_fake_docker_engine(tmp_path))
    fam = TerminalFamily(
        runtime=RuntimeConfig(kind=name),
        services=FamilyServices(
            options={"dirs": [str(FIXTURES / "tb2")], "shipped": False, "docker": engine}
        ),
    )
    assert fam.kinds == {"count-words": name}
    assert [t.data["kind"] for t in fam.check_tasks()] == [name]
