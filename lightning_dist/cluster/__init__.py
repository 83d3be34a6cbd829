"""What a job's processes do across a cluster, around the parallel model: which node each rank
runs on (`nodes.py`), joining the process group so torchrun's restarts work (`elastic.py`),
replica groups that heal live over torchft (`replica_groups.py`), how data-parallel replicas
exchange gradients, compressed or once every H steps (`grad_sync.py`, `diloco.py`), and ranks
or links made slower on purpose for tests and benchmarks (`simulate.py`). No Lightning here;
`parallel/` (which applies parallelism to a model) never imports this floor."""
