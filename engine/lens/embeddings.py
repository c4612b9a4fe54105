"""The input embedding table: nearest tokens by cosine similarity, and a 2-D PCA map.

`EmbeddingIndex` normalizes the (vocab, hidden) table once per model; a neighbour query is then a
single matrix-vector product (vocab × hidden), cheap enough to answer every keystroke.

A model opened from a GGUF file keeps its table as stored (a `StoredEmbedding`, quantized blocks
in the mapped file): a float32 copy of it would be 2.1 GB for an 8B model, so the index never
makes one. It keeps each row's norm (computed once, a chunk of rows at a time), ranks a query on
the stored blocks themselves (the LM head's kernel: one pass over the table, 8-bit activations)
and scores the best candidates exactly on their dequantized rows; the map dequantizes only the
rows it draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..gguf.stored import StoredEmbedding, StoredMatrix, matmul, rows
from ..loader import LoadedModel

CHUNK_BYTES = 32 << 20  # float32 rows dequantized at once while the norms are computed
CANDIDATES = 64  # stored table: rows ranked by the kernel's product, then scored exactly


@dataclass(frozen=True, slots=True, eq=False)
class Neighbours:
    ids: np.ndarray  # (k,) int64, most similar first
    scores: np.ndarray  # (k,) float32 cosine similarity


def _row_norms(m: StoredMatrix) -> torch.Tensor:
    """(V,) float32: every row's length, dequantizing `CHUNK_BYTES` of rows at a time."""
    step = max(1, CHUNK_BYTES // (4 * m.cols))
    return torch.cat([rows(m, torch.arange(start, min(start + step, m.rows))).norm(dim=-1)
                      for start in range(0, m.rows, step)])


class EmbeddingIndex:
    def __init__(self, lm: LoadedModel) -> None:
        embedding = lm.model.get_input_embeddings()
        self.matrix: StoredMatrix | None = None
        if isinstance(embedding, StoredEmbedding):  # as stored: norms only, no float copy
            self.matrix = embedding.matrix
            self.norms = _row_norms(self.matrix).clamp_min(1e-12)  # (V,)
            return
        self.table = embedding.weight.detach().float().cpu()  # (V, d)
        self.unit = torch.nn.functional.normalize(self.table, dim=-1)  # (V, d) unit rows

    @property
    def nbytes(self) -> int:
        """Memory held beyond the model (the float copy and its normalized rows; for a stored
        table, its row norms)."""
        if self.matrix is not None:
            return self.norms.nbytes
        return self.table.nbytes + self.unit.nbytes

    @property
    def vocab_size(self) -> int:
        return self.matrix.rows if self.matrix is not None else self.unit.shape[0]

    def vectors(self, ids: list[int] | np.ndarray) -> torch.Tensor:
        """(len(ids), d) float32: these rows of the table, dequantized when it is stored."""
        index = torch.as_tensor(np.asarray(ids, dtype=np.int64))
        return self.table[index] if self.matrix is None else rows(self.matrix, index)

    def neighbours(self, token_id: int, k: int = 10) -> Neighbours:
        """The k tokens whose embeddings are most cosine-similar to `token_id`'s, itself excluded."""
        if self.matrix is not None:
            return self._stored_neighbours(token_id, k)
        scores = self.unit @ self.unit[token_id]  # (V,)
        scores[token_id] = -2.0
        top = torch.topk(scores, k)
        return Neighbours(top.indices.numpy().astype(np.int64), top.values.numpy().astype(np.float32))

    def _stored_neighbours(self, token_id: int, k: int) -> Neighbours:
        """Every row ranked by the kernel's product with the query row (close to exact: the
        query is rounded to 8 bits per 32 values), then the best `CANDIDATES` (at least k)
        scored exactly on their dequantized rows; memory: the V scores and those rows."""
        m = self.matrix
        query = self.vectors([token_id])[0]  # (d,)
        length = query.norm().clamp_min(1e-12)
        ranked = matmul(m, query[None])[0] / (self.norms * length)  # (V,)
        ranked[token_id] = -2.0
        pool = torch.topk(ranked, min(m.rows, max(CANDIDATES, k + 1))).indices  # (C,)
        pool = pool[pool != token_id]
        exact = (rows(m, pool) @ query) / (self.norms[pool] * length)  # (C,)
        top = torch.topk(exact, min(k, len(pool)))
        return Neighbours(pool[top.indices].numpy().astype(np.int64),
                          top.values.numpy().astype(np.float32))

    def pca_map(self, ids: list[int], background: int = 1500, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Project `ids` and a random vocabulary sample onto the first two principal components
        of both together. Returns (coords of ids (n, 2), background ids, their coords (m, 2))."""
        rng = np.random.default_rng(seed)
        sample = rng.choice(self.vocab_size, size=min(background, self.vocab_size), replace=False)
        picked = self.vectors(np.concatenate([np.asarray(ids, dtype=np.int64), sample])).double()
        centred = picked - picked.mean(0)  # (n + m, d)
        _, _, v = torch.linalg.svd(centred, full_matrices=False)
        coords = (centred @ v[:2].T).numpy()  # (n + m, 2)
        return coords[: len(ids)], sample.astype(np.int64), coords[len(ids):]
