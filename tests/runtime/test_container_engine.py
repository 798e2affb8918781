"""Choosing the OCI engine and its environment, without an engine: Conveyor's containers.conf
for podman (written once, only through CONTAINERS_CONF, never over the user's own), the
engine a client name means, and the base image's tag."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.runtime.engine import CONF_ENV, PODMAN_CONF, engine_of, podman_conf
from conveyor.runtime.images import BaseRecipe


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path))
    monkeypatch.delenv("CONTAINERS_CONF", raising=False)
    monkeypatch.delenv(CONF_ENV, raising=False)
    return tmp_path


def test_podman_reads_conveyor_s_own_conf(cache: Path) -> None:
    engine = engine_of("/usr/bin/podman")
    conf = cache / "containers" / "containers.conf"
    assert engine.name == "podman" and engine.env is not None
    assert engine.env["CONTAINERS_CONF"] == str(conf)
    text = conf.read_text()
    assert text == PODMAN_CONF
    for line in ('cgroup_manager = "cgroupfs"', "default_ulimits = []", 'runtime = "runc"'):
        assert line in text
    conf.write_text("stale\n")  # an older Conveyor's: rewritten
    assert podman_conf() == conf and conf.read_text() == PODMAN_CONF


def test_a_user_s_own_conf_wins(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTAINERS_CONF", "/etc/mine.conf")
    assert engine_of("podman").env is None  # podman runs with the user's environment as is
    assert not (cache / "containers").exists()
    monkeypatch.delenv("CONTAINERS_CONF")
    monkeypatch.setenv(CONF_ENV, "")
    assert engine_of("podman").env is None
    monkeypatch.setenv(CONF_ENV, "/srv/other.conf")
    env = engine_of("podman").env
    assert env is not None and env["CONTAINERS_CONF"] == "/srv/other.conf"


def test_docker_gets_no_conf(cache: Path) -> None:
    docker = engine_of("docker")
    assert (docker.name, docker.client, docker.env) == ("docker", "docker", None)
    assert docker.argv("ps", "-a") == ["docker", "ps", "-a"]


def test_the_base_image_tag_is_a_hash_of_its_recipe() -> None:
    tag = BaseRecipe().tag
    assert tag.startswith("conveyor-base:") and len(tag.split(":")[1]) == 16
    assert BaseRecipe().tag == tag
    assert BaseRecipe(packages=("python3", "git")).tag != tag
    assert BaseRecipe(mirror="http://mirror.example/debian").tag != tag
