"""`python -m lightning_dist.launch replicas --groups N --nproc-per-group M <train.py overrides>`:
a `strategy=ft_hsdp` job on this machine: torchft's Lighthouse, and one torchrun per replica
group, each relaunched by its torchrun (`--max-restarts`) when one of its ranks fails; the
relaunched group heals live from a peer while the others keep training.

Group g writes its run directory `<run dir>/group<g>` (its summary.json, checkpoints and
logs); the run directory is `hydra.run.dir` when given, else `outputs/replicas/<time>`. The
config is checked (composition, layout, batch split) before anything starts: exit status 2
for a bad one, else the highest exit status of the groups (128 + N for a group ended by
signal N). SIGINT or SIGTERM is passed on to every group. A group spanning several nodes runs
its own `torchrun --nnodes` with the same environment (`REPLICA_GROUP_ID`, and
`TORCHFT_LIGHTHOUSE` pointing at one Lighthouse); this launcher covers one node per group.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lightning_dist.cluster.replica_groups import GROUP_ENV, LIGHTHOUSE_ENV
from lightning_dist.launch.torchrun import torchrun_environment
from lightning_dist.runtime.quiet import quiet_native_logs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_dist.launch replicas",
        description="Start a strategy=ft_hsdp job on this machine: torchft's Lighthouse and one "
        "torchrun per replica group (docs/MULTINODE.md, live healing).",
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. model=llama_debug")
    parser.add_argument("--groups", type=int, default=2, help="replica groups (default 2)")
    parser.add_argument("--nproc-per-group", type=int, default=1, help="ranks in each group")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="relaunches of each group (torchrun --max-restarts)",
    )
    parser.add_argument(
        "--script",
        default=None,
        help="a training script (default: the package's, python -m lightning_dist)",
    )
    return parser


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def group_overrides(overrides: list[str], groups: int, nproc: int) -> list[str]:
    """The overrides every group runs with: the user's, then the strategy, group count and
    ranks per group (a user's own values for them must agree)."""
    fixed = {
        "strategy": "ft_hsdp",
        "strategy.replica_groups": str(groups),
        "hardware.devices": str(nproc),
    }
    for item in overrides:
        key, _, value = item.partition("=")
        if key in fixed and value != fixed[key]:
            _fail(
                f"{item} disagrees with the launcher's {key}={fixed[key]} (set by --groups and "
                "--nproc-per-group)"
            )
    return [f"{k}={v}" for k, v in fixed.items()] + [
        o for o in overrides if o.partition("=")[0] not in fixed
    ]


def _check(overrides: list[str]):
    """Compose and plan the run as train.py will, so a bad config stops before any process;
    returns the strategy's replica-group options."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lightning_dist.config import compose_config
    from lightning_dist.run.errors import config_errors, report_config_error
    from lightning_dist.run.plan import plan_run

    try:
        with config_errors():
            cfg = compose_config([*overrides, "paths.output_dir=outputs/replicas/check"])
            return plan_run(cfg).strategy.options.replicas
    except (ValueError, HydraException, OmegaConfBaseException) as e:
        report_config_error(e)


def _start_lighthouse(options):
    os.environ.setdefault("RUST_LOG", "warn")  # torchft logs every quorum at info
    from torchft.coordination import LighthouseServer

    return LighthouseServer(
        bind="[::]:0",
        min_replicas=options.min_replica_groups,
        join_timeout_ms=int(options.join_timeout_s * 1000),
        heartbeat_timeout_ms=int(options.heartbeat_timeout_s * 1000),
    )


def exit_status(code: int) -> int:
    """A child's status as a shell reports it: 128 + N for one ended by signal N."""
    return 128 - code if code < 0 else code


def _wait(groups: list[subprocess.Popen]) -> list[int]:
    """Wait for every group; SIGINT or SIGTERM is passed on to them once, and a group still
    running 60 s later is killed."""

    def forward(signum, frame):
        for p in groups:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        deadline = time.monotonic() + 60
        for p in groups:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return [p.wait() for p in groups]


def main(argv: list[str]) -> None:

    quiet_native_logs()  # every group's ranks inherit it: no C++ stack dumps (runtime/quiet.py)
    args = _parser().parse_intermixed_args(argv)
    if args.groups < 1 or args.nproc_per_group < 1 or args.max_restarts < 0:
        _fail("--groups and --nproc-per-group must be at least 1, --max-restarts at least 0")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        _fail(f"{' '.join(bad)} is not a KEY=VALUE override of train.py")
    overrides = group_overrides(args.overrides, args.groups, args.nproc_per_group)
    run_dir = next(
        (o.partition("=")[2] for o in overrides if o.startswith("hydra.run.dir=")),
        f"outputs/replicas/{time.strftime('%Y-%m-%d_%H-%M-%S')}",
    )
    overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    lighthouse = _start_lighthouse(_check(overrides))
    print(
        f"replicas: Lighthouse at {lighthouse.address()}; {args.groups} groups of "
        f"{args.nproc_per_group} ranks; run directory {run_dir}",
        flush=True,
    )
    groups = []
    for group in range(args.groups):
        # Each torchrun round gets a store of its own (torchrun_environment): on the shared
        # one, a relaunched group reads its dead manager's address, left by the round before.
        env = {
            "RUST_LOG": "warn",
            **torchrun_environment(os.environ),
            GROUP_ENV: str(group),
            LIGHTHOUSE_ENV: lighthouse.address(),
        }
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc_per_group}", f"--max-restarts={args.max_restarts}",
               *([args.script] if args.script else ["-m", "lightning_dist"]), *overrides, f"hydra.run.dir={Path(run_dir) / f'group{group}'}"]  # fmt: skip
        groups.append(subprocess.Popen(cmd, env=env))
    try:
        codes = [exit_status(c) for c in _wait(groups)]
    finally:
        lighthouse.shutdown()
    for group, code in enumerate(codes):
        if code:
            # 137: SIGKILL, which the group's ranks send their torchrun when no relaunch can
            # help (the Lighthouse lost, no group left to heal from), after their own lines.
            why = " (SIGKILL: the lines above say why)" if code == 128 + signal.SIGKILL else ""
            print(f"replicas: group {group} ended with exit status {code}{why}", file=sys.stderr)
    sys.exit(max(codes))
