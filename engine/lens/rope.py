"""Rotary position embedding (RoPE) as the model applies it, for the Embeddings page.

Dimension pair i of a head vector (HF's layout pairs dimension i with i + head_dim/2) is rotated
by the angle position · θ^(−2i/head_dim). The q·k score of two rotated vectors then depends only on
their relative distance.
"""

from __future__ import annotations

import numpy as np


def inverse_frequencies(theta: float, head_dim: int) -> np.ndarray:
    """(head_dim/2,) radians per position for each dimension pair."""
    return theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def angles(theta: float, head_dim: int, positions: np.ndarray) -> np.ndarray:
    """(P, head_dim/2) rotation angle of every dimension pair at each position."""
    return np.outer(np.asarray(positions, dtype=np.float64), inverse_frequencies(theta, head_dim))


def rotate(x: np.ndarray, position: int, theta: float) -> np.ndarray:
    """x (head_dim,) rotated as transformers' apply_rotary_pos_emb does (rotate_half layout)."""
    half = x.shape[-1] // 2
    a = angles(theta, x.shape[-1], np.array([position]))[0]
    cos, sin = np.cos(a), np.sin(a)
    first, second = x[:half], x[half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin])


def score_by_distance(q: np.ndarray, k: np.ndarray, theta: float, distances: np.ndarray,
                      query_position: int = 0) -> np.ndarray:
    """q·k after rotating q at `query_position` + d and k at `query_position`, for each d."""
    rk = rotate(k, query_position, theta)
    return np.array([rotate(q, query_position + int(d), theta) @ rk for d in distances])
