"""Cluster launch helpers: Slurm job scripts written from the hardware spec and the strategy.

`python -m lightning_dist.launch slurm <train.py overrides>` writes an sbatch script (nodes,
tasks and GPUs per node, CPUs, the srun line, the requeue signal, the hardware's NCCL settings)
and submits it; see docs/LAUNCH.md. Slurm starts one task per rank and Lightning's
`SLURMEnvironment` reads the ranks from it: nothing here starts processes itself (for that, see
`lightning_dist.strategies.launch`, which starts the ranks of a run on one machine).
"""
