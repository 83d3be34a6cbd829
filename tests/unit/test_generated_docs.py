"""The generated reference pages (docs/reference/) are current: each equals what
`python scripts/generate_docs.py` writes now from the option classes and the result files."""

import dataclasses
import importlib.util

from tests.repo import REPO_ROOT

_spec = importlib.util.spec_from_file_location(
    "generate_docs", REPO_ROOT / "scripts" / "generate_docs.py"
)
generate_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate_docs)


def test_the_generated_pages_are_current():
    assert generate_docs.stale_pages() == [], "run: python scripts/generate_docs.py"


def test_a_changed_option_doc_makes_the_knob_page_stale(monkeypatch):
    # The check above can fail: a knob whose documentation changes without regenerating.
    from lightning_dist.options.optim import OptimOptions

    lr = next(f for f in dataclasses.fields(OptimOptions) if f.name == "lr")
    monkeypatch.setattr(lr, "metadata", {**lr.metadata, "doc": "a doc changed by the test"})
    assert generate_docs.stale_pages() == ["KNOBS.md"]


def test_every_setting_appears_in_the_knob_page():
    from lightning_dist import options

    page = (generate_docs.OUT / "KNOBS.md").read_text()
    for group in options.GROUPS:
        for f in options.group_knobs(group):
            assert f"| `{f.name}` |" in page, f.name
