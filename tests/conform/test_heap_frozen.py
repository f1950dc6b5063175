"""A conformance run keeps the objects alive before it out of the garbage collector's passes while it runs, and
leaves the collector as it found it: unfrozen after, and a caller's own freeze untouched."""

from __future__ import annotations

import gc

import alibi.conform.pipeline as pipeline
from alibi.conform.pipeline import choose_pair, heap_frozen, run_conformance, source_from_preset


def test_run_freezes_the_heap_it_found_and_unfreezes_it_after(monkeypatch):
    gc.unfreeze()
    seen = []
    prepare = pipeline.prepare_tiles

    def watched(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return prepare(*args, **kwargs)
    monkeypatch.setattr(pipeline, "prepare_tiles", watched)
    run_conformance(choose_pair("emulator:w_then_a", "emulator:a_then_w"), source_from_preset("tiny"), device="cpu")
    assert seen and min(seen) > 0, "the run prepared tiles with nothing frozen"
    assert gc.get_freeze_count() == 0, "the run left objects frozen"


def test_a_callers_own_freeze_is_kept():
    gc.unfreeze()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with heap_frozen():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
