"""The KV cache: bytes measured from the cache tensors, quantized and windowed cache layers, cache
experiments (variants, on vs off), the calculator over published configs, and a paged allocator's view.
"""
