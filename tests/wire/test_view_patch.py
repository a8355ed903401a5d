"""Revision patches (wire/view_patch.py): a patched view equals the newer view."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pi_workflows.wire.view_patch import PatchError, apply_patch, diff_views


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(7 if depth < 3 else 4)
    if choice == 0:
        return rng.randrange(5)
    if choice == 1:
        return rng.choice([True, False, None])
    if choice == 2:
        return rng.choice(["a", "b", "~x/y", ""])
    if choice == 3:
        return rng.random()
    if choice in (4, 5):
        return {
            rng.choice(["k", "l", "a/b", "~0"]): _random_value(rng, depth + 1) for _ in range(3)
        }
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]


def test_random_documents_patch_into_each_other() -> None:
    rng = random.Random(13)
    for _ in range(2000):
        old, new = _random_value(rng), _random_value(rng)
        assert apply_patch(old, diff_views(old, new)) == new


def test_a_sliding_trace_window_patches_with_few_operations() -> None:
    old = {"trace": {"items": [{"n": i} for i in range(256)]}}
    new = {"trace": {"items": [{"n": i} for i in range(3, 259)]}}
    operations = diff_views(old, new)
    assert len(operations) == 6
    assert apply_patch(old, operations) == new


def test_true_and_one_are_different_values() -> None:
    operations = diff_views({"a": 1}, {"a": True})
    assert operations == [{"op": "replace", "path": "/a", "value": True}]


def test_the_given_document_is_not_changed() -> None:
    old = {"a": [1, 2]}
    apply_patch(old, diff_views(old, {"a": [1]}))
    assert old == {"a": [1, 2]}


def test_a_patch_for_another_document_is_refused() -> None:
    with pytest.raises(PatchError):
        apply_patch({"a": 1}, [{"op": "replace", "path": "/b", "value": 2}])
    with pytest.raises(PatchError):
        apply_patch([1], [{"op": "remove", "path": "/3"}])
