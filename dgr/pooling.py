"""An input's vector from its token states, pooled by dgr itself in a fixed order
(so the same rows give the same bits whatever shared their step), and llama.cpp's
normalizations of it."""

from __future__ import annotations

import math

import numpy as np


def pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    """One input's vector from its token rows (tokens x n_embd, float32): their mean,
    the first's, the last's, or all of them (none). Computed from these rows alone,
    so the same rows give the same bits."""
    if pooling == "mean":
        return (np.add.reduce(rows, axis=0, dtype=np.float32)
                / np.float32(len(rows))).astype(np.float32)
    if pooling == "cls":
        return rows[0].copy()
    if pooling == "last":
        return rows[-1].copy()
    return rows.copy()


def normalize(vector: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's embedding normalizations (embd_normalize): -1 none, 0 by the
    largest magnitude to int16's range, 1 taxicab, 2 euclidean, p > 2 the p-norm.
    Sums in double, as llama.cpp's."""
    values = vector.astype(np.float64)
    if norm < 0:
        return vector
    if norm == 0:
        total = float(np.abs(values).max()) / 32760.0 if values.size else 0.0
    elif norm == 2:
        total = math.sqrt(float(np.dot(values, values)))
    else:
        total = float(np.sum(np.abs(values) ** norm)) ** (1.0 / norm)
    scale = 1.0 / total if total > 0.0 else 0.0
    return (values * scale).astype(np.float32)
