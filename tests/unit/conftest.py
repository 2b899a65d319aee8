"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from disagg import loop, reconcile


@pytest.fixture
def fresh_loop_memory() -> Iterator[None]:
    """The loop's trackers, the pods it took out of routing and the desired sizes start and end empty (a fresh operator per test)."""
    loop.TRACKERS.clear()
    loop.OUT_OF_ROUTING.clear()
    reconcile.DESIRED.clear()
    reconcile.NO_ROUTER.clear()
    yield
    loop.TRACKERS.clear()
    loop.OUT_OF_ROUTING.clear()
    reconcile.DESIRED.clear()
    reconcile.NO_ROUTER.clear()
