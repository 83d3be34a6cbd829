"""The bottom floor of a run's process: the requeue-signal holder (`requeue_signal.py`), the
filter of known warnings (`quiet.py`), secret redaction (`redaction.py`) and the format of a
run's record (`record.py`). Each is torch- and Lightning-free and imports nothing above it."""
