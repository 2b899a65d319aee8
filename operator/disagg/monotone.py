"""Searches for the boundary of a monotone predicate over the integers (pure, standard library)."""

from __future__ import annotations

from collections.abc import Callable


def smallest_passing(ok: Callable[[int], bool], guess: int, cap: int) -> int:
    """Smallest n in [1, cap] with ok(n), for ok monotone in n (false, then true); galloping
    from `guess`, then bisection: about 2 log2 |answer - guess| tests.

    Returns cap when even cap fails (the caller then takes the largest size tried).
    """
    guess = max(1, min(cap, guess))
    lo = 0  # largest n known to fail (0: none tried)
    if ok(guess):
        hi, step = guess, 1
        while hi > 1:
            cand = max(1, hi - step)
            if not ok(cand):
                lo = cand
                break
            hi, step = cand, step * 2
    else:
        lo, step = guess, 1
        while True:
            cand = min(cap, lo + step)
            if ok(cand):
                hi = cand
                break
            if cand >= cap:
                return cap
            lo, step = cand, step * 2
    while hi - lo > 1:  # ok(hi) holds, ok(lo) does not (or lo == 0)
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
