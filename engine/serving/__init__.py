"""Serving many requests on the loaded model: a block pool, a scheduler, batched forwards."""
