"""Published training runs as checks of the planner: the runs (`runs.py`, `foundry.py`), their
calibration rows, and the leave-one-source-out fits behind the plan's band (`holdout.py`)."""
