"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from disagg import loop, reconcile


@pytest.fixture
def fresh_loop_memory() -> Iterator[None]:
    """The loop's trackers and the desired sizes start and end empty (a fresh operator per test)."""
    loop.TRACKERS.clear()
    reconcile.DESIRED.clear()
    reconcile.NO_ROUTER.clear()
    yield
    loop.TRACKERS.clear()
    reconcile.DESIRED.clear()
    reconcile.NO_ROUTER.clear()
