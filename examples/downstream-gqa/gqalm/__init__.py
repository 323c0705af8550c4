"""A grouped-query attention language model with an optional per-head output gate."""
