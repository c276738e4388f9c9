"""How the erf coefficients of schedules/intrinsics.py (`_ERF_P`, `_ERF_Q`) were fitted.

erf(x) ~ x P(x^2) / Q(x^2) on [0, 4], P and Q of degree 5, Q(0) = 1. Each round solves the
linearised problem P(t) - g(t) (Q(t) - 1) = g(t), g(t) = erf(sqrt t) / sqrt t, by least squares,
weighted by 1 / (g Q_previous) so that the residual is the relative error of erf; after ten rounds
the weights also grow where the error is largest (Lawson), which pushes the fit towards minimax.

    python -m bench.fit_erf          # prints the coefficients and the errors

The fit's own relative error is 2.5e-8; evaluated in float32 (the intrinsic's Horner steps, fused
multiply-adds) the absolute error stays under 4e-7 (tests/schedules/test_intrinsics.py measures the
compiled intrinsic).
"""

from __future__ import annotations

import math

import numpy as np

CLAMP, DEG_P, DEG_Q = 4.0, 5, 5


def fit(rounds: int = 60) -> tuple[np.ndarray, np.ndarray, float]:
    x = np.unique(np.concatenate([np.linspace(1e-4, CLAMP, 6000),
                                  CLAMP * (1 - np.cos(np.linspace(0, np.pi / 2, 4000)))[1:]]))
    erf = np.array([math.erf(v) for v in x])
    t, g = x * x, erf / x
    powers = np.vander(t, max(DEG_P, DEG_Q) + 1, increasing=True)
    a = np.hstack([powers[:, :DEG_P + 1], -g[:, None] * powers[:, 1:DEG_Q + 1]])
    q, w, rel = np.ones_like(t), np.ones_like(t), np.zeros_like(t)
    p = qc = np.zeros(0)
    for r in range(rounds):
        scale = w / (g * q)
        coef, *_ = np.linalg.lstsq(a * scale[:, None], g * scale, rcond=None)
        p, qc = coef[:DEG_P + 1], np.concatenate([[1.0], coef[DEG_P + 1:]])
        q = powers[:, :DEG_Q + 1] @ qc
        rel = np.abs(x * (powers[:, :DEG_P + 1] @ p) / q - erf) / erf
        if r >= 10:
            w = w * np.sqrt(rel / rel.max()) + 1e-12
            w /= w.sum()
    return p, qc, float(rel.max())


def float32_error(p: np.ndarray, qc: np.ndarray) -> float:
    """Max absolute error over [-6, 6] with float32 coefficients and fused multiply-adds."""
    f = np.float32
    x = np.linspace(-6, 6, 1_000_001).astype(f)
    c = np.clip(x, f(-CLAMP), f(CLAMP))
    t = (c * c).astype(np.float64)

    def horner(coefs: np.ndarray) -> np.ndarray:
        acc = np.full_like(c, f(coefs[-1]))
        for k in coefs[-2::-1]:
            acc = (acc.astype(np.float64) * t + np.float64(f(k))).astype(f)
        return acc

    y = (c * horner(p)) / horner(qc)
    exact = np.array([math.erf(float(v)) for v in x])
    return float(np.abs(y.astype(np.float64) - exact).max())


if __name__ == "__main__":
    p, qc, rel = fit()
    print("_ERF_P =", tuple(float(v) for v in p))
    print("_ERF_Q =", tuple(float(v) for v in qc))
    print(f"relative error of the fit {rel:.3g}; float32 absolute error {float32_error(p, qc):.3g}")
