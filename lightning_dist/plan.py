"""Pre-flight planner CLI: which layouts fit, and which runs fastest, before renting anything.

    python -m lightning_dist.plan model=llama3_70b hardware=dgx_h100 hardware.num_nodes=4
    python -m lightning_dist.plan model=llama3_405b hardware=dgx_h100 hardware.num_nodes=2048 \\
        data.global_batch_size=2048 data.seq_len=8192 --json

It composes the same Hydra config as train.py (every override train.py takes works here), then
prints a Rich table of the top layouts, or with --json exactly
{"candidates": [...], "chosen": <index or null>, "rejected": [...]}.
Exit status: 0 when a layout fits, 1 when none does, 2 for a bad config.
"""

from __future__ import annotations

import argparse
import json
import sys


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _check_choices(overrides: list[str]) -> None:
    """One clear line for a config name that does not exist, listing the valid ones."""
    from lightning_dist.config import CONF_DIR, choice_names

    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if sep and "." not in key and (CONF_DIR / key).is_dir():
            valid = choice_names(key)
            if value not in valid and value != "null":
                _fail(f"unknown {key} {value!r}; valid: {', '.join(valid)}")


def _compose(overrides: list[str]):
    _check_choices(overrides)
    from lightning_dist.config import compose_config, hardware_spec, model_spec

    try:
        cfg = compose_config(overrides)
        return cfg, model_spec(cfg), hardware_spec(cfg)
    except Exception as err:  # Hydra/OmegaConf errors: one line, no traceback
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        _fail(" ".join(lines[:3]) or type(err).__name__)


def _plan(cfg, model, hardware):
    from lightning_dist.planner import plan_layouts

    mbs = cfg.data.get("micro_batch_size")
    try:
        return plan_layouts(
            model,
            hardware,
            global_batch_size=int(cfg.data.global_batch_size),
            seq_len=int(cfg.data.seq_len),
            precision=cfg.trainer.get("precision") or None,
            micro_batch_sizes=(int(mbs),) if mbs else None,
        )
    except ValueError as err:
        _fail(str(err))


def _gib(nbytes: float) -> str:
    return f"{nbytes / 1024**3:.1f}"


def print_plan(result, cfg, model, hardware, top: int = 8) -> None:
    """Print the Rich table of the top `top` candidates, the choice and some rejections.

    `cfg` is the composed config (only `cfg.data` is read); train.py's plan.only uses this too.
    """
    from rich.console import Console
    from rich.table import Table

    # Piped output gets a wide console: a folded table is unreadable in a log file.
    console = Console(width=None if sys.stdout.isatty() else 200)
    args = model.to_model_args() if hasattr(model, "to_model_args") else model
    per_node = hardware.resolved_devices()
    memory = f"{hardware.memory_gib:g} GiB" if hardware.memory_gib else "unknown memory"
    n = args.num_params()
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    console.print(
        f"[bold]{size}-parameter model[/] on [bold]{hardware.name}[/]: "
        f"{hardware.num_nodes} node(s) x {per_node} devices, {memory} each; global batch "
        f"{cfg.data.global_batch_size} x {cfg.data.seq_len} tokens"
    )
    if hardware.peak_tflops_bf16 is None or hardware.intra_node_gbytes_per_sec is None:
        console.print(
            "[yellow]this hardware spec has no peak FLOP/s or link bandwidth: times use nominal "
            "figures and only rank the layouts[/]"
        )
    table = Table(show_lines=False)
    for name in ("#", "layout", "params", "grads", "optim", "acts", "buffers", "total GiB"):
        table.add_column(name, justify="left" if name == "layout" else "right", no_wrap=True)
    for name in ("step s", "tokens/s", "MFU", "comm/comp", "bubble"):
        table.add_column(name, justify="right", no_wrap=True)
    for i, cand in enumerate(result.candidates[:top]):
        mem, t = cand.memory, cand.time
        mark = "*" if i == result.chosen else str(i)
        table.add_row(
            mark,
            cand.describe(),
            *(_gib(x) for x in (mem.params, mem.grads, mem.optimizer, mem.activations)),
            _gib(mem.buffers),
            _gib(mem.total) + ("" if cand.fits else " !"),
            f"{t.step_seconds:.3g}",
            f"{t.tokens_per_sec:,.0f}",
            "-" if t.mfu is None else f"{t.mfu:.1%}",
            f"{t.comm_compute_ratio:.2f}",
            f"{t.bubble_fraction:.1%}",
        )
    console.print(table)
    if result.chosen is not None:
        console.print(f"chosen: [bold green]{result.best().describe()}[/]")
    if result.rejected:
        console.print(f"{len(result.rejected)} families rejected, e.g.:")
        for item in result.rejected[:5]:
            console.print(f"  {item['family']}: {item['reason']}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m lightning_dist.plan`."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.plan",
        description="Predict memory per device and step time of every layout; rank those that fit.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for train.py")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--top", type=int, default=8, help="rows of the table (default 8)")
    ns = parser.parse_args(argv)
    cfg, model, hardware = _compose(ns.overrides)
    result = _plan(cfg, model, hardware)
    if ns.json:
        print(json.dumps(result.as_dict(), indent=1))
    else:
        print_plan(result, cfg, model, hardware, ns.top)
    if result.chosen is None:
        print(f"error: {result.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
