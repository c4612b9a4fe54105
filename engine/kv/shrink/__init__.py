"""Shrinking the KV cache itself, live on the loaded model: a latent cache made from the model's
own keys and values (latent.py), sparse attention over the top-k keys (sparse.py), eviction by
H2O, SnapKV, StreamingLLM and key norm (evict.py), each teacher-forced against the unmodified
model for bytes, quality and time (run.py), from the shell as `python -m engine kv-shrink`
(cli.py)."""
