"""Private names of torch, Lightning, Hydra, OmegaConf and transformers: fenced and pinned.

Every private name the package uses must be registered in `_compat.PRIVATE_NAMES` and used in
`_compat` only: a scan of the package's sources (below) finds each use and fails, naming
file:line, on one that is not registered or is used elsewhere.
Each registered name must still exist where its entry says, so an upgrade that moves one fails
here, by name. The helpers of `_compat` are exercised too. (That `_compat` itself imports none of
torch, Lightning, Hydra and OmegaConf is tests/e2e/test_compat_imports.py.)

What the scan counts as a use of a private name (`_x`, `__x`; not `__x__`, nor the sunder
`_x_` that enum and Hydra make public):

- an attribute `obj._x` (or `getattr(obj, "_x")`, `setattr`, `hasattr`, `delattr`) that our own
  code does not define. Ours are the methods and class attributes of our classes, dataclass
  fields, `self._x = ...` and attributes set on our own functions; but `self._x` in one of our
  classes is foreign when a foreign base class defines or uses `_x` (read from its bytecode),
  and such a name is then foreign on any other receiver too. A chain rooted at an import is
  named in full (`torch._C._current_graph_task_id`); one into our own package is ours;
- a private method of one of our classes that a foreign base class has (a hook override);
- a private module or name imported from outside the package;
- `obj.attr = <a lambda, a function defined here, a partial>` on an object that is not `self`
  (a patch), and `Base.method(self, ...)` where Base is a foreign class that is not a direct
  base of the class (a bypass of the classes between).

Classes defined inside functions cannot be looked up, so every private method of theirs and
every `self._x` in them counts (when they have bases at all). Receivers are not typed: a foreign
object's `_x` that shares its name with an attribute of ours (`strategy._layout`) goes unseen.
"""

import ast
import dis
import functools
import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lightning_dist import _compat


def test_torch_private_apis_are_where_they_were():
    apply_ac, wrapper = _compat.checkpoint_wrapper_api()
    assert callable(apply_ac) and callable(wrapper)
    tracker = _compat.mem_tracker_class()
    for name in _compat.MEM_TRACKER_INTERNALS:
        assert callable(getattr(tracker, name, None)), f"MemTracker.{name} moved"
    assert "_in_opt" in inspect.getsource(tracker), "MemTracker._in_opt moved"
    assert "_mod_tracker" in inspect.getsource(tracker), "MemTracker._mod_tracker moved"
    assert _compat.in_backward() is False
    kinds = _compat.pipeline_action_types()
    for kind in ("FORWARD", "SEND_F", "RECV_F", "UNSHARD", "RESHARD"):
        assert hasattr(kinds, kind), f"_ComputationType.{kind} moved"
    assert callable(_compat.schedule_ops_api()), "get_schedule_ops moved"


def test_hook_classes_override_what_the_foreign_bases_still_have():
    """Each private method a hook class of `_compat` overrides is still its base's, with the
    same parameters (a renamed or re-signed hook would silently stop being called)."""
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.tensor.parallel import ParallelStyle

    bases = {
        _compat.ParallelStyleHook: ParallelStyle,
        _compat.MemTrackerHooks: _compat.mem_tracker_class(),
        _compat.ModelSetupHook: FSDPStrategy,
    }
    for hook, base in bases.items():
        overridden = [n for n in vars(hook) if private(n) and callable(vars(hook)[n])]
        assert overridden, hook
        for name in overridden:
            assert callable(getattr(base, name, None)), f"{base.__qualname__}.{name} moved"
            ours = list(inspect.signature(getattr(hook, name)).parameters)
            assert ours == list(inspect.signature(getattr(base, name)).parameters), name


def test_dcp_metadata_records_and_helpers_are_where_they_were():
    import importlib

    for module, names in _compat.DCP_METADATA_RECORDS.items():
        found = importlib.import_module(module)
        for name in names:
            assert hasattr(found, name), f"{module}.{name} moved"
    assert callable(_compat.dcp_set_element())
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader("/nonexistent")
    assert str(_compat.dcp_metadata_path(reader, None)).endswith("/.metadata")


def test_in_backward_is_true_inside_a_backward_pass():
    import torch

    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(_compat.in_backward())
            return grad * 2

    Probe.apply(torch.ones(1, requires_grad=True)).sum().backward()
    assert seen == [True]


