"""Fixtures of the closed-loop tests."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from e2e_stack import Stack


@pytest.fixture
def stack(cluster, namespace, tmp_path, prometheus_factory, operator_factory) -> Iterator[Stack]:
    s = Stack(cluster, namespace, tmp_path, prometheus_factory, operator_factory)
    yield s
    if s.emulator and s.emulator.poll() is None:
        s.emulator.terminate()
        try:
            s.emulator.wait(10)
        except subprocess.TimeoutExpired:
            s.emulator.kill()
    # Free the simulated GPUs for the next test.
    cluster.kubectl("delete", "disaggdeployment", "--all", "-n", namespace, "--wait=false", check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and s.pods():
        time.sleep(0.5)
