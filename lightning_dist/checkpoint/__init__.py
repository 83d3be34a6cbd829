"""Checkpoints that move between layouts: one format for every strategy, safe loading, and
conversions to and from Hugging Face (see docs/CHECKPOINTS.md)."""
