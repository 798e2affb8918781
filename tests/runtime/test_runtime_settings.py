"""The `runtime` settings section: registered kinds only, docker needs its image, strict."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.selection import RuntimeRequest, choose_runtime


def test_defaults_leave_the_choice_to_each_family() -> None:
    settings = RuntimeConfig()
    assert (settings.kind, settings.docker_image, settings.workspace_size_bytes) == (
        "auto",
        None,
        None,
    )
    assert {"simulated", "local", "bubblewrap", "docker"} <= set(RUNTIMES.names())


def test_an_unknown_kind_names_the_known_ones_and_the_nearest() -> None:
    with pytest.raises(ValidationError, match=r"unknown runtime kind 'bubblwrap'.*'bubblewrap'\?"):
        RuntimeConfig(kind="bubblwrap")


def test_docker_needs_an_image() -> None:
    with pytest.raises(ValidationError, match=r"runtime.kind 'docker' needs runtime.docker_image"):
        RuntimeConfig(kind="docker")
    assert RuntimeConfig(kind="docker", docker_image="python:3.11").docker_image == "python:3.11"


@pytest.mark.parametrize(
    "fields",
    [{"kind": 1}, {"workspace_size_bytes": 0}, {"workspace_size_bytes": "1G"}, {"images": "x"}],
)
def test_bad_values_and_unknown_keys_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RuntimeConfig(**fields)  # type: ignore[arg-type]


def test_every_field_is_described() -> None:
    for name, field in RuntimeConfig.model_fields.items():
        assert field.description, name


def test_choose_runtime_resolves_auto_to_the_family_default() -> None:
    assert choose_runtime("f", RuntimeConfig(), ("local", "docker")) == "local"
    assert (
        choose_runtime("f", RuntimeConfig(kind="docker", docker_image="i"), ("local", "docker"))
        == "docker"
    )
    with pytest.raises(ValueError, match="lists no runtime kind"):
        choose_runtime("f", RuntimeConfig(), ())


def test_a_request_holds_files_or_a_workspace() -> None:
    with pytest.raises(ValueError, match="either files or a host workspace"):
        RuntimeRequest()
    with pytest.raises(ValueError, match="'bubblewrap' works in a host workspace"):
        RuntimeRequest(files={}).host_workspace("bubblewrap")
    with pytest.raises(ValueError, match="in-memory file tree"):
        from pathlib import Path

        RUNTIMES.get("simulated")(RuntimeRequest(workspace=Path("/tmp")), RuntimeConfig())
