"""Measuring a training step without a Trainer: one rank of a planned world built by the real
code on torch's fake process group and fake tensors (`fake_rank.py`, with balanced expert
routing for mixtures of experts, `fake_routing.py`), and a step's memory by category on a real
rank (`step_memory.py`). No Lightning here; the planner's accuracy tests and the memory
telemetry read it."""
