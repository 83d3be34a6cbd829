"""The layers of DESIGN.md hold by construction: no import cycle, imports only point down.

The walk reads every `import` in the package, including those inside functions (lazy ones), and
leaves out only `if TYPE_CHECKING:` blocks, which never run."""

import ast
from pathlib import Path

import lightning_dist

PACKAGE = Path(lightning_dist.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str) -> set[str]:
    """The package modules that module `name` imports at run time."""
    found = set()
    for node in _runtime_nodes(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for target in targets:
            if target in MODULES and target != name:
                found.add(target)
    # `from pkg import mod` names both; it imports the module (pkg/__init__ runs, but that is
    # Python's doing, not an edge of this module's).
    return {t for t in found if not any(o.startswith(t + ".") for o in found)}


GRAPH = {name: imports_of(name) for name in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_lazy_imports():
    # train() imports the LightningModule inside a function; the walk must see it.
    assert "lightning_dist.lm.module" in GRAPH["lightning_dist.train"]


def test_no_import_cycle():
    assert _cycles() == []


def test_strategies_do_not_import_the_lightning_module():
    bad = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("lightning_dist.strategies")
        for target in targets
        if target.startswith("lightning_dist.lm")
    }
    assert not bad, bad


def test_lower_layers_do_not_import_upper_ones():
    """models/ sees only itself; parallel/ and planner/ see neither Lightning glue nor lm/.
    Both read the option classes (lightning_dist/options/) and the parsed activation-
    checkpointing setting, torch-free like the layout."""
    rules = {
        "lightning_dist.models": ("lightning_dist.models", "lightning_dist._compat"),
        "lightning_dist.parallel": (
            "lightning_dist.parallel",
            "lightning_dist.layout",
            "lightning_dist.options",
            "lightning_dist.options.activation_checkpointing",
            "lightning_dist.models",
            "lightning_dist._compat",
        ),
        "lightning_dist.planner": (
            "lightning_dist.planner",
            "lightning_dist.layout",
            "lightning_dist.options",
            "lightning_dist.options.activation_checkpointing",
            "lightning_dist.hardware",
            "lightning_dist.models",
        ),
    }
    bad = [
        (name, target)
        for name, targets in GRAPH.items()
        for layer, allowed in rules.items()
        if name.startswith(layer)
        for target in targets
        if not target.startswith(allowed)
    ]
    assert not bad, bad


# --- a strategy added through the contract alone ------------------------------------------------

TOY = Path(__file__).with_name("toy_train.py")


def _toy(*overrides: str, tmp_path: Path):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(TOY), "strategy=toy", "debug=fast", f"hydra.run.dir={tmp_path}",
         *overrides],
        capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"},
    )  # fmt: skip


def test_a_toy_strategy_gets_checks_planner_settings_and_telemetry(tmp_path):
    """tests/toy_strategy.py + its schema + tests/toy_conf/strategy/toy.yaml, nothing else."""
    import json

    # Pre-flight: the toy's own check stops a 3-rank run with one line, before any process.
    bad = _toy("hardware.devices=3", tmp_path=tmp_path / "bad")
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1, bad.stderr[-2000:]
    assert "power-of-two world size, got 3" in errors[0]
    # Planner: the toy's settings (activation checkpointing) reach the prediction.
    plan = _toy("hardware=dgx_h100", "model=llama3_1b", "data.global_batch_size=64", "plan.only=true",
                tmp_path=tmp_path / "plan")  # fmt: skip
    layout_line = next(line for line in plan.stdout.splitlines() if "layout:" in line)
    assert "dp_replicate=8" in layout_line and layout_line.rstrip().endswith("ac=full"), plan.stdout
    # Telemetry: a real 2-rank run records the toy's layout, throughput and memory.
    run = _toy("hardware.devices=2", "trainer.max_steps=3", tmp_path=tmp_path / "run")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["strategy"] == "toy" and summary["world_size"] == 2
    assert summary["layout"] == {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1}
    assert summary["steps"] == 3 and summary["tokens_per_sec"] > 0
    assert len(summary["memory_by_category"]) == 2
