"""The input embedding table: nearest tokens by cosine similarity, and a 2-D PCA map.

`EmbeddingIndex` normalizes the (vocab, hidden) table once per model; a neighbour query is then a
single matrix-vector product (vocab × hidden), cheap enough to answer every keystroke.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..loader import LoadedModel


@dataclass(frozen=True, slots=True, eq=False)
class Neighbours:
    ids: np.ndarray  # (k,) int64, most similar first
    scores: np.ndarray  # (k,) float32 cosine similarity


class EmbeddingIndex:
    def __init__(self, lm: LoadedModel) -> None:
        self.table = lm.model.get_input_embeddings().weight.detach().float().cpu()  # (V, d)
        self.unit = torch.nn.functional.normalize(self.table, dim=-1)  # (V, d) unit rows

    @property
    def nbytes(self) -> int:
        """Memory held beyond the model (the float copy and its normalized rows)."""
        return self.table.nbytes + self.unit.nbytes

    @property
    def vocab_size(self) -> int:
        return self.unit.shape[0]

    def neighbours(self, token_id: int, k: int = 10) -> Neighbours:
        """The k tokens whose embeddings are most cosine-similar to `token_id`'s, itself excluded."""
        scores = self.unit @ self.unit[token_id]  # (V,)
        scores[token_id] = -2.0
        top = torch.topk(scores, k)
        return Neighbours(top.indices.numpy().astype(np.int64), top.values.numpy().astype(np.float32))

    def pca_map(self, ids: list[int], background: int = 1500, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Project `ids` and a random vocabulary sample onto the first two principal components
        of both together. Returns (coords of ids (n, 2), background ids, their coords (m, 2))."""
        rng = np.random.default_rng(seed)
        sample = rng.choice(self.vocab_size, size=min(background, self.vocab_size), replace=False)
        rows = torch.cat([self.table[list(ids)], self.table[sample]]).double()  # (n + m, d)
        centred = rows - rows.mean(0)
        _, _, v = torch.linalg.svd(centred, full_matrices=False)
        coords = (centred @ v[:2].T).numpy()  # (n + m, 2)
        return coords[: len(ids)], sample.astype(np.int64), coords[len(ids):]
