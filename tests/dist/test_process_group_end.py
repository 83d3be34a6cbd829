"""After a finished run, a rank that torchrun (or Slurm, or Lightning's launcher) started keeps
its process group for the rest of the process and destroys it at exit: a gloo group left to the
interpreter's teardown can abort the process ("terminate called without an active exception"),
which failed a finished two-task sbatch job in CI."""

import json

from tests.dist.rank_scripts import run_two_ranks


def test_a_started_rank_destroys_its_group_at_exit_not_before(tmp_path):
    out = tmp_path / "result.json"
    result = run_two_ranks("end_job_ranks.py", out)  # both ranks exit 0
    assert result == {"alive_after_end_job": True, "sum": 2.0}
    for rank in (0, 1):
        at_exit = json.loads((tmp_path / f"result.json.rank{rank}").read_text())
        assert at_exit == {"group_alive": False}, rank
