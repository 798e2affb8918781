"""The docker runtime on a real OCI engine (podman here, docker where that is what answers).

Every test starts real containers of the locally built base image (`conveyor-base:<hash>`,
built once per machine by `ensure_base_image` and then found in the engine's store): commands
and files, no network, memory and pids limits, a timed-out command killed inside the container,
removal on close, the sweep of a SIGKILLed run's containers at the next start, and a terminal
task through the family's real rollout path (its image built `FROM` the base image, the agent's
calls and the verifier in its container). Skips, saying why, where no engine answers or the
base image cannot be built (no mmdebstrap, no Debian mirror).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.config.loader import load_config
from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.docker import DockerRuntime
from conveyor.runtime.engine import (
    OWNER_LABEL,
    Engine,
    engine_available,
    owner_labels,
    resolve_engine,
    sweep_leftovers,
)
from conveyor.runtime.images import ImageBuildError, ensure_base_image
from conveyor.runtime.limits import MiB, SandboxLimits

T = TypeVar("T")
ENGINE = resolve_engine("auto")
ENGINE_OK, ENGINE_WHY = engine_available(ENGINE)
pytestmark = pytest.mark.skipif(not ENGINE_OK, reason=f"no container engine: {ENGINE_WHY}")
SRC = Path(__file__).resolve().parents[2] / "src"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="session")
def base_image() -> str:
    """The base image's tag, built on first use (a cache hit in every later run)."""
    try:
        return ensure_base_image(ENGINE).tag
    except ImageBuildError as exc:
        pytest.skip(f"the base image cannot be built here: {exc}")


def containers(**labels: str) -> list[str]:
    """Names of the engine's containers (running or not) carrying all of `labels`."""
    filters = [arg for key, value in labels.items() for arg in ("--filter", f"label={key}={value}")]
    done = ENGINE.run("ps", "-a", "--format", "{{.Names}}", *filters)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def exists(name: str) -> bool:
    return ENGINE.run("container", "inspect", "--format", "{{.Name}}", name).returncode == 0


def test_commands_and_files_run_in_a_labelled_container_that_close_removes(
    base_image: str, tmp_path: Path
) -> None:
    (tmp_path / "given.txt").write_text("from the host\n")

    async def scenario() -> str:
        rt = DockerRuntime(base_image, workdir="/workspace", workspace=tmp_path, docker=ENGINE)
        await rt.start()
        try:
            inside = await rt.exec("cat /etc/debian_version; python3 -c 'print(6 * 7)'; pwd", 30)
            assert inside.exit_code == 0, inside.stderr
            version, answer, cwd = inside.stdout.split()
            assert version.startswith("12.") and answer == "42" and cwd == "/workspace"
            assert await rt.read_file("given.txt") == "from the host\n"
            await rt.write_file("made/inside.txt", "from the container\n")
            assert (tmp_path / "made" / "inside.txt").read_text() == "from the container\n"
            with pytest.raises(PermissionError):
                await rt.read_file("/etc/passwd")
            assert (await rt.exec("exit 3", 10)).exit_code == 3
            assert rt.name in containers(**owner_labels())
        finally:
            await rt.close()
        return rt.name

    name = run(scenario())
    assert not exists(name)


def test_a_missing_image_is_an_infrastructure_failure() -> None:
    rt = DockerRuntime("conveyor-no-such-image:0", docker=ENGINE)
    with pytest.raises(RuntimeFailure, match="conveyor-no-such-image"):
        run(rt.start())
    assert not exists(rt.name)


