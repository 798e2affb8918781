"""The HTML shell: data, script and style inline, and a content security policy that forbids
every request, so the page works offline and cannot leak a run's contents anywhere."""

from __future__ import annotations

import html

from conveyor.view.script import SCRIPT
from conveyor.view.style import STYLE

_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def embed_json(data_json: str) -> str:
    """`data_json` safe inside a <script> element: no `</script>` or `<!--` can appear, since
    `<` occurs in JSON only inside strings, where `\\u003c` means the same character."""
    return data_json.replace("<", "\\u003c")


def render_page(data_json: str, title: str) -> str:
    """The complete HTML document for a run whose page data is `data_json`."""
    name = html.escape(title)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{name} · conveyor view</title>
<style>{STYLE}</style></head>
<body>
<header><h1>{name}</h1><nav><a href="#summary">Summary</a><a href="#list">Trajectories</a>
<a id="nav-compare" href="#compare">Before / after</a></nav></header>
<main id="main"></main>
<script id="run-data" type="application/json">{embed_json(data_json)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
