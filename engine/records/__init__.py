"""What a run leaves behind: the frozen Trace, its experiment results, the versioned pickle-free
file, and every invariant a trace read from a file must satisfy.
"""
