"""Fixtures of the closed-loop tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_stack import Stack


@pytest.fixture
def stack(cluster, namespace, tmp_path, prometheus_factory, operator_factory) -> Iterator[Stack]:
    s = Stack(cluster, namespace, tmp_path, prometheus_factory, operator_factory)
    yield s
    s.release()
