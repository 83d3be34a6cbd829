"""The stored references cannot rot: one is recomputed on every run and must match the file.

The match is to `baselines.STORED_MATCH` (1e-6 relative), not bitwise: the file is bitwise what
the machine that wrote it computed, but CPUs of other instruction sets take other matmul kernels
(measured 2026-12-02: an AVX2-only EPYC differs from the stored file by 7.6e-8 relative at step
5). Every parity bound that compares with a stored reference is 1e-5 or looser, so this check is
ten times tighter than the tests it protects.
"""

import baselines


def test_a_recomputed_reference_matches_the_stored_one(train_in, tmp_path):
    name = "llama_debug_clip005"
    entry = baselines.stored()[name]
    assert entry["overrides"] == baselines.REFERENCES[name]
    fresh = train_in(entry["overrides"], tmp_path)
    fresh = {"overrides": entry["overrides"], **{k: fresh[k] for k in ("losses", "val_losses")}}
    assert baselines.matches(entry, fresh), (fresh, entry)


def test_a_changed_loss_does_not_match():
    entry = baselines.stored()["llama_debug_clip005"]
    nudged = {**entry, "losses": [entry["losses"][0] * (1 + 2e-6), *entry["losses"][1:]]}
    assert baselines.matches(entry, entry) and not baselines.matches(entry, nudged)


def test_every_declared_reference_is_stored():
    assert set(baselines.stored()) == set(baselines.REFERENCES)
    for name, entry in baselines.stored().items():
        assert entry["overrides"] == baselines.REFERENCES[name], name
        steps = next(int(o.split("=")[1]) for o in entry["overrides"] if "max_steps=" in o)
        assert len(entry["losses"]) == steps, name
