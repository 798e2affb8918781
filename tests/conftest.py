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


# Parallel runs (`pytest -n 2 --dist loadgroup`, what scripts/test.sh does): each file stays on
# one worker, so a module's fixtures (a vLLM server, an engine) start once; the files that start
# Ray clusters share one group, so two clusters never run at once on one machine. A scheduler of
# our own: with pytest 9, xdist 3.8's `xdist_group` marks no longer reach its loadgroup
# scheduler (it renames `item._nodeid`, which pytest 9's `nodeid` no longer reads).
RAY_FILES = {"test_cluster.py", "test_compose.py", "test_dispatch_ray.py", "test_ray_fsdp.py"}


def test_group(nodeid: str) -> str:
    """The worker group of a test: its file, or "ray" for the files that start Ray."""
    path = nodeid.split("::", 1)[0]
    return "ray" if Path(path).name in RAY_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # xdist's own schedulers for every other --dist
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid)

    return FileGroups(config, log)
