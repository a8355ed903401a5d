"""Messages carry data, never code: no field of a message record holds a callable.

Every frozen dataclass an actor receives or sends (the actors' own messages, the process
supervisor's vocabulary, the child channels' frames and events, the units of work) is
checked: a continuation comes back as a message to the address that asked (`Done`),
and a unit of work is named data resolved by the actor that runs it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing

import pi_workflows.actors as actors
from pi_workflows import _address
from pi_workflows.domain import _units
from pi_workflows.supervision import _child_channels, _messages

MODULES = [
    *(
        importlib.import_module(f"pi_workflows.actors.{info.name}")
        for info in pkgutil.iter_modules(actors.__path__)
    ),
    _address,
    _messages,
    _child_channels,
    _units,
]


def _message_records() -> list[type[object]]:
    found: list[type[object]] = []
    for module in MODULES:
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ != module.__name__ or not dataclasses.is_dataclass(value):
                continue
            if value.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                found.append(value)
    return found


def test_no_message_field_holds_code() -> None:
    records = _message_records()
    assert len(records) > 60
    carrying_code = []
    for record in records:
        hints = typing.get_type_hints(record, vars(importlib.import_module(record.__module__)))
        for field in dataclasses.fields(record):  # type: ignore[arg-type]
            if "Callable" in str(hints.get(field.name, "")):
                carrying_code.append(f"{record.__module__}.{record.__name__}.{field.name}")
    assert carrying_code == []
