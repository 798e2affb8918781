"""SWE hints: the general `HintPolicy` plus "paging through files without searching".

When the agent has viewed files with `str_replace_editor` `VIEW_PAGING_THRESHOLD` times (or more)
since it last called `search_code`, one hint suggests `search_code`; it fires again only after
another run of views. Like every hint it is text the policy did not sample (loss mask 0) and is
counted per trigger (`hint_view_without_search`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from conveyor.agent.hints import HintPolicy, TurnObservation

VIEW_PAGING_THRESHOLD = 4
VIEW_WITHOUT_SEARCH = "view_without_search"
SEARCH_HINT = (
    "[hint] You have paged through files with `view` several times without searching. Use "
    "`search_code` to jump to a definition (e.g. search_code(query='parse_config')), its "
    "callers (kind='callers'), or code matching a description."
)


@dataclass
class SweHintPolicy(HintPolicy):
    """`HintPolicy` with the SWE trigger; `view_threshold` views since the last search fire it."""

    view_threshold: int = VIEW_PAGING_THRESHOLD
    views_since_search: int = 0

    def hints_for(self, seen: TurnObservation) -> list[str]:
        """The general hints, then the search hint when its trigger fires."""
        hints = super().hints_for(seen)
        if not self.config.enabled:
            return hints
        for call in _calls(seen.action_key):
            name, arguments = call.get("name"), call.get("arguments")
            arguments = arguments if isinstance(arguments, dict) else {}
            if name == "search_code":
                self.views_since_search = 0
            elif name == "str_replace_editor" and arguments.get("command") == "view":
                self.views_since_search += 1
        if self.views_since_search >= self.view_threshold:
            self.views_since_search = 0
            self.counts[VIEW_WITHOUT_SEARCH] += 1
            hints.append(SEARCH_HINT)
        return hints


def _calls(action_key: str) -> list[dict[str, object]]:
    """The tool calls of a turn from the loop's action key (a JSON list of calls)."""
    try:
        calls = json.loads(action_key) if action_key else []
    except ValueError:
        return []
    return [c for c in calls if isinstance(c, dict)]
