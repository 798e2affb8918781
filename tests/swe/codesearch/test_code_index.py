"""CodeIndex on a small multi-module package: definitions, resolved references, callers, search."""

from __future__ import annotations

import itertools
import shutil
import threading
from pathlib import Path

import pytest

from conveyor.tasks.swe.codesearch.index import CodeIndex, IndexCache, content_hash, is_test_path

SAMPLE = Path(__file__).parents[2] / "fixtures" / "code_index_sample"


def _where(refs: list, path: str) -> list[int]:
    return sorted(r.line for r in refs if r.path == path)


def test_definitions_have_qualnames_kinds_spans_and_docs(index: CodeIndex) -> None:
    d = index.definition("shapes.core.Shape.area")
    assert d is not None
    assert (d.kind, d.path, d.line, d.end_line) == ("method", "shapes/core.py", 15, 17)
    assert d.signature == "(self) -> float"
    assert d.doc == "Surface covered by the shape."
    kinds = {d.qualname: d.kind for d in index.definitions}
    assert kinds["shapes.geometry.measure"] == "module"
    assert kinds["shapes"] == "module"  # a package's __init__
    assert kinds["shapes.core.Polygon"] == "class"
    assert kinds["shapes.core.parse_shape"] == "function"
    assert kinds["shapes.core._normalise.inner"] == "function"  # nested
    assert kinds["shapes.render.Renderer._prepare"] == "method"


def test_signatures_are_rendered_from_the_syntax_tree(index: CodeIndex) -> None:
    def signature(qualname: str) -> str:
        found = index.definition(qualname)
        assert found is not None
        return found.signature

    assert signature("shapes.core.parse_shape") == "(text: str, *, strict: bool = False) -> Shape"
    assert signature("shapes.core._normalise") == "(text, /, lower=True, *rest, **options)"
    assert signature("shapes.core.Polygon.perimeter") == (
        "(self, lengths: list[float], *, scale: float = 1.0) -> float"
    )
    assert signature("shapes.core.Polygon") == "(Shape)"
    first = index.definition("shapes.core.parse_shape")
    assert first is not None and first.doc.startswith("Parse a textual description")


def test_tests_are_kept_and_tagged(index: CodeIndex) -> None:
    test = index.definition("check_core.test_parse")
    assert test is not None and test.is_test
    assert not index.definition("shapes.core.parse_shape").is_test  # type: ignore[union-attr]
    assert is_test_path("pkg/tests/helpers.py") and is_test_path("test_x.py")
    assert not is_test_path("pkg/testing_tools.py")


def test_a_file_that_does_not_parse_is_skipped_and_counted(index: CodeIndex) -> None:
    assert index.failed == ["shapes/broken.py"]
    assert index.stats["failed_files"] == 1
    assert not any(d.path == "shapes/broken.py" for d in index.definitions)


def test_references_resolve_aliases_relative_imports_and_re_exports(index: CodeIndex) -> None:
    refs = index.find_references("shapes.core.parse_shape")
    # `import shapes.core as sc; sc.parse_shape(...)` and `from ..core import parse_shape`
    assert _where(refs, "shapes/geometry/measure.py") == [7, 16, 17]
    # `from .core import parse_shape as parse` in __init__, then `from shapes import parse`
    assert _where(refs, "shapes/__init__.py") == [4]
    assert _where(refs, "shapes/render.py") == [5, 15]
    assert _where(refs, "tests/check_core.py") == [1, 5]
    # asking by the re-exported name finds the same uses
    assert index.find_references("shapes.parse") == refs


def test_references_through_self_class_attribute_and_alias(index: CodeIndex) -> None:
    area = index.find_references("shapes.core.Shape.area")
    assert _where(area, "shapes/core.py") == [21]  # self.area() inside the class
    # `Polygon.area(shape)`: inherited from Shape
    assert _where(area, "shapes/geometry/measure.py") == [18]
    describe = index.find_references("shapes.core.Shape.describe")
    assert _where(describe, "shapes/render.py") == [16]  # `from . import core; core.Shape...`
    assert _where(describe, "shapes/core.py") == [33]  # self.describe() in a subclass
    # `from ..core import Shape as S`: used as annotation and as a base class
    shape = index.find_references("shapes.core.Shape", include_imports=False)
    assert {10, 26} <= set(_where(shape, "shapes/geometry/measure.py"))
    survey = index.definition("shapes.geometry.measure.Survey")
    assert survey is not None and index.resolve(survey.bases[0]) == "shapes.core.Shape"


