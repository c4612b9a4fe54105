"""Decode steps beside the eager one, and the machine's ceilings they are measured against:
the compiled step (torch.compile), the hand-written C step, and the bandwidth / FLOP/s micro-benchmarks.
"""
