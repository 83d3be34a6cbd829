"""Every file path and `python -m` module that README.md and docs/*.md name exists.

A path is a token that starts at one of the checkout's top folders (`lightning_dist/`, `tests/`,
`bench/`, `scripts/`, `examples/`, `docs/`) or at a bare `conf/`, which moved into the package;
a file named from inside the package (`planner/memory.py`) is looked for under lightning_dist/;
a Markdown link's target is resolved against the page's own folder. `::test_name`, `#anchor` and
`:line` suffixes are dropped; placeholders (`<name>`, `*`, `{a,b}`, upper-case words such as
`SPEC`) and what commands write under `bench/results/` are not checked. A `python -m
lightning_dist...` module must be found by the import system's path finder, part by part, and
a package must have a `__main__`; nothing is imported, so the check takes no torch import.
"""

from __future__ import annotations

import importlib.machinery
import re
from pathlib import Path

from tests.repo import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("lightning_dist", "tests", "bench", "scripts", "examples", "docs", "conf")
PATH = re.compile(
    r"(?<![\w./~$-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./<>*{},-]+)"
)  # a path that starts here, not inside another one (`/tmp/tests/x`, `pkg/docs/y`)
SUBPACKAGES = sorted(
    p.name for p in (REPO_ROOT / "lightning_dist").iterdir() if (p / "__init__.py").exists()
)
IN_PACKAGE = re.compile(
    r"(?<![\w./~$-])((?:" + "|".join(SUBPACKAGES) + r")/[\w./<>*{},-]*\.(?:py|json|yaml))"
)  # `planner/memory.py`: a file of a subpackage, named from inside the package
NOT_OURS = {
    "scripts/train/benchmarking/README.md",
    "scripts/train/benchmarking/submit_benchmarks.py",
}
"""Paths of other projects' repositories that a page cites (llm-foundry's benchmark table)."""
LINK = re.compile(r"\]\(([^)\s]+)\)")
MODULE = re.compile(r"python -m (lightning_dist[\w.]*)")
PLACEHOLDER = re.compile(r"[<>*{}]|(?:^|/)[A-Z][A-Z_]+(?:/|$|\.(?!md$))")
"""`<name>`, globs, `{a,b}` and upper-case words (`SPEC`, not `PLANNER.md`) stand for a family
of paths, not one."""
OUTPUTS = ("bench/results/",)
"""Folders that commands write into (ignored by git): a page may name what they will hold."""


def _clean(path: str) -> str:
    path = path.split("::")[0].split("#")[0]
    path = re.sub(r":\d+$", "", path)
    return path.rstrip(".,;:)")


def _named_paths(text: str, folder: Path) -> set[str]:
    """The checkout-relative paths that `text`, a page in `folder`, names."""
    found = {_clean(m) for m in PATH.findall(text)} - NOT_OURS
    found |= {"lightning_dist/" + _clean(m) for m in IN_PACKAGE.findall(text)}
    for target in LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        resolved = (folder / _clean(target)).resolve()
        if resolved.is_relative_to(REPO_ROOT):
            found.add(str(resolved.relative_to(REPO_ROOT)))
    return {p for p in found if p and not PLACEHOLDER.search(p) and not p.startswith(OUTPUTS)}


def test_every_named_path_exists():
    missing = sorted(
        f"{page.relative_to(REPO_ROOT)}: {path}"
        for page in PAGES
        for path in _named_paths(page.read_text(), page.parent)
        if not (REPO_ROOT / path).exists()
    )
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def _runnable(module: str) -> bool:
    """`python -m module` finds something to run: each part's spec found under its parent's
    folders (as `importlib.util.find_spec` would, but without importing the parents), and a
    package's `__main__`."""
    spec, search = None, [str(REPO_ROOT)]
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return False
        search = list(spec.submodule_search_locations or [])
    if spec is not None and spec.submodule_search_locations:
        return _runnable(module + ".__main__")
    return True


def test_every_named_module_is_found():
    modules = {(page, m.rstrip(".")) for page in PAGES for m in MODULE.findall(page.read_text())}
    assert modules, "no `python -m lightning_dist...` found: the check proves nothing"
    missing = sorted(
        f"{page.relative_to(REPO_ROOT)}: python -m {module}"
        for page, module in modules
        if not _runnable(module)
    )
    assert not missing, "modules the docs name that do not exist:\n" + "\n".join(missing)


def test_the_walk_finds_paths_and_leaves_placeholders_out():
    text = (
        "see `lightning_dist/train.py:12`, tests/unit/test_layers.py::test_no_import_cycle, "
        "[a page](PLANNER.md#calibration), planner/memory.py, bench/no_such_bench.py, /tmp/tests/x.py and "
        "lightning_dist/conf/hardware/SPEC.yaml"
    )
    named = _named_paths(text, REPO_ROOT / "docs")
    assert named == {
        "lightning_dist/train.py",
        "tests/unit/test_layers.py",
        "docs/PLANNER.md",
        "lightning_dist/planner/memory.py",
        "bench/no_such_bench.py",
    }
    assert not (REPO_ROOT / "bench/no_such_bench.py").exists()  # the check would fail on it
    assert _runnable("lightning_dist.plan") and _runnable("lightning_dist.checkpoint")
    assert not _runnable("lightning_dist.no_such_cli") and not _runnable("lightning_dist.config")