def test_lightning_private_apis_are_where_they_were():
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.fabric.utilities.load import _METADATA_FILENAME
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    assert _METADATA_FILENAME == _compat.LIGHTNING_CHECKPOINT_METADATA
    assert callable(fabric_launcher._hydra_subprocess_cmd)
    assert callable(trainer_launcher._hydra_subprocess_cmd)
    assert "_experiment" in inspect.getsource(WandbLogger.__init__)
    logger = WandbLogger(project="p", mode="disabled")
    assert "anonymous" in logger._wandb_init  # what drop_wandb_anonymous removes
    _compat.drop_wandb_anonymous(logger)
    assert "anonymous" not in logger._wandb_init
    from lightning.pytorch import LightningModule

    assert "_device_mesh" in inspect.getsource(LightningModule.device_mesh.fget)


def test_hydra_reports_errors_through_run_and_report():
    from hydra._internal import utils

    assert callable(utils.run_and_report)
    assert "run_and_report(" in inspect.getsource(utils._run_hydra)  # looked up on each call


def test_transformers_initialised_flag_is_still_used():
    transformers = pytest.importorskip("transformers")
    source = inspect.getsource(transformers.modeling_utils)
    assert _compat.HF_INITIALIZED_FLAG in source


def test_saved_tensors_hooks_active_sees_checkpointing_hooks():
    import torch

    assert _compat.saved_tensors_hooks_active() is False
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert _compat.saved_tensors_hooks_active() is True


# --- the scan ------------------------------------------------------------------------------------

SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
ACCESSORS = ("getattr", "setattr", "hasattr", "delattr")
PATCH_CALLS = ("partial", "functools.partial", "MethodType", "types.MethodType")
ATTRIBUTE_OPS = {"LOAD_ATTR", "STORE_ATTR", "DELETE_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"}
DOCUMENTED = {"os._exit"}
"""Underscored names the standard library documents as public."""
MATCHES = {
    "attribute": {"attribute", "hook", "patch"},
    "hook": {"hook"},
    "import": {"import"},
    "patch": {"patch"},
    "bypass": {"bypass"},
}
"""The kinds of entry that cover a use of each kind (`super()._setup_model` reads a hook)."""


def private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not name.endswith("_")


def lookup(dotted: str):
    """The object at a dotted path: its longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            found = getattr(found, part)
        return found
    raise ImportError(dotted)


def _codes(value):
    for v in (value, *(getattr(value, a, None) for a in ("__func__", "func", "fget", "fset"))):
        code = getattr(v, "__code__", None)
        if code is not None:
            yield code


@functools.cache
def class_names(cls: type) -> frozenset:
    """What a class defines or reaches on its instances: its attributes, and every attribute
    name (or string constant, as in `getattr(self, "_x")`) its functions use."""
    names = set(vars(cls))
    stack = [code for value in vars(cls).values() for code in _codes(value)]
    while stack:
        code = stack.pop()
        for ins in dis.get_instructions(code):
            if ins.opname in ATTRIBUTE_OPS or (
                ins.opname == "LOAD_CONST" and isinstance(ins.argval, str)
            ):
                names.add(ins.argval)
        stack += [c for c in code.co_consts if hasattr(c, "co_code")]
    return frozenset(names)


def reaches(cls: type, name: str) -> bool:
    return any(name in class_names(base) for base in cls.__mro__)


@dataclass(frozen=True)
class Use:
    kind: str
    name: str
    where: str  # path:line
    module: str
    base: type | None = None  # of a hook: the foreign class that has the method


def _shallow(scope):
    """The nodes of a scope's own body; nested scopes are yielded but not entered."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, SCOPES):
            stack.extend(ast.iter_child_nodes(node))


class _Scope:
    def __init__(self, node, package: str):
        self.node = node
        self.imports: dict[str, str] = {}  # bound name -> what it imports
        self.local: set[str] = set()
        self.defs: set[str] = set()
        self.body = list(_shallow(node))
        if isinstance(node, FUNCTIONS):
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if arg is not None:
                    self.local.add(arg.arg)
        for n in self.body:
            if isinstance(n, ast.Import):
                for a in n.names:
                    bound = a.asname or a.name.split(".")[0]
                    self.imports[bound] = a.name if a.asname else bound
            elif isinstance(n, ast.ImportFrom):
                module = package if n.level else n.module
                for a in n.names:
                    self.imports[a.asname or a.name] = f"{module}.{a.name}"
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.local.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs.add(n.name)
        self.local |= self.defs


