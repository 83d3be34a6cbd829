"""The Hydra configs (`train.yaml` and one folder per group), shipped inside the package so that
an installed wheel composes them: Hydra finds them as `pkg://lightning_dist.conf`."""
