"""What a run leaves behind, and the files that carry it: the frozen Trace, the versioned
pickle-free trace file (with its experiments section as plain JSON), every invariant a trace read
from a file must satisfy, and the one RecordFormat mechanism every file kind is read through.

Part of the engine's core: it imports nothing from the subsystems (kernels, kv, quant, serving,
remote, lens, timing). Readings of traces (comparisons, notices) live in engine/lens.
"""
