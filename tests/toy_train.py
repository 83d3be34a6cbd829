"""`python tests/toy_train.py [overrides]`: train.py with tests/toy_strategy.py loaded and
tests/toy_conf on Hydra's search path (Lightning's launcher re-runs this same script)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tests.toy_strategy  # noqa: E402,F401  (registers the schema, allows the target)

sys.argv.append(f"hydra.searchpath=[file://{ROOT / 'tests' / 'toy_conf'}]")

from train import main  # noqa: E402

if __name__ == "__main__":
    main()
