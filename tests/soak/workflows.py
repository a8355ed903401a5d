"""The workflows the random-kill soak runs, as workflow-file sources.

Each name maps to the source of `<project>/.pi/workflows/NAME.workflow.py`. The soak
passes every run `{"ledger": ABS PATH, "nap": SECONDS, "n": INT}` as input.

The ledger effect appends `<idempotency key> <run ID> <kind>` to the ledger file with one
`O_APPEND` write (atomic against SIGKILL), with a nap before it (a kill there leaves the
effect not applied) and after it (a kill there leaves it applied but not settled). Its
`read_back` proves the outcome from the ledger; the `noproof` variant has none, so a
kill inside `apply` makes the run `ambiguous`.
"""

from __future__ import annotations

CHAIN = """
import time

from pi_workflows import compute, define_workflow


def _step(name):
    def run(ctx):
        time.sleep(ctx.input["nap"])
        return {"node": name, "n": ctx.input["n"] + len(ctx.outputs)}

    return run


workflow = define_workflow(
    name="soak-chain",
    start_at="a",
    nodes={name: compute(_step(name)) for name in ("a", "b", "c", "d")},
    edges=[{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "d"}],
)
"""

_LEDGER_EFFECT = """
import os
import time

from pi_workflows import action, checkpoint, compute, define_workflow, shell
from pi_workflows.engine import NOT_APPLIED


def _append(key, request):
    time.sleep(request["nap"])
    fd = os.open(request["ledger"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{key} {request['run']} {request['kind']}\\n".encode())
    finally:
        os.close(fd)
    time.sleep(request["nap"])
    return {"appended": key}


def _read_back(key, request):
    try:
        with open(request["ledger"], encoding="utf-8") as ledger:
            for line in ledger:
                if line.split(" ", 1)[0] == key:
                    return {"appended": key}
    except FileNotFoundError:
        pass
    return NOT_APPLIED


def _charge(kind, proven):
    def run(ctx):
        request = {
            "ledger": ctx.input["ledger"],
            "run": ctx.run_id,
            "kind": kind,
            "nap": ctx.input["nap"],
        }
        return ctx.effect(
            "ledger.append", request, apply=_append, read_back=_read_back if proven else None
        )

    return run


def _pause(ctx):
    time.sleep(ctx.input["nap"])
    return {"n": ctx.input["n"]}
"""

LEDGER_PROVEN = (
    _LEDGER_EFFECT
    + """
workflow = define_workflow(
    name="soak-ledger",
    start_at="prep",
    nodes={"prep": compute(_pause), "charge": action(_charge("proven", True)),
           "after": compute(_pause)},
    edges=[{"from": "prep", "to": "charge"}, {"from": "charge", "to": "after"}],
)
"""
)

LEDGER_UNPROVEN = (
    _LEDGER_EFFECT
    + """
workflow = define_workflow(
    name="soak-noproof",
    start_at="prep",
    nodes={"prep": compute(_pause), "charge": action(_charge("unproven", False)),
           "after": compute(_pause)},
    edges=[{"from": "prep", "to": "charge"}, {"from": "charge", "to": "after"}],
)
"""
)

SHELL = """
import time

from pi_workflows import compute, define_workflow, shell


def _check(ctx):
    out = ctx.outputs["cmd"]
    if out["exitCode"] != 0 or out["stdout"].strip() != "soak":
        raise RuntimeError(f"shell node went wrong: {out}")
    return {"ok": True}


workflow = define_workflow(
    name="soak-shell",
    start_at="prep",
    nodes={
        "prep": compute(lambda ctx: time.sleep(ctx.input["nap"]) or {"n": ctx.input["n"]}),
        "cmd": shell(lambda ctx: ["sh", "-c", "sleep 0.3; echo soak"], timeout=60),
        "check": compute(_check),
    },
    edges=[{"from": "prep", "to": "cmd"}, {"from": "cmd", "to": "check"}],
)
"""

GATE = (
    _LEDGER_EFFECT
    + """

def _use(ctx):
    if ctx.outputs["gate"].get("go") is not True:
        raise RuntimeError("the checkpoint answer did not reach the continuation")
    return {"answered": True}


workflow = define_workflow(
    name="soak-gate",
    start_at="prep",
    nodes={
        "prep": compute(_pause),
        "gate": checkpoint(summary="soak checkpoint"),
        "use": compute(_use),
        "pay": action(_charge("gate", True)),
    },
    edges=[{"from": "prep", "to": "gate"}, {"from": "gate", "to": "use"},
           {"from": "use", "to": "pay"}],
)
"""
)

DOOMED = """
import time

from pi_workflows import compute, define_workflow


def _boom(ctx):
    time.sleep(ctx.input["nap"])
    raise RuntimeError("soak-doomed fails by design")


workflow = define_workflow(
    name="soak-doomed",
    start_at="a",
    nodes={"a": compute(lambda ctx: time.sleep(ctx.input["nap"]) or {}), "boom": compute(_boom)},
    edges=[{"from": "a", "to": "boom"}],
)
"""

SOURCES: dict[str, str] = {
    "soak-chain": CHAIN,
    "soak-ledger": LEDGER_PROVEN,
    "soak-noproof": LEDGER_UNPROVEN,
    "soak-shell": SHELL,
    "soak-gate": GATE,
    "soak-doomed": DOOMED,
}

WEIGHTS: dict[str, int] = {
    "soak-chain": 3,
    "soak-ledger": 3,
    "soak-noproof": 2,
    "soak-shell": 2,
    "soak-gate": 2,
    "soak-doomed": 1,
}
"""How often each workflow is started."""

MAY_BE_AMBIGUOUS = frozenset({"soak-noproof", "soak-shell"})
"""Workflows with an effect that has no read-back (the shell command is one, too)."""

FAILS_BY_DESIGN = frozenset({"soak-doomed"})
"""Workflows whose runs end `failed` (`nodeFailed`) when they are not cancelled."""
