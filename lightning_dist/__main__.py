"""`python -m lightning_dist [KEY=VALUE ...]`: train, as `python train.py` and `lightning-dist-train`."""

from lightning_dist.train import main

if __name__ == "__main__":
    main()