class Scan:
    """The private names that the modules of `package` (a folder on sys.path) use.

    `fence` names the module that wraps them (`_compat`): the private methods its classes define
    are the foreign hooks they override, so they do not make the name ours elsewhere."""

    def __init__(self, folder: Path, package: str, fence: str = ""):
        self.package = package
        self.fence = fence
        self.uses: list[Use] = []
        self.own: set[str] = set()
        self.foreign_self: set[str] = set()
        self._pending: list[tuple[str, str, ast.AST, str]] = []
        self._inner: set[ast.AST] = set()  # nodes, not ids: a parsed file's ids are reused
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder.parent)
            parts = rel.with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self._rel = rel.as_posix()
            self._module = module
            self._visit(ast.parse(path.read_text(), self._rel), [], [], False)
        for rel, module, node, name in self._pending:
            if name not in self.own or name in self.foreign_self:
                self.uses.append(Use("attribute", name, f"{rel}:{node.lineno}", module))

    def foreign(self, qualified: str) -> bool:
        return qualified.split(".")[0] not in (self.package, "builtins")

    def foreign_bases(self, cls: type) -> list[type]:
        return [b for b in cls.__mro__ if self.foreign(b.__module__)]

    def _use(self, kind, name, node, base=None):
        self.uses.append(Use(kind, name, f"{self._rel}:{node.lineno}", self._module, base))

    def _visit(self, node, scopes, classes, in_function):
        scope = _Scope(node, self.package)
        scopes = [*scopes, scope]
        self._own(scopes)
        if isinstance(node, ast.ClassDef):
            classes = [*classes, (node, None if in_function else self._class(classes, node))]
        in_function = in_function or isinstance(node, FUNCTIONS)
        for child in scope.body:
            self._node(child, scopes, classes)
        for child in scope.body:
            if isinstance(child, SCOPES):
                self._visit(child, scopes, classes, in_function)

    def _class(self, classes, node):
        """Our class at run time, or None where it cannot be looked up."""
        if self._module.endswith("__main__"):
            return None
        found = importlib.import_module(self._module)
        for name in [c.name for c, _ in classes] + [node.name]:
            found = getattr(found, name, None)
        return found if isinstance(found, type) else None

    def _own(self, scopes):
        scope = scopes[-1]
        if isinstance(scope.node, ast.ClassDef) and self._module != self.fence:
            self.own |= scope.local - set(scope.imports)
        ours = {"self", "cls"}.union(*(s.defs for s in scopes))  # and our functions
        for n in scope.body:
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                if isinstance(n.value, ast.Name) and n.value.id in ours:
                    self.own.add(n.attr)

    @staticmethod
    def _resolve(scopes, name):
        """What `name` imports where it is read; None for a local, a parameter, a builtin."""
        for i, scope in enumerate(reversed(scopes)):
            if i and isinstance(scope.node, ast.ClassDef):
                continue  # a class body's names are not seen from its methods
            if name in scope.imports:
                return scope.imports[name]
            if name in scope.local:
                return None
        return None

    @staticmethod
    def _is_self(node):
        if isinstance(node, ast.Call):
            return isinstance(node.func, ast.Name) and node.func.id == "super"
        return isinstance(node, ast.Name) and node.id in ("self", "cls")

    def _node(self, node, scopes, classes):
        if isinstance(node, ast.ImportFrom) and not node.level and self.foreign(node.module):
            in_private = any(private(p) for p in node.module.split("."))
            for a in node.names:
                if in_private or private(a.name):
                    self._use("import", f"{node.module}.{a.name}", node)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if self.foreign(a.name) and any(private(p) for p in a.name.split(".")):
                    self._use("import", a.name, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(node.name):
            if classes and classes[-1][0] is scopes[-1].node:
                self._hook(node, *classes[-1])
        elif isinstance(node, ast.Attribute):
            self._attribute(node, scopes, classes)
        elif isinstance(node, ast.Call):
            self._call(node, scopes, classes)
        elif isinstance(node, ast.Assign):
            self._patch(node, scopes)

    def _attribute(self, node, scopes, classes):
        if node in self._inner:
            return
        parts, root = [], node
        while isinstance(root, ast.Attribute):
            parts.append(root.attr)
            root = root.value
        parts.reverse()
        target = self._resolve(scopes, root.id) if isinstance(root, ast.Name) else None
        if target:  # a chain from an import, named in full
            inner = node.value
            while isinstance(inner, ast.Attribute):  # the outer node comes first
                self._inner.add(inner)
                inner = inner.value
            last = max((i for i, p in enumerate(parts) if private(p)), default=None)
            if last is not None and self.foreign(target):
                name = ".".join([target, *parts[: last + 1]])
                if name not in DOCUMENTED:
                    self._use("attribute", name, node)
        elif private(node.attr):
            self._access(node, node.value, node.attr, classes)

    def _access(self, node, receiver, name, classes):
        if self._is_self(receiver) and classes:
            cls_node, cls = classes[-1]
            if cls is None:  # made in a function: its bases are not known here
                foreign = bool(cls_node.bases)
            else:
                foreign = any(name in class_names(b) for b in self.foreign_bases(cls))
            if foreign:
                self.foreign_self.add(name)
                self._use("attribute", name, node)
                return
        self._pending.append((self._rel, self._module, node, name))

    def _hook(self, fn, cls_node, cls):
        if cls is None:
            if cls_node.bases:
                self._use("hook", fn.name, fn)
            return
        for base in self.foreign_bases(cls):
            if fn.name in vars(base):
                self._use("hook", fn.name, fn, base)
                return

    def _call(self, node, scopes, classes):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ACCESSORS and len(node.args) > 1:
            key = node.args[1]
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and private(key.value):
                self._access(node, node.args[0], key.value, classes)
        if not (
            classes
            and isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
        ):
            return
        target = self._resolve(scopes, func.value.id)
        direct = {ast.unparse(b) for b in classes[-1][0].bases}
        if target and self.foreign(target) and func.value.id not in direct:
            try:
                is_class = isinstance(lookup(target), type)
            except (ImportError, AttributeError):
                is_class = False
            if is_class:
                self._use("bypass", f"{target}.{func.attr}", node)

    def _patch(self, node, scopes):
        value = node.value
        if not (
            isinstance(value, ast.Lambda)
            or (isinstance(value, ast.Name) and value.id in scopes[-1].defs)
            or (isinstance(value, ast.Call) and ast.unparse(value.func) in PATCH_CALLS)
        ):
            return
        for target in node.targets:
            if (
                isinstance(target, ast.Attribute)
                and not self._is_self(target.value)
                and not private(target.attr)
            ):
                self._use("patch", target.attr, node)


PACKAGE_DIR = Path(_compat.__file__).parent
REPO = PACKAGE_DIR.parent


@functools.cache
def package_scan() -> Scan:
    return Scan(PACKAGE_DIR, "lightning_dist", fence=_compat.__name__)


def _source_of(module: str) -> str:
    path = REPO.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return path.read_text()


# --- the registry --------------------------------------------------------------------------------

ENTRIES = list(_compat.PRIVATE_NAMES.values())


def test_every_private_name_used_is_registered():
    problems = []
    for use in package_scan().uses:
        entry = _compat.PRIVATE_NAMES.get(use.name)
        if entry is None:
            problems.append(f"{use.where}: {use.kind} {use.name} is not in _compat.PRIVATE_NAMES")
        elif entry.kind not in MATCHES[use.kind]:
            problems.append(f"{use.where}: {use.name} is used as a {use.kind}, not {entry.kind}")
        elif use.base is not None and not any(issubclass(use.base, lookup(o)) for o in entry.owner):
            problems.append(
                f"{use.where}: {use.name} overrides {use.base.__module__}.{use.base.__qualname__}"
                f", which is none of its registered owners {entry.owner}"
            )
        elif use.module not in entry.used_in and not (use.module == _compat.__name__ and entry.via):
            problems.append(f"{use.where}: {use.name} is used in {use.module}; add it to used_in")
    assert not problems, "unregistered private names:\n" + "\n".join(sorted(set(problems)))


def test_private_names_are_used_in_compat_only():
    """Outside `_compat` the package names no private name of another package: each goes through
    a wrapper there (a function, or a hook class whose private override calls a public method).
    What stays outside are patches of public attributes (`module.forward = ...`), no `_x`."""
    outside = [
        f"{u.where}: {u.kind} {u.name}"
        for u in package_scan().uses
        if u.module != _compat.__name__ and any(private(p) for p in u.name.split("."))
    ]
    assert len(outside) == 0, "wrap these in lightning_dist/_compat.py:\n" + "\n".join(outside)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_registered_name_still_exists_where_it_says(entry):
    if entry.owner[0].startswith("transformers"):
        pytest.importorskip("transformers")
    attr = entry.name.rpartition(".")[2]
    for owner in entry.owner:
        found = lookup(owner)
        if isinstance(found, type):
            assert hasattr(found, attr) or reaches(found, attr), f"{owner} has no {attr} any more"
        else:
            assert hasattr(found, attr), f"{owner}.{attr} moved"
    if "." in entry.name:
        lookup(entry.name)
    if entry.probe:
        lookup(entry.probe)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_registered_name_is_still_used_where_it_says(entry):
    assert entry.kind in _compat.KINDS
    assert entry.owner and entry.used_in and entry.why and entry.checked
    assert len(entry.why) <= 200, "keep the reason short; the helper's docstring can say more"
    attr = entry.name.rpartition(".")[2]
    if entry.via:
        assert hasattr(_compat, entry.via), f"_compat.{entry.via} is gone"
        assert attr in inspect.getsource(_compat), f"_compat no longer names {attr}"
    for module in entry.used_in:
        source = _source_of(module)
        assert attr in source or (entry.via and entry.via in source), (
            f"{module} no longer uses {entry.name}; update its used_in"
        )


# --- the scan itself, on a package of its own ----------------------------------------------------

SAMPLE = """
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from lightning.pytorch.strategies import DDPStrategy, Strategy


class Mine(nn.Module):
    def __init__(self):
        super().__init__()
        self._own = 1

    def _helper(self):
        return self._own + len(self._modules)

    def _apply(self, fn, recurse=True):
        return super()._apply(fn, recurse)


class Strat(DDPStrategy):
    def setup(self, trainer):
        Strategy.setup(self, trainer)
        DDPStrategy.setup(self, trainer)


def tracker():
    class Tracker(MemTracker):
        def _update_peak_stats(self, state):
            return self._curr_mem_snap

    return Tracker


def f(x, m, mine):
    mine._own, mine._helper()
    m._buffers
    getattr(m, "_parameters", None)
    torch._C._current_graph_task_id()
    m.forward = lambda: 0
    m._stamp_ = 1
    return _local(x)


def _local(x):
    _local._seen = True
    return _local._seen


def wrapped(m):
    return m._wrapped()
"""

FENCE = """
class Hook:
    def _wrapped(self):
        return self.wrapped()
"""
"""The sample's wrapper module: its class's private method is a foreign hook, not our name."""


def test_scan_finds_each_kind_and_skips_our_own(tmp_path, monkeypatch):
    package = tmp_path / "scanned_sample"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sample.py").write_text(SAMPLE)
    (package / "fence.py").write_text(FENCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        uses = Scan(package, "scanned_sample", fence="scanned_sample.fence").uses
    finally:
        for module in ("scanned_sample.sample", "scanned_sample.fence", "scanned_sample"):
            sys.modules.pop(module, None)
    found = {(u.kind, u.name, int(u.where.rpartition(":")[2])) for u in uses}
    line = {text: i + 1 for i, text in enumerate(SAMPLE.splitlines())}
    expected = {
        ("import", "torch.distributed._tools.mem_tracker.MemTracker", 4),
        ("attribute", "_modules", 14),
        ("hook", "_apply", 16),
        ("attribute", "_apply", 17),
        ("bypass", "lightning.pytorch.strategies.Strategy.setup", 22),
        ("hook", "_update_peak_stats", 28),
        ("attribute", "_curr_mem_snap", 29),
        ("attribute", "_buffers", 36),
        ("attribute", "_parameters", 37),
        ("attribute", "torch._C._current_graph_task_id", 38),
        ("patch", "forward", 39),
        ("attribute", "_wrapped", line["    return m._wrapped()"]),
    }
    assert line["    m._buffers"] == 36  # the sample's line numbers above
    assert found == expected
