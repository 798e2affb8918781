"""The docker runtime: the container spec it builds and its in-container scripts.

The scripts' path checks are exercised through a stand-in `docker` CLI that runs `docker exec`
commands on this machine (the symlink and permission cases need a host folder to look at);
everything a real engine shows (network, limits, timeouts, sweeping) is in test_containers.py.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.docker import (
    KEEPER,
    DockerRuntime,
    container_spec,
    docker_available,
    host_nproc,
)
from conveyor.runtime.limits import SandboxLimits

T = TypeVar("T")

FAKE_DOCKER = """#!/bin/sh
cmd=$1; shift
case "$cmd" in
  info) echo 99.0-fake ;;
  run) echo "$@" > "$(dirname "$0")/run.log"; echo 0123456789ab ;;
  exec) [ "$1" = "-i" ] && shift; shift; exec "$@" ;;
  rm) echo "$@" > "$(dirname "$0")/rm.log" ;;
esac
"""

NO_ENGINE = """#!/bin/sh
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2
exit 1
"""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_spec_confines_the_container(tmp_path: Path) -> None:
    limits = SandboxLimits(memory_bytes=2 << 30, cpu_seconds=60, max_processes=128)
    argv = container_spec(
        "swebench/sweb.eval.x86_64.psf__requests-2317:latest",
        name="conveyor-abc",
        limits=limits,
        workspace=tmp_path,
        env_dir=tmp_path / "venv",
        user="1000:1000",
        cpus=2,
        env={"B": "2", "A": "1"},
    )
    assert argv[:3] == ["docker", "run", "-d"]
    assert argv[-4:] == ["swebench/sweb.eval.x86_64.psf__requests-2317:latest", "sh", "-c", KEEPER]

    def value(flag: str) -> list[str]:
        return [argv[i + 1] for i, item in enumerate(argv) if item == flag]

    assert value("--name") == ["conveyor-abc"]
    assert value("--network") == ["none"]
    assert value("--memory") == value("--memory-swap") == [str(2 << 30)]
    assert value("--pids-limit") == ["128"]
    assert value("--cpus") == ["2"]
    assert value("--user") == ["1000:1000"]
    assert value("--workdir") == ["/testbed"]
    assert value("--cap-drop") == ["ALL"]
    assert value("--security-opt") == ["no-new-privileges"]
    assert set(value("--ulimit")) == {
        "cpu=60:61",
        f"fsize={1 << 30}:{1 << 30}",
        "nofile=4096:4096",
        "core=0:0",
        f"nproc={host_nproc()}:{host_nproc()}",
    }
    venv = (tmp_path / "venv").resolve()
    assert value("--mount") == [
        f"type=bind,source={tmp_path.resolve()},target=/testbed",
        f"type=bind,source={venv},target={venv},readonly",
    ]
    assert value("--env") == ["A=1", "B=2"]
    assert "--init" not in argv  # the keeper is PID 1: `kill -9 -1` inside cannot stop it
    bare = container_spec("img", name="n", limits=SandboxLimits())
    assert "--user" not in bare and "--mount" not in bare


def test_no_engine_is_a_clear_start_failure(tmp_path: Path) -> None:
    docker = script(tmp_path, "docker", NO_ENGINE)
    ok, reason = docker_available(str(docker))
    assert not ok and "Cannot connect to the Docker daemon" in reason
    with pytest.raises(RuntimeFailure, match=r"docker is not usable here: .*Cannot connect"):
        run(DockerRuntime("img", docker=str(docker)).start())
    assert docker_available(str(tmp_path / "nope")) == (
        False,
        f"no `{tmp_path / 'nope'}` client on PATH",
    )


def test_in_container_scripts_through_a_stand_in_cli(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = script(bin_dir, "docker", FAKE_DOCKER)
    workdir = tmp_path / "testbed"
    workdir.mkdir()
    (workdir / "a.py").write_text("x = 1\n")
    (workdir / "a.py").chmod(0o755)
    (tmp_path / "secret.txt").write_text("secret\n")
    (workdir / "leak").symlink_to(tmp_path / "secret.txt")

    async def scenario() -> None:
        rt = DockerRuntime("img", workdir=str(workdir), docker=str(docker))
        assert isinstance(rt, Runtime)
        await rt.start()
        assert f"--name {rt.name}" in (bin_dir / "run.log").read_text()
        assert await rt.read_file("a.py") == "x = 1\n"
        await rt.write_file(f"{workdir}/a.py", "x = 2\n")
        await rt.write_file("pkg/new.py", "y = 1\n")
        assert (workdir / "a.py").read_text() == "x = 2\n"
        assert os.stat(workdir / "a.py").st_mode & 0o777 == 0o755
        assert await rt.list_dir(".") == ["a.py", "leak", "pkg/"]
        for bad in ["leak", "../secret.txt", "/etc/passwd"]:
            with pytest.raises(PermissionError):
                await rt.read_file(bad)
        with pytest.raises(PermissionError):
            await rt.write_file("leak", "pwned\n")
        assert (tmp_path / "secret.txt").read_text() == "secret\n"
        with pytest.raises(FileNotFoundError):
            await rt.read_file("missing.py")
        with pytest.raises(IsADirectoryError):
            await rt.read_file("pkg")
        with pytest.raises(NotADirectoryError):
            await rt.list_dir("a.py")
        done = await rt.exec("echo out; echo err >&2; exit 4", 10)
        assert (done.exit_code, done.stdout, done.stderr) == (4, "out\n", "err\n")
        slow = await rt.exec("sleep 30", 1)
        assert slow.timed_out and slow.exit_code == 124
        await rt.close()
        await rt.close()
        assert rt.name in (bin_dir / "rm.log").read_text()
        with pytest.raises(RuntimeFailure, match="closed"):
            await rt.read_file("a.py")

    run(scenario())
