"""`python -m lightning_dist.calibration_report [--write] [--megatron] [--refit]`: the planner against every row of
its calibration (lightning_dist/planner/calibration.json): predicted, measured or published,
error, and whether the row meets its target (`calibration_errors.TARGETS`).

The published runs, predicted here by the current planner:

- **torchtitan, Llama 3.1 8B on H100** (`benchmarks/llama3_h100_202412_torchtitan.md` in
  pytorch/torchtitan, December 2024, Tables 1 and 3): FSDP on 8 and 128 GPUs, local batch 2,
  sequence 8192, selective (op) activation checkpointing, with and without torch.compile, and
  compiled with float8 (tensorwise, the float8 all-gather assumed on: torchtitan's float8 docs
  of the time recommend it; the benchmark does not say);
  tokens per second per GPU and memory per GPU (torchtitan logs the CUDA caching allocator's
  peak reserved memory). The GPUs are H100 SXM with 96 GB of HBM2e (2.4 TB/s) at a 500 W power
  limit, "between SXM and NVL" in peak FLOP/s: `hardware=dgx_h100 hardware.memory_gib=96
  hardware.memory_gbytes_per_sec=2400 hardware.power_w=500`, the SXM peak of 989 TFLOP/s as
  the datasheet figure, the 500 W limit's lower clock from `power_w` (planner/device_rates.py).
  torchtitan's op policy saves every other matmul's output (its `_save_list` and mm counter):
  ours under `activation_checkpointing=op_alternate`, which the rows are predicted with. Memory is the caching allocator's reserved memory,
  `MemoryBreakdown.reserved` (live tensors and the allocator's slack, no CUDA context).
- **Megatron-LM Table 1** (Narayanan et al., SC 2021; planner/megatron.py): GPT models from
  1.7B to 1T on DGX A100 80 GB, as the percentage of peak the paper reports (its FLOPs count
  the recomputed forward: `time.hfu`), predicted for the published layout (best schedule and
  micro-batch) with the math attention path of 2021 (no flash attention).

- **llm-foundry's MPT table** (`scripts/train/benchmarking/README.md` in mosaicml/llm-foundry;
  `published/foundry.py`): 15 FSDP rows, 7B to 70B on H100 and A100, 2K to 32K tokens, fitted
  to nothing.

Beside each published time row it prints the error as shipped, in-sample (every source fitted)
and leave-one-source-out (`published/holdout.py`; `--refit` recomputes those fits).

`published_rows()` gives them as calibration rows with the current planner's predictions;
`--write` stores those in calibration.json (a test checks that the stored ones are current);
`--megatron` prints the Megatron comparison as docs/PLANNER.md's table. The runs and their
predictions are `lightning_dist/published/`; this module is the command line.
"""

from __future__ import annotations

from dataclasses import replace

from lightning_dist.planner.calibration import CalibrationRow, save, stored
from lightning_dist.planner.calibration_errors import TARGETS, row_error, table
from lightning_dist.published.runs import hardware, held_out_rows, published_rows


def _missed(rows: list[CalibrationRow]) -> list[CalibrationRow]:
    return [
        r
        for r in rows
        if (t := TARGETS.get((r.source, r.quantity))) is not None
        and (e := row_error(r)) is not None
        and abs(e) > t
    ]


def main(argv: list[str] | None = None) -> int:
    """The planner against every calibration row, with its error."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.calibration_report", description=main.__doc__
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="store the published rows' current predictions in calibration.json",
    )
    parser.add_argument(
        "--megatron",
        action="store_true",
        help="print the Megatron-LM Table 1 comparison of docs/PLANNER.md instead",
    )
    parser.add_argument(
        "--refit",
        action="store_true",
        help="refit the leave-one-source-out constants and store them (planner/holdout_fits.json)",
    )
    args = parser.parse_args(argv)
    if args.megatron:
        from lightning_dist.planner.megatron import TABLE1, compare_row, markdown

        node = hardware(["hardware=dgx_a100"])
        results = [compare_row(row, node) for row in TABLE1]
        print(markdown(results))
        for r in results:
            print(
                f"{r['row'].billions:g}B: published layout as {r['label']}; "
                f"planner's choice {r['chosen']}"
            )
        return 0
    live = published_rows()
    current = stored()
    if args.write:  # the live rows replace every stored published row (a renamed one too)
        kept = tuple(r for r in current.rows if r.source != "published")
        save(replace(current, rows=kept).with_rows(live))
        current = stored()
    others = [r for r in current.rows if r.source != "published"]
    print(table(others + live))
    missed = _missed(live)
    print(
        f"\n{len(live)} published rows, {len(live) - len(missed)} within their targets"
        + (f"; missed: {', '.join(f'{r.layout} {r.quantity}' for r in missed)}" if missed else "")
    )
    held = held_out_rows()
    print(
        "\nHeld out (no constant fitted to them; each row's assumptions: HELD_OUT in "
        "lightning_dist/published/runs.py):\n"
    )
    print(table(held))
    missed = _missed(held)
    print(f"\n{len(held)} held-out rows, {len(held) - len(missed)} within the same targets")
    print_holdout(refit=args.refit)
    return 0


def print_holdout(refit: bool = False) -> None:
    """The published time rows' errors as shipped, in-sample and leave-one-source-out
    (`published/holdout.py`), and the plan's prediction band they give."""
    from lightning_dist.published import holdout

    if refit:
        holdout.save_fits(holdout.refit())
    fits = holdout.load_fits()
    text, misses = holdout.holdout_report(fits["fits"])
    print(
        "\nLeave-one-source-out (time constants refitted without the row's source; in-sample: "
        "fitted to every source; lightning_dist/planner/holdout_fits.json):\n"
    )
    print(text)
    rows = text.count("\n") - 1
    p10, p90 = fits["band"]
    print(
        f"\n{rows} published time rows, {rows - len(misses)} within their targets left out of "
        f"the fit; the 10th-90th percentile of those errors, {p10:+.1%} to {p90:+.1%}, is the "
        "plan's band. Memory rows depend on no fitted constant: their error above is their "
        "leave-one-source-out error."
    )


if __name__ == "__main__":
    import sys

    sys.exit(main())
