"""Read one Python module's syntax tree: its definitions, its name bindings and the names it uses.

`scan_module` is the per-file half of `CodeIndex`: it knows nothing about other modules, so a name
used here is recorded as the dotted path it is bound to *in this module* (`import numpy as np;
np.dot` becomes `numpy.dot`, `from .core import parse as p; p()` becomes `pkg.core.parse`, `self.m`
inside class `C` becomes `pkg.mod.C.m`). `CodeIndex` later follows re-exports and base classes to
turn those paths into the qualified names of real definitions.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from conveyor.tasks.python_ast import parse_source

DefinitionKind = Literal["module", "class", "function", "method"]
ReferenceVia = Literal["name", "attribute", "self", "import"]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SHORT_EXPR = 40
_DOC_CHARS = 1500


@dataclass(frozen=True)
class Definition:
    """A module, class, function or method: where it is and how it is called.

    `qualname` is dotted from the module (`pkg.mod.Class.method`); `path` is relative to the
    repository root with forward slashes; `line`..`end_line` is the 1-based inclusive span;
    `signature` is rendered from the syntax tree (`(self, x: int = 1) -> str`, or the bases of a
    class); `doc` is the docstring's first line. `bases` (classes only) are the dotted paths the
    base expressions are bound to in their module, before `CodeIndex` resolves them.
    """

    qualname: str
    name: str
    kind: DefinitionKind
    path: str
    line: int
    end_line: int
    signature: str = ""
    doc: str = ""
    is_test: bool = False
    bases: tuple[str, ...] = ()

    @property
    def location(self) -> str:
        """`path:line` of the definition's first line."""
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Reference:
    """One use of a name: an attribute access, a bare name, a call or an import.

    `target` is the qualified name of what is used (a definition's qualname once `CodeIndex` has
    resolved it, else the dotted path as bound, e.g. `os.path.join`); `scope` is the qualname of the
    innermost enclosing definition; `via` says how it was reached: `self` marks `self.x`/`cls.x`
    inside a class.
    """

    target: str
    path: str
    line: int
    column: int
    scope: str
    is_call: bool
    via: ReferenceVia


@dataclass
class ModuleScan:
    """What one file yields: definitions (module first) with their search text, bindings, uses."""

    module: str
    definitions: list[Definition]
    chunks: list[str]
    bindings: dict[str, str]
    star_imports: list[str]
    references: list[Reference]


@dataclass
class _Scope:
    owner: str
    is_class: bool
    bindings: dict[str, str | None]
    implicit: set[str] = field(default_factory=set)


def scan_module(
    source: str, module: str, path: str, *, is_package: bool = False, is_test: bool = False
) -> ModuleScan:
    """Scan one module's source; raises `SyntaxError` (or `ValueError`) if it does not parse."""
    tree = parse_source(source, filename=path)
    scanner = _Scanner(module, path, is_package, is_test, source.splitlines())
    scanner.run(tree)
    module_scope = scanner.module_scope
    return ModuleScan(
        module=module,
        definitions=scanner.definitions,
        chunks=scanner.chunks,
        bindings={k: v for k, v in module_scope.bindings.items() if v is not None},
        star_imports=scanner.star_imports,
        references=scanner.references,
    )


def render_signature(args: ast.arguments, returns: ast.expr | None = None) -> str:
    """`(a: int, /, b=1, *args, c: str = 'x', **kw) -> bool`, long defaults shortened."""
    parts: list[str] = []
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    for i, arg in enumerate(positional):
        default = args.defaults[i - first_default] if i >= first_default else None
        parts.append(_render_arg(arg, default))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            parts.append("/")
    if args.vararg is not None:
        parts.append("*" + _render_arg(args.vararg, None))
    elif args.kwonlyargs:
        parts.append("*")
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        parts.append(_render_arg(arg, kw_default))
    if args.kwarg is not None:
        parts.append("**" + _render_arg(args.kwarg, None))
    text = "(" + ", ".join(parts) + ")"
    return text + (f" -> {short_expr(returns)}" if returns is not None else "")


