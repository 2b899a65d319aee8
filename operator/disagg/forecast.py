"""Load predictors for the Dynamo baseline: a small auto-ARIMA and the constant predictor.

Pure (numpy only). Written from the textbook definitions, not from any library:

* the differencing order d is the number of differences (at most ``MAX_D``) after
  which a KPSS test for level stationarity no longer rejects at 5 %;
* each candidate ARIMA(p, d, q), with a mean on the differenced series when d <= 1
  (a level for d = 0, a drift for d = 1), is fitted by conditional sum of squares
  (CSS): residuals are run forward from zero pre-sample shocks, the AR part of
  a pure-AR model by least squares (the exact CSS minimum), models with MA terms by
  Nelder-Mead from a Hannan-Rissanen start, AR and MA polynomials kept
  stationary and invertible;
* the order with the lowest AIC (Gaussian CSS likelihood, all candidates
  conditioned on the same first observations so their AICs compare) wins, p and q
  in 0..``MAX_PQ`` and at most a third of the series each.

`ArimaPredictor` follows how ai-dynamo/dynamo's planner uses its default ARIMA
predictor (components/src/dynamo/planner/utils/load_predictor.py, ARIMAPredictor
with pmdarima's auto_arima): a non-finite reading counts as 0; leading zeros (the
idle period before the first request) are skipped; values are clipped at 0; with
fewer than 5 points it returns the last value, and with a constant series that
value; the order is chosen once, at the first fit, and later points only refit the
coefficients; when the chosen order has p = q = 0 the series is refitted on
log1p(y) and stays in that space; a forecast is clipped at 0; a failed fit returns
the last value. pmdarima's stepwise search (p, q up to 5) and exact-likelihood fit
are replaced by the exhaustive small grid and CSS above.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ARIMA_MIN_POINTS",
    "PREDICTORS",
    "ArimaFit",
    "ArimaPredictor",
    "ConstantPredictor",
    "auto_arima",
    "choose_d",
    "fit_arima",
    "kpss_level_statistic",
]

ARIMA_MIN_POINTS = 5  # Dynamo's ARIMAPredictor(minimum_data_points=5): fewer -> last value
MAX_D = 2  # at most two differences (pmdarima's max_d)
MAX_PQ = 3  # candidate AR and MA orders 0..3 each
KPSS_CRITICAL_5PCT = 0.463  # KPSS level-stationarity critical value at 5 % (Kwiatkowski et al. 1992)
SELECT_MAXITER = 400  # Nelder-Mead iterations when choosing the order
UPDATE_MAXITER = 60  # ... when refitting a chosen order from its previous coefficients
ROOT_MARGIN = 1.05  # AR and MA roots at least this far outside the unit circle (CSS overfits near it)


def kpss_level_statistic(x: np.ndarray) -> float:
    """KPSS statistic for level stationarity: sum of squared partial sums / (n^2 x long-run variance).

    Long-run variance by Newey-West (Bartlett weights) with Schwert's short lag rule
    trunc(4 (n / 100)^(1/4)), pmdarima's default. A series with no variance counts as
    stationary (0).
    """
    n = x.shape[0]
    e = x - x.mean()
    s = np.cumsum(e)
    gamma0 = float(e @ e) / n
    lags = min(int(4.0 * (n / 100.0) ** 0.25), n - 1)
    lrv = gamma0
    for k in range(1, lags + 1):
        lrv += 2.0 * (1.0 - k / (lags + 1.0)) * float(e[k:] @ e[:-k]) / n
    if lrv <= 1e-12 * (1.0 + float(x @ x) / n):
        return 0.0
    return float(s @ s) / (n * n * lrv)


def choose_d(y: np.ndarray, max_d: int = MAX_D) -> int:
    """Differences needed until KPSS does not reject level stationarity at 5 % (at most max_d)."""
    d = 0
    x = y
    while d < max_d and x.shape[0] > 2 and kpss_level_statistic(x) > KPSS_CRITICAL_5PCT:
        x = np.diff(x)
        d += 1
    return d


def _stable(coef: np.ndarray, sign: float) -> bool:
    """Roots of 1 + sign x (c1 z + c2 z^2 + ...) all at least ROOT_MARGIN outside the unit circle.

    True when there is no coefficient. Degrees 1 and 2 in closed form (this runs
    at every evaluation of the fit's objective), higher ones by numpy.roots.
    """
    k = coef.shape[0]
    while k and coef[k - 1] == 0.0:
        k -= 1
    if k == 0:
        return True
    if k == 1:
        return abs(float(coef[0])) * ROOT_MARGIN < 1.0
    if k == 2:
        a, b = sign * float(coef[0]), sign * float(coef[1])
        disc = cmath.sqrt(a * a - 4.0 * b)
        return all(abs(r) > ROOT_MARGIN for r in ((-a + disc) / (2.0 * b), (-a - disc) / (2.0 * b)))
    # numpy.roots wants the highest power first: sign c_k z^k + ... + sign c_1 z + 1
    poly = np.concatenate([(sign * coef[:k])[::-1], [1.0]])
    return bool(np.all(np.abs(np.roots(poly)) > ROOT_MARGIN))


def _residuals(w: np.ndarray, mu: float, phi: np.ndarray, theta: np.ndarray, start: int) -> np.ndarray:
    """CSS residuals e_t for t >= start (shocks before `start` are 0).

    e_t = (w_t - mu) - sum_i phi_i (w_{t-i} - mu) - sum_j theta_j e_{t-j}.
    """
    x = w - mu
    n = x.shape[0]
    p = phi.shape[0]
    ar = x[start:].copy()
    for i in range(1, p + 1):
        ar -= phi[i - 1] * x[start - i : n - i]
    q = theta.shape[0]
    if q == 0:
        return ar
    # the MA recursion is sequential: plain floats are faster than numpy scalars here
    if q == 1:
        th1 = float(theta[0])
        out = []
        prev = 0.0
        for a in ar.tolist():
            prev = a - th1 * prev
            out.append(prev)
        return np.asarray(out)
    th = [float(t) for t in theta]
    e = [0.0] * q
    for a in ar.tolist():
        v = a
        for j in range(q):
            v -= th[j] * e[-1 - j]
        e.append(v)
    return np.asarray(e[q:])


def _nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: np.ndarray, maxiter: int
) -> np.ndarray:
    """Minimise f from x0 by the Nelder-Mead simplex (reflection 1, expansion 2, contraction 1/2)."""
    k = x0.shape[0]
    pts = [x0.copy()] + [x0 + np.eye(k)[i] * step[i] for i in range(k)]
    vals = [f(p) for p in pts]
    for _ in range(maxiter):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= 1e-10 * (abs(vals[0]) + 1e-12):
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2.0 * (centroid - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:  # shrink towards the best point
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


@dataclass(frozen=True)
class ArimaFit:
    """A fitted ARIMA(p, d, q): coefficients on the d-times differenced series."""

    p: int
    d: int
    q: int
    mean: float | None  # mean of the differenced series (level for d = 0, drift for d = 1); None: none
    phi: tuple[float, ...]
    theta: tuple[float, ...]
    sigma2: float
    aic: float

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.p, self.d, self.q)

    def forecast(self, y: Sequence[float] | np.ndarray) -> float:
        """One-step-ahead forecast of the series y (in the space it was fitted in)."""
        y = np.asarray(y, dtype=float)
        w = np.diff(y, n=self.d) if self.d else y
        mu = self.mean or 0.0
        phi = np.asarray(self.phi)
        theta = np.asarray(self.theta)
        e = _residuals(w, mu, phi, theta, self.p)
        e = np.concatenate([np.zeros(self.p), e])
        x = w - mu
        n = w.shape[0]
        nxt = mu
        nxt += sum(phi[i] * x[n - 1 - i] for i in range(self.p))
        nxt += sum(theta[j] * e[n - 1 - j] for j in range(self.q) if n - 1 - j >= 0)
        # undo the differencing: y_{n+1} = next difference + what the lower differences carry
        if self.d == 0:
            return float(nxt)
        if self.d == 1:
            return float(y[-1] + nxt)
        return float(2.0 * y[-1] - y[-2] + nxt)


def _initial(w: np.ndarray, p: int, q: int, with_mean: bool) -> np.ndarray:
    """Hannan-Rissanen start: regress w on its lags and on the residuals of a long AR."""
    n = w.shape[0]
    mu = float(w.mean()) if with_mean else 0.0
    x = w - mu
    if q == 0 and p == 0:
        return np.array([mu] if with_mean else [])
    eps = np.zeros(n)
    m = min(max(p, q) + 2, n // 3)
    if q > 0 and m > 0 and n - m > m:
        lag = np.column_stack([x[m - i : n - i] for i in range(1, m + 1)])
        a, *_ = np.linalg.lstsq(lag, x[m:], rcond=None)
        eps[m:] = x[m:] - lag @ a
    k = max(p, q)
    cols = [x[k - i : n - i] for i in range(1, p + 1)] + [eps[k - j : n - j] for j in range(1, q + 1)]
    if n - k <= p + q:
        coef = np.zeros(p + q)
    else:
        coef, *_ = np.linalg.lstsq(np.column_stack(cols), x[k:], rcond=None)
    phi, theta = coef[:p], coef[p:]
    # pull a start outside the stationary / invertible region back inside
    while not _stable(phi, -1.0):
        phi = phi * 0.5
    while not _stable(theta, 1.0):
        theta = theta * 0.5
    return np.concatenate([[mu] if with_mean else [], phi, theta])


def fit_arima(
    y: Sequence[float] | np.ndarray,
    p: int,
    d: int,
    q: int,
    with_mean: bool | None = None,
    start: int | None = None,
    previous: ArimaFit | None = None,
) -> ArimaFit | None:
    """Fit ARIMA(p, d, q) to y by CSS; None when the series is too short for the order.

    `with_mean` defaults to d <= 1. `start` is the first differenced observation
    whose residual counts (default p); `previous`, a fit of the same order to
    start from (fewer iterations).
    """
    y = np.asarray(y, dtype=float)
    with_mean = d <= 1 if with_mean is None else with_mean
    w = np.diff(y, n=d) if d else y
    start = p if start is None else start
    n_eff = w.shape[0] - start
    k = p + q + int(with_mean) + 1  # coefficients, mean, innovation variance
    if n_eff <= k:
        return None
    scale = float(np.var(w)) + float(np.mean(w)) ** 2 + 1e-12
    floor = 1e-12 * scale  # a perfect fit still has a finite likelihood

    def unpack(v: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        off = int(with_mean)
        return (float(v[0]) if with_mean else 0.0), v[off : off + p], v[off + p :]

    def sse(v: np.ndarray) -> float:
        mu, phi, theta = unpack(v)
        if not (_stable(phi, -1.0) and _stable(theta, 1.0)):
            return math.inf
        e = _residuals(w, mu, phi, theta, start)
        return float(e @ e)

    if previous is not None and previous.order == (p, d, q):
        x0 = np.concatenate([[previous.mean] if with_mean else [], previous.phi, previous.theta])
        maxiter, simplex = UPDATE_MAXITER, 0.1  # one more point moves the optimum a little
    else:
        x0 = _initial(w, p, q, with_mean)
        maxiter, simplex = SELECT_MAXITER, 1.0
    if q == 0:
        # pure AR: CSS is linear least squares in (intercept, phi); exact when the result is stationary
        cols = ([np.ones(n_eff)] if with_mean else []) + [
            w[start - i : w.shape[0] - i] for i in range(1, p + 1)
        ]
        if cols:
            coef, *_ = np.linalg.lstsq(np.column_stack(cols), w[start:], rcond=None)
            phi = coef[int(with_mean) :]
            if _stable(phi, -1.0):
                mu = float(coef[0]) / (1.0 - float(phi.sum())) if with_mean else 0.0
                x0 = np.concatenate([[mu] if with_mean else [], phi])
                maxiter = 0
    if maxiter and x0.shape[0]:
        sd = math.sqrt(float(np.var(w)) + 1e-12)
        step = simplex * np.array([max(sd, 1e-6)] * int(with_mean) + [0.1] * (p + q))
        x0 = _nelder_mead(sse, x0, step, maxiter)
    value = sse(x0)
    if not math.isfinite(value):
        return None
    sigma2 = max(value / n_eff, floor)
    loglik = -0.5 * n_eff * (math.log(2.0 * math.pi * sigma2) + 1.0)
    mu, phi, theta = unpack(x0)
    return ArimaFit(
        p=p,
        d=d,
        q=q,
        mean=mu if with_mean else None,
        phi=tuple(float(v) for v in phi),
        theta=tuple(float(v) for v in theta),
        sigma2=sigma2,
        aic=-2.0 * loglik + 2.0 * k,
    )


def auto_arima(y: Sequence[float] | np.ndarray, max_pq: int = MAX_PQ) -> ArimaFit | None:
    """The lowest-AIC ARIMA(p, d, q) for y: d by KPSS, p and q in 0..min(max_pq, n/3) by CSS.

    Every candidate counts residuals from the same differenced observation (the
    largest p tried), so their AICs are comparable; ties go to fewer coefficients.
    None when no candidate fits.
    """
    y = np.asarray(y, dtype=float)
    d = choose_d(y)
    n = y.shape[0] - d
    top = max(0, min(max_pq, n // 3))
    best: ArimaFit | None = None
    for p in range(top + 1):
        for q in range(top + 1):
            fit = fit_arima(y, p, d, q, start=top)
            if fit is not None and (best is None or fit.aic < best.aic - 1e-9):
                best = fit
    if best is None:
        return None
    # the chosen order, refitted with its own conditioning (all its usable residuals)
    return fit_arima(y, best.p, d, best.q, previous=best) or best


class ConstantPredictor:
    """Dynamo's "constant" predictor: the next value is the last one (0 before any)."""

    name = "constant"

    def __init__(self) -> None:
        self.values: list[float] = []
        self._seen_nonzero = False

    def add(self, value: float | None) -> None:
        """Record one interval's value: non-finite or None counts as 0; leading zeros are skipped."""
        v = 0.0 if value is None or not math.isfinite(value) else float(value)
        if v == 0.0 and not self._seen_nonzero:
            return
        self._seen_nonzero = self._seen_nonzero or v != 0.0
        self.values.append(v)

    def last(self) -> float:
        return self.values[-1] if self.values else 0.0

    def predict(self) -> float:
        return self.last()


class ArimaPredictor(ConstantPredictor):
    """Dynamo's default "arima" predictor (see the module docstring for what it follows)."""

    name = "arima"

    def __init__(self) -> None:
        super().__init__()
        self.fit: ArimaFit | None = None
        self.log_space = False  # switched on when the raw series' order has p = q = 0

    def add(self, value: float | None) -> None:
        before = len(self.values)
        super().add(value)
        if len(self.values) > before:
            self.values[-1] = max(0.0, self.values[-1])

    def _series(self) -> np.ndarray:
        y = np.asarray(self.values, dtype=float)
        return np.log1p(y) if self.log_space else y

    def predict(self) -> float:
        if len(self.values) < ARIMA_MIN_POINTS:
            return self.last()
        if len(set(self.values)) == 1:
            return self.values[0]
        try:
            if self.fit is None:
                self.log_space = False
                fit = auto_arima(self._series())
                if fit is not None and fit.p == 0 and fit.q == 0:
                    self.log_space = True
                    fit = auto_arima(self._series())
                    if fit is None:
                        self.log_space = False
                        fit = auto_arima(self._series())
                self.fit = fit
            else:
                f = self.fit
                self.fit = fit_arima(self._series(), f.p, f.d, f.q, previous=f) or f
            if self.fit is None:
                return self.last()
            forecast = self.fit.forecast(self._series())
        except (np.linalg.LinAlgError, ValueError, FloatingPointError):
            return self.last()
        if not math.isfinite(forecast):
            return self.last()
        if self.log_space:
            return max(0.0, math.expm1(min(forecast, 700.0)))
        return max(0.0, forecast)


PREDICTORS: dict[str, Callable[[], ConstantPredictor]] = {
    "arima": ArimaPredictor,
    "constant": ConstantPredictor,
}
