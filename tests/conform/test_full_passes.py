"""A conformance run holds off the garbage collector's full passes while it lasts and leaves its thresholds as it
found them; it makes no cyclic garbage, so holding them off keeps nothing alive."""

from __future__ import annotations

import gc

import pytest

import alibi.conform.pipeline as pipeline
from alibi.conform.pipeline import (
    DEFERRED_FULL_PASSES,
    choose_pair,
    full_passes_deferred,
    run_conformance,
    source_from_preset,
)


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def _pair():
    return choose_pair("emulator:w_then_a", "emulator:a_then_w")


def test_a_run_defers_full_passes_while_it_lasts_and_restores_the_thresholds(monkeypatch, thresholds):
    gc.set_threshold(700, 10, 10)
    seen = []
    prepare = pipeline.prepare_tiles

    def watched(*args, **kwargs):
        seen.append(gc.get_threshold())
        return prepare(*args, **kwargs)
    monkeypatch.setattr(pipeline, "prepare_tiles", watched)
    run_conformance(_pair(), source_from_preset("tiny"), device="cpu")
    assert seen and all(t == (700, 10, DEFERRED_FULL_PASSES) for t in seen), seen
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_set_inside_a_run_are_kept(thresholds):
    gc.set_threshold(700, 10, 10)
    with full_passes_deferred():
        gc.set_threshold(500, 5, 5)
    assert gc.get_threshold() == (500, 5, 5)


def test_nested_runs_restore_the_outer_thresholds(thresholds):
    gc.set_threshold(700, 10, 10)
    with full_passes_deferred():
        with full_passes_deferred():
            assert gc.get_threshold()[2] == DEFERRED_FULL_PASSES
        assert gc.get_threshold() == (700, 10, DEFERRED_FULL_PASSES)
    assert gc.get_threshold() == (700, 10, 10)


def _cyclic_garbage(pair, source, device: str) -> list[str]:
    """The types of the objects one warm run leaves in reference cycles (its young passes' finds included)."""
    run_conformance(pair, source, device=device)  # imports, caches and CUDA graphs made once, outside the count
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run_conformance(pair, source, device=device)
        gc.collect()
        return [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_run_on_the_cpu_makes_no_cyclic_garbage():
    assert _cyclic_garbage(_pair(), source_from_preset("tiny"), "cpu") == []


@pytest.mark.gpu
def test_a_run_on_the_gpu_with_replayed_launches_makes_no_cyclic_garbage():
    """The GPU path (arms and checks replayed from CUDA graphs, batches overlapped) too: deferring the full passes
    must not keep a batch's device tensors alive."""
    pair = choose_pair("cutlass", "triton")
    assert _cyclic_garbage(pair, source_from_preset("smollm2-135m"), "cuda") == []
