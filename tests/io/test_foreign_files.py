"""Issue 36 #2: nothing alibi did not write is deleted or overwritten.

An existing output folder is replaced only if alibi wrote every file and folder in it, hidden ones
included (listed in a manifest there, or a manifest, stage or write probe itself:
`alibi.io.atomic.check_replaceable`); anything else is refused in one line naming it, exit 2, with the
folder, the inputs and the place beside it left as they were. `alibi report html` overwrites only a
page it rendered.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import main_one_line

from alibi.cli import main
from alibi.governance.manifest import build_predicate, verify_files, write_manifest
from alibi.io import atomic

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--quiet"]
FOREIGN = "which alibi did not write"


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _beside(out: Path) -> list[str]:
    """What lies beside `out` in its folder: stages of the refused run would show here."""
    return sorted(p.name for p in out.parent.iterdir() if p != out)


def _user_files(out: Path) -> None:
    """What a person keeps in a result folder: a git repository and a hidden note."""
    (out / ".git" / "refs").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / ".notes").write_text("ran on the quiet machine\n")


def test_conform_rerun_refuses_a_folder_holding_a_file_it_did_not_write(tmp_path, capsys):
    """Guards: a second `conform --out` into the same folder deleted `.git/` and `.notes` (hidden names
    were not looked at), although the report had never written them."""
    out = tmp_path / "report"
    argv = ["conform", *EMU, "--synthetic", "tiny", "--out", str(out)]
    assert main(argv) == 0
    assert main(argv) == 0  # a folder holding only what conform wrote is replaced
    _user_files(out)
    before, beside = _tree(out), _beside(out)
    main_one_line(capsys, argv, "holds '.git/HEAD', " + FOREIGN, "choose another output folder")
    assert _tree(out) == before and _beside(out) == beside
    assert verify_files(out, exact=False) == []


def test_conform_rerun_trusts_the_manifest_not_the_names_of_a_report_s_files(tmp_path, capsys):
    """Guards: the report folder's file names were trusted, not its manifest: a `report.md` the manifest
    does not list (the user's own, beside an earlier report that did not write one) would be replaced."""
    out = tmp_path / "report"
    argv = ["conform", *EMU, "--synthetic", "tiny", "--out", str(out)]
    assert main(argv) == 0
    write_manifest(out, "report", build_predicate(), files=["report.json"])  # an earlier report of report.json alone
    before = _tree(out)
    main_one_line(capsys, argv, "holds 'junit.xml', " + FOREIGN)
    assert _tree(out) == before


def test_matrix_rerun_refuses_a_folder_holding_a_hidden_file_it_did_not_write(tmp_path, capsys):
    """Guards: a second `matrix --out` deleted the hidden files of the folder it replaced."""
    out = tmp_path / "m"
    argv = ["matrix", "--kernels", "emulator:w_then_a,emulator:a_then_w", "--synthetic", "tiny", "--scales", "real",
            "--out", str(out), "--quiet"]
    assert main(argv) in (0, 1)
    capsys.readouterr()
    (out / ".notes").write_text("mine")
    before, beside = _tree(out), _beside(out)
    main_one_line(capsys, argv, "holds '.notes', " + FOREIGN)
    assert _tree(out) == before and _beside(out) == beside


def test_a_folder_without_a_manifest_is_never_replaced_and_its_first_file_is_named(tmp_path):
    """Guards: `staged_dir` (every command's folder output: model prepare, capture, prompts build, sweep,
    mutants, analyze) replaced any existing folder whole."""
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "b.txt").write_text("mine")
    (dest / "a").mkdir()
    (dest / "a" / "z.txt").write_text("mine too")
    with pytest.raises(atomic.InputError, match=r"out: holds 'a/z.txt', which alibi did not write"):
        with atomic.staged_dir(dest) as stage:
            pytest.fail(f"the block ran with {stage}")
    assert _tree(dest) == {"a/z.txt": b"mine too", "b.txt": b"mine"} and _beside(dest) == []


def test_an_empty_folder_the_user_made_inside_an_output_is_refused(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "f").write_text("old")
    write_manifest(dest, "tiles", build_predicate())
    (dest / "keep").mkdir()
    with pytest.raises(atomic.InputError, match=r"holds 'keep/', which alibi did not write"):
        with atomic.staged_dir(dest) as stage:
            (stage / "f").write_text("new")
    assert (dest / "keep").is_dir() and (dest / "f").read_text() == "old" and _beside(dest) == []


