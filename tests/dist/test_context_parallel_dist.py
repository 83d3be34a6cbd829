"""Context-parallel attention (lightning_dist/parallel/context_parallel.py) on 2 and 4 gloo
ranks: each rank's output and gradients equal the same slices of one device's causal attention,
for the all-gather and the Ulysses algorithms, grouped-query heads included, and under a
packed-documents mask."""

import pytest

CASES = [  # (ranks, mode, query heads, key/value heads)
    (2, "allgather", 4, 2), (2, "ulysses", 4, 2), (2, "ulysses", 4, 1),
    (4, "allgather", 4, 2), (4, "ulysses", 4, 2), (4, "ulysses", 8, 4),
]  # fmt: skip


@pytest.mark.slow
def test_context_parallel_attention_matches_one_device(worlds):
    for ranks, mode, heads, kv_heads in CASES:
        for dtype, bound, packed in (
            ("float64", 1e-12, False),
            ("float32", 1e-5, False),
            ("float64", 1e-12, True),
        ):
            errors = worlds(ranks).run(
                "context_parallel_cases:attention_matches_one_device",
                mode,
                heads,
                kv_heads,
                dtype,
                packed,
            )
            label = f"cp={ranks} {mode} heads {heads}/{kv_heads} {dtype}" + " packed" * packed
            print(f"\n{label}: {max(errors):.1e}")
            assert max(errors) < bound, (label, errors)


@pytest.mark.slow
def test_the_model_under_context_parallelism_matches_one_device(worlds):
    """Our Transformer with its attention routed through each algorithm, rotary positions of
    each rank's chunks: the loss and gradients equal one device's (to float32 rounding even in
    float64: the rotary step and the norms compute in float32, and their weight gradients sum
    the tokens in another order)."""
    for ranks in (2, 4):
        for mode in ("allgather", "ulysses"):
            for dtype, bound in (("float64", 1e-6), ("float32", 1e-5)):
                out = worlds(ranks).run(
                    "context_parallel_cases:model_matches_one_device", mode, dtype
                )
                print(f"\nmodel cp={ranks} {mode} {dtype}: {out[0]}")
                assert max(out[0].values()) < bound, (ranks, mode, dtype, out)
