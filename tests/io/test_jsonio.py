"""`alibi.io.jsonio`: the depth bound is measured on the text, and agrees with the depth of the parsed value."""

from __future__ import annotations

import json
import random

import pytest

from alibi.errors import InputError
from alibi.io import jsonio

TRICKY = ["a]\\\"[{", "\\\\", "}", " x\\\\\"]", "[{", "é]"]  # brackets and escapes inside strings


def _value(rng: random.Random, level: int = 0):
    r = rng.random()
    if level > 6 or r < 0.3:
        return rng.choice([1, None, 2.5, True, *TRICKY])
    if r < 0.65:
        return [_value(rng, level + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["k", *TRICKY]) + str(i): _value(rng, level + 1) for i in range(rng.randint(0, 3))}


def test_the_depth_of_the_text_is_the_depth_of_its_value_whatever_the_strings_hold():
    rng = random.Random(0)
    for _ in range(2000):
        value = _value(rng)
        for text in (json.dumps(value), json.dumps(value, indent=1), json.dumps(value, ensure_ascii=False)):
            assert jsonio.text_depth(text) == jsonio.depth(value), text


@pytest.mark.parametrize("text, depth", [("1", 0), ('"[["', 0), ("[]", 1), ("{}", 1), ('[{"a": [1]}, 2]', 3)])
def test_the_depth_counts_containers_not_scalars(text, depth):
    assert jsonio.text_depth(text) == depth == jsonio.depth(json.loads(text))


def test_json_one_level_deeper_than_the_bound_is_refused_and_the_bound_itself_is_read():
    at = "[" * jsonio.MAX_DEPTH + "]" * jsonio.MAX_DEPTH
    assert jsonio.loads(at, "x.json") is not None
    with pytest.raises(InputError, match=r"x\.json: JSON nested more than 64 levels deep"):
        jsonio.loads("[" + at + "]", "x.json")
