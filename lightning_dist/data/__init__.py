"""Corpora on disk: documents out of the formats real corpora ship in (`records`), token shards
in Megatron-Core's indexed format and nanoGPT-style flat token files (`indexed`), and the
parallel, resumable tokenization into shards (`prepare`, `python -m lightning_dist.data prepare`).

Plain Python, numpy and pyarrow: no Lightning, no torch.distributed.
"""
