"""`Calibration`: fits per-slot multipliers and the hidden prompt overhead to reported usage.

```python
calibration = Calibration(slots=7, image_slot=6)
calibration.add(vector, prompt_tokens)      # a request's per-slot vector and its real count
calibration.multipliers, calibration.overhead
```

`MessageCounter` owns one and feeds it every `observe`; you need it directly only to fit
another counter the same way.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from agentctx.errors import ConfigError
from agentctx.messages import MOST_TOKENS

__all__ = ["Calibration"]


def _number(value: object) -> bool:
    """A finite int or float (an int too large for a float is not, for this)."""
    if type(value) is int:
        return -MOST_TOKENS <= value <= MOST_TOKENS
    return type(value) is float and math.isfinite(value)


def _report(value: object, slots: int) -> bool:
    """Whether ``value`` is one saved report: ``[vector, prompt_tokens]``."""
    if not isinstance(value, list) or len(value) != 2:
        return False
    x, y = value
    return (
        isinstance(x, list)
        and len(x) == slots
        and all(_number(v) and 0 <= v <= MOST_TOKENS for v in x)
        and type(y) is int
        and 0 < y <= MOST_TOKENS
    )


def _explains(multipliers: list[float], overhead: float, observations: list[Any]) -> bool:
    """Whether a saved fit could be one of these saved reports: none before the first (every
    multiplier 1, no overhead), and never an overhead above every report (each report holds
    it). A fit may sit far from its newest report after the host's prompt jumps (measured by
    a re-run: an MCP toolset added, 10 sessions of 10), so nothing closer is asked of it."""
    if not observations:
        return overhead == 0 and all(m == 1 for m in multipliers)
    return bool(overhead <= max(y for _, y in observations))


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for the small normal equations."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if m[col][col] == 0.0:
            continue
        for r in range(n):
            if r != col and m[r][col] != 0.0:
                f = m[r][col] / m[col][col]
                for j in range(col, n + 1):
                    m[r][j] -= f * m[col][j]
    return [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


# A report the current fit predicts within this (relative) is recorded without refitting;
# the fit catches up with what was recorded at least every _REFIT_EVERY reports.
_REFIT_ERROR = 0.01
_REFIT_EVERY = 8
_LEAST, _MOST = 0.25, 4.0  # the multipliers a fit may give: no estimate is off by more


class Calibration:
    """Least-squares fit of one multiplier per slot and a fixed overhead per request.

    The multiplier of slot ``i`` is ``1 + g + d_i``: ``g`` is a scale shared by every slot
    but the image slot (another tokenizer scales all text alike), ``d_i`` the slot's own
    deviation. The fit uses the last ``max_observations`` reports in relative terms, older
    ones weighted ``decay ** age``, with a ridge prior of strength ``prior`` on the deviations
    and ``prior / 10`` on the shared scale and the overhead.
    """

    __slots__ = (
        "_decay",
        "_image",
        "_observations",
        "_prior",
        "_unfitted",
        "multipliers",
        "overhead",
    )

    def __init__(
        self,
        slots: int,
        image_slot: int,
        *,
        max_observations: int = 16,
        decay: float = 0.9,
        prior: float = 1e-3,
    ) -> None:
        if max_observations < 1 or not 0 < decay <= 1 or prior <= 0:
            raise ConfigError(
                "calibration needs max_observations >= 1, 0 < decay <= 1 and prior > 0, "
                f"got {max_observations}, {decay} and {prior}"
            )
        self._image = image_slot
        self._decay = decay
        self._prior = prior
        self._observations: deque[tuple[tuple[float, ...], int]] = deque(maxlen=max_observations)
        self._unfitted = 0  # reports since the last fit
        self.multipliers: list[float] = [1.0] * slots
        """Calibrated multiplier per slot (all 1.0 before the first report)."""
        self.overhead = 0.0
        """Fitted tokens every request carries beyond its messages (never above a report)."""

    def __len__(self) -> int:
        return len(self._observations)

    def state(self) -> dict[str, Any]:
        """What `restore` takes back: the reports the fit uses and the fit (JSON-ready)."""
        return {
            "observations": [[list(x), y] for x, y in self._observations],
            "unfitted": self._unfitted,
            "multipliers": list(self.multipliers),
            "overhead": self.overhead,
        }

    def restore(self, state: object) -> bool:
        """Take back a `state` a calibration of the same shape saved (a worker resuming a
        session where another left it); ``False``, with nothing changed, for anything that
        is not one."""
        k = len(self.multipliers)
        if not isinstance(state, dict):
            return False
        observations: Any = state.get("observations")
        multipliers: Any = state.get("multipliers")
        overhead: Any = state.get("overhead")
        unfitted: Any = state.get("unfitted")
        if not (
            isinstance(observations, list)
            and len(observations) <= (self._observations.maxlen or 0)
            and all(_report(o, k) for o in observations)
            and isinstance(multipliers, list)
            and len(multipliers) == k
            and all(_number(m) and _LEAST <= m <= _MOST for m in multipliers)
            and _number(overhead)
            and 0 <= overhead <= MOST_TOKENS
            and type(unfitted) is int
            and 0 <= unfitted <= _REFIT_EVERY
            and _explains(multipliers, overhead, observations)
        ):
            return False
        self._observations.clear()
        self._observations.extend((tuple(map(float, x)), y) for x, y in observations)
        self._unfitted = unfitted
        self.multipliers = [float(m) for m in multipliers]
        self.overhead = float(overhead)
        return True

    def add(
        self,
        vector: tuple[float, ...],
        prompt_tokens: int,
        *,
        most_overhead: float | None = None,
    ) -> None:
        """Record that a request whose uncalibrated per-slot vector is ``vector`` cost
        ``prompt_tokens``, and refit. ``most_overhead``: the largest overhead this fit may give
        (the next ones fit freely); beyond it, the multipliers explain the rest, unless they
        would have to be off by more than any estimate is. A few reports of views of one size
        cannot tell the overhead from a denser tokenizer."""
        self._observations.append((vector, prompt_tokens))
        self._unfitted += 1
        predicted = self.overhead + sum(
            m * x for m, x in zip(self.multipliers, vector, strict=True)
        )
        if (
            len(self._observations) > 2
            and self._unfitted < _REFIT_EVERY
            and abs(predicted - prompt_tokens) <= _REFIT_ERROR * prompt_tokens
        ):
            return  # the fit already explains it: refitting would move it by a fraction of that
        self._fit(most_overhead)
        self._unfitted = 0

    def _fit(self, most_overhead: float | None = None) -> None:
        # One row per observation in relative terms (residual / reported), so big and small
        # prompts weigh alike, older rows decayed. Ridge priors keep 1-3 observations sane:
        # d is held close to 0 (unused slots stay at 1), g and c loosely, so one observation
        # is split between scale and overhead and growth between observations fixes the rest.
        obs = list(self._observations)
        scale = sum(y for _, y in obs) / len(obs)
        k = len(self.multipliers)
        image = self._image
        rows: list[tuple[list[float], float, float]] = []
        for age, (x, y) in enumerate(reversed(obs)):
            shared = sum(x) - x[image]
            coeffs = [v / y for v in x] + [shared / y, scale / y]
            rows.append((coeffs, (y - sum(x)) / y, self._decay**age))
        priors = [self._prior] * k + [self._prior / 10, self._prior / 10]
        floor = float(min(y for _, y in obs))
        theta = _ridge(rows, priors)
        overhead = theta[k + 1] * scale
        if overhead < 0 or not self._plausible(theta):
            # A negative overhead, or multipliers past what any estimate is off by: reports
            # of views of one size (compaction holds them at its target) cannot tell the
            # overhead from the scale, and such a fit pays for a larger overhead with
            # multipliers that price the next new message at a fraction of its size. The
            # overhead is then held (none when it would be negative, else at what it was) and
            # the multipliers explain the rest; if they cannot, the overhead shrank (tools
            # dropped), which older reports still show, and it is what the newest report
            # leaves beyond its messages' estimate.
            newest, reported = obs[-1]
            room = min(max(0.0, reported - sum(newest)), floor)
            fits = []
            for held in (self.overhead, room) if overhead >= 0 else (0.0,):
                fits.append((_ridge(_holding(rows, obs, held), priors), held))
            theta, overhead = next((f for f in fits if self._plausible(f[0])), fits[0])
        if most_overhead is not None and overhead > most_overhead:
            bounded = _ridge(_holding(rows, obs, most_overhead), priors)
            if self._plausible(bounded):  # else no fit at that overhead explains the reports
                theta, overhead = bounded, most_overhead
        self.multipliers = [min(_MOST, max(_LEAST, m)) for m in self._multipliers(theta)]
        # The overhead is part of every report, so no report can be smaller than it; this keeps
        # inconsistent reports (a host that compacted on its own) from running away with it.
        self.overhead = min(max(0.0, overhead), floor)

    def _multipliers(self, theta: list[float]) -> list[float]:
        """The multiplier of each slot ``theta`` gives: 1 + the shared scale (not for images)
        + the slot's own deviation."""
        k, image = len(self.multipliers), self._image
        g = theta[k]
        return [1.0 + d + (g if i != image else 0.0) for i, d in enumerate(theta[:k])]

    def _plausible(self, theta: list[float]) -> bool:
        """Whether every multiplier ``theta`` gives is one an estimate may be off by."""
        return all(_LEAST <= m <= _MOST for m in self._multipliers(theta))


def _holding(
    rows: list[tuple[list[float], float, float]], obs: list[Any], overhead: float
) -> list[tuple[list[float], float, float]]:
    """``rows`` (newest first, as `Calibration._fit` makes them of ``obs``) with the overhead
    held at ``overhead``: its column dropped, its share taken from each residual."""
    ys = [y for _, y in reversed(obs)]
    return [(c[:-1], r - overhead / y, w) for (c, r, w), y in zip(rows, ys, strict=True)]


def _ridge(rows: list[tuple[list[float], float, float]], priors: list[float]) -> list[float]:
    """The ridge solution of weighted ``rows`` (coefficients, residual, weight)."""
    n = len(rows[0][0])
    a = [[0.0] * n for _ in range(n)]
    b = [0.0] * n
    for coeffs, residual, weight in rows:
        for i in range(n):
            wc = weight * coeffs[i]
            b[i] += wc * residual
            for j in range(n):
                a[i][j] += wc * coeffs[j]
    for i in range(n):
        a[i][i] += priors[i]
    return _solve(a, b)
