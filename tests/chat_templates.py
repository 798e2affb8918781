"""Verbatim third-party chat templates from tests/fixtures (see LICENSE-Qwen.txt there).

A plain module, not conftest: test folders have conftests of their own, and `from conftest
import ...` would get whichever conftest pytest imported last.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"


def template(name: str) -> str:
    """The template file `name`."""
    return (TEMPLATES / name).read_text()
