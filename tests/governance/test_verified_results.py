"""Every command that reads a result verifies it first (issue 36 #1): `alibi.governance.verified`, and the
readers of `prereg evaluate` and `report html` on results changed after alibi wrote them, forged to contradict
themselves, or of another kind; each is refused in one line naming the file, exit 2, and the untouched result
is still read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hostile import main_one_line

from alibi.cli import main
from alibi.errors import InputError
from alibi.governance import prereg
from alibi.governance.manifest import build_predicate, read_manifest, write_manifest

MATRIX_KERNELS = "emulator:w_then_a,emulator:a_then_w,torch-cpu"


@pytest.fixture(scope="module")
def matrix_folder(tmp_path_factory) -> Path:
    """`alibi matrix` of three kernels whose every pair differs, explained by their declared models."""
    out = tmp_path_factory.mktemp("matrix") / "m"
    assert main(["matrix", "--kernels", MATRIX_KERNELS, "--synthetic", "epilogue-probe-bias", "--rows", "8",
                 "--scales", "real", "--out", str(out), "--quiet"]) == 0
    statuses = {c["status"] for c in json.loads((out / "matrix.json").read_text())["cells"]}
    assert statuses == {"explained"}
    return out


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def _edit_json(path: Path, change, *, reseal: bool) -> None:
    """Change a result document; with `reseal`, also write its folder's manifest anew (a forger who
    rewrites the manifest too: only the document's own consistency can give it away)."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    if reseal:
        m = read_manifest(path.parent)
        write_manifest(path.parent, m.kind, m.predicate, files=[s.name for s in m.subjects])


def _all_bitwise(doc: dict) -> None:
    for cell in doc["cells"]:
        cell["status"] = "bitwise"


# --- the shared reader ---------------------------------------------------------------------------

def test_a_verified_file_is_the_bytes_its_manifest_pins(matrix_folder):
    from alibi.governance.verified import verified_file

    got = verified_file(matrix_folder / "matrix.json", ("matrix",), fix="re-run it")
    assert got.data == (matrix_folder / "matrix.json").read_bytes() and got.manifest.kind == "matrix"


@pytest.mark.parametrize(("damage", "fragment"), [
    (lambda f: (f / "matrix.md").write_text("edited\n"), "fails its manifest"),
    (lambda f: (f / "notes.txt").write_text("mine\n"), "notes.txt: present in"),
    (lambda f: (f / "manifest.json").unlink(), "no manifest.json covers it"),
    (lambda f: (f / "manifest.json").write_text("{}"), "its manifest cannot be read"),
])
def test_a_result_folder_that_fails_its_manifest_is_refused_naming_the_file(matrix_folder, tmp_path, damage,
                                                                             fragment):
    from alibi.governance.verified import verified_file

    folder = _copy(matrix_folder, tmp_path)
    damage(folder)
    with pytest.raises(InputError) as info:
        verified_file(folder / "matrix.json", ("matrix",), fix="re-run it")
    assert str(info.value).startswith(str(folder / "matrix.json")) and fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_a_result_of_another_kind_is_refused_by_its_manifest(matrix_folder):
    from alibi.governance.verified import verified_manifest

    with pytest.raises(InputError, match="a 'matrix' result, not 'flip-analysis'"):
        verified_manifest(matrix_folder, ("flip-analysis",), fix="re-run it")


# --- alibi report html -----------------------------------------------------------------------------

def test_report_html_renders_an_untouched_matrix(matrix_folder, tmp_path):
    folder = _copy(matrix_folder, tmp_path)
    assert main(["report", "html", str(folder)]) == 0
    assert (tmp_path / "m.report.html").read_bytes() == (folder / "report.html").read_bytes()


def test_report_html_refuses_a_matrix_json_changed_after_it_was_written(matrix_folder, tmp_path, capsys):
    folder = _copy(matrix_folder, tmp_path)
    _edit_json(folder / "matrix.json", _all_bitwise, reseal=False)
    main_one_line(capsys, ["report", "html", str(folder)], str(folder / "matrix.json"), "fails its manifest")
    assert not (tmp_path / "m.report.html").exists()


