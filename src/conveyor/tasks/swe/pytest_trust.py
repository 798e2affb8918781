"""The bootstrap's checks of pytest's state: the snapshot of the runner's code and the reporter's
data, and the plugin check; copied into each test env as `conveyor_trust.py`.

Stand-alone (no conveyor imports). `make_guard` is called by the bootstrap after pytest, pluggy
and the trusted plugins are imported and before any project code runs; the checks it returns
are closures bound to what they use at that moment (builtins and helpers included), so code
that later replaces a global of this module, of `__main__` or of `builtins` does not change
what they do. A finding is written to the outcome channel at once, as a
`{"kind": "tamper", "what": ...}` record (`report`), never kept in a list.

Snapshot (`check`): by identity, every function (and its code), class, and class member of
pytest, `_pytest`, pluggy and the grader's own modules; every global of the reporter
(`conveyor_outcomes`, except the test it marks as running), of `__main__` (the bootstrap) and
of `json`; `os.write`, `os._exit`; the hook implementations pluggy calls (each one's function),
and pluggy's hook executor. A change whose new code lies in a trusted file is pytest configuring
itself (its `legacypath` plugin adds methods to `Config`, `Node`, ...) and is accepted; any
other is tampering.

Plugin check (`check_plugin`): a registered plugin must be a module that `sys.modules` holds
under its name with a `__file__` in a trusted root or a declared `conftest.py`, an object whose
class resolves by identity (`vars(sys.modules[cls.__module__])` down its `__qualname__`) to a
class defined in such a module, with every method of its classes (and every hook
implementation registered for it) in trusted code, or the bootstrap's own watcher.

Item check (`check_item`, as each test's call phase starts): the function pytest is about to
call, and the item's fixtures, are code of a declared test file or a trusted library, and no
method of the item is replaced on the instance. It holds no state: a wrapper the project put in
the test's place (an import hook's, a neutered `item.obj` or `item.runtest`) is seen when it
would run, whatever was restored later.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

GUARDED_PACKAGES = frozenset({"pytest", "_pytest", "pluggy", "conveyor_outcomes", "conveyor_trust"})
GUARDED_PACKAGES |= {"conveyor_audit", "conveyor_audit_files", "conveyor_pins"}
VALUE_GUARDED = frozenset({"conveyor_outcomes", "__main__", "json", "conveyor_trust"})
_METHODS = (types.FunctionType, classmethod, staticmethod, property)

Guard = tuple[
    Callable[..., None], Callable[[Any], None], Callable[[Any], None], Callable[[Any], None]
]


def make_guard(
    outcomes_fd: int,
    report: Callable[[str], None],
    trusted_roots: list[str],
    declared: list[str],
    watch_class: type,
    *,
    snapshot: bool,
    plugin_check: bool,
    item_check: bool,
) -> Guard:
    """(`check(final=False)`, `check_plugin(plugin)`, `watch(pluginmanager)`,
    `check_item(item)`); each does nothing when its defence is switched off. `declared`: the
    task's test files and conftests."""

    _type, _len, _isinstance, _vars, _id, _tuple = type, len, isinstance, vars, id, tuple
    _str, _sorted, _list, _dict, _set, _zip = str, sorted, list, dict, set, zip
    _getattr, _any, _frozenset, _range, _all, _map = getattr, any, frozenset, range, all, map
    from operator import is_

    _object, _property, _classmethod, _staticmethod = object, property, classmethod, staticmethod
    modules = sys.modules
    builtins_module = modules["builtins"]
    function_type, module_type = types.FunctionType, types.ModuleType
    method_kinds = _METHODS
    bound_method = types.MethodType
    type_module = type.__dict__["__module__"].__get__
    type_qualname = type.__dict__["__qualname__"].__get__
    roots = _tuple(r.rstrip("/") + "/" for r in trusted_roots if r.startswith("/"))
    declared_files = frozenset(declared)
    guarded = GUARDED_PACKAGES
    value_guarded = VALUE_GUARDED
    outcomes_mutable: frozenset[str] = _getattr(
        modules.get("conveyor_outcomes"), "MUTABLE", frozenset()
    )
    missing = _object()
    type_mro = type.__dict__["__mro__"].__get__
    getframe = sys._getframe
    from conveyor_pins import broken_writer, check_pins, pin

    def state(_s: Any = None) -> Any:
        """The guard's state, a tuple held as this function's default (only an audited
        `__defaults__` assignment changes it)."""
        return _s

    # Its fields, by index.
    ENTRIES, CLASSES, SPACES, FIRST_LABELS, PM, INNER, CALLER_CLASS, IMPLS, REPORTED, QUICK = (
        _range(10)
    )

    def put(**fields: Any) -> None:
        """Change the state, unless code of the project is on the stack (a check run inside
        its call, e.g. a plugin registration it made): the audit hook would refuse the
        assignment, and the check runs again later from pytest alone."""
        frame: Any = getframe(1)
        while frame is not None:
            if not trusted_file(frame.f_code.co_filename):
                return
            frame = frame.f_back
        now = _list(state())
        for name, value in fields.items():
            now[names[name]] = value
        state.__defaults__ = (_tuple(now),)

    names = {
        "entries": ENTRIES,
        "classes": CLASSES,
        "spaces": SPACES,
        "first_labels": FIRST_LABELS,
        "pm": PM,
        "inner": INNER,
        "caller_class": CALLER_CLASS,
        "impls": IMPLS,
        "reported": REPORTED,
        "quick": QUICK,
    }
    inert = _frozenset({_type(None), bool, int, float, _str, bytes})

    def trusted_file(name: Any) -> bool:
        if _type(name) is not _str:
            return False
        return (
            name in declared_files
            or name.startswith("<frozen ")
            or (name.startswith(roots) and "/../" not in name and "/./" not in name)
        )

    def trusted_code(item: Any) -> bool:
        """A function (method, property, class- or static method) whose code is trusted."""
        if _type(item) is bound_method:
            item = item.__func__
        if _type(item) is _property:
            item = item.fget
        elif _type(item) is _classmethod or _type(item) is _staticmethod:
            item = item.__func__
        if _type(item) is not function_type:
            return False
        return trusted_file(item.__code__.co_filename)

    def trusted_module(module: Any) -> bool:
        if _type(module) is not module_type:
            return False
        space = _vars(module)
        name = space.get("__name__")
        if _type(name) is not _str or modules.get(name) is not module:
            return False
        return module is builtins_module or trusted_file(space.get("__file__"))

    def trusted_class(cls: Any) -> str | None:
        """Why `cls` is not a class of a trusted module (resolved by identity), or None."""
        for klass in type_mro(cls):
            if klass is _object:
                continue
            module = modules.get(type_module(klass))
            if not trusted_module(module):
                return f"class {type_qualname(klass)} of untrusted module {type_module(klass)}"
            found: Any = module
            for part in type_qualname(klass).split("."):
                found = _vars(found).get(part) if _isinstance(found, (module_type, _type)) else None
            if found is not klass:
                return f"class {type_qualname(klass)} is not {type_module(klass)}'s own"
            for name, member in _list(_vars(klass).items()):
                if _isinstance(member, method_kinds) and not trusted_code(member):
                    return f"method {type_qualname(klass)}.{name} from untrusted code"
        return None

    def plugin_problem(plugin: Any) -> str | None:
        if plugin is None or _type(plugin) is watch_class:
            return None
        space: Any
        if _type(plugin) is module_type:
            space = _vars(plugin)
            name = space.get("__name__")
            if _type(name) is not _str or modules.get(name) is not plugin:
                return f"plugin module {name!s:.100} is not the module sys.modules holds"
            path = space.get("__file__")
            if _type(path) is not _str:
                return f"plugin module {name:.100} has no file"
            if not trusted_file(path):
                return f"plugin module {name:.100} from {path:.200}"
            return None
        if _isinstance(plugin, _type):
            return trusted_class(plugin)
        why = trusted_class(_type(plugin))
        if why is not None:
            return f"plugin object: {why}"
        space = _getattr(plugin, "__dict__", None)
        if _type(space) is _dict:
            for name, value in _list(space.items()):
                if _type(name) is not _str or (
                    name.startswith("pytest_") and not trusted_code(value)
                ):
                    return f"plugin object with its own hook {name!s:.60}"
        return None

    def tamper(what: str) -> None:
        reported = state()[REPORTED]
        if what not in reported and _len(reported) < 200:
            report(what)
            put(reported=reported | {what})

    # ---- the snapshot

    # (namespace, key, object, its code or None, label, strict: no change is acceptable)
    Entry = tuple[dict[str, Any], str, Any, Any, str, bool]

    def take_view() -> None:
        entries: list[Entry] = []
        classes: list[tuple[type, frozenset[str]]] = []
        spaces: list[tuple[str, dict[str, Any], frozenset[str]]] = []
        for name, module in _list(modules.items()):
            top = name.split(".")[0]
            if module is None or (top not in guarded and name not in value_guarded):
                continue
            entries.append((modules, name, module, None, f"sys.modules[{name}]", True))
            space = _vars(module)
            spaces.append((name, space, _frozenset(space)))
            every = name in value_guarded
            for attr, value in _list(space.items()):
                label = f"{name}.{attr}"
                code = value.__code__ if _type(value) is function_type else None
                if every and not (name == "conveyor_outcomes" and attr in outcomes_mutable):
                    entries.append((space, attr, value, code, label, True))
                elif _type(value) is function_type and value.__globals__ is space:
                    # A function of this module's own (not one stored into it at run time,
                    # as pytest does with `_pytest.assertion.util._reprcompare` per test).
                    entries.append((space, attr, value, code, label, False))
                elif _isinstance(value, _type):
                    entries.append((space, attr, value, None, label, False))
                if _isinstance(value, _type) and top in guarded and value.__module__ == name:
                    members = _vars(value)
                    classes.append((value, _frozenset(members)))
                    for member, item in _list(members.items()):
                        if _isinstance(item, method_kinds):
                            code = _getattr(item, "__code__", None)
                            entries.append(
                                (members, member, item, code, f"{label}.{member}", False)
                            )
        for module_name, attr in (("os", "write"), ("os", "_exit"), ("posix", "write")):
            space = _vars(modules[module_name])
            entries.append((space, attr, space.get(attr), None, f"{module_name}.{attr}", True))
        groups: dict[int, tuple[Any, list[str], list[Any]]] = {}
        for space, attr, value, _code, _label, _strict in entries:
            group = groups.setdefault(_id(space), (space, [], []))
            group[1].append(attr)
            group[2].append(value)
        quick = _tuple((g[0], _tuple(g[1]), _tuple(g[2])) for g in groups.values())
        put(
            entries=_tuple(entries),
            classes=_tuple(classes),
            spaces=_tuple(spaces),
            quick=quick,
        )

    def changes(thorough: bool) -> list[tuple[str, Any, bool]] | None:
        """(what, new value or `missing`, strict) of each entry, class and guarded namespace
        that changed; None when nothing did. After each test only identities and sizes are
        compared, in C (well under a millisecond for the ~4000 entries); `thorough` (at the
        end) also compares each function's code (reading `__code__` is an audited event,
        costly when repeated; a `__code__` set by the project is refused by the audit hook as
        it happens)."""
        found: list[tuple[str, Any, bool]] = []
        now_state = state()
        first_labels = now_state[FIRST_LABELS]
        same = not thorough
        for space, keys, values in now_state[QUICK]:  # the same objects: compared in C
            if same and not _all(_map(is_, _map(space.get, keys), values)):
                same = False
        for cls, members in now_state[CLASSES]:
            if same and _len(_vars(cls)) != _len(members):
                same = False
        for _module_name, space, keys in now_state[SPACES]:
            if same and _len(space) != _len(keys):
                same = False
        if same:
            return None
        for space, name, item, code, label, strict in now_state[ENTRIES]:
            now = space.get(name, missing)
            if now is not item or (thorough and code is not None and now.__code__ is not code):
                found.append((label, now, strict or (now is missing and label in first_labels)))
        for cls, members in now_state[CLASSES]:
            now_members = _vars(cls)
            if _len(now_members) != _len(members):
                for key in _list(now_members):
                    if key not in members:
                        label = f"{type_module(cls)}.{type_qualname(cls)}.{key}"
                        found.append((label, now_members[key], False))
        for module_name, space, keys in now_state[SPACES]:
            if _len(space) != _len(keys):
                for key in _list(space):
                    if key not in keys and _isinstance(space[key], (_type, function_type)):
                        found.append((f"{module_name}.{key}", space[key], False))
        return found

    # ---- the hook implementations pluggy calls

    def hookimpls() -> tuple[Any, ...]:
        relay = state()[PM].hook
        found = []
        for caller in _list(_vars(relay).values()):
            for impl in _list(_getattr(caller, "_hookimpls", ())):
                found.append(impl)
                found.append(impl.function)
        return _tuple(found)

    def hookimpl_problems() -> list[str]:
        now_state = state()
        pm = now_state[PM]
        problems = []
        if pm._inner_hookexec is not now_state[INNER]:
            problems.append("pluggy's hook executor was replaced")
        for caller in _list(_vars(pm.hook).values()):
            if _type(caller) is not now_state[CALLER_CLASS]:
                problems.append(f"hook caller of type {type_qualname(_type(caller))}")
                continue
            for impl in _list(caller._hookimpls):
                plugin = impl.plugin
                if not pm.is_registered(plugin):
                    problems.append(f"hook {caller.name} of an unregistered plugin")
                elif _type(plugin) is not watch_class and not trusted_code(impl.function):
                    problems.append(f"hook {caller.name} from untrusted code")
        return problems

    def watch(pm: Any, _armed: Any = None) -> None:
        """Start watching `pm`'s hooks (from the first plugin registration)."""
        _armed[0](_armed[1])  # the pins hold (see the end of make_guard)
        if state()[PM] is not None or not plugin_check:
            return
        put(pm=pm, inner=pm._inner_hookexec, caller_class=_type(pm.hook.pytest_configure))

    def check_plugin(plugin: Any, _armed: Any = None) -> None:
        _armed[0](_armed[1])  # the pins hold (see the end of make_guard)
        if plugin_check:
            problem = plugin_problem(plugin)
            if problem is not None:
                tamper(problem)
        check()

    def acceptable(value: Any) -> bool:
        """A change pytest makes to itself: trusted code, plain data, or a member it added
        removed again (its `legacypath` plugin undoes its additions when unconfigured)."""
        return value is missing or _type(value) in inert or trusted_code(value)

    def check(final: bool = False, thorough: bool = False, _armed: Any = None) -> None:
        _armed[0](_armed[1])  # the pins hold (see the end of make_guard)
        if snapshot:
            found = changes(final or thorough)
            if found is not None:
                for what, value, strict in found:
                    if strict or not acceptable(value):
                        tamper(f"changed: {what}")
                take_view()  # the accepted (trusted) changes are the state from now on
        if plugin_check and state()[PM] is not None:
            now = hookimpls()
            seen = state()[IMPLS]
            if final or _len(now) != _len(seen) or _any(a is not b for a, b in _zip(now, seen)):
                for found_problem in hookimpl_problems():
                    tamper(found_problem)
                put(impls=now)
            if final:
                for _name, plugin in _list(state()[PM].list_name_plugin()):
                    problem = plugin_problem(plugin)
                    if problem is not None:
                        tamper(problem)

    # ---- the test about to run

    python_module = modules["_pytest.python"]
    function_item = python_module.Function
    method_kinds_and_types = (*method_kinds, _type)

    def class_member(cls: type, name: str) -> Any:
        for klass in type_mro(cls):
            found = _vars(klass).get(name, missing)
            if found is not missing:
                return found
        return missing

    def inherited_test(item: Any, function: Any) -> bool:
        """A test method of a test class (of a declared test file) whose code the library
        provides: markdown's test classes get their methods from `LegacyTestCase` (and its
        metaclass) in `markdown/test_tools.py`, which is the agent's to edit anyway. Accepted
        when the class resolves the test's name to this very function; a library that rebinds
        a test class's attribute at run time is not seen by this check (canaries and the audit
        hook's import checks are)."""
        cls = _getattr(item, "cls", None)
        name = _getattr(item, "originalname", None) or _getattr(item, "name", None)
        if not _isinstance(cls, _type) or _type(name) is not _str:
            return False
        module_name: Any = _getattr(cls, "__module__", None)
        module = modules.get(module_name) if _type(module_name) is _str else None
        if _getattr(module, "__file__", None) not in declared_files:
            return False
        for klass in _getattr(cls, "__mro__", ()):
            if name in _vars(klass):
                return _vars(klass)[name] is function
        return False

    def item_problem(item: Any) -> str | None:
        """Why the test `item` is not the one collected from the task's files, if so: an
        instance-level replacement of one of its methods, a test function or a fixture whose
        code is neither a declared test file's nor a trusted library's."""
        nodeid = _getattr(item, "nodeid", "?")
        cls = _type(item)
        why = trusted_class(cls)
        if why is not None:
            return f"{nodeid}: item {why}"
        space: Any = _getattr(item, "__dict__", None)
        if _type(space) is _dict:
            for key in _list(space):
                if _type(key) is not _str:
                    return f"{nodeid}: odd attribute"
                if _isinstance(class_member(cls, key), method_kinds_and_types):
                    return f"{nodeid}: {key} replaced on the item"
        if _isinstance(item, function_item):
            function: Any = item.obj
            if _type(function) is bound_method:
                function = function.__func__
            if _type(function) is not function_type:
                return f"{nodeid}: runs a {type_qualname(_type(function))}, not a function"
            if not trusted_code(function) and not inherited_test(item, function):
                return f"{nodeid}: runs {function.__code__.co_filename}'s code"
            info = _getattr(item, "_fixtureinfo", None)
            for definitions in _list(_getattr(info, "name2fixturedefs", {}).values()):
                for definition in definitions:
                    function = _getattr(definition, "func", None)
                    if _type(function) is bound_method:
                        function = function.__func__
                    if _type(function) is function_type and not trusted_code(function):
                        code_file = function.__code__.co_filename
                        return f"{nodeid}: fixture {definition.argname} from {code_file}"
        return None

    def check_item(item: Any, _armed: Any = None) -> None:
        _armed[0](_armed[1])  # the pins hold (see the end of make_guard)
        if item_check:
            problem = item_problem(item)
            if problem is not None:
                tamper(problem)

    state.__defaults__ = ((None,) * 10,)
    put(impls=(), reported=_frozenset())
    take_view()
    put(first_labels=_frozenset(entry[4] for entry in state()[ENTRIES]))
    # Pin every closure cell and dict the checks read, as each one's defaults: a cell or dict
    # changed later is seen when any of them runs next.
    cell_pins, dict_pins = pin([check, check_plugin, watch, check_item])
    armed = (check_pins, (cell_pins, dict_pins, missing, broken_writer(outcomes_fd)))
    check.__defaults__ = (False, False, armed)
    for function in (check_plugin, watch, check_item):
        function.__defaults__ = (armed,)
    return check, check_plugin, watch, check_item