def test_nested_outputs_are_replaced_by_their_own_manifests_until_a_file_none_lists_appears(tmp_path):
    """`model prepare` writes OUT/bf16 and OUT/w8a8, each with its own manifest and none at OUT: replaced
    as alibi's; a file in a subfolder that its manifest does not list is refused, naming its path."""
    dest = tmp_path / "prepared"

    def write(stage: Path, text: str) -> None:
        for sub in ("bf16", "w8a8"):
            (stage / sub / "tok").mkdir(parents=True)
            (stage / sub / "config.json").write_text(text)
            (stage / sub / "tok" / "tokenizer.json").write_text(text)
            write_manifest(stage / sub, "checkpoint", build_predicate())

    with atomic.staged_dir(dest) as stage:
        write(stage, "1")
    with atomic.staged_dir(dest) as stage:
        write(stage, "2")
    assert (dest / "w8a8" / "tok" / "tokenizer.json").read_text() == "2"
    (dest / "w8a8" / "tok" / "added.json").write_text("mine")
    with pytest.raises(atomic.InputError, match=r"holds 'w8a8/tok/added.json', which alibi did not write"):
        with atomic.staged_dir(dest) as stage:
            write(stage, "3")
    assert (dest / "w8a8" / "tok" / "added.json").read_text() == "mine"
    assert (dest / "bf16" / "config.json").read_text() == "2" and _beside(dest) == []


def test_a_file_put_into_the_output_while_the_new_one_is_staged_is_refused_before_the_swap(tmp_path):
    """Guards: a command that stages for minutes (a replay pair, a sweep) swapped in its result over a
    file someone saved into the old folder meanwhile."""
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "f").write_text("old")
    write_manifest(dest, "tiles", build_predicate())
    with pytest.raises(atomic.InputError, match=r"holds 'later.txt', which alibi did not write"):
        with atomic.staged_dir(dest) as stage:
            (stage / "f").write_text("new")
            (dest / "later.txt").write_text("mine")
    assert (dest / "later.txt").read_text() == "mine" and (dest / "f").read_text() == "old"
    assert _beside(dest) == []  # the stage is gone


def test_a_symbolic_link_at_the_output_path_is_refused_and_left_in_place(tmp_path):
    """Guards: a link at --out was dropped and replaced by a folder (its target kept, the link lost)."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(atomic.InputError, match="is a symbolic link, which alibi did not make"):
        with atomic.staged_dir(tmp_path / "out") as stage:
            (stage / "f").write_text("new")
    assert (tmp_path / "out").is_symlink() and list(target.iterdir()) == []


def test_stages_and_write_probes_of_other_processes_are_alibi_s_own(tmp_path):
    """A stage a killed write left inside an output (`alibi run` writes its manifest in place) does not
    make the folder foreign."""
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "f").write_text("old")
    write_manifest(dest, "tiles", build_predicate())
    (dest / ".manifest.json.alibi.another-host.12345.abc_1.partial").write_text("{")
    (dest / ".alibi-probe.x1y2").write_text("")
    assert atomic.foreign_entry(dest) is None
    (dest / ".manifest.json.partial").write_text("{")  # looks like one, is not
    assert atomic.foreign_entry(dest) == ".manifest.json.partial"


def test_report_html_refuses_to_overwrite_a_file_it_did_not_render(tmp_path, capsys):
    """Guards: `alibi report html DIR --out FILE` overwrote whatever FILE held; the page in a folder no
    manifest pins (report.html beside report.json) overwrote a report.html the user wrote there."""
    out = tmp_path / "report"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--out", str(out)]) == 0
    page = tmp_path / "page.html"
    assert main(["report", "html", str(out), "--out", str(page)]) == 0
    assert main(["report", "html", str(out), "--out", str(page)]) == 0  # its own page is re-rendered
    capsys.readouterr()
    notes = tmp_path / "notes.html"
    notes.write_text("<p>my notes</p>")
    main_one_line(capsys, ["report", "html", str(out), "--out", str(notes)], "notes.html: exists and is not a page "
                  "alibi rendered")
    assert notes.read_text() == "<p>my notes</p>"
    loose = tmp_path / "loose"  # a folder no manifest pins, holding the user's own report.html
    loose.mkdir()
    (loose / "report.json").write_bytes((out / "report.json").read_bytes())
    (loose / "report.html").write_text("<p>mine</p>")
    # (rendering `loose` itself is refused before any write since issue 36 #1: no manifest vouches for it)
    main_one_line(capsys, ["report", "html", str(out), "--out", str(loose / "report.html")],
                  "report.html: exists and is not a page alibi rendered")
    assert (loose / "report.html").read_text() == "<p>mine</p>"
