import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def committed_code(monkeypatch):
    """A pre-registered `alibi run` refuses code that differs from git HEAD; the shared development
    tree rarely is a commit, so tests about other parts of such a run make it see committed code
    (tests/test_experiment.py tests the refusal itself)."""
    import alibi.experiment
    from alibi.governance.environment import WorkingTree

    monkeypatch.setattr(alibi.experiment, "working_tree", lambda: WorkingTree(True, (), "0" * 40))
