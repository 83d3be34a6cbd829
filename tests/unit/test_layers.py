"""The layers of DESIGN.md hold by construction: no import cycle, imports only point down (no
strategy imports lm/), and few modules sit at the package root.

The walk reads every `import` in the package, including those inside functions (lazy ones).
`GRAPH` leaves out the `if TYPE_CHECKING:` blocks, which never run; `TYPING_GRAPH` keeps them,
and it has no cycle either: no import circle of any kind. (A strategy added through the contract
alone is tests/e2e/test_toy_strategy.py.)"""

import ast
from pathlib import Path

import lightning_dist

PACKAGE = Path(lightning_dist.__file__).parent
MAX_ROOT_MODULES = 10
"""`.py` modules directly in lightning_dist/ (besides `__init__` and `__main__`); the rest live
in subpackages."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _nodes(tree: ast.AST, *, typing: bool):
    """Every node, except those under `if TYPE_CHECKING:` unless `typing`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not typing and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.AST, name: str) -> set[str]:
    """The package modules (other than `name`) that one import statement names."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
    else:
        return set()
    return {t for t in targets if t in MODULES and t != name}


def _most_specific(found: set[str]) -> set[str]:
    # `from pkg import mod` names both; it imports the module (pkg/__init__ runs, but that is
    # Python's doing, not an edge of this module's).
    return {t for t in found if not any(o.startswith(t + ".") for o in found)}


def imports_of(name: str, *, typing: bool = False) -> set[str]:
    """The package modules that module `name` imports at run time (also for type checkers
    only, with `typing`)."""
    found = set()
    for node in _nodes(TREES[name], typing=typing):
        found |= _targets(node, name)
    return _most_specific(found)


GRAPH = {name: imports_of(name) for name in MODULES}
TYPING_GRAPH = {name: imports_of(name, typing=True) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _imports_in(nodes) -> dict[str, set[str]]:
    """{module: the package modules its import statements among `nodes(module)` name}."""
    return {name: set().union(*(_targets(n, name) for n in nodes(name))) for name in MODULES}


def _lazy_only_imports() -> set[tuple[str, str]]:
    """(module, target) where the module imports the target inside a function, never at the
    top of the module."""
    top = _imports_in(lambda name: TREES[name].body)
    lazy = _imports_in(
        lambda name: (
            inner
            for fn in ast.walk(TREES[name])
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for inner in _nodes(fn, typing=False)
        )
    )
    return {(name, t) for name, targets in lazy.items() for t in targets - top[name]}


def _typing_only_imports() -> set[tuple[str, str]]:
    """(module, target) where the module imports the target under `if TYPE_CHECKING:` only."""
    typing = _imports_in(
        lambda name: (
            inner
            for block in ast.walk(TREES[name])
            if _is_type_checking(block)
            for stmt in block.body
            for inner in ast.walk(stmt)
        )
    )
    return {(name, t) for name, targets in typing.items() for t in targets - GRAPH[name]}


def _sees(graph: dict[str, set[str]], name: str, target: str) -> bool:
    """The edge name -> target, or one to a module inside `target` (see `_most_specific`)."""
    return any(t == target or t.startswith(target + ".") for t in graph[name])


def test_the_walk_sees_lazy_imports():
    # Some module imports a package module inside a function only; the walk must see it.
    lazy = _lazy_only_imports()
    assert lazy, "no function-level import found: the check below would prove nothing"
    unseen = sorted((name, t) for name, t in lazy if not _sees(GRAPH, name, t))
    assert not unseen, unseen


def test_the_typing_walk_sees_typing_only_imports():
    # `GRAPH` leaves `if TYPE_CHECKING:` imports out, `TYPING_GRAPH` must keep them.
    typing = _typing_only_imports()
    assert typing, "no `if TYPE_CHECKING:` import found: the check below would prove nothing"
    unseen = sorted((name, t) for name, t in typing if not _sees(TYPING_GRAPH, name, t))
    assert not unseen, unseen


def test_no_import_cycle():
    cycles = _cycles(GRAPH)
    assert not cycles, f"import circles (lazy imports included): {cycles}"


def test_no_import_cycle_counting_typing_only_imports():
    cycles = _cycles(TYPING_GRAPH)
    assert not cycles, f"import circles (`if TYPE_CHECKING:` imports included): {cycles}"


def test_few_modules_at_the_package_root():
    root = sorted(
        p.stem for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(root) <= MAX_ROOT_MODULES, (
        f"{len(root)} modules directly in lightning_dist/ (at most {MAX_ROOT_MODULES}; move "
        f"some into a subpackage): {', '.join(root)}"
    )


def test_strategies_do_not_import_the_lightning_module():
    bad = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("lightning_dist.strategies")
        for target in targets
        if target.startswith("lightning_dist.lm")
    }
    assert not bad, bad


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


CLI_MODULES = (
    "lightning_dist.__main__",
    "lightning_dist.train",
    "lightning_dist.plan",
    "lightning_dist.parity",
    "lightning_dist.report",
    "lightning_dist.sweep",
    "lightning_dist.calibration_report",
    "lightning_dist.checkpoint.__main__",
    "lightning_dist.checkpoint.cli",
    "lightning_dist.data.__main__",
    "lightning_dist.launch.__main__",
)
"""The command lines (`python -m ...` and pyproject's `[project.scripts]`): they import the
library; nothing in the package imports them (but `__main__`, which is `train`'s)."""

_BASE = ("runtime", "layout", "hardware", "options", "models", "_compat")
_MIDDLE = (
    *_BASE,
    "config",
    "contract",
    "planner",
    "parallel",
    "cluster",
    "measure",
    "published",
    "data",
)
FLOORS: dict[str, tuple[str, ...]] = {
    # the ground floor: torch-free records, the process helpers and the single-device models
    "runtime": ("_compat",),  # the process ends run Python's exit hooks through it
    "conf": (),  # the Hydra configs (package data), no code
    "layout": (),
    "hardware": (),
    "options": ("layout",),
    "_compat": (),
    "models": ("_compat",),
    # what reads configs, plans, applies parallelism and measures; no Lightning glue, no lm/
    "config": ("options", "models", "hardware", "layout", "_compat", "runtime"),
    "contract": ("layout", "models", "options"),
    "planner": ("layout", "options", "hardware", "models"),
    "parallel": ("layout", "options", "models", "_compat"),
    "cluster": ("parallel", "layout", "options", "models", "_compat", "runtime"),
    "measure": ("parallel", "layout", "options", "models", "_compat"),
    "published": ("config", "hardware", "layout", "models", "planner"),
    "data": ("runtime",),
    # Lightning's side: callbacks, the checkpoint format, the LightningModule, the strategies
    "callbacks": _MIDDLE,
    "checkpoint": (*_MIDDLE, "callbacks"),
    "mesh": (*_MIDDLE, "checkpoint"),  # the mesh runtime: no Lightning (see NO_LIGHTNING)
    "lm": (*_MIDDLE, "checkpoint", "mesh"),
    "strategies": (*_MIDDLE, "checkpoint", "mesh"),
    # a run from its config, and the launchers of many runs
    "run": (*_MIDDLE, "callbacks", "checkpoint", "mesh", "lm", "strategies"),
    "launch": (*_MIDDLE, "callbacks", "checkpoint", "mesh", "lm", "strategies", "run"),
}
"""Each floor of the package (a subpackage or a module at its root) and the floors it may import
besides itself, typing-only imports included. The command lines (`CLI_MODULES`) may import any."""


def _floor(name: str) -> str:
    return name.split(".")[1] if name.count(".") else "__init__"


def test_every_floor_is_placed():
    # A new subpackage or root module must be given its floor here, or the checks below skip it.
    floors = {_floor(n) for n in MODULES if n not in CLI_MODULES} - {"__init__"}
    assert floors <= set(FLOORS), f"not in FLOORS: {sorted(floors - set(FLOORS))}"


UPWARD_LEFT: set[tuple[str, str]] = set()
"""Arrows up a floor not yet mended (data/ reading the tokenizer and token cache of lm/): the set
may only shrink."""


def test_every_floor_imports_only_the_floors_below_it():
    bad = [
        (name, target)
        for name, targets in sorted(TYPING_GRAPH.items())
        if name not in CLI_MODULES and _floor(name) in FLOORS
        for target in sorted(targets)
        if _floor(target) != _floor(name)
        and target not in CLI_MODULES
        and _floor(target) not in FLOORS[_floor(name)]
    ]
    assert set(bad) <= UPWARD_LEFT, sorted(set(bad) - UPWARD_LEFT)


def test_nothing_imports_a_command_line():
    bad = [
        (name, target)
        for name, targets in sorted(TYPING_GRAPH.items())
        for target in targets
        if target in CLI_MODULES and name not in CLI_MODULES
    ]
    assert not bad, (
        f"library modules importing a command line (move the code they need down): {bad}"
    )


def test_checkpoint_imports_neither_run_nor_lm():
    # Stated on its own: the format is read by tools that load no LightningModule.
    bad = [
        (name, target)
        for name, targets in sorted(TYPING_GRAPH.items())
        if _floor(name) == "checkpoint" and name not in CLI_MODULES
        for target in targets
        if _floor(target) in ("run", "lm")
    ]
    assert not bad, bad


IMPORTS_IN_FUNCTIONS = 387
"""Import statements inside functions, in the whole package (counted 2026-12-06). It may only go
down. Those left are meant: optional extras (torchft, wandb, transformers, pyarrow, datasets,
zstandard, matplotlib, s3fs: a run that does not use one never needs it installed), start-up time
(the CLIs and `train.py` answer `--help` and one-line refusals before torch and Lightning load),
and the process helpers that run before a rank's distributed setup."""


def _imports_in_functions() -> int:
    def count(node: ast.AST, inside: bool) -> int:
        here = inside and isinstance(node, ast.Import | ast.ImportFrom)
        inside = inside or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        return here + sum(count(child, inside) for child in ast.iter_child_nodes(node))

    return sum(count(tree, False) for tree in TREES.values())


def test_imports_inside_functions_only_go_down():
    count = _imports_in_functions()
    assert count <= IMPORTS_IN_FUNCTIONS, (
        f"{count} imports inside functions (at most {IMPORTS_IN_FUNCTIONS}): import at the top of "
        "the module unless it is an optional extra or start-up time needs it"
    )


def test_lower_layers_do_not_import_upper_ones():
    """runtime/ and models/ see only themselves and _compat; config/ sees the option classes,
    models, hardware and layout; mesh/ (the mesh runtime) sees parallel/, checkpoint/ and what
    they see; parallel/ and planner/ see neither Lightning glue nor lm/. Both
    read the option classes (lightning_dist/options/, the parsed activation-checkpointing
    setting among them), torch-free like the layout. Typing-only imports count too."""
    rules = {
        "lightning_dist.runtime": ("lightning_dist.runtime", "lightning_dist._compat"),
        "lightning_dist.models": ("lightning_dist.models", "lightning_dist._compat"),
        "lightning_dist.config": (
            "lightning_dist.config",
            "lightning_dist.runtime",
            "lightning_dist.options",
            "lightning_dist.models",
            "lightning_dist.hardware",
            "lightning_dist.layout",
            "lightning_dist._compat",
        ),
        "lightning_dist.parallel": (
            "lightning_dist.parallel",
            "lightning_dist.layout",
            "lightning_dist.options",
            "lightning_dist.models",
            "lightning_dist._compat",
        ),
        "lightning_dist.planner": (
            "lightning_dist.planner",
            "lightning_dist.layout",
            "lightning_dist.options",
            "lightning_dist.hardware",
            "lightning_dist.models",
        ),
        "lightning_dist.mesh": (
            "lightning_dist.mesh",
            "lightning_dist.parallel",
            "lightning_dist.checkpoint.format",
            "lightning_dist.checkpoint.canonical",
            "lightning_dist.planner",
            "lightning_dist.layout",
            "lightning_dist.options",
            "lightning_dist.models",
            "lightning_dist._compat",
        ),
    }
    bad = [
        (name, target)
        for name, targets in sorted(TYPING_GRAPH.items())
        for layer, allowed in rules.items()
        if _within(name, (layer,))
        for target in sorted(targets)
        if not _within(target, allowed)
    ]
    assert not bad, bad


NO_LIGHTNING = (
    "lightning_dist.parallel",
    "lightning_dist.planner",
    "lightning_dist.models",
    "lightning_dist.mesh",
)
"""The floors that run without Lightning: a plain PyTorch loop drives the mesh runtime."""


def _external_roots(name: str, *, lazy: bool) -> set[str]:
    """The top-level packages outside ours that module `name` imports: when it is imported,
    or also inside its functions (`lazy`); `if TYPE_CHECKING:` blocks never run."""
    stack: list[ast.AST] = [TREES[name]]
    roots = set()
    while stack:
        node = stack.pop()
        if not lazy and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if _is_type_checking(node):  # never runs
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        stack.extend(ast.iter_child_nodes(node))
    return roots


def test_the_lightning_free_floors_never_import_lightning():
    """Not even inside a function; and the package modules they import, at any depth, do not
    import it when they are imported (`_compat` wraps Lightning's names inside functions that
    only the Lightning glue calls)."""
    seen: set[str] = set()
    todo = [name for name in MODULES if _within(name, NO_LIGHTNING)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(GRAPH[name])
    lightning = {"lightning", "pytorch_lightning", "lightning_fabric"}
    bad = sorted(
        name for name in seen if _external_roots(name, lazy=_within(name, NO_LIGHTNING)) & lightning
    )
    assert len(seen) > 50, "the walk found too few modules to prove anything"
    assert not bad, f"modules reached from {NO_LIGHTNING} import Lightning: {bad}"
