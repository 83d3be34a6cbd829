"""`python tests/toy_train.py [overrides]`: train.py with the test plugins loaded: the toy
strategy (tests/toy_strategy.py, tests/toy_conf on Hydra's search path) and the fault injectors
(tests/faults.py). Lightning's launcher and torchrun re-run this same script on every rank."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tests.toy_strategy  # noqa: E402,F401  (registers the schema, allows the target)
from lightning_dist.config.targets import allow_targets  # noqa: E402

allow_targets("callbacks", "tests.faults.")
allow_targets("data", "tests.faults.")  # a reference's data (tests/faults.py)

sys.argv.append(f"hydra.searchpath=[file://{ROOT / 'tests' / 'toy_conf'}]")

from train import main  # noqa: E402

if __name__ == "__main__":
    from lightning_dist.runtime.process_end import run_then_end

    run_then_end(main)
