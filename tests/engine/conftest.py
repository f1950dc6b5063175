from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model(smollm2) -> Path:
    """The SmolLM2-135M W8A8 checkpoint `alibi model prepare` writes, prepared once per session (tests/conftest.py)."""
    return smollm2.w8a8
