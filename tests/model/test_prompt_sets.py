"""Prompt sets: deterministic windows, pinned sources, verified on load."""

from __future__ import annotations

import bz2
import importlib.util
import itertools
import zipfile

import pytest

from alibi.cli import main
from alibi.errors import InputError
from alibi.model.prompts import (
    GENSIM_WIKIPEDIA,
    WikipediaSource,
    file_text,
    select_windows,
    wikipedia_text,
)
from alibi.model.wikitext import articles, clean_wikitext

needs_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                                      reason="needs tokenizers (pip install 'integer-alibi[model]')")

CORPUS = " ".join(f"Sentence {i} tells of the river, the hill and the {i % 7} stones." for i in range(600))


def test_windows_are_evenly_spaced_non_overlapping_and_depend_only_on_the_sizes():
    assert select_windows(10_000, 4, 512) == [0, 2048, 4608, 7168]  # 19 windows fit: indices 0, 4, 9, 14
    starts = select_windows(100_000, 8, 512)
    assert starts == select_windows(100_000, 8, 512)
    assert all(b - a >= 512 for a, b in itertools.pairwise(starts)) and starts[-1] + 512 <= 100_000
    with pytest.raises(InputError, match="only 1 windows of 512 fit"):
        select_windows(1000, 2, 512)


def test_wikitext_cleaner_keeps_prose_and_drops_markup():
    raw = ("{{Infobox|name=x {{nested}} }}'''Foo''' is a [[bar|Bar thing]] in [[Baz]].<ref>cite</ref> "
           "See [http://example.org the site].<!-- hidden -->\n[[File:x.jpg|thumb|A [[caption]]]]\n"
           "{| class=wikitable\n|-\n| cell\n|}\n== History ==\n* Item &amp; more\n== References ==\n* junk")
    assert clean_wikitext(raw) == "Foo is a Bar thing in Baz. See the site.\n\nHistory\nItem & more"


def _dump(pages: list[tuple[str, int, str]]) -> bytes:
    body = "".join(f"<page><title>{t}</title><ns>{ns}</ns><revision><text>{x}</text></revision></page>"
                   for t, ns, x in pages)
    return f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{body}</mediawiki>'.encode()


def test_only_real_articles_of_namespace_zero_are_kept():
    long = "word " * 60
    xml = _dump([("A", 0, long), ("Talk:A", 1, long), ("R", 0, "#REDIRECT [[A]]"), ("B", 0, long + "end")])
    assert [a.title for a in articles(xml)] == ["A", "B"]


def test_a_wikipedia_source_whose_digest_does_not_match_is_refused(tmp_path):
    tampered = bz2.compress(_dump([("A", 0, "x " * 200)]))
    (tmp_path / "excerpt.bz2").write_bytes(tampered)
    with pytest.raises(InputError, match="sha256 is .* but the pinned source is"):
        wikipedia_text(tmp_path / "excerpt.bz2")
    wheel = tmp_path / "gensim-4.4.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(GENSIM_WIKIPEDIA.member, tampered)
    with pytest.raises(InputError, match="pinned source"):
        wikipedia_text(wheel)
    known = WikipediaSource(GENSIM_WIKIPEDIA.member, GENSIM_WIKIPEDIA.member_sha256, {wheel.name: "0" * 64}, "")
    with pytest.raises(InputError, match="does not match the pinned"):
        wikipedia_text(wheel, known)


def test_a_pinned_text_file_with_another_digest_is_refused_with_exit_2(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(CORPUS)
    with pytest.raises(InputError, match="--sha256 pins"):
        file_text(text, "ab" * 32)
    (tmp_path / "m").mkdir()
    code = main(["prompts", "build", "--text", str(text), "--sha256", "ab" * 32, "--tokenizer", str(tmp_path / "m"),
                 "--out", str(tmp_path / "set")])
    assert code == 2 and "--sha256 pins" in capsys.readouterr().err
    assert not (tmp_path / "set").exists()


@needs_tokenizers
def test_building_a_prompt_set_twice_gives_the_same_ids_and_digest(tmp_path):
    from alibi.model.prompts import build_prompt_set, load_prompt_set

    from .builders import write_tiny_tokenizer

    tok = write_tiny_tokenizer(tmp_path / "tok", CORPUS)
    (tmp_path / "t.txt").write_text(CORPUS)
    source = file_text(tmp_path / "t.txt")
    a = build_prompt_set(source, tok, tmp_path / "a", windows=3, tokens=64)
    b = build_prompt_set(file_text(tmp_path / "t.txt"), tok, tmp_path / "b", windows=3, tokens=64)
    assert a.input_ids.shape == (3, 64)
    assert a.digest == b.digest and bool((a.input_ids == b.input_ids).all())
    for name in ("tokens.safetensors", "windows.jsonl", "ATTRIBUTION.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert load_prompt_set(tmp_path / "a").digest == a.digest


@needs_tokenizers
def test_an_edited_prompt_set_is_refused_on_load(tmp_path):
    from alibi.model.prompts import build_prompt_set, load_prompt_set

    from .builders import write_tiny_tokenizer

    tok = write_tiny_tokenizer(tmp_path / "tok", CORPUS)
    (tmp_path / "t.txt").write_text(CORPUS)
    build_prompt_set(file_text(tmp_path / "t.txt"), tok, tmp_path / "s", windows=2, tokens=32)
    with open(tmp_path / "s" / "windows.jsonl", "a") as fh:
        fh.write("{}\n")
    with pytest.raises(InputError, match="does not match its manifest"):
        load_prompt_set(tmp_path / "s")


def test_a_wheel_member_declaring_more_than_any_pinned_excerpt_is_refused_before_it_is_decompressed(tmp_path):
    """Issue 26: the member was decompressed whole before its sha256 was compared, so a zip bomb under the
    pinned name filled memory. Its declared size is now checked first: 256 MiB of zeros (≈ 0.25 MiB
    compressed) is refused while the peak of traced allocations stays far below the member's size."""
    import tracemalloc
    import zipfile

    wheel = tmp_path / "gensim-4.4.0-bomb.whl"
    chunk = bytes(2**20)
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open(GENSIM_WIKIPEDIA.member, "w", force_zip64=True) as fh:
            for _ in range(256):
                fh.write(chunk)
    assert wheel.stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"declares 268,435,456 bytes, more than any Wikipedia excerpt"):
            wikipedia_text(wheel)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak:,} bytes allocated: the member was decompressed"


def test_an_excerpt_file_larger_than_any_pinned_excerpt_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "excerpt.bz2"
    with open(big, "wb") as fh:
        fh.truncate(65 * 2**20)  # sparse: no disk, no read
    with pytest.raises(InputError, match=r"68,157,440 bytes, more than any Wikipedia excerpt"):
        wikipedia_text(big)
