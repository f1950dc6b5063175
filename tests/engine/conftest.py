from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> Path:
    """The SmolLM2-135M W8A8 checkpoint `alibi model prepare` writes, built once for every engine test."""
    from alibi.model.prepare import prepare_model

    return prepare_model("smollm2-135m", tmp_path_factory.mktemp("smollm2") / "model").w8a8
