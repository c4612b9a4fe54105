"""Timing and what it means: clocks (wall, CPU, the machine's load), the rule for disturbed steps,
latency metrics, FLOPs and bytes per forward (the roofline), timing sweeps and the dtype comparison.
"""
