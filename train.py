"""Train a language model: `python train.py [model=...] [strategy=...] [hardware=...] [KEY=VALUE ...]`.

Thin on purpose: Hydra composes conf/train.yaml, `lightning_dist.train.train(cfg)` does the work.
"""

import sys

import hydra

from lightning_dist.config import CONF_DIR
from lightning_dist.train import ConfigError, train


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg) -> None:
    try:
        result = train(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    if result.get("plan_only") and not result["fits"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
