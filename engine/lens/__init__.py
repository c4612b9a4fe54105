"""Looking inside the model on a trace: tokens and BPE, embedding neighbours and RoPE, attention
statistics per head, one head recomputed step by step, and two traces compared side by side.
"""
