"""How Lightning's launcher re-runs `train.py` for ranks 1..N-1 under Hydra.

Lightning's own command for Hydra children repeats `sys.argv`, which under `-m` (multirun)
starts a whole sweep in every child, and points children at `hydra.run.dir`, which under a
sweep is not the job's directory. We give each child exactly this job's overrides and this
job's output directory, so a multi-process run writes one run directory, and multirun works.
"""

from __future__ import annotations

import sys


def _child_command(local_rank: int) -> tuple[list[str], str]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd, to_absolute_path

    import __main__

    hydra_cfg = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += list(hydra_cfg.overrides.task)
    command += [
        f"hydra.run.dir={hydra_cfg.runtime.output_dir}",
        f"hydra.job.name={hydra_cfg.job.name}_rank{local_rank}",
        "hydra.output_subdir=null",
    ]
    return command, get_original_cwd()


def fix_hydra_child_command() -> None:
    """Make Lightning's subprocess launcher start children with this job's own overrides."""
    from lightning_dist._compat import replace_hydra_child_command

    replace_hydra_child_command(_child_command)
