"""A fused q/k/v projection under tensor parallelism and FSDP2: one device's math, and its checkpoints.

A from-scratch GPT (tests/fused_gpt.py: one `Linear(C, 3C)` with a bias for q, k and v, split by
`.chunk(3, -1)`) under Parallel3DStrategy on started worlds of 4 and 8 ranks
(tests/dist/fused_projection_runs.py). With `"colwise_fused(3)"` every step's loss of tp2 (as
dp_replicate=2 x tp=2), of tp2 x pp2, of FSDP2 with tp2 (dp_shard=2 x tp=2) and of FSDP2 with
tp2 x pp2 (8 ranks) equals one device's within 1e-4; with plain `"colwise"` (what a user first
wrote) the losses differ, so the comparison can fail. Each checkpoint (tp2 x pp2, dp_shard2 x tp2,
dp_shard2 x tp2 x pp2) holds every weight in the single-device order (read whole in one process),
and another layout resumes from it with one device's losses: dp_shard2 x tp2 from tp2 x pp2, tp2
from dp_shard2 x tp2. (The style's checks and the plan warning run in one process:
tests/unit/test_tp.py.)
"""

from __future__ import annotations

import pytest

TOLERANCE = 1e-4


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def runs(worlds, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fused")
    result = worlds(4).run("fused_projection_runs:main", str(out))[0]
    print(f"FUSED runs: {result['seconds']:.0f} s")
    eight = worlds(8).run("fused_projection_runs:main_8", str(out))[0]
    print(f"FUSED runs on 8 ranks: {eight['seconds']:.0f} s")
    return {
        **result,
        "fsdp_tp2_pp2": eight["fsdp_tp2_pp2"],
        "weight_diff": {**result["weight_diff"], **eight["weight_diff"]},
    }


@pytest.mark.slow
def test_fused_qkv_under_tp_pp_and_fsdp_has_one_devices_losses(runs):
    reference = runs["reference"][:10]
    assert reference[-1] < reference[0] - 1.0, reference  # it learns
    for layout in ("tp2", "tp2_pp2", "fsdp_tp2", "fsdp_tp2_pp2"):
        diff = _max_diff(reference, runs[layout])
        relative = max(abs(x - y) / abs(x) for x, y in zip(reference, runs[layout], strict=True))
        print(f"PARITY fused qkv {layout}: {diff:.2e} (relative {relative:.2e})")
        assert diff <= TOLERANCE, (layout, reference, runs[layout])
    # Plain colwise on the same model runs without an error, with other losses.
    unfused = _max_diff(reference, runs["unfused_tp2_pp2"])
    print(f"PARITY plain colwise tp2_pp2: {unfused:.2e}")
    assert unfused > 100 * TOLERANCE, runs["unfused_tp2_pp2"]


@pytest.mark.slow
def test_the_fused_checkpoints_are_the_single_device_model_and_resume_elsewhere(runs):
    assert sorted(runs["weight_diff"]) == [
        "fsdp_tp2.ckpt",
        "fsdp_tp2_pp2.ckpt",
        "tp2_pp2.ckpt",
    ]
    for ckpt, diffs in runs["weight_diff"].items():
        assert sorted(diffs) == runs["weights"], ckpt  # every weight, single-device names
        for name, parts in diffs.items():
            if name.endswith("qkv.bias"):
                q, k, v = parts
                # The key bias has no gradient (softmax ignores a shift shared by all keys):
                # AdamW turns rounding noise into steps of up to lr there, on every layout.
                assert max(q, v) <= TOLERANCE and k <= 10 * 1e-2, (ckpt, name, parts)
            else:
                assert parts[0] <= TOLERANCE, (ckpt, name, parts)
    # Saved at step 10, resumed under another layout for steps 11 and 12.
    for run, change in [
        ("resumed", "tp2_pp2 -> dp_shard2_tp2"),
        ("resumed_from_fsdp", "dp_shard2_tp2 -> dp_replicate2_tp2"),
    ]:
        diff = _max_diff(runs["reference"][10:], runs[run])
        print(f"RESUME fused qkv {change}: {diff:.2e}")
        assert diff <= TOLERANCE, (run, runs[run])
