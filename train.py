"""Train a language model: `python train.py [model=...] [strategy=...] [hardware=...] [KEY=VALUE ...]`.

Thin on purpose: `lightning_dist.train.main` composes the configs and runs `train(cfg)`; the
installed `lightning-dist-train` command and `python -m lightning_dist` are the same program.
"""

from lightning_dist.train import main

if __name__ == "__main__":
    main()
