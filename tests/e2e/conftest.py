"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from e2e_support import ServerProcess, need_cli

# The markers of both Python suites, as client/python/pyproject.toml
# registers them: this folder may run on its own, without that file.
MARKERS = (
    "e2e: starts a tensorcheck-server process (scripts/test.sh runs these; --quick does not)",
    "slow: minutes each: only the deep check runs these (scripts/test.sh --deep)",
    "big: the multi-GB layers (470 MB and 2.1 GB weights); run with TENSORCHECK_BIG_TESTS=1",
)


def pytest_configure(config: pytest.Config) -> None:
    known = {line.split(":")[0] for line in config.getini("markers")}
    for line in MARKERS:
        if line.split(":")[0] not in known:
            config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this folder is end to end: the server and CLI binaries."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    """One server for the CLI tests; yields HOST:PORT."""
    need_cli()
    process = ServerProcess()
    yield process.address
    process.stop()
