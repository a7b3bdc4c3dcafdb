"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from e2e_support import ServerProcess, need_cli


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """One server for the CLI tests; yields HOST:PORT."""
    need_cli()
    process = ServerProcess()
    yield process.address
    process.stop()
