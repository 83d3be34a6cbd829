"""The prepared GPU check: measured tokens/s, MFU and peak memory beside the planner's, in one
short budget, rehearsed on CPU first.

    python bench/gpu.py [--budget 330] [--out DIR]     on the GPU machine
    python bench/gpu.py --rehearse [--out DIR]         here, on CPU, in under 3 minutes
    python bench/gpu.py --merge DIR/gpu-rows.json      here: the GPU's rows into the calibration

`--only small|large` keeps one model's rows and `--rows REGEX` the rows whose names match (the
suite's rehearsal, tests/e2e/test_gpu_rehearsal.py, picks one row per code path with it).

**On a machine with a GPU** (a rented box reached with ssh, a Slurm node, a container), from a
fresh clone, with the README's install and the CUDA build of torch (a bare `pip install
torch==2.13.0` on Linux fetches it):

    git clone <this repository> lightning_dist && cd lightning_dist
    python -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[dev]"
    python bench/gpu.py --out bench/results            # about 6 minutes: the 330 s budget + start-up

Under Slurm, run it as one task on one GPU (the one-device rows; the multi-GPU rows start their
ranks through Lightning's own launcher, which a Slurm step replaces, so run those on a node
reached with ssh or in a container; not yet tried under srun):

    srun --nodes=1 --ntasks=1 --gpus-per-task=1 --time=00:15:00 python bench/gpu.py --out bench/results

In a container, mount the clone and install into the image's Python (an image whose torch is
2.11 to 2.13 keeps it):

    docker run --gpus all --rm -v "$PWD":/src -w /src <an image with CUDA torch> \
        bash -c 'pip install -e ".[dev]" && python bench/gpu.py --out bench/results'

Then bring `bench/results/gpu-rows.json` back to a checkout and `python bench/gpu.py --merge
bench/results/gpu-rows.json` adds its rows to the calibration. (On a GPU host where nothing can
be installed but torch, Lightning, torchmetrics and transformers are, `python bench/gpu_env.py
site` builds the missing pure-Python packages into `bench/.gpu_site` on another machine; copy the
checkout with that folder over and run with `PYTHONPATH=bench/.gpu_site`.)

**What it runs.** Each row is one short `train.py` run (the in-process `train(cfg)`, in a child
forked from a server that imported torch, Lightning and Hydra once) on one device, bf16-mixed,
with the chunked loss: llama3_1b and llama3_8b, with `op` and `full` activation checkpointing,
eager and compiled (inductor), bf16 and float8 (tensorwise), plus FSDP2 on one rank; on a
machine with more GPUs, the multi-GPU strategies too (each as `python train.py`, whose
Lightning launcher starts the other ranks). Before a row starts:

- the planner predicts it (`run.calibrate.predict`, what `plan.check` asks); a row it says does
  not fit is skipped and says so;
- its cost is estimated (start-up and compile time as measured by the rows before it, steps at
  the planner's step time); a row that does not fit in the budget left is skipped and says so;
- it gets its own time limit, at most the budget left, so one hang cannot eat the rest.

Each row prints as it ends (measured, planner, error), and after each row the table, the rows
for the planner's calibration (`lightning_dist/planner/calibration.py`, source "measured-gpu")
and the row's own folder (its log) are written to `--out`. `--merge` takes only GPU rows.

**The rehearsal** (`--rehearse`) runs the same rows, the same code paths, on CPU: llama_debug and
tiny in place of the 1B and 8B, 128-token sequences, aot_eager in place of inductor (inductor's
C++ build costs a minute per row here), torchao's float8 emulation, rows measured with the
process's peak memory against the planner's total, the 2-device rows on 2 CPU processes
(`--devices 1` skips them); its rows are marked "measured-cpu".
`python bench/gpu_env.py shaped -- python bench/gpu.py --rehearse` runs it where only what the
GPU image has, plus the carried packages, can be imported.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KNOWN_GPUS = {
    "H100 PCIe": "gpu",
    "H100 NVL": "gpu",
    "H200": "dgx_h200",
    "H100": "dgx_h100",
    "A100": "dgx_a100",
    "4090": "rtx4090_x4",
}
"""GPU name fragment -> the lightning_dist/conf/hardware spec whose per-device figures apply, first match
("gpu": no datasheet figures, so no MFU; the PCIe and NVL H100s have other peaks than SXM)."""


@dataclass(frozen=True)
class Row:
    """One run: a model slot ("small" or "large"), a strategy and its settings."""

    slot: str
    strategy: str = "3d"
    float8: bool = False
    compile: bool = False
    checkpointing: str = "op"
    devices: int = 1
    extra: tuple[str, ...] = ()

    def name(self, model: str) -> str:
        parts = [
            model,
            self.strategy if self.devices == 1 else f"{self.strategy} x{self.devices}",
            "fp8" if self.float8 else "bf16",
            f"ac={self.checkpointing}",
        ]
        return " ".join(parts + (["compile"] if self.compile else []))

    def overrides(self, backend: str) -> list[str]:
        return [
            f"strategy={self.strategy}", *self.extra, f"hardware.devices={self.devices}",
            f"strategy.activation_checkpointing={self.checkpointing}",
            f"strategy.compile={str(self.compile).lower()}", f"strategy.compile_backend={backend}",
            f"strategy.float8={'tensorwise' if self.float8 else 'none'}",
        ]  # fmt: skip


ROWS = (
    Row("small"),
    Row("small", compile=True),
    Row("small", float8=True, compile=True),
    Row("small", checkpointing="full"),
    Row("large"),
    Row("large", compile=True),
    Row("small", strategy="fsdp2"),
    Row("small", float8=True),
    Row("small", compile=True, checkpointing="full"),
    Row("large", float8=True, compile=True),
    Row("large", checkpointing="full"),
    Row("large", compile=True, checkpointing="full"),
    Row("large", strategy="fsdp2"),
    Row("large", float8=True),
    # More GPUs than one: the multi-GPU strategies on the small model.
    Row("small", strategy="fsdp2", devices=2),
    Row("small", strategy="tp", devices=2, extra=("strategy.tp=2",)),
    Row("small", strategy="pp", devices=2, extra=("strategy.pp=2",)),
    Row("small", strategy="3d", devices=8, extra=("strategy.tp=2", "strategy.pp=2")),
)
"""In the order they run: the most telling first, so a short budget keeps those."""


@dataclass(frozen=True)
class Profile:
    """Where the rows run: the GPU machine, or the CPU rehearsal."""

    models: dict[str, str]
    seq_len: dict[str, int]
    global_batch: dict[str, int]
    loss_chunk_tokens: int
    steps: int
    compile_backend: str
    budget_s: float
    row_limit_s: float
    startup_guess_s: float
    compile_guess_s: float
    source: str
    rehearsal: bool = False
    hardware: tuple[str, ...] = field(default=())

    def overrides(self, row: Row) -> list[str]:
        return [
            f"model={self.models[row.slot]}", "data=synthetic", f"data.seq_len={self.seq_len[row.slot]}",
            f"data.global_batch_size={self.global_batch[row.slot] * row.devices}",
            f"model.loss_chunk_tokens={self.loss_chunk_tokens}", f"trainer.max_steps={self.steps}",
            "trainer.val_check_interval=null", "logger=none", "trainer.precision=bf16-mixed",
            *self.hardware, *row.overrides(self.compile_backend),
        ]  # fmt: skip


def gpu_profile(
    budget_s: float, steps: int, spec: str | None = None, memory_gib: float | None = None
) -> Profile:
    """4,096 tokens a sequence on the hardware spec of the GPU found (so MFU and the planner
    use its datasheet) with the memory the device reports; or on `spec` with its own memory
    (`--plan`, no GPU needed)."""
    if spec is None:
        import torch

        name = torch.cuda.get_device_name(0)
        spec = next((s for fragment, s in KNOWN_GPUS.items() if fragment in name), "gpu")
        memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    hardware = (f"hardware={spec}", "hardware.num_nodes=1")
    if memory_gib is not None:
        hardware += (f"hardware.memory_gib={memory_gib:.1f}",)
    return Profile(
        models={"small": "llama3_1b", "large": "llama3_8b"},
        seq_len={"small": 4096, "large": 2048},
        global_batch={"small": 4, "large": 1},
        loss_chunk_tokens=4096,
        steps=steps,
        compile_backend="inductor",
        budget_s=budget_s,
        row_limit_s=180,
        startup_guess_s=30,
        compile_guess_s=90,
        source="measured-gpu",
        hardware=hardware,
    )


def rehearsal_profile(budget_s: float, steps: int) -> Profile:
    return Profile(
        models={"small": "llama_debug", "large": "tiny"},
        seq_len={"small": 128, "large": 128},
        global_batch={"small": 4, "large": 2},
        loss_chunk_tokens=256,
        steps=steps,
        compile_backend="aot_eager",
        budget_s=budget_s,
        row_limit_s=60,
        startup_guess_s=5,
        compile_guess_s=10,
        source="measured-cpu",
        rehearsal=True,
        hardware=("hardware=cpu",),
    )


# --- one row in a child process -------------------------------------------------------------


def _train_row(overrides: list[str], run_dir: str) -> None:
    """The child: its own process group (so a timeout ends its compile workers too), output to
    run_dir/log.txt, the summary (or the one-line error) to run_dir/result.json."""
    os.setpgrp()
    log = os.open(os.path.join(run_dir, "log.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    result: dict = {}
    try:
        from lightning_dist.config import compose_config
        from lightning_dist.train import train

        cfg = compose_config([*overrides, f"paths.output_dir={run_dir}"])
        result = {"summary": train(cfg)}
    except BaseException as e:  # the row reports it; the next row still runs
        result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
        import traceback

        traceback.print_exc()
    finally:
        Path(run_dir, "result.json").write_text(json.dumps(result, default=str))
        sys.stdout.flush()
        os._exit(0)


class RowRunner:
    """Runs rows in children of a fork server that imported the training stack once."""

    def __init__(self) -> None:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        )
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(
            ["torch", "lightning", "hydra", "lightning_dist.train", "lightning_dist.config"]
        )
        self.warmed = False

    def warm(self) -> None:
        """Start the fork server (its imports) before the first row is timed."""
        child = self.ctx.Process(target=os.getpid)
        child.start()
        child.join()
        self.warmed = True

    def run(
        self, overrides: list[str], run_dir: Path, limit_s: float, devices: int = 1
    ) -> tuple[dict, float]:
        """(the child's result, its wall seconds); {"error": ...} on a timeout or a crash. A row
        on more than one device runs `python train.py` (Lightning starts its other ranks from
        that command line), in a session of its own that a timeout ends whole."""
        run_dir.mkdir(parents=True, exist_ok=True)
        if devices > 1:
            return self._run_train_py(overrides, run_dir, limit_s)
        if not self.warmed:
            self.warm()
        start = time.perf_counter()
        child = self.ctx.Process(target=_train_row, args=(overrides, str(run_dir)))
        child.start()
        child.join(limit_s)
        if child.is_alive():
            try:  # its process group (compile workers), and itself if it had none yet
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.kill()
            child.join(10)
            return {"error": f"timed out after {limit_s:.0f} s (its own limit)"}, limit_s
        wall = time.perf_counter() - start
        path = run_dir / "result.json"
        if not path.exists():
            return {"error": f"the row's process died (exit {child.exitcode})"}, wall
        return json.loads(path.read_text()), wall

    @staticmethod
    def _run_train_py(overrides: list[str], run_dir: Path, limit_s: float) -> tuple[dict, float]:
        import subprocess

        start = time.perf_counter()
        with open(run_dir / "log.txt", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return {"error": f"timed out after {limit_s:.0f} s (its own limit)"}, limit_s
        wall = time.perf_counter() - start
        summary = run_dir / "summary.json"
        if code != 0 or not summary.exists():
            errors = [
                ln
                for ln in (run_dir / "log.txt").read_text().splitlines()
                if ln.startswith("error:")
            ]
            return {"error": (errors or [f"train.py exited {code}"])[0][:200]}, wall
        return {"summary": json.loads(summary.read_text())}, wall


# --- planning, measuring, reporting ---------------------------------------------------------


@dataclass
class Outcome:
    row: Row
    name: str
    overrides: list[str]
    skipped: str | None = None
    error: str | None = None
    wall_s: float = 0.0
    measured: dict[str, float | None] = field(default_factory=dict)
    predicted: dict[str, float | None] = field(default_factory=dict)
    planner_layout: str = ""


QUANTITIES = {
    "tokens/s": "time.tokens_per_sec_per_device",
    "MFU": "time.mfu",
    "peak GiB": "memory.total_bytes",
}
"""Printed column -> the calibration quantity of its row (on CPU, peak memory is the process's:
memory.process_bytes against the planner's total)."""


def predict(overrides: list[str], rehearsal: bool) -> tuple[object, dict[str, float | None]]:
    from lightning_dist.run.calibrate import predict as planner_predict

    candidate = planner_predict(overrides)
    world = candidate.layout.world_size
    memory = candidate.memory.total if rehearsal else candidate.memory.tensors
    return candidate, {
        "tokens/s": candidate.time.tokens_per_sec / world,
        "MFU": candidate.time.mfu,
        "peak GiB": memory,
    }


def measured(summary: dict) -> dict[str, float | None]:
    return {
        "tokens/s": (summary["tokens_per_sec"] or 0) / summary["world_size"] or None,
        "MFU": summary["mfu"],
        "peak GiB": max(summary["peak_memory_bytes"] or [0]) or None,
    }


class Budget:
    """The time left, and each row's estimated cost from the rows measured before it: start-up
    per model slot (the last row of that slot), compile time (the largest seen)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.deadline = time.perf_counter() + profile.budget_s
        self.startup_s: dict[str, float] = {}
        self.compile_s: float | None = None

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def estimate(self, row: Row, step_s: float) -> float:
        startup = self.startup_s.get(row.slot, max(self.startup_s.values(), default=0.0))
        startup = max(startup, self.profile.startup_guess_s if not self.startup_s else 0.0)
        compile_s = self.profile.compile_guess_s if self.compile_s is None else self.compile_s
        return startup + (compile_s if row.compile else 0.0) + 1.5 * step_s * self.profile.steps

    def limit(self, cost: float) -> float:
        """A row's own time limit: three times its estimate (at least a minute), within the
        profile's cap and the budget left."""
        return min(self.left(), self.profile.row_limit_s, max(60.0, 3 * cost))

    def timed_out(self, row: Row, limit: float) -> None:
        """A row that ran out of time: the next like it is expected to take as long."""
        if row.compile:
            self.compile_s = max(self.compile_s or 0.0, limit)
        else:
            self.startup_s[row.slot] = max(self.startup_s.get(row.slot, 0.0), limit)

    def learn(self, row: Row, wall_s: float, summary: dict) -> None:
        """Start-up (and compile) time: the row's wall time less its steady steps."""
        steps = sorted(summary.get("step_seconds") or [0.0])
        overhead = max(0.0, wall_s - steps[len(steps) // 2] * len(steps))
        if not row.compile:
            self.startup_s[row.slot] = overhead
        elif row.slot in self.startup_s:
            self.compile_s = max(self.compile_s or 0.0, overhead - self.startup_s[row.slot])


def selected(profile: Profile, slot: str | None, pattern: str | None) -> list[Row]:
    """The rows of one model slot (`--only`, or both) whose names (`llama3_1b 3d fp8 ac=op
    compile`, ...) match the regular expression `pattern` (`--rows`, or all)."""
    return [
        row
        for row in ROWS
        if (slot is None or row.slot == slot)
        and (pattern is None or re.search(pattern, row.name(profile.models[row.slot])))
    ]


def run_rows(
    profile: Profile, rows, devices: int, workdir: Path, runner: RowRunner | None, after_each=None
) -> list[Outcome]:
    """Plan, run and print each row; `after_each(outcomes)` after every row (the results are
    written as they come, so a run cut short keeps what it measured)."""
    budget = Budget(profile)
    outcomes = []
    for row in rows:
        out = Outcome(row, row.name(profile.models[row.slot]), profile.overrides(row))
        outcomes.append(out)
        try:
            candidate, out.predicted = predict(out.overrides, profile.rehearsal)
        except ValueError as e:  # the planner refuses the layout (float8 on an A100, ...)
            out.skipped = f"the planner refuses it: {e}"
            print(render_row(out), flush=True)
            continue
        out.planner_layout = candidate.describe()
        cost = budget.estimate(row, candidate.time.step_seconds)
        if row.devices > devices:
            out.skipped = f"needs {row.devices} devices, {devices} here"
        elif not candidate.fits:
            out.skipped = f"the planner says it does not fit: {candidate.reason}"
        elif runner is None:
            out.skipped = f"planned only: about {cost:.0f} s"
        elif cost > budget.left():
            out.skipped = f"about {cost:.0f} s, {max(0, budget.left()):.0f} s of the budget left"
        else:
            limit = budget.limit(cost)
            result, out.wall_s = runner.run(
                out.overrides, workdir / f"row{len(outcomes)}", limit, row.devices
            )
            if "summary" in result:
                out.measured = measured(result["summary"])
                budget.learn(row, out.wall_s, result["summary"])
            else:
                out.error = result["error"]
                if out.error.startswith("timed out"):
                    budget.timed_out(row, limit)
        print(render_row(out), flush=True)
        if after_each is not None:
            after_each(outcomes)
    return outcomes


def _cell(column: str, measured: float | None, predicted: float | None) -> str:
    def show(v):
        if v is None:
            return "–"
        return {"tokens/s": f"{v:,.0f}", "MFU": f"{v:.1%}", "peak GiB": f"{v / 2**30:.2f}"}[column]

    error = f" ({predicted / measured - 1:+.0%})" if measured and predicted else ""
    return f"{show(measured)} / {show(predicted)}{error}"


HEADER = (
    "| row | tokens/s, measured / planner (error) | MFU | peak GiB | wall s | note |\n"
    "| --- | --- | --- | --- | ---: | --- |"
)


def render_row(out: Outcome) -> str:
    cells = [_cell(c, out.measured.get(c), out.predicted.get(c)) for c in QUANTITIES]
    note = f"skipped: {out.skipped}" if out.skipped else f"failed: {out.error}" if out.error else ""
    return f"| {out.name} | {' | '.join(cells)} | {out.wall_s:.0f} | {note} |"


def calibration_rows(profile: Profile, outcomes: list[Outcome], hardware_name: str, device: str):
    """The measured rows as the calibration owner's rows."""
    from lightning_dist.planner.calibration import CalibrationRow

    today = datetime.date.today().isoformat()
    origin = "python bench/gpu.py" + (" --rehearse" if profile.rehearsal else "")
    rows = []
    for out in outcomes:
        if not out.measured:
            continue
        for column, quantity in QUANTITIES.items():
            if profile.rehearsal and column == "peak GiB":
                quantity = "memory.process_bytes"
            value = out.measured.get(column)
            if value is None:
                continue
            rows.append(
                CalibrationRow(
                    source=profile.source,
                    quantity=quantity,
                    measured=value,
                    predicted=out.predicted.get(column),
                    model=profile.models[out.row.slot],
                    hardware=hardware_name,
                    layout=out.name,
                    overrides=tuple(out.overrides),
                    planner_layout=out.planner_layout,
                    precision="bf16-mixed",
                    seq_len=profile.seq_len[out.row.slot],
                    global_batch_size=profile.global_batch[out.row.slot] * out.row.devices,
                    origin=origin,
                    date=today,
                    notes=device,
                )
            )
    return rows


def merge(path: Path, into: Path | None = None) -> int:
    """Add the rows of `path` to the calibration file `into` (the planner's by default); a row
    with the key of a stored one replaces it."""
    from lightning_dist.planner.calibration import PATH, load, save

    into = into or PATH
    rows = load(path).rows
    rehearsed = sorted({r.source for r in rows} - {"measured-gpu"})
    if rehearsed:
        print(
            f"error: {path} holds {', '.join(rehearsed)} rows (a --rehearse run's); only a GPU "
            "run's rows (measured-gpu) go into the calibration",
            file=sys.stderr,
        )
        return 2
    save(load(into).with_rows(rows), into)
    print(f"merged {len(rows)} rows of {path} into {into}")
    return 0


def _pattern(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {e}") from None
    return text


def _no_rows(args) -> int:
    asked = " ".join(f"--{k} {v!r}" for k, v in (("only", args.only), ("rows", args.rows)) if v)
    print(
        f"error: no row matches {asked}; the row names are in the table of a plain run",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rehearse", action="store_true", help="the same rows on CPU, tiny models")
    parser.add_argument(
        "--budget", type=float, help="seconds for all rows (330 on GPU, 150 rehearsed)"
    )
    parser.add_argument("--steps", type=int, help="optimizer steps a row (10 on GPU, 4 rehearsed)")
    parser.add_argument("--only", choices=("small", "large"), help="the rows of one model slot")
    parser.add_argument(
        "--rows",
        metavar="REGEX",
        type=_pattern,
        help="only the rows whose names match (e.g. 'fp8|fsdp2')",
    )
    parser.add_argument(
        "--devices",
        type=int,
        help="CPU processes a rehearsed multi-device row may use (default 2; 1 skips those rows)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--merge", type=Path, help="add a gpu-rows.json to the calibration; no run")
    parser.add_argument(
        "--plan",
        metavar="SPEC",
        help="print the GPU rows as the planner sees "
        "them on lightning_dist/conf/hardware/SPEC (dgx_h200); no run, no GPU needed",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge)
    if args.plan:
        profile = gpu_profile(args.budget or 330, args.steps or 10, spec=args.plan)
        rows = selected(profile, args.only, args.rows)
        if not rows:
            return _no_rows(args)
        print(f"{args.plan}, planned only\n{HEADER}", flush=True)
        run_rows(profile, rows, 1, Path("."), None)
        return 0
    import torch

    if args.rehearse:
        profile = rehearsal_profile(args.budget or 170, args.steps or 4)
        devices, device = args.devices or 2, "CPU rehearsal"
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device here; run `python bench/gpu.py --rehearse` on a CPU")
            return 2
        profile = gpu_profile(args.budget or 330, args.steps or 10)
        devices, device = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    rows = selected(profile, args.only, args.rows)
    if not rows:
        return _no_rows(args)
    os.environ.setdefault("WANDB_MODE", "disabled")
    print(
        f"{device}: {len(rows)} rows, a budget of {profile.budget_s:.0f} s, {profile.steps} "
        f"steps a row, {profile.compile_backend}\n{HEADER}",
        flush=True,
    )
    hardware_name = profile.hardware[0].split("=", 1)[1]
    args.out.mkdir(parents=True, exist_ok=True)
    from lightning_dist.planner.calibration import Calibration, save

    def write(outcomes: list[Outcome]) -> list:
        rows = calibration_rows(profile, outcomes, hardware_name, device)
        save(Calibration(rows=tuple(rows)), args.out / "gpu-rows.json")
        table = "\n".join([HEADER, *map(render_row, outcomes)])
        (args.out / "gpu-table.md").write_text(f"{device}, {datetime.date.today()}\n\n{table}\n")
        return rows

    # Each row's folder (its log.txt) stays under --out, to be copied back with the rows.
    outcomes = run_rows(profile, rows, devices, args.out / "runs", RowRunner(), write)
    calibration = write(outcomes)
    ran = sum(1 for o in outcomes if o.measured)
    failed = [o.name for o in outcomes if o.error]
    print(
        f"{ran} rows measured, {len(failed)} failed, {len(outcomes) - ran - len(failed)} "
        f"skipped; {len(calibration)} calibration rows in {args.out / 'gpu-rows.json'}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
