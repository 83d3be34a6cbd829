"""The top floor: one training run in three stages that pass objects.

`spec.py` turns the composed config into a typed `RunSpec` once, at the edge; `plan.py` makes
the `RunPlan` from it (every check, the pre-flight planner, the resume point); `build.py` makes
the Trainer, module, data and callbacks from the plan; `finish.py` writes summary.json and closes
the loggers. `lightning_dist.train.train(cfg)` calls the three in turn."""
