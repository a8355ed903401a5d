"""The public surface: the authoring names at the package root and the engine's `__all__`."""

from __future__ import annotations

import importlib
import pkgutil

import pi_workflows
import pi_workflows.engine as engine

AUTHORING = {
    "action",
    "agent",
    "checkpoint",
    "compute",
    "define_workflow",
    "include_workflow",
    "notify",
    "shell",
}


def test_root_exports_the_authoring_api() -> None:
    assert set(pi_workflows.__all__) >= AUTHORING
    for name in AUTHORING:
        assert getattr(pi_workflows, name) is getattr(engine, name)


def test_engine_exports_resolve() -> None:
    assert engine.__all__ == sorted(engine.__all__, key=lambda n: (not n.isupper(), n))
    for name in engine.__all__:
        assert hasattr(engine, name), name
    assert "_" not in {n[0] for n in engine.__all__}


def test_implementation_modules_are_private_and_declare_all() -> None:
    for info in pkgutil.iter_modules(engine.__path__):
        if info.name == "builtins":
            continue
        assert info.name.startswith("_") or info.name in (
            "channel_adapter",
            "resolve",
            "runner",
            "resource_runner",
            "validate",
        ), info.name
        module = importlib.import_module(f"pi_workflows.engine.{info.name}")
        assert isinstance(getattr(module, "__all__", None), list), info.name
        doc = module.__doc__ or ""
        assert 2 <= len(doc.strip().splitlines()) <= 5, info.name