@pytest.fixture
def host_server() -> Iterator[tuple[str, int, list[object]]]:
    """A TCP server on this host (all addresses): its address as the container could reach it
    (this host's outward IP), its port, and the connections it accepted."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: it only picks the route
        address = probe.getsockname()[0]
    try:
        yield address, server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()


def test_the_network_is_off(base_image: str, host_server: tuple[str, int, list[object]]) -> None:
    address, port, accepted = host_server
    connect = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"
    reached = subprocess.run([sys.executable, "-c", connect, address, str(port)], check=False)
    assert reached.returncode == 0 and len(accepted) == 1  # the server answers from the host

    async def scenario() -> tuple[Any, Any, Any]:
        rt = DockerRuntime(base_image, workdir="/tmp", docker=ENGINE)
        await rt.start()
        try:
            tries = [
                await rt.exec(f"python3 -c '{connect}' {host} {port}", 20)
                for host in (address, "127.0.0.1")
            ]
            links = await rt.exec("ls /sys/class/net", 10)
            return *tries, links
        finally:
            await rt.close()

    outward, loopback, links = run(scenario())
    assert outward.exit_code != 0 and "Network is unreachable" in outward.stderr
    assert loopback.exit_code != 0 and "Connection refused" in loopback.stderr
    assert links.stdout.split() == ["lo"]
    assert len(accepted) == 1  # nothing from inside reached it


def test_a_2_gb_allocation_is_killed_at_the_memory_limit_and_the_container_lives_on(
    base_image: str,
) -> None:
    limits = SandboxLimits(memory_bytes=256 * MiB)

    async def scenario() -> tuple[Any, Any]:
        rt = DockerRuntime(base_image, workdir="/tmp", limits=limits, docker=ENGINE)
        await rt.start()
        try:
            hog = await rt.exec("python3 -c 'b = b\"x\" * (2 << 30); print(len(b))'", 60)
            return hog, await rt.exec("echo still here", 10)
        finally:
            await rt.close()

    hog, after = run(scenario())
    # Killed by the kernel's OOM killer in the container's cgroup: the command's own failure
    # (the policy's), not a runtime failure and not a timeout.
    assert hog.exit_code == 137 and not hog.timed_out and hog.stdout == ""
    assert after.exit_code == 0 and after.stdout == "still here\n"


def test_the_pids_limit_holds_and_a_fork_bomb_is_the_command_s_own_timeout(
    base_image: str,
) -> None:
    limits = SandboxLimits(max_processes=64)
    count_forks = textwrap.dedent(
        """\
        import os, signal, time
        children = []
        try:
            while len(children) < 500:
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                children.append(pid)
        except OSError as exc:
            print(len(children), exc.errno, flush=True)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        """
    )

    async def scenario() -> tuple[Any, Any, Any, Any]:
        rt = DockerRuntime(base_image, workdir="/tmp", limits=limits, docker=ENGINE)
        await rt.start()
        try:
            await rt.write_file("forks.py", count_forks)
            forks = await rt.exec("python3 forks.py", 60)
            made, errno = forks.stdout.split()
            assert 30 < int(made) < 64 and errno == "11"  # EAGAIN at the limit, before 500
            # The classic bomb returns at once, leaving its processes behind; this one waits
            # for its time limit.
            quick = await rt.exec(":(){ :|:& };:", 10)
            bomb = await rt.exec("bomb() { bomb | bomb & }; bomb; while :; do :; done", 3)
            # The kill of the bomb's processes is asynchronous: on a loaded machine a listing
            # right after it may still see some dying; they must be gone within seconds.
            for _ in range(20):
                left = await rt.exec("ls -d /proc/[0-9]* | wc -l", 20)
                if int(left.stdout) < 10:
                    break
                await asyncio.sleep(0.5)
            return quick, bomb, left, await rt.exec("echo alive", 10)
        finally:
            await rt.close()

    quick, bomb, left, after = run(scenario())
    # The policy's own mess, whatever its exit status (under load bash's own forks may fail and
    # exit non-zero): a command's result, not a runtime failure (that raises). The classic bomb
    # usually returns at once, but bash retries a fork refused with EAGAIN, backing off, so on a
    # loaded machine it can also run into its own time limit (seen in a test run): either is the
    # command's own result.
    assert quick.timed_out == (quick.exit_code == 124)
    assert bomb.timed_out and bomb.exit_code == 124
    # The bomb's processes are gone with it: the keeper, its sleep and the listing remain.
    assert int(left.stdout) < 10, left
    assert after.exit_code == 0 and after.stdout == "alive\n"


def test_a_timed_out_command_is_killed_inside_the_container(base_image: str) -> None:
    async def scenario() -> tuple[Any, Any]:
        rt = DockerRuntime(base_image, workdir="/tmp", docker=ENGINE)
        await rt.start()
        try:
            began = time.monotonic()
            slow = await rt.exec("sleep 301 & setsid sleep 302 & sleep 303", 1)
            assert time.monotonic() - began < 8
            listing = await rt.exec(
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done", 10
            )
            return slow, listing
        finally:
            await rt.close()

    slow, listing = run(scenario())
    assert slow.timed_out and slow.exit_code == 124
    assert "sleep 30" not in listing.stdout  # its group and the one that left it (setsid)
    assert "sleep 86400" in listing.stdout  # the keeper's own sleep is untouched


OWNER = """
import asyncio, sys
from conveyor.runtime.docker import DockerRuntime
from conveyor.runtime.engine import resolve_engine

