"""The bottom floor of a run's process: the requeue-signal holder (`requeue_signal.py`), the
filter of known warnings (`quiet.py`), secret redaction (`redaction.py`), the format of a
run's record (`record.py`), and our strategies' names in Lightning's registry, registered when
Lightning loads (`strategy_names.py`), and a stderr line written in one call (`console.py`). Each is torch- and Lightning-free and imports nothing above it."""
