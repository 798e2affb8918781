"""BFCL v4 multi-turn data as shipped in the `bfcl-eval` wheel: entries, answers, function docs.

Everything here is read from the installed package (no network): the four multi-turn categories
(`base`, `long_context`, `miss_func`, `miss_param`, 200 entries each), their possible answers
(one list of call strings per user turn) and the function docs of the eight simulator classes.
The docs are turned into OpenAI function schemas; the answers' call strings are *parsed* (Python
literals only, never evaluated) into named arguments for the oracle.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.resources
import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# The multi-turn categories of BFCL v4, in the order the data ships them.
CATEGORIES: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")

BFCL_VERSION = "2026.3.23"

# Simulator class -> its function-doc file and its module (the multi-turn suite's eight classes).
_CLASS_DOCS: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

# BFCL's parameter type names -> JSON-schema type names.
_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


@dataclass(frozen=True)
class Entry:
    """One BFCL multi-turn entry with its possible answer.

    `turns` holds one user message per turn ("" for a `miss_func` holdout turn, whose message is
    the new functions' docs); `missed` maps a holdout turn's index to the functions it reveals;
    `answer` holds, per turn, the ground-truth call strings.
    """

    id: str
    category: str
    scenario: int
    turns: list[str]
    initial_config: dict[str, Any]
    classes: list[str]
    missed: dict[int, list[str]]
    answer: list[list[str]]

    @property
    def long_context(self) -> bool:
        """Whether the simulators load BFCL's long-context padding (as BFCL decides it)."""
        return "long_context" in self.id.rsplit("_", 1)[0]

    def to_data(self) -> dict[str, Any]:
        """The entry as JSON-ready `Task.data`."""
        return {
            "bfcl_id": self.id,
            "category": self.category,
            "scenario": self.scenario,
            "turns": self.turns,
            "initial_config": self.initial_config,
            "classes": self.classes,
            "missed": {str(k): v for k, v in self.missed.items()},
            "answer": self.answer,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Entry:
        """The entry back from `Task.data`."""
        return cls(
            id=data["bfcl_id"],
            category=data["category"],
            scenario=int(data["scenario"]),
            turns=list(data["turns"]),
            initial_config=data["initial_config"],
            classes=list(data["classes"]),
            missed={int(k): list(v) for k, v in data["missed"].items()},
            answer=[list(turn) for turn in data["answer"]],
        )


def _data_dir() -> Any:
    try:
        return importlib.resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise RuntimeError(
            f"the bfcl family needs the bfcl-eval package: pip install --no-deps "
            f"bfcl-eval=={BFCL_VERSION} (as scripts/bootstrap.sh does; its own dependencies "
            "would replace numpy)"
        ) from None


def _jsonl(resource: Any) -> Iterator[dict[str, Any]]:
    for line in resource.read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


@functools.cache
def load_category(category: str) -> tuple[Entry, ...]:
    """Every entry of one multi-turn category, in the dataset's order."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; expected one of {CATEGORIES}")
    name = f"BFCL_v4_multi_turn_{category}.json"
    answers = {
        row["id"]: row["ground_truth"] for row in _jsonl(_data_dir() / "possible_answer" / name)
    }
    entries = []
    for row in _jsonl(_data_dir() / name):
        turns = []
        for messages in row["question"]:
            if len(messages) > 1:
                raise ValueError(f"{row['id']}: a turn with {len(messages)} messages")
            turns.append(messages[0]["content"] if messages else "")
        entries.append(
            Entry(
                id=row["id"],
                category=category,
                scenario=int(row["id"].rsplit("_", 1)[1]),
                turns=turns,
                initial_config=row["initial_config"],
                classes=list(row["involved_classes"]),
                missed={int(k): list(v) for k, v in row.get("missed_function", {}).items()},
                answer=answers[row["id"]],
            )
        )
    return tuple(entries)


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs (name, description, parameters) of one simulator class."""
    if class_name not in _CLASS_DOCS:
        raise ValueError(f"unknown BFCL class {class_name!r}; expected one of {list(_CLASS_DOCS)}")
    resource = _data_dir() / "multi_turn_func_doc" / _CLASS_DOCS[class_name]
    return tuple(_jsonl(resource))


def simulator_classes() -> list[str]:
    """The simulator classes of the multi-turn suite."""
    return list(_CLASS_DOCS)


def simulator_class(class_name: str) -> type:
    """The simulator class itself, imported from BFCL's own module for it."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    cls: type = getattr(module, class_name)
    return cls


def openai_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI function schema of one BFCL function doc (BFCL's `dict`/`float`/`tuple`
    types become `object`/`number`/`array`)."""
    parameters = _convert(doc.get("parameters", {"type": "dict", "properties": {}}))
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": parameters,
        },
    }


def _convert(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value != "any":
                out["type"] = _SCHEMA_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: _convert(prop) for name, prop in value.items()}
        elif key == "items" and isinstance(value, dict):
            out["items"] = _convert(value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class ParsedCall:
    """A ground-truth call string, parsed: the function's name and its literal arguments."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def parse_call(text: str) -> ParsedCall:
    """Parse `name(arg, key=value, ...)` whose arguments are Python literals; `ValueError` for
    anything else. Nothing is evaluated: `ast.literal_eval` reads literals only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"not a call: {text!r} ({error.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call of a plain function name: {text!r}")
    try:
        args = tuple(ast.literal_eval(arg) for arg in node.args)
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        raise ValueError(f"arguments that are not literals in {text!r}") from None
    if len(kwargs) != len(node.keywords):
        raise ValueError(f"**-arguments in {text!r}")
    return ParsedCall(node.func.id, args, kwargs)


def named_arguments(class_name: str, call: ParsedCall) -> dict[str, Any]:
    """`call`'s arguments by parameter name, bound to the simulator method's own signature
    (ground-truth strings sometimes pass arguments by position)."""
    method = getattr(simulator_class(class_name), call.name)
    bound = inspect.signature(method).bind(None, *call.args, **call.kwargs)
    names = list(bound.arguments)
    return {name: bound.arguments[name] for name in names[1:]}  # drop `self`


def owner_of(function: str, classes: list[str]) -> str:
    """The class among `classes` whose docs define `function`; `KeyError` if none does."""
    for class_name in classes:
        if any(doc["name"] == function for doc in function_docs(class_name)):
            return class_name
    raise KeyError(f"no class among {classes} has a function {function!r}")
