"""Units of work are named data: each record stands for one domain function by name.

The database and reader actors resolve a unit's kind to its function (`perform`); these
tests pin that every record's fields are exactly its function's keyword arguments, so a
unit reads as the call it stands for and a field can never be dropped on the way.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import pi_workflows.domain as domain
from pi_workflows.domain import _units
from pi_workflows.storage import open_database


def _unit_kinds() -> list[type[object]]:
    return [
        getattr(_units, name)
        for name in _units.__all__
        if isinstance(getattr(_units, name), type)
        and dataclasses.is_dataclass(getattr(_units, name))
    ]


def test_every_unit_record_is_registered_with_its_function() -> None:
    kinds = _unit_kinds()
    assert len(kinds) >= 30
    for kind in kinds:
        assert kind in _units._WORK, kind.__name__


@pytest.mark.parametrize("kind", _unit_kinds(), ids=lambda kind: kind.__name__)
def test_a_units_fields_are_its_functions_keyword_arguments(kind: type[object]) -> None:
    work, names = _units._WORK[kind]
    parameters = list(inspect.signature(work).parameters.values())
    assert parameters[0].name in ("db", "reader"), "the database comes first"
    accepted = {p.name for p in parameters[1:]}
    required = {p.name for p in parameters[1:] if p.default is inspect.Parameter.empty}
    assert set(names) <= accepted, f"{kind.__name__} passes what {work.__name__} does not take"
    assert required <= set(names), f"{kind.__name__} lacks what {work.__name__} needs"
    params = kind.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen, f"{kind.__name__} is a message: frozen data"


def test_a_unit_label_is_safe_to_log() -> None:
    assert domain.unit_label(domain.NextDeadline()) == "deadlines"
    assert domain.unit_label(domain.Barrier(3)) == "barrier"


def test_perform_refuses_what_is_not_a_unit(tmp_path: object) -> None:
    db = open_database(tmp_path / "state.sqlite")  # type: ignore[operator]
    try:
        with pytest.raises(TypeError, match="not a unit of work: str"):
            domain.perform(db, "SELECT 1")
        assert domain.perform(db, domain.Barrier(7)) == 7
    finally:
        db.close()
