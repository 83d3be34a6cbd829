"""What a user sees, the record's pieces in one process: the smoothed final loss, the console's
closing summary, the multirun comparison table, which names jobs by the overrides that differ
(a job without a summary included) and is the README's, and the report's file modes. (The
train.py runs are tests/e2e/test_record_e2e.py.)"""

from __future__ import annotations

import json

import pytest

from lightning_dist.runtime.record import smoothed_final_loss, smoothing_window, summary_block
from lightning_dist.sweep import comparison_table, job_rows, write_comparison

# --- unit: the record's pieces ------------------------------------------------------------------


def test_smoothed_final_loss_averages_the_last_steps():
    assert smoothed_final_loss([]) is None
    assert smoothed_final_loss([5.0, 4.0, 3.0]) == 3.0  # a short run: its last step
    losses = [float(i) for i in range(100, 0, -1)]  # 100 .. 1
    assert smoothing_window(len(losses)) == 10
    assert smoothed_final_loss(losses) == pytest.approx(5.5)  # mean of 10 .. 1
    assert smoothing_window(20) == 5


def test_summary_block_says_loss_validation_speed_and_where():
    summary = {
        "steps": 200, "wall_seconds": 151.6, "model": "tiny", "strategy": "ddp",
        "world_size": 2, "hardware": "cpu", "final_loss": 2.2647, "final_loss_smoothed": 2.31,
        "smoothing_steps": 10, "final_val_loss": 2.4012, "val_steps": [100, 200],
        "tokens_per_sec": 8123.4, "mfu": None, "peak_memory_bytes": [2**30, 2**29],
    }  # fmt: skip
    text = summary_block(summary, "out/summary.json")
    assert "200 steps in 152 s" in text and "strategy=ddp on 2 rank(s) of cpu" in text
    assert "loss 2.3100 (mean of the last 10 steps; step 200 alone 2.2647)" in text
    assert "validation loss 2.4012 at step 200" in text
    assert "tokens/s 8,123 | MFU n/a | peak memory 1.00 GiB" in text
    assert text.endswith("summary: out/summary.json")
    # A resumed attempt says which steps it ran, and what every attempt took together.
    resumed = {
        **summary,
        "first_step": 10,
        "wall_seconds": 52.0,
        "total_wall_seconds": 104.4,
        "segments": [{"first_step": 1, "last_step": 10}, {"first_step": 11, "last_step": 200}],
    }
    head = summary_block(resumed).splitlines()[0]
    assert "steps 11-200 (resumed at step 10) in 52 s, 2 attempts 104 s" in head, head


def test_comparison_table_names_jobs_by_the_overrides_that_differ(tmp_path):
    for job, (strategy, loss) in enumerate([("ddp", 2.5), ("fsdp", 2.25)]):
        (tmp_path / str(job) / ".hydra").mkdir(parents=True)
        (tmp_path / str(job) / ".hydra" / "overrides.yaml").write_text(
            f"- strategy={strategy}\n- debug=fast\n"
        )
        (tmp_path / str(job) / "summary.json").write_text(
            json.dumps(
                {
                    "strategy": strategy,
                    "world_size": 2,
                    "steps": 3,
                    "final_loss": loss,
                    "final_loss_smoothed": loss,
                    "final_val_loss": None,
                    "tokens_per_sec": 100.0 * (job + 1),
                    "peak_memory_bytes": [2**30],
                    "mfu": None,
                    "wall_seconds": 9.0,
                }
            )
        )
    (tmp_path / "2" / ".hydra").mkdir(parents=True)  # a job that failed before its summary
    (tmp_path / "2" / ".hydra" / "overrides.yaml").write_text("- strategy=3d\n- debug=fast\n")
    rows = job_rows(tmp_path)
    assert [r["overrides"] for r in rows] == [["strategy=ddp"], ["strategy=fsdp"], ["strategy=3d"]]
    table = comparison_table(rows)
    assert "| 1 | strategy=fsdp | 2 | 3 | 2.2500 | 2.2500 | - | 200 | 1.00 | - | 9 |" in table
    assert "strategy=3d (no summary.json)" in table
    write_comparison(tmp_path)
    assert (tmp_path / "comparison.md").read_text().count("\n| ") == 5  # header, rule, 3 jobs
    assert len(json.loads((tmp_path / "comparison.json").read_text())) == 3


def test_the_readmes_sweep_table_is_what_the_sweep_writes(tmp_path):
    """README.md's comparison table (a real `python train.py -m ... debug=fast`), rebuilt from
    summary.json files holding its numbers: the columns, their order and formats are the ones
    `lightning_dist.sweep` writes today, so a change there shows here."""
    from pathlib import Path

    from lightning_dist.sweep import COLUMNS, GIB

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("| job | overrides |"))
    shown = readme[
        start : next(i for i in range(start, len(readme)) if not readme[i].startswith("|"))
    ]
    header = [h for h, _, _ in COLUMNS]
    for line in shown[2:]:
        cells = dict(zip(header, [c.strip() for c in line.strip("|").split("|")], strict=True))
        value = {
            k: None if v == "-" else float(v.rstrip("%").replace(",", ""))
            for k, v in cells.items()
            if k not in ("job", "overrides", "ranks", "steps")
        }
        job = tmp_path / cells["job"]
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- {cells['overrides']}\n- debug=fast\n")
        (job / "summary.json").write_text(
            json.dumps(
                {
                    "world_size": int(cells["ranks"]),
                    "steps": int(cells["steps"]),
                    "final_loss": value["final loss"],
                    "final_loss_smoothed": value["smoothed"],
                    "final_val_loss": value["val loss"],
                    "tokens_per_sec": value["tokens/s"],
                    "peak_memory_bytes": [value["peak GiB"] * GIB],
                    "mfu": None if value["MFU"] is None else value["MFU"] / 100,
                    "wall_seconds": value["wall s"],
                }
            )
        )
    assert write_comparison(tmp_path).splitlines() == shown


def test_the_report_is_as_private_as_the_run_directory(tmp_path):
    """`python -m lightning_dist.report` under the usual umask (022): in a private run directory
    (paths.private: 0700) the report folder is 0700 and its files 0600, a report written before
    included; in an open one they follow the umask."""
    import os
    import stat

    from lightning_dist.report import main

    summary = {"losses": [3.0, 2.0], "strategy": "ddp", "model": "tiny"}
    umask = os.umask(0o022)
    try:
        for mode, folder_mode, file_mode in ((0o700, 0o700, 0o600), (0o755, 0o755, 0o644)):
            run = tmp_path / f"run{mode:o}"
            run.mkdir()
            run.chmod(mode)
            (run / "summary.json").write_text(json.dumps(summary))
            (run / "report").mkdir()  # an earlier report's, under the umask
            (run / "report" / "README.md").write_text("an earlier report\n")
            assert main([str(run)]) == 0
            files = list((run / "report").iterdir())
            assert sorted(p.name for p in files) == ["README.md", "loss.png"]
            assert stat.S_IMODE((run / "report").stat().st_mode) == folder_mode
            assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {file_mode}
    finally:
        os.umask(umask)