async def main():
    rt = DockerRuntime(sys.argv[1], workdir="/tmp", docker=resolve_engine("auto"))
    await rt.start()
    # what a terminal task's verifier does: commit the container to a `-verify` image
    tag = f"localhost/conveyor-sweep-verify:{rt.name.removeprefix('conveyor-')}"
    await rt._client([rt.docker, "commit", "-q", rt.name, tag], timeout_s=120)
    print(rt.name, tag, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_sigkilled_run_s_containers_are_swept_at_the_next_start(
    base_image: str, tmp_path: Path
) -> None:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    owner = subprocess.Popen(
        [sys.executable, str(script), base_image], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    name, tag = owner.stdout.readline().split()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert name and exists(name)  # a SIGKILL runs no cleanup: the container outlives its run
    # and so does the image committed from it
    assert ENGINE.run("image", "inspect", tag, timeout_s=60).returncode == 0

    async def live_one() -> None:
        mine = DockerRuntime(base_image, workdir="/tmp", docker=ENGINE)
        # the first start of a process sweeps (`sweep_once`; earlier tests of this file may
        # have made that start already), and so does any later sweep
        await mine.start()
        try:
            sweep_leftovers(ENGINE)
            assert exists(mine.name)  # a live run's containers are left alone
        finally:
            await mine.close()

    run(live_one())
    assert not exists(name)
    assert ENGINE.run("image", "inspect", tag, timeout_s=60).returncode != 0


def test_owner_labels_name_this_process() -> None:
    import os

    labels = owner_labels()
    assert labels[OWNER_LABEL].startswith(f"{os.getpid()}:")
    assert labels[OWNER_LABEL].split(":")[1].isdigit()


TASK_TOML = """\
version = "1.0"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 60.0
"""


def terminal_task(root: Path, base_image: str) -> Path:
    """A Harbor task folder as published: `FROM python:3.11-slim` (a registry image, built on
    the local base image through the default `base_images` map), with a `RUN`; its verifier
    writes Harbor's `reward.json`."""
    folder = root / "count-lines-in-container"
    (folder / "environment" / "app").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nWORKDIR /app\nCOPY app/ /app/\nRUN echo built > /app/stamp\n"
    )
    (folder / "environment" / "app" / "words.txt").write_text("a\nb\nc\n")
    (folder / "instruction.md").write_text(
        "Write the number of lines of /app/words.txt into /app/count.txt.\n"
    )
    (folder / "task.toml").write_text(TASK_TOML)
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nwc -l < /app/words.txt > count.txt\n"
    )
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/stamp)" = built ] && [ "$(cat /app/count.txt)" = 3 ]; then\n'
        "  echo '{\"reward\": 1}' > /logs/verifier/reward.json\nelse\n"
        "  echo '{\"reward\": 0}' > /logs/verifier/reward.json\nfi\n"
        # Everything else is killed: the verifier, its container's main process, lives on.
        "kill -9 -1\n"
    )
    return folder


def test_a_terminal_task_runs_and_is_verified_in_its_own_image(
    base_image: str, tmp_path: Path, model_dir: Path
) -> None:
    from typer.testing import CliRunner

    from conveyor.app.families import check_family
    from conveyor.cli import app
    from conveyor.tasks.family import build_families, options_services, split_of

    folder = terminal_task(tmp_path, base_image)
    options = {"dirs": [str(folder)], "shipped": False}
    sets = [
        "tasks.families=[terminal]",
        f"tasks.options={{terminal: {json.dumps(options)}}}",
        "runtime.kind=docker",
        f"runtime.docker_image={base_image}",  # unused: the task's own image runs
        f"runtime.engine={ENGINE.name}",
    ]
    # `conveyor images build` makes the task's image ahead of the run, then finds it held
    yaml = tmp_path / "run.yaml"
    yaml.write_text("run:\n  dir: null\n")
    build = ["images", "build", "--config", str(yaml), "--json"]
    build += [arg for item in sets for arg in ("--set", item)]
    config = load_config(None, sets).config
    family = build_families(["terminal"], config.runtime, options_services(config.tasks.options))
    (task_runtime,) = family["terminal"].image_runtimes()  # type: ignore[attr-defined]
    ENGINE.run("rmi", "-f", task_runtime.image, timeout_s=120)  # built by an earlier run here
    summaries = []
    for _ in range(2):
        done = CliRunner().invoke(app, build)
        assert done.exit_code == 0, done.output
        summaries.append(json.loads(done.stdout.splitlines()[-1]))
    assert [(s["images"], s["built"], s["cached"]) for s in summaries] == [(1, 1, 0), (1, 0, 1)]
    report = run(
        check_family(config, "terminal", n=1, split=split_of(folder.name), say=lambda _: None)
    )
    assert report["ok"], report["problems"]
    assert (report["oracle_mean"], report["empty_mean"]) == (1.0, 0.0)
    assert not containers(**owner_labels())  # every rollout's container is gone


