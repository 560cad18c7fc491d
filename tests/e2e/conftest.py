"""One set of e2e inputs (tokenizer, model, data) for every `main_ppo` run of a session."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.main_ppo import ENGINE_PYTHON, ROOT


@pytest.fixture(scope="session")
def e2e_assets() -> Iterator[Path]:
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} is missing: `make engine-venv` builds it")
    assets = Path(tempfile.mkdtemp(prefix="rl-assets-", dir="/tmp"))
    try:
        subprocess.run(
            [str(ENGINE_PYTHON), "-m", "tests.e2e.assets", str(assets)], cwd=ROOT, check=True
        )
        yield assets
    finally:
        shutil.rmtree(assets, ignore_errors=True)
