"""What if: change one thing in a run and see what follows.

Modules: `branch` (continue a generation from any of its tokens with another token, on the
cached prefix: the KV cache of the tokens before the branch point is reused, not recomputed),
`ablate` (switch heads or a layer's MLP off and compare the next-token distribution and the
greedy text), `patch` (activation patching: the clean run's residual stream put into a corrupted
run at one layer and position at a time), `cli` (`python -m engine branch|ablate|patch`).

Sites are named as TransformerLens names them, by layer and site: a head's output before the
output projection (`attn.hook_z`), the MLP's output (`hook_mlp_out`), the residual stream
entering a layer (`hook_resid_pre`). The package imports nothing heavy: the CLI can list its
commands before torch loads.
"""
