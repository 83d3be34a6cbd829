"""The GPU check rehearsed on CPU as the suite can afford it: bench/gpu.py --rehearse, the small
model's rows that take each code path once (float8 + compile + op checkpointing, eager full
checkpointing, FSDP2 on one rank; 3 steps each) and the rows that need more devices, where only
the GPU image's packages and the carried ones can be imported (bench/gpu_env.py shaped; wandb,
which the image lacks, cannot). Every row prints the planner's prediction beside what was
measured, and the rows written load as calibration rows. The whole rehearsal (both models, and
the 2-device rows on 2 CPU processes) is `python bench/gpu.py --rehearse`, 105 s here."""

from __future__ import annotations

import re
import subprocess
import sys

from lightning_dist.planner.calibration import load
from tests.repo import REPO_ROOT

ROWS = "fp8 ac=op compile|ac=full$|fsdp2| x[0-9]"


def test_rehearsal_in_the_gpu_image_shape_measures_each_code_path_once(tmp_path):
    inner = (
        f"python -c 'import wandb' 2>/dev/null && exit 9; "
        f"python bench/gpu.py --rehearse --only small --rows '{ROWS}' --steps 3 --devices 1 "
        f"--out {tmp_path}"
    )
    cmd = [sys.executable, "bench/gpu_env.py", "shaped", "--site", "here", "--", "sh", "-c", inner]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| llama_debug")]
    assert len(rows) == 7, proc.stdout  # 3 rows on one device, 4 that need more
    measured = [r for r in rows if "skipped" not in r]
    assert len(measured) == 3, proc.stdout
    for line in measured:  # tokens/s and peak memory: measured / planner (error)
        assert len(re.findall(r"[\d,.]+ / [\d,.]+ \([+-]\d+%\)", line)) == 2, line
    assert all(re.search(r"– / [\d,]+ .*needs \d devices, 1 here", r) for r in rows[3:]), rows[3:]
    calibration = load(tmp_path / "gpu-rows.json")
    assert {r.quantity for r in calibration.rows} == {
        "time.tokens_per_sec_per_device",
        "memory.process_bytes",
    }
    assert len(calibration.rows) == 6 and {r.source for r in calibration.rows} == {"measured-cpu"}
    assert all(r.predicted and r.measured > 0 for r in calibration.rows)
    assert "llama_debug 3d fp8 ac=op compile" in (tmp_path / "gpu-table.md").read_text()
