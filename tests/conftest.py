"""Session-wide settings: runs started by tests write their run directories under a
temporary directory (``TIANJI_RUN_DIR``), never into the checkout."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tianji.config import RUN_DIR_ENV


@pytest.fixture(autouse=True, scope="session")
def _runs_in_a_temporary_directory() -> Iterator[None]:
    root = tempfile.mkdtemp(prefix="tianji-test-runs-")
    before = os.environ.get(RUN_DIR_ENV)
    os.environ[RUN_DIR_ENV] = root
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RUN_DIR_ENV, None)
        else:
            os.environ[RUN_DIR_ENV] = before
        shutil.rmtree(root, ignore_errors=True)
