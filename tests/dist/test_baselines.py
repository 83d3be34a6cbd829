"""The stored references cannot rot: one is recomputed on every run and must equal the file."""

import baselines


def test_a_recomputed_reference_equals_the_stored_one(train_in, tmp_path):
    name = "llama_debug_clip005"
    entry = baselines.stored()[name]
    assert entry["overrides"] == baselines.REFERENCES[name]
    fresh = train_in(entry["overrides"], tmp_path)
    assert fresh["losses"] == entry["losses"]
    assert fresh["val_losses"] == entry["val_losses"]


def test_every_declared_reference_is_stored():
    assert set(baselines.stored()) == set(baselines.REFERENCES)
    for name, entry in baselines.stored().items():
        assert entry["overrides"] == baselines.REFERENCES[name], name
        steps = next(int(o.split("=")[1]) for o in entry["overrides"] if "max_steps=" in o)
        assert len(entry["losses"]) == steps, name