def test_engine_is_what_runtime_engine_names() -> None:
    assert resolve_engine("docker") == Engine("docker", "docker")
    assert resolve_engine("podman").name == "podman"
    with pytest.raises(ValueError, match="auto, podman or docker"):
        resolve_engine("lxc")
    if shutil.which("podman"):
        assert ENGINE.name == "podman"  # auto: podman where it answers


# Published Terminal-Bench 2 tasks install their test tools in tests/test.sh, like this.
TB2_TEST_SH = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
uvx -p 3.13 -w pytest==8.4.1 pytest /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_a_verifier_that_installs_over_the_network_is_an_infrastructure_error(
    base_image: str, tmp_path: Path, model_dir: Path
) -> None:
    from conveyor.app.compose import Composition
    from conveyor.app.families import check_config, scripted_rollouts
    from conveyor.tasks.family import say

    folder = terminal_task(tmp_path, base_image)  # its image is built: a cache hit
    (folder / "tests" / "test.sh").write_text(TB2_TEST_SH)
    options = {"dirs": [str(folder)], "shipped": False}
    config = load_config(
        None,
        [
            "tasks.families=[terminal]",
            f"tasks.options={{terminal: {json.dumps(options)}}}",
            "runtime.kind=docker",
            f"runtime.docker_image={base_image}",
            f"runtime.engine={ENGINE.name}",
        ],
    ).config
    parts = Composition(check_config(config, "terminal"))

    async def rollout() -> list[Any]:
        try:
            tasks = parts.families["terminal"].check_tasks()
            return await scripted_rollouts(parts, tasks, lambda _t: [say("done")])
        finally:
            await parts.close()

    # The verifier ran and failed (no curl, no network): not a reward of 0 but an
    # infrastructure error naming the reason.
    (trajectory,) = run(rollout())
    assert trajectory.status == "infra_error" and trajectory.reward is None
    assert "needs network" in trajectory.error and "runtime.verifier_network" in trajectory.error
    assert "tests/test.sh:2: apt-get update" in trajectory.error
    assert not containers(**owner_labels())


def test_the_verifier_gets_network_only_where_runtime_verifier_network_allows(
    base_image: str, tmp_path: Path, host_server: tuple[str, int, list[object]]
) -> None:
    from conveyor.tasks.terminal.docker_env import DockerTaskRuntime
    from conveyor.tasks.terminal.harbor import load_task

    address, port, accepted = host_server
    folder = terminal_task(tmp_path, base_image)  # its image is built: a cache hit
    (folder / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        f"python3 -c 'import socket; socket.create_connection((\"{address}\", {port}), 5)' "
        "&& [ -f /app/done ] && echo 1 > /logs/verifier/reward.txt\n"
    )
    task = load_task(folder)
    # Nothing in the script fetches: without network its failure is the policy's result (the
    # output, which the policy's code could write, never makes it an infrastructure error).
    assert task.network_fetches == ()

    async def grade(network: bool) -> Any:
        rt = DockerTaskRuntime(task, limits=None, docker=ENGINE, verifier_network=network)
        await rt.start()
        try:
            await rt.exec("touch /app/done", 10)
            return await rt.verify()
        finally:
            await rt.close()

    offline = run(grade(False))
    assert offline.reward == 0.0 and "Network is unreachable" in offline.output
    assert accepted == []
    result = run(grade(True))
    assert (result.reward, result.source) == (1.0, "reward_file") and len(accepted) == 1
    assert not containers(**owner_labels())
    assert not [
        line
        for line in ENGINE.run("images", "--format", "{{.Repository}}").stdout.split()
        if line.endswith("-verify")
    ]  # the committed copies are gone too