def test_local_names_shadow_and_self_writes_are_not_uses(index: CodeIndex) -> None:
    # `shape.area()` on a local variable cannot be resolved and must not be guessed
    area = index.find_references("shapes.core.Shape.area")
    assert all(r.line != 12 for r in area if r.path == "shapes/geometry/measure.py")
    # `self.name = name` assigns; it is no reference to the class
    shape = index.find_references("shapes.core.Shape")
    assert not [r for r in shape if r.path == "shapes/core.py" and r.line in (12, 13)]


def test_callers_are_the_enclosing_definitions(index: CodeIndex) -> None:
    callers = {
        c.definition.qualname: [r.line for r in c.calls]
        for c in index.find_callers("shapes.core.parse_shape")
    }
    assert callers == {
        "shapes.geometry.measure.measure": [16, 17],
        "shapes.render.Renderer.draw": [15],
        "check_core.test_parse": [5],
    }
    nested = index.find_callers("shapes.render.Renderer")
    assert [c.definition.qualname for c in nested] == ["shapes.render.render.helper"]
    assert [c.definition.qualname for c in index.find_callers("shapes.render.render.helper")] == [
        "shapes.render.render"
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("parse_shape", "shapes.core.parse_shape"),
        ("parse_shap", "shapes.core.parse_shape"),  # partial
        ("prase_shape", "shapes.core.parse_shape"),  # typo
        ("ParseShape", "shapes.core.parse_shape"),  # other case convention
        ("PARSE_SHAPE", "shapes.core.parse_shape"),
        ("perimter", "shapes.core.Polygon.perimeter"),
        ("hypotenuse", "shapes.geometry.measure.compute_hypotenuse"),  # one word of the name
        ("Shape.area", "shapes.core.Shape.area"),
        ("shapes.parse", "shapes.core.parse_shape"),  # re-export
        ("renderer", "shapes.render.Renderer"),
    ],
)
def test_fuzzy_name_matching_ranks_the_right_definition_first(
    index: CodeIndex, query: str, expected: str
) -> None:
    matches = index.find_definition(query)
    assert matches and matches[0].definition.qualname == expected
    assert all(a.score >= b.score for a, b in itertools.pairwise(matches))


def test_exact_names_score_above_fuzzy_ones(index: CodeIndex) -> None:
    scores = {m.definition.qualname: m.score for m in index.find_definition("area")}
    assert scores["shapes.core.Shape.area"] == 1.0
    assert scores["shapes.geometry.measure.total_area"] < 0.9
    assert index.find_definition("zzzqqq") == []


def test_bm25_finds_a_function_by_docstring_words(index: CodeIndex) -> None:
    hits = index.search_text("length of the long side of a right triangle")
    assert hits[0].definition.qualname == "shapes.geometry.measure.compute_hypotenuse"
    hits = index.search_text("adds up the areas of shapes")
    assert hits[0].definition.qualname == "shapes.geometry.measure.total_area"
    assert index.search_text("zzzqqq") == []


def test_save_and_load_give_identical_results(index: CodeIndex, tmp_path: Path) -> None:
    index.save(tmp_path / "ix")
    loaded = CodeIndex.load(tmp_path / "ix")
    assert loaded.definitions == index.definitions
    assert loaded.references == index.references
    assert loaded.failed == index.failed
    for query in ("parse_shap", "Shape.area", "perimter"):
        assert loaded.find_definition(query) == index.find_definition(query)
    for qualname in ("shapes.parse", "shapes.core.Shape.area", "shapes.core.Shape"):
        assert loaded.find_references(qualname) == index.find_references(qualname)
        assert loaded.find_callers(qualname) == index.find_callers(qualname)
    query = "longest side of a right triangle"
    assert loaded.search_text(query) == index.search_text(query)


def test_index_cache_builds_once_per_content(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(SAMPLE, first)
    shutil.copytree(SAMPLE, second)
    assert content_hash(first) == content_hash(second)
    cache = IndexCache(directory=tmp_path / "store")
    results: list[CodeIndex] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(first))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.builds == 1 and all(r is results[0] for r in results)
    assert cache.get(second) is results[0]  # a copy of the same content shares the index
    (second / "shapes" / "extra.py").write_text("def added():\n    pass\n")
    changed = cache.get(second)
    assert cache.builds == 2 and changed.definition("shapes.extra.added") is not None
    # a fresh cache on the same folder loads from disk instead of building
    again = IndexCache(directory=tmp_path / "store")
    assert again.get(first).definitions == results[0].definitions and again.builds == 0
