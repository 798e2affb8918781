"""The code-index sample package both code-search test modules run on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conveyor.tasks.swe.codesearch.index import CodeIndex

SAMPLE = Path(__file__).parents[2] / "fixtures" / "code_index_sample"


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample package plus a module that does not parse (kept out of the repository, where
    it would break the linters)."""
    root = tmp_path_factory.mktemp("sample") / "code_index_sample"
    shutil.copytree(SAMPLE, root)
    (root / "shapes" / "broken.py").write_text("def oops(:\n    return 1\n")
    return root


@pytest.fixture(scope="module")
def index(sample: Path) -> CodeIndex:
    return CodeIndex.build(sample)