def test_report_html_refuses_a_forged_all_bitwise_matrix_even_under_a_rewritten_manifest(matrix_folder, tmp_path,
                                                                                        capsys):
    folder = _copy(matrix_folder, tmp_path)
    _edit_json(folder / "matrix.json", _all_bitwise, reseal=True)
    main_one_line(capsys, ["report", "html", str(folder)], str(folder / "matrix.json"), "contradicts itself",
                  "says bitwise with 243 differing elements")
    assert not (tmp_path / "m.report.html").exists()


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda d: d["cells"][0].update(n_differing=0), "its units sum to 243"),
    (lambda d: d["cells"][0]["units"][0].update(n_predicted=1), "predicted and differing counts"),
    (lambda d: d["cells"].pop(), "not one per pair of its 3 kernels"),
])
def test_report_html_refuses_a_matrix_whose_cell_contradicts_its_units(matrix_folder, tmp_path, capsys, change,
                                                                       fragment):
    folder = _copy(matrix_folder, tmp_path)
    _edit_json(folder / "matrix.json", change, reseal=True)
    main_one_line(capsys, ["report", "html", str(folder)], str(folder / "matrix.json"), fragment)


# --- alibi prereg evaluate ---------------------------------------------------------------------------

def _protocol(tmp_path: Path, source: str, metric: str, op: str, value) -> Path:
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    (folder / "analysis.yaml").write_text(yaml.safe_dump({"criteria": [
        {"id": "c", "prediction": "p", "source": source, "metric": metric, "op": op, "value": value}]}))
    prereg.lock(folder)
    return folder


def _flips(tmp_path: Path) -> Path:
    """A result file under the manifest of the folder that holds it, as `alibi analyze flips` leaves it."""
    folder = tmp_path / "flips"
    folder.mkdir()
    (folder / "flips.json").write_text(json.dumps({"schema": "alibi-test-result/v1", "n_flips": 0}) + "\n")
    write_manifest(folder, "flip-analysis", build_predicate())
    return folder / "flips.json"


def test_prereg_evaluate_judges_an_untouched_result(tmp_path, capsys):
    protocol = _protocol(tmp_path, "real", "n_flips", "==", 0)
    assert main(["prereg", "evaluate", str(protocol), "--result", f"real={_flips(tmp_path)}"]) == 0


def test_prereg_evaluate_refuses_a_flips_json_that_fails_its_own_manifest(tmp_path, capsys):
    protocol = _protocol(tmp_path, "real", "n_flips", "==", 0)
    flips = _flips(tmp_path)
    flips.write_text(flips.read_text().replace('"n_flips": 0', '"n_flips": 1'))  # one byte changed
    main_one_line(capsys, ["prereg", "evaluate", str(protocol), "--result", f"real={flips}"], str(flips),
                  "fails its manifest")


def test_prereg_evaluate_refuses_a_result_no_manifest_covers(tmp_path, capsys):
    protocol = _protocol(tmp_path, "real", "n_flips", "==", 0)
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps({"schema": "alibi-test-result/v1", "n_flips": 0}))
    main_one_line(capsys, ["prereg", "evaluate", str(protocol), "--result", f"real={loose}"], str(loose),
                  "no manifest.json covers it")


def test_prereg_evaluate_refuses_a_matrix_that_contradicts_itself(matrix_folder, tmp_path, capsys):
    protocol = _protocol(tmp_path, "m", "schema", "==", "alibi.matrix/v2")
    folder = _copy(matrix_folder, tmp_path)
    assert main(["prereg", "evaluate", str(protocol), "--result", f"m={folder / 'matrix.json'}"]) == 0
    _edit_json(folder / "matrix.json", _all_bitwise, reseal=True)
    main_one_line(capsys, ["prereg", "evaluate", str(protocol), "--result", f"m={folder / 'matrix.json'}"],
                  str(folder / "matrix.json"), "contradicts itself")
