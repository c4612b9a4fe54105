"""Timing and what it means: the rule for disturbed steps, latency metrics, FLOPs and bytes per
forward (the roofline), timing sweeps and the dtype comparison. The clocks themselves (wall, CPU,
the machine's load) are engine/clock.py, in the core: the recorded run reads them.
"""
