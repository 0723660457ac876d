"""The inputs and the comparison the numpy action distribution tests share
(test_distributions.py, test_distribution_small_blocks.py, test_distribution_catalog.py):
seeded dist-input rows that push RLlib's clamps, and a float64 ``assert_allclose``.
"""

from __future__ import annotations

import numpy as np


def _inputs(batch: int, width: int) -> np.ndarray:
    """Random rows plus the rows that push RLlib's clamps (+-15 alternating, a ramp). The
    rows depend only on (batch, width), whichever tests ran before in the process."""
    rows = [np.random.default_rng([1234, batch, width]).normal(0.0, 2.0, size=(batch, width))]
    rows.append(np.where(np.arange(width) % 2 == 0, 15.0, -15.0)[None])
    rows.append(np.linspace(-15.0, 15.0, width)[None])
    return np.concatenate(rows).astype(np.float32)


def _close(actual, expected, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol)
