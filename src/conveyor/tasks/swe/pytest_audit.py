"""The grader's PEP 578 audit hook for the test process; copied into each test env as
`conveyor_audit.py` and installed by the bootstrap (`pytest_bootstrap.py`) before it imports
pytest. An audit hook cannot be removed.

Its state cannot be rewritten either. The hook and its helpers are closures made by `install`,
bound to the builtins and library functions they use at install time (patching `builtins`, `os`
or a module global later changes nothing they do: a test checks they load no global name). Code
of the project may still find them (`gc.get_objects` stays allowed: boltons' own `gcutils`
calls it), so `arm` pins them: every closure cell reachable from the hook and every dict they
read, with what each holds, go into the hook's `__defaults__` (setting those is an audited
event this hook refuses), and each handled event first checks the pins; a cell or dict changed
since is tampering.

Code is *untrusted* unless its file lies in the standard library, the test venv or the grader's
plugin folder (or is frozen), or is one of the task's declared test files: the project's files,
and code compiled from strings, are untrusted. With untrusted code on the stack these are
refused: the hook writes `{"kind": "tamper", "what": ...}` to the outcome channel at once (not
to memory the project could reach and clear) and raises `RuntimeError` (`ImportError` for
imports):
- `sys.settrace`, `sys.setprofile` (a tracer can skip a test's failing line); coverage.py's own
  tracer (the factory's baseline) is let through;
- `sys._current_frames` and every `ctypes.*` event (other threads' frames; memory itself); in
  threads other than the main one also without untrusted code on the stack unless a test
  file's frame is on it (a callback made of builtins run by a thread has no frame of its own);
- making code (`code.__new__`, `code.replace`), making a function of trusted code
  (`function.__new__`), setting a function's `__code__`, setting the defaults of a trusted
  function or of a test function (not of one made inside a test: boltons' `copy_function`
  copies a test's lambda); compiling source under a trusted file name that is not that file's
  content, or under a test file's name; unmarshalling code other than a source file's own byte
  code (a forged `co_filename` would make the project's code look trusted);
- setting a special attribute (`__bases__`, `__name__`, ...) of a class of pytest, pluggy or the
  grader, or `__class__` of an instance of one or to one (Python audits no other attribute
  assignment: the bootstrap's snapshot covers plain ones);
- executing a test file's code (a loader of the project's wrapping the tests);
- the file rules of `pytest_audit_files.py` (`/proc/*/mem`, `/proc/*/fd`, `run.json`, writing
  the declared test files and their folders).
At every `import` and `exec` event the import system must be one the bootstrap can vouch for
(`import_system_problem`), and a module being loaded must come from where its kind says
(`loading_problem`); otherwise tamper and `ImportError`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# The events the hook looks at (and every `ctypes.*` one); any other returns at once.
HANDLED = frozenset(
    """sys.settrace sys.setprofile sys._current_frames code.__new__ function.__new__
    object.__setattr__ marshal.loads marshal.load compile exec import open os.listdir os.scandir
    os.rename os.remove os.rmdir os.truncate os.link os.symlink shutil.rmtree""".split()
)
MAX_CHANNEL_BYTES = 64 << 20  # past this, tamper records are no longer written (still refused)


def install(
    outcomes_fd: int,
    trusted_roots: list[str],
    test_files: list[str],
    run_json: str,
    keep_clear: list[str],
) -> Callable[..., None]:
    """Add the audit hook (idle until armed) and return `arm(*classes)`, which snapshots the
    import system, pins the hook's state and starts enforcing (`classes`: more classes whose
    special attributes only trusted code may set); `arm` works once. `keep_clear`: folders
    whose writes stay allowed although a test file lies in them (the workspace root, the
    project's folder)."""
    import _json
    import posix
    import threading
    import types

    import conveyor_audit_files
    from conveyor_pins import broken_writer, check_pins, pin

    # Everything the hook uses is bound here, before any project code exists.
    os_write, os_fstat = posix.write, posix.fstat
    encode_str = _json.encode_basestring_ascii
    getframe, get_ident = sys._getframe, threading.get_ident
    _type, _len, _isinstance, _vars, _id, _tuple = type, len, isinstance, vars, id, tuple
    _str, _bytes, _frozenset, _open = str, bytes, frozenset, open
    _all, _any, _zip, _range, _list, _dict = all, any, zip, range, list, dict
    _type_error = TypeError
    # Loading a shared library and looking up its symbols is what libraries using ctypes do at
    # import (keyring's macOS backend); reading memory, making objects of addresses and calling
    # foreign functions stay refused.
    ctypes_loading = _frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle"})
    _runtime_error, _import_error, _os_error = RuntimeError, ImportError, OSError
    _no_frame = ValueError
    type_name = type.__dict__["__qualname__"].__get__
    type_mro = type.__dict__["__mro__"].__get__
    function_name = types.FunctionType.__dict__["__qualname__"].__get__
    function_type, code_type = types.FunctionType, types.CodeType
    classmethod_type, staticmethod_type = classmethod, staticmethod
    main_ident = get_ident()
    max_bytes = MAX_CHANNEL_BYTES
    sys_module = sys
    roots = _tuple(r.rstrip("/") + "/" for r in trusted_roots if r.startswith("/"))
    tests = _frozenset(test_files)
    coverage_dir = _coverage_dir()

    def report(what: str) -> None:
        try:
            if os_fstat(outcomes_fd).st_size < max_bytes:
                line = '{"kind": "tamper", "what": ' + encode_str(what[:300]) + "}\n"
                os_write(outcomes_fd, line.encode())
        except _os_error:
            pass

    def refuse(what: str, error: type[Exception] = _runtime_error) -> None:
        report(what)
        raise error(f"conveyor: refused in the graded test process: {what}")

    def kind_of(filename: Any) -> int:
        """0 trusted, 1 untrusted, 2 a declared test file."""
        if _type(filename) is not _str:
            return 1
        if filename in tests:
            return 2
        if filename.startswith("<frozen ") or (
            filename.startswith(roots) and "/../" not in filename and "/./" not in filename
        ):
            return 0
        return 1

    def untrusted(frame: Any) -> str | None:
        """The file of the innermost untrusted frame from `frame` outwards, if any."""
        while frame is not None:
            name = frame.f_code.co_filename
            if kind_of(name) == 1:
                return name if _type(name) is _str else "?"
            frame = frame.f_back
        return None

    def test_frame(frame: Any) -> bool:
        while frame is not None:
            if kind_of(frame.f_code.co_filename) == 2:
                return True
            frame = frame.f_back
        return False

    file_rules = conveyor_audit_files.file_rules(
        refuse, untrusted, test_files, run_json, keep_clear
    )

    # ---- the import system as `arm` found it (filled once, by `arm`, then pinned)

    snapshot: dict[str, Any] = {}
    finder_attrs = _frozenset({"path", "_loaders", "_path_mtime", "_path_cache"})
    finder_attrs |= {"_relaxed_path_cache"}

    def loaders_ok(finder: Any) -> bool:
        loaders = finder._loaders
        expected = snapshot["loaders"]
        if _type(loaders) is not _list or _len(loaders) != _len(expected):
            return False
        for item, (suffix, loader) in _zip(loaders, expected):
            if _type(item) is not _tuple or _len(item) != 2 or item[1] is not loader:
                return False
            if _type(item[0]) is not _str or item[0] != suffix:
                return False
        return True

    def outside_defined(obj: Any, names: tuple[str, ...]) -> bool:
        """Whether `obj` (a function, a class or an instance) is the project's or the tests'
        own: the first of `names` its class defines is a function of theirs."""
        if _type(obj) is function_type:
            return kind_of(obj.__code__.co_filename) != 0
        cls = obj if _isinstance(obj, _type) else _type(obj)
        for klass in type_mro(cls):
            space = _vars(klass)
            for name in names:
                member = space.get(name)
                if member is None:
                    continue
                if _type(member) is classmethod_type or _type(member) is staticmethod_type:
                    member = member.__func__
                return _type(member) is function_type and kind_of(member.__code__.co_filename) != 0
        return False

    def library_finder(finder: Any) -> bool:
        """A finder of the venv's or the standard library's (importlib_metadata adds its
        `MetadataPathFinder` when first imported), used as its class defines it: its
        `find_spec` is trusted code and the instance overrides no method. What it loads is still
        checked when it runs (`loading_problem`)."""
        if _isinstance(finder, _type):
            return False
        try:
            space = _vars(finder)
        except _type_error:  # no instance dict: nothing overridden
            space = {}
        if _any(k in space for k in ("find_spec", "find_module")):
            return False
        for klass in type_mro(_type(finder)):
            member = _vars(klass).get("find_spec")
            if member is None:
                continue
            if _type(member) is classmethod_type or _type(member) is staticmethod_type:
                member = member.__func__
            return _type(member) is function_type and kind_of(member.__code__.co_filename) == 0
        return False

    def import_system_problem() -> str | None:
        """What is wrong with the import system, if anything: a finder, hook or cached finder
        that is neither one present at `arm`, pytest's assertion rewriter, a plain FileFinder,
        nor the project's or the tests' own (toolz's `tlz` adds a finder of its own: what such
        a finder loads is checked when it runs, `loading_problem`). A library's finder, or a
        FileFinder made with other loaders, is how an attack would look trusted."""
        if sys_module.modules is not snapshot["modules"]:
            return "sys.modules was replaced"
        if sys_module.pycache_prefix != snapshot["prefix"]:
            return "sys.pycache_prefix was changed"
        meta, hooks = sys_module.meta_path, sys_module.path_hooks
        if _type(meta) is not _list or _type(hooks) is not _list:
            return "sys.meta_path or sys.path_hooks was replaced"
        for finder in _list(meta):
            if _id(finder) in snapshot["meta"]:
                continue
            if _type(finder) is snapshot["hook_class"]:
                names = snapshot["hook_methods"]
                if _all(_type(k) is _str and k not in names for k in _vars(finder)):
                    continue
            elif outside_defined(finder, ("find_spec", "find_module")):
                continue
            elif library_finder(finder):
                continue
            return f"untrusted sys.meta_path entry {type_name(_type(finder))}"
        for hook in _list(hooks):
            if _id(hook) not in snapshot["hooks"] and not outside_defined(hook, ("__init__",)):
                return "untrusted sys.path_hooks entry"
        cache = sys_module.path_importer_cache
        if cache is not snapshot["cache"] or _type(cache) is not _dict:
            return "sys.path_importer_cache was replaced"
        file_finder = snapshot["finder"]
        for key, value in _list(cache.items()):
            if value is None or _id(value) in snapshot["cached"]:
                continue
            if _type(value) is file_finder and _type(key) is _str:
                if (
                    _type(value.path) is _str
                    and value.path == key
                    and _all(_type(k) is _str and k in finder_attrs for k in _vars(value))
                    and loaders_ok(value)
                ):
                    continue
            elif outside_defined(value, ("find_spec", "find_module")):
                continue
            shown = key[:200] if _type(key) is _str else "?"
            return f"untrusted sys.path_importer_cache entry for {shown}"
        return None

    def loading_problem(code: Any, caller: Any) -> str | None:
        """When a module's code is executed by the import system: a test module must come
        through the standard machinery (a plain `ModuleSpec` whose loader is pytest's assertion
        rewriter or the source loader, for its own file), and a module named like the standard
        library, the venv's packages or the runner from their files."""
        frame, spec = caller, None
        # The loader's frame executes the code; the importer's frame (holding `spec`) is at
        # most two frames above it (code executed deeper down, e.g. a namedtuple's, is not a
        # module being loaded).
        for _ in _range(3):
            if frame is None:
                break
            if frame.f_code is snapshot["load_unlocked"] or frame.f_code is snapshot["pytest_load"]:
                spec = frame.f_locals.get("spec")
                break
            frame = frame.f_back
        if spec is None:
            return None  # not an import (exec of a string, a trusted runner's own loading)
        if _type(spec) is not snapshot["spec_class"]:
            return f"a module loaded with a spec of type {type_name(_type(spec))}"
        name, origin, loader = spec.name, spec.origin, spec.loader
        filename = code.co_filename
        if kind_of(filename) == 2:
            if _type(loader) not in snapshot["test_loaders"] or origin != filename:
                return f"test module {filename} loaded by {type_name(_type(loader))}"
        top = name.partition(".")[0] if _type(name) is _str else ""
        if top in snapshot["library_names"] and top not in snapshot["project_names"]:
            if _type(origin) is _str and origin not in ("built-in", "frozen"):
                if kind_of(origin) != 0 or kind_of(filename) != 0:
                    return f"module {name} loaded from {origin}"
        return None

    # ---- the events

    def on_trace(event: str, args: tuple[Any, ...], caller: Any) -> None:
        where = untrusted(caller)
        if where is None:
            return
        if coverage_dir and caller.f_code.co_filename.startswith(coverage_dir):
            return  # coverage.py (the factory's baseline) installing its tracer in a thread
        refuse(f"{event} from {where}")

    def on_introspection(event: str, args: tuple[Any, ...], caller: Any) -> None:
        where = untrusted(caller)
        if where is not None:
            refuse(f"{event} from {where}")
        if get_ident() != main_ident and not test_frame(caller):
            refuse(f"{event} in a thread not started by a test")

    def on_code(event: str, args: tuple[Any, ...], caller: Any) -> None:
        where = untrusted(caller)
        if where is not None:
            refuse(f"{event} from {where}")

    def on_new_function(event: str, args: tuple[Any, ...], caller: Any) -> None:
        code: Any = args[0] if args else None
        if _type(code) is code_type and kind_of(code.co_filename) == 0:
            where = untrusted(caller)
            if where is not None:
                refuse(f"a function made of {code.co_filename}'s code from {where}")

    def on_setattr(event: str, args: tuple[Any, ...], caller: Any) -> None:
        target, name = args[0], args[1]
        value = args[2] if _len(args) > 2 else None
        name = name if _type(name) is _str else "?"
        if _type(target) is function_type:
            owner = kind_of(target.__code__.co_filename)
            if name == "__code__" or (
                (name == "__defaults__" or name == "__kwdefaults__")
                and (owner == 0 or (owner == 2 and "<locals>" not in function_name(target)))
            ):
                where = untrusted(caller)
                if where is not None:
                    refuse(f"setting {name} of {function_name(target)} from {where}")
            return
        guarded = snapshot["classes"]
        if _id(target) in guarded or (  # a special attribute (`__bases__`, ...) of a class
            name == "__class__" and (_id(_type(target)) in guarded or _id(value) in guarded)
        ):
            where = untrusted(caller)
            if where is not None:
                refuse(f"setting {name} of a {type_name(_type(target))} from {where}")

    def on_marshal(event: str, args: tuple[Any, ...], caller: Any) -> None:
        code = caller.f_code if caller is not None else None
        back = caller.f_back.f_code if caller is not None and caller.f_back else None
        if sys_module.pycache_prefix == snapshot["prefix"] and (
            (code is snapshot["compile_bytecode"] and back is snapshot["source_get_code"])
            or (code is not None and code is snapshot["read_pyc"])
        ):
            return  # a source file's own cached byte code, whose file name importlib fixes
        where = untrusted(caller)
        if where is not None:
            refuse(f"{event} from {where}")

    def on_compile(event: str, args: tuple[Any, ...], caller: Any) -> None:
        filename: Any = args[1] if _len(args) > 1 else None
        if _isinstance(filename, _bytes):
            filename = _bytes.decode(filename, "utf-8", "surrogateescape")
        if not _isinstance(filename, _str):
            return
        filename = "".join((filename, ""))  # an exact str: a subclass's methods never run
        if kind_of(filename) == 1:
            return
        where = untrusted(caller)
        if where is None:
            return
        source = args[0]
        if kind_of(filename) == 0 and not filename.startswith("<"):
            if _type(source) is _str:
                source = source.encode("utf-8", "surrogatepass")
            try:
                with _open(filename, "rb") as handle:
                    if _type(source) is _bytes and handle.read() == source:
                        return  # importing a library module with no cached byte code
            except _os_error:
                pass
        refuse(f"compiling code named {filename} from {where}")

    def on_exec(event: str, args: tuple[Any, ...], caller: Any) -> None:
        on_import(event, args, caller)
        code: Any = args[0] if args else None
        if _type(code) is not code_type:
            return
        if kind_of(code.co_filename) == 2:
            where = untrusted(caller)
            if where is not None:
                refuse(f"test code {code.co_filename} executed from {where}", _import_error)
        problem = loading_problem(code, caller)
        if problem is not None:
            refuse(problem, _import_error)

    def on_import(event: str, args: tuple[Any, ...], caller: Any) -> None:
        problem = import_system_problem()
        if problem is not None:
            refuse(problem, _import_error)

    handlers = {
        "sys.settrace": on_trace,
        "sys.setprofile": on_trace,
        "sys._current_frames": on_introspection,
        "code.__new__": on_code,
        "function.__new__": on_new_function,
        "object.__setattr__": on_setattr,
        "marshal.loads": on_marshal,
        "marshal.load": on_marshal,
        "compile": on_compile,
        "exec": on_exec,
        "import": on_import,
        **file_rules,
    }

    def on_event(event: str, args: tuple[Any, ...]) -> None:
        """Dispatch a handled event (the pins were checked)."""
        try:
            caller = getframe(2)  # the frame whose code raised the event
        except _no_frame:
            caller = None  # C code with no Python frame (e.g. a thread running a builtin)
        handler = handlers.get(event)
        if handler is not None:
            handler(event, args, caller)
        elif event not in ctypes_loading:  # ctypes.*: reaching memory, calling C
            on_introspection(event, args, caller)

    def audit(event: str, args: tuple[Any, ...], _armed: Any = None) -> None:
        # Nothing but this function's defaults is used before the pins are checked.
        if _armed is None:
            return
        handled, verify, pins, dispatch = _armed
        if event not in handled and event[:7] != "ctypes.":
            return
        verify(pins)
        dispatch(event, args)

    def arm(*extra_classes: type) -> None:
        if audit.__defaults__ != (None,):
            refuse("the audit hook was armed twice")
        from importlib.machinery import FileFinder

        rewrite = sys_module.modules.get("_pytest.assertion.rewrite")
        hook_class = getattr(rewrite, "AssertionRewritingHook", None)
        external = sys_module.modules["_frozen_importlib_external"]
        bootstrap = sys_module.modules["_frozen_importlib"]
        meta, hooks = _tuple(sys_module.meta_path), _tuple(sys_module.path_hooks)
        cached = _tuple(sys_module.path_importer_cache.values())
        snapshot.update(
            modules=sys_module.modules,
            cache=sys_module.path_importer_cache,
            prefix=sys_module.pycache_prefix,
            alive=(meta, hooks, cached),  # their ids stay theirs
            meta=_frozenset(_id(f) for f in meta),
            hooks=_frozenset(_id(h) for h in hooks),
            cached=_frozenset(_id(v) for v in cached if v is not None),
            finder=FileFinder,
            loaders=_tuple(_tuple(item) for item in _probe_loaders(FileFinder)),
            hook_class=hook_class,
            hook_methods=_frozenset(_methods_of(hook_class)) if hook_class else _frozenset(),
            compile_bytecode=external._compile_bytecode.__code__,
            source_get_code=external.SourceLoader.get_code.__code__,
            read_pyc=getattr(getattr(rewrite, "_read_pyc", None), "__code__", None),
            load_unlocked=bootstrap._load_unlocked.__code__,
            pytest_load=_pytest_spec_loader_code(),
            spec_class=bootstrap.ModuleSpec,
            test_loaders=_frozenset({hook_class, external.SourceFileLoader} - {None}),
            library_names=_library_names(trusted_roots),
            project_names=_top_level_names(keep_clear),
            classes=_guarded_classes() | {_id(c) for c in extra_classes},
        )
        cell_pins, dict_pins = pin([on_event])
        pins = (cell_pins, dict_pins, object(), broken_writer(outcomes_fd))
        audit.__defaults__ = ((HANDLED, check_pins, pins, on_event),)

    sys.addaudithook(audit)
    return arm


def _coverage_dir() -> str | None:
    """coverage.py's package folder when it runs this process (`coverage run`), else None."""
    module = sys.modules.get("coverage")
    path = getattr(module, "__file__", None)
    return path.rpartition("/")[0] + "/" if path else None


def _probe_loaders(file_finder: Any) -> list[tuple[str, Any]]:
    """The (suffix, loader class) pairs of the FileFinder the standard path hook makes."""
    for hook in sys.path_hooks:
        try:
            finder = hook(sys.prefix)
        except ImportError:
            continue
        if type(finder) is file_finder:
            return list(getattr(finder, "_loaders", []))
    return []


def _pytest_spec_loader_code() -> Any:
    """The code of pytest's own loader for `--import-mode=importlib` (its frame holds `spec`)."""
    pathlib = sys.modules.get("_pytest.pathlib")
    function = getattr(pathlib, "_import_module_using_spec", None)
    return getattr(function, "__code__", None)


def _top_level_names(folders: list[str]) -> frozenset[str]:
    import os

    names: set[str] = set()
    for folder in folders:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        names |= {e.partition(".")[0] for e in entries}
    return frozenset(names)


def _library_names(trusted_roots: list[str]) -> frozenset[str]:
    """Top-level module names of the standard library, the venv and the runner: a module of
    such a name must come from their files."""
    return frozenset(sys.stdlib_module_names) | _top_level_names(trusted_roots)


def _methods_of(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ for name in vars(klass) if not name.startswith("__")}


def _guarded_classes() -> frozenset[int]:
    """Ids of the classes of pytest, pluggy and the grader's modules (alive as long as their
    modules: the ids stay theirs)."""
    found = set()
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in GUARDED_PACKAGES:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                found.add(id(value))
    return frozenset(found)


GUARDED_PACKAGES = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "conveyor_outcomes",
        "conveyor_audit",
        "conveyor_audit_files",
        "conveyor_pins",
        "conveyor_trust",
    }
)