def short_expr(node: ast.expr, limit: int = _SHORT_EXPR) -> str:
    """Source text of an expression on one line, cut to `limit` characters."""
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module named by `from <level dots><target> import ...` inside `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".") if module else []
    if not is_package:
        parts = parts[:-1]
    parts = parts[: max(0, len(parts) - (level - 1))]
    if target:
        parts.append(target)
    return ".".join(parts)


def _render_arg(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg
    if arg.annotation is not None:
        text += f": {short_expr(arg.annotation)}"
    if default is not None:
        text += (" = " if arg.annotation is not None else "=") + short_expr(default)
    return text


def _first_line(doc: str | None) -> str:
    for line in (doc or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


class _Scanner(ast.NodeVisitor):
    def __init__(
        self, module: str, path: str, is_package: bool, is_test: bool, lines: list[str]
    ) -> None:
        self.module = module
        self.path = path
        self.is_package = is_package
        self.is_test = is_test
        self.lines = lines
        self.definitions: list[Definition] = []
        self.chunks: list[str] = []
        self.references: list[Reference] = []
        self.star_imports: list[str] = []
        self.module_scope = _Scope(module, False, {})
        self._scopes: list[_Scope] = []
        self._calls: set[int] = set()

    def run(self, tree: ast.Module) -> None:
        doc = ast.get_docstring(tree)
        top = [n.name for n in tree.body if isinstance(n, (*_FUNCTIONS, ast.ClassDef))]
        name = self.module.rpartition(".")[2]
        self._define(self.module, name, "module", 1, max(1, len(self.lines)), "", doc, ())
        self.chunks[-1] = " ".join([self.module, name, (doc or "")[:_DOC_CHARS], *top])
        self._collect(tree.body, self.module_scope, module_level=True)
        self._scopes.append(self.module_scope)
        for stmt in tree.body:
            self.visit(stmt)
        self._scopes.pop()

    # Definitions ---------------------------------------------------------------------------

    def _define(
        self,
        qualname: str,
        name: str,
        kind: DefinitionKind,
        line: int,
        end_line: int,
        signature: str,
        doc: str | None,
        bases: tuple[str, ...],
    ) -> None:
        self.definitions.append(
            Definition(
                qualname=qualname,
                name=name,
                kind=kind,
                path=self.path,
                line=line,
                end_line=end_line,
                signature=signature,
                doc=_first_line(doc),
                is_test=self.is_test,
                bases=bases,
            )
        )
        self.chunks.append(" ".join([name, signature, (doc or "")[:_DOC_CHARS]]))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        owner = self._scopes[-1].owner
        qualname = f"{owner}.{node.name}"
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        bases = tuple(b for b in (self._bound_path(e) for e in node.bases) if b)
        shown = [short_expr(b) for b in node.bases]
        shown += [f"{k.arg}={short_expr(k.value)}" if k.arg else "**" for k in node.keywords]
        signature = f"({', '.join(shown)})" if shown else ""
        doc = ast.get_docstring(node)
        end = node.end_lineno or node.lineno
        self._define(qualname, node.name, "class", node.lineno, end, signature, doc, bases)
        members = [n.name for n in node.body if isinstance(n, (*_FUNCTIONS, ast.ClassDef))]
        self.chunks[-1] += " " + " ".join(members)
        scope = _Scope(qualname, True, {})
        self._collect(node.body, scope, module_level=False)
        self._scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self._scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        parent = self._scopes[-1]
        qualname = f"{parent.owner}.{node.name}"
        args = node.args
        for expr in [*node.decorator_list, *args.defaults, *args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        for arg in self._all_args(args):
            if arg.annotation is not None:
                self.visit(arg.annotation)
        if node.returns is not None:
            self.visit(node.returns)
        kind: DefinitionKind = "method" if parent.is_class else "function"
        prefix = "async " if isinstance(node, ast.AsyncFunctionDef) else ""
        signature = prefix + render_signature(args, node.returns)
        end = node.end_lineno or node.lineno
        self._define(
            qualname, node.name, kind, node.lineno, end, signature, ast.get_docstring(node), ()
        )
        self.chunks[-1] += " " + "\n".join(self.lines[node.lineno : end])
        scope = _Scope(qualname, False, {a.arg: None for a in self._all_args(args)})
        positional = [*args.posonlyargs, *args.args]
        decorators = {short_expr(d) for d in node.decorator_list}
        if parent.is_class and positional and "staticmethod" not in decorators:
            scope.bindings[positional[0].arg] = parent.owner
            scope.implicit.add(positional[0].arg)
        self._collect(node.body, scope, module_level=False)
        self._scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self._scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in [*node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        bindings: dict[str, str | None] = {a.arg: None for a in self._all_args(node.args)}
        self._scopes.append(_Scope(self._scopes[-1].owner, False, bindings))
        self.visit(node.body)
        self._scopes.pop()

    def _visit_comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> None:
        bindings: dict[str, str | None] = {}
        for generator in node.generators:
            for target in ast.walk(generator.target):
                if isinstance(target, ast.Name):
                    bindings[target.id] = None
        self._scopes.append(_Scope(self._scopes[-1].owner, False, bindings))
        self.generic_visit(node)
        self._scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _visit_comprehension

    @staticmethod
    def _all_args(args: ast.arguments) -> list[ast.arg]:
        extra = [a for a in (args.vararg, args.kwarg) if a is not None]
        return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]

    # Bindings ------------------------------------------------------------------------------

    def _collect(self, body: list[ast.stmt], scope: _Scope, *, module_level: bool) -> None:
        """Bind every name the block assigns, imports or defines (Python's scoping is per block,
        so a name used before its `def` or `import` line still resolves)."""
        named_scope = module_level or scope.is_class
        declared_global: set[str] = set()
        aliases: list[tuple[str, str]] = []
        pending: deque[ast.AST] = deque(body)
        while pending:
            node = pending.popleft()
            if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                scope.bindings[node.name] = f"{scope.owner}.{node.name}"
                continue
            if isinstance(node, (ast.Lambda, *_COMPREHENSIONS)):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self._bind_import(scope, alias.asname, alias.name)
                    else:
                        head = alias.name.split(".")[0]
                        self._bind_import(scope, head, head)
                continue
            if isinstance(node, ast.ImportFrom):
                base = resolve_relative(self.module, self.is_package, node.level, node.module)
                for alias in node.names:
                    if alias.name == "*":
                        if module_level:
                            self.star_imports.append(base)
                    else:
                        target = f"{base}.{alias.name}" if base else alias.name
                        self._bind_import(scope, alias.asname or alias.name, target)
                continue
            if isinstance(node, ast.Global | ast.Nonlocal):
                declared_global.update(node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                value = f"{scope.owner}.{node.id}" if named_scope else None
                scope.bindings.setdefault(node.id, value)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                scope.bindings.setdefault(node.name, None)
            if (
                named_scope
                and isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Name)
            ):
                aliases.append((node.targets[0].id, node.value.id))
            pending.extend(ast.iter_child_nodes(node))
        for name in declared_global:
            scope.bindings.pop(name, None)
        for name, value in aliases:
            # `parseString = parse_string`: the alias is the same definition.
            if scope.bindings.get(value) and value != name:
                scope.bindings[name] = scope.bindings[value]

    @staticmethod
    def _bind_import(scope: _Scope, name: str, target: str) -> None:
        # Imports win over plain assignments (`try: import x` / `except: x = None`).
        if scope.bindings.get(name) is None or scope.bindings[name] == f"{scope.owner}.{name}":
            scope.bindings[name] = target

    def _lookup(self, name: str) -> tuple[str | None, bool]:
        innermost = True
        for scope in reversed(self._scopes):
            if scope.is_class and not innermost:
                continue  # a class body's names are not visible inside its methods
            innermost = False
            if name in scope.bindings:
                return scope.bindings[name], name in scope.implicit
        return None, False

    def _bound_path(self, node: ast.expr) -> str | None:
        chain = _attribute_chain(node)
        if chain is None:
            return None
        bound, _ = self._lookup(chain[0])
        return ".".join([bound, *chain[1:]]) if bound else None

    # Uses ----------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node, "import", is_call=False)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = resolve_relative(self.module, self.is_package, node.level, node.module)
        for alias in node.names:
            if alias.name != "*":
                self._add(f"{base}.{alias.name}" if base else alias.name, node, "import", False)

    def visit_Call(self, node: ast.Call) -> None:
        self._calls.add(id(node.func))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load | ast.Del):
            self._use(node, [node.id], "name")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = _attribute_chain(node)
        if chain is None:
            self.generic_visit(node)
        elif not isinstance(node.ctx, ast.Store):  # `self.x = ...` uses nothing
            self._use(node, chain, "attribute")

    def _use(self, node: ast.expr, chain: list[str], via: ReferenceVia) -> None:
        bound, implicit = self._lookup(chain[0])
        if bound is None:
            return
        dotted = ".".join([bound, *chain[1:]])
        self._add(dotted, node, "self" if implicit else via, id(node) in self._calls)

    def _add(self, target: str, node: ast.AST, via: ReferenceVia, is_call: bool) -> None:
        scope = self._scopes[-1].owner if self._scopes else self.module
        line = getattr(node, "lineno", 1)
        column = getattr(node, "col_offset", 0)
        self.references.append(Reference(target, self.path, line, column, scope, is_call, via))


def _attribute_chain(node: ast.expr) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None when the root is not a plain name."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(attrs)]
