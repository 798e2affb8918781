"""Shared fixtures: the real embedded model and its tokenizer, prepared once per machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Two cores: torch threads fight every other process (10-70x slower) unless capped.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct HF folder (converted from the shipped GGUF once)."""
    from conveyor.models import prepare_default_model

    return prepare_default_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    """The real SmolLM2 tokenizer."""
    from conveyor.engines.factory import load_tokenizer

    return load_tokenizer(model_dir)


# Parallel runs (`pytest -n 2`, what scripts/test.sh does): each file stays on one worker, so a
# module's fixtures (a vLLM server, an engine) start once; the files that start Ray clusters
# share one group, so two clusters never run at once on one machine.
RAY_FILES = {"test_cluster.py", "test_compose.py", "test_dispatch_ray.py", "test_ray_fsdp.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("ray" if name in RAY_FILES else str(item.path)))
