"""Weights in fewer bits: formats, the weight-byte calculator, variants of the loaded model and
their quality against float32.

Modules: `scheme` (the formats as numbers, no torch), `formats` (quantize / dequantize tensors
by GGML's rules), `ggml_blocks` (our q4_0 / q4_1 / q8_0 as GGML's block bytes),
`kquants` (GGML's Q4_K, Q6_K and Q5_0 blocks), `kmix` (which
GGML type llama.cpp gives each tensor in the K-quant variants), `calculator` (bytes for any
parameter count), `variants` (a quantized copy of the loaded model),
`awq` (an AWQ-style activation-aware scale search before rounding),
`gguf_grid` (the default model's weights already lie on its GGUF file's 4-bit grid), `quality`
(perplexity, KL and top-1 agreement against float32 by teacher forcing).

The package itself imports nothing heavy, so the CLI can list the variant names before torch loads.
"""

from __future__ import annotations

# Every name `apply_variant` and `python -m engine quality --weights` accept, reference first;
# awq_<format>: that format's rounding after an AWQ-style scale search (`awq`).
# q6_k, q4_k_m, q4_k: llama.cpp's K-quant mixes, every tensor in the GGML type llama.cpp gives it.
VARIANT_NAMES = ("fp32", "fp16", "bf16", "int8", "q8_0", "q6_k", "q4_k_m", "q4_k", "q4_0", "q4_1",
                 "q3", "q2", "awq_q4_0", "awq_q3")
