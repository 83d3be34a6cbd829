"""`python -m lightning_dist.checkpoint`: see lightning_dist/checkpoint/cli.py."""

import sys

from lightning_dist.checkpoint.cli import main

sys.exit(main())
