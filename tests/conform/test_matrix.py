"""`alibi matrix`: every pair of a kernel set through the conformance pipeline, each kernel run once per tile.

The CPU kernel set is the one CI can run: torch-cpu (torch._int_mm), the real Triton kernel under the
Triton interpreter, TorchAO's W8A8 linear (when the torchao extra is installed) and emulators.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from faulty_kernels import Nondeterministic, OneUlpUp, Reference

from alibi.cli import main
from alibi.conform.matrix import SCHEMA, SCHEMA_FILE, Matrix, run_matrix, to_markdown
from alibi.conform.pipeline import Pair, run_conformance, source_from_tiles
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.io.digests import sha256_file
from alibi.kernels.registry import _EXTRA, get_kernel, register
from alibi.tiles.synthetic import synthetic_tiles

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_SHA256 = "cd440761d481107e552f7e5755a64a441360af14de21214a630fb20cdda20085"
# v1, still read: docs/schemas/alibi.matrix.v1.schema.json
PUBLISHED_V1_SHA256 = "2aad37780e50685cb45a825f5fb009e367ce40ec9930235aa9d67d4e6c208a8c"

try:
    import torchao  # noqa: F401
    HAVE_TORCHAO = True
except ImportError:
    HAVE_TORCHAO = False

CPU_KERNELS = ["torch-cpu", "triton", *(["torchao-int8"] if HAVE_TORCHAO else []), "emulator:w_then_a",
               "emulator:a_then_w+add_after_cast", "emulator:product_first+add_before_cast"]


def biased_tiles():
    """The two `tiny` tiles, each with a bf16 bias large enough to tell bias modes apart on some outputs."""
    gen = torch.Generator().manual_seed(7)
    return [t.replace(name=f"{t.name}-bias", bias=(0.5 * torch.randn(t.N, generator=gen)).to(torch.bfloat16))
            for t in synthetic_tiles("tiny")]


def probe_rows():
    """The first 8 rows of `epilogue-probe-bias`: scale orders, intermediate rounding and bias modes all change
    bits there (its bias cancels row n mod 64 of column n)."""
    return synthetic_tiles("epilogue-probe-bias")[0].rows(slice(0, 8))


@pytest.fixture(scope="module")
def source():
    return source_from_tiles(biased_tiles() + synthetic_tiles("tiny") + [probe_rows()],
                             label="tiny, with and without bias, and 8 probe rows")


@pytest.fixture(scope="module")
def matrix(source):
    return run_matrix(CPU_KERNELS, source, ("real", "pow2"))


def _status(report) -> str:
    fired = {v.check for v in report.checks if v.fired}
    if {"predicted-differences", "epilogue-model"} & fired:
        return "unexplained"
    if all(u.bitwise_equal for u in report.tiles):
        return "bitwise"
    return "explained" if all(u.explained for u in report.tiles) else "not-judged"


def test_the_matrix_cells_equal_the_pairwise_conform_results(matrix, source):
    """Each cell against `run_conformance` of the same pair with fresh kernels and the default checks (what
    `alibi conform --kernel-a A --kernel-b B` computes): unit by unit, and the verdict."""
    assert len(matrix.cells) == len(CPU_KERNELS) * (len(CPU_KERNELS) - 1) // 2
    for cell in matrix.cells:
        report = run_conformance(Pair(get_kernel(cell.kernel_a), get_kernel(cell.kernel_b), "requested"), source,
                                 ("real", "pow2"), created_at=None)
        assert cell.status == _status(report), (cell.kernel_a, cell.kernel_b)
        assert cell.verdict == report.verdict
        got = [(u.tile, u.regime, u.n_differing, u.n_predicted, u.explained, u.cause, u.max_ulp) for u in cell.units]
        want = [(u.tile, u.regime, u.n_differing, u.n_predicted, u.explained, u.cause, u.max_ulp) for u in report.tiles]
        assert got == want, (cell.kernel_a, cell.kernel_b)


def test_the_cpu_matrix_has_bitwise_and_explained_pairs_and_names_their_causes(matrix):
    assert matrix.exit_code == 0 and not matrix.unexplained
    assert matrix.cell("torch-cpu", "emulator:w_then_a").status == "explained"  # bias: add_before_cast vs fma
    assert "bias mode" in matrix.cell("torch-cpu", "emulator:w_then_a").causes
    assert matrix.cell("triton", "emulator:a_then_w+add_after_cast").status == "bitwise"
    if HAVE_TORCHAO:
        cell = matrix.cell("torch-cpu", "torchao-int8")
        assert cell.status == "explained" and "intermediate rounding" in cell.causes


def test_each_kernel_runs_once_per_tile_and_regime(source):
    """A counting kernel in the matrix: its launches are the tiles × regimes (the first also exposing its
    accumulator), plus its own checks' launches (one repeat and the sub-batches per real-scale tile), however
    many pairs it is in."""
    calls = []

    class Counting(Reference):
        name = "counting"

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            calls.append(a_q.shape[0])
            return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)

    register("counting", Counting)
    try:
        m = run_matrix(["counting", "emulator:a_then_w", "emulator:w_then_a", "torch-cpu"], source, ("real", "pow2"))
    finally:
        _EXTRA.pop("counting")
    n_tiles = len(source.tiles)
    row = next(k for k in m.kernels if k.name == "counting")
    assert row.launches == n_tiles * 2
    full_m = [t.M for t in source.tiles]
    sub_batch_launches = sum(len([s for s in (1, 4, 16) if s < M]) for M in full_m)
    assert len(calls) == n_tiles * 2 + n_tiles + sub_batch_launches


def test_a_kernel_departing_from_its_declared_model_makes_its_pairs_unexplained_and_exit_1(tmp_path, source):
    register("one-ulp-up", OneUlpUp)
    try:
        m = run_matrix(["one-ulp-up", "emulator:a_then_w", "emulator:w_then_a"], source, ("real",))
        assert main(["matrix", "--kernels", "one-ulp-up,emulator:a_then_w", "--synthetic", "tiny",
                     "--out", str(tmp_path / "m"), "--quiet"]) == 1
    finally:
        _EXTRA.pop("one-ulp-up")
    assert m.exit_code == 1
    assert {c.status for c in m.cells if "one-ulp-up" in (c.kernel_a, c.kernel_b)} == {"unexplained"}
    assert m.cell("emulator:a_then_w", "emulator:w_then_a").status != "unexplained"


class Alternating(Nondeterministic):
    """Alternates the scale order from call to call: a second launch of any tile differs where the orders do."""

    name = "alternating"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        self.calls += 1
        model = EpilogueModel("a_then_w" if self.calls % 2 else "w_then_a")
        return apply_epilogue(model, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


def test_a_nondeterministic_kernel_fires_its_own_run_to_run_check(source):
    register("alternating", Alternating)
    try:
        m = run_matrix(["alternating", "emulator:a_then_w"], source, ("real",))
    finally:
        _EXTRA.pop("alternating")
    row = next(k for k in m.kernels if k.name == "alternating")
    assert "run-to-run" in row.fired and m.exit_code == 1
    assert not next(k for k in m.kernels if k.name == "emulator:a_then_w").fired


def test_matrix_json_validates_against_its_published_schema_and_reads_back(matrix):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / SCHEMA_FILE).read_text())
    assert schema["$id"] == SCHEMA
    jsonschema.Draft202012Validator(schema).validate(json.loads(matrix.to_json()))
    assert Matrix.from_json(matrix.to_json()) == matrix


def test_the_published_schema_files_are_unchanged():
    assert sha256_file(ROOT / SCHEMA_FILE) == PUBLISHED_SHA256
    assert sha256_file(ROOT / "docs/schemas/alibi.matrix.v1.schema.json") == PUBLISHED_V1_SHA256


def test_the_cli_writes_json_markdown_html_and_manifest(tmp_path):
    out = tmp_path / "m"
    assert main(["matrix", "--kernels", "torch-cpu,emulator:w_then_a,emulator:a_then_w", "--synthetic", "tiny",
                 "--scales", "real", "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "matrix.json", "matrix.md", "report.html"]
    m = Matrix.from_json((out / "matrix.json").read_text())
    assert (out / "matrix.md").read_text() == to_markdown(m)
    html = (out / "report.html").read_text()
    assert "Conformance matrix: 3 kernels, 3 pairs" in html and "data:image/png;base64," in html
    assert main(["manifest", "verify", str(out)]) == 0


def test_an_unavailable_kernel_exits_3_unless_left_out_with_its_reason(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("cutlass is available with a GPU")
    args = ["matrix", "--kernels", "cutlass,torch-cpu,emulator:a_then_w", "--synthetic", "tiny", "--scales", "real",
            "--quiet"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 3
    assert not (tmp_path / "a").exists()
    assert main([*args, "--out", str(tmp_path / "b"), "--available-only"]) == 0
    m = Matrix.from_json((tmp_path / "b" / "matrix.json").read_text())
    assert [u.name for u in m.unavailable] == ["cutlass"] and m.unavailable[0].reason
    assert "cutlass" in (tmp_path / "b" / "matrix.md").read_text()


@pytest.mark.parametrize("kernels, message", [("torch-cpu", "at least two kernels"),
                                              ("torch-cpu,torch-cpu", "twice"),
                                              ("torch-cpu,no-such-kernel", "unknown kernel")])
def test_bad_kernel_lists_are_refused_with_exit_2_and_no_output(tmp_path, capsys, kernels, message):
    out = tmp_path / "m"
    assert main(["matrix", "--kernels", kernels, "--synthetic", "tiny", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_an_out_folder_holding_other_files_is_refused_and_left_untouched(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["matrix", "--kernels", "torch-cpu,emulator:w_then_a", "--synthetic", "tiny", "--out", str(out)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_tiles_sharing_a_name_are_refused_since_the_matrix_tells_tiles_apart_by_name():
    from alibi.errors import InputError

    tiles = synthetic_tiles("tiny")
    twin = tiles[1].replace(name=tiles[0].name)
    with pytest.raises(InputError, match="two tiles are named"):
        run_matrix(["torch-cpu", "emulator:w_then_a"], source_from_tiles([tiles[0], twin]), ("real",))
    assert run_matrix(["torch-cpu", "emulator:w_then_a"], source_from_tiles(tiles), ("real",)).cells


class _Undeclared(Reference):
    """The exact a_then_w program, declaring no epilogue model."""

    name = "undeclared-a-then-w"
    epilogue = None

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(EpilogueModel("a_then_w"), exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


def test_a_pair_with_an_undeclared_arm_is_never_explained_and_says_which_arm(source):
    """issue 36 item 6: differences no declaration predicts cannot be `explained`, however they arose."""
    kernels = [get_kernel("emulator:w_then_a"), _Undeclared()]
    m = run_matrix([k.name for k in kernels], source, ("real",), kernels=kernels, created_at=None)
    cell = m.cell("emulator:w_then_a", "undeclared-a-then-w")
    assert cell.n_differing > 0, "the source must make the scale orders differ somewhere"
    assert cell.status == "not-judged" and "declares no epilogue model" in cell.not_judged_because
