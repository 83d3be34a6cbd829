"""Where the checkout is: tests run `train.py`, scripts and examples from it."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
