# ruff: noqa: N999 - workflow files are loaded by path; the stem is the command name
"""hello: a three-step example workflow (compute → compute → compute).

Start it with input `{"name": "Ada"}` (or no input); it greets, shouts and counts.
"""

from typing import Any

from pi_workflows import compute, define_workflow


def normalise(value: Any) -> dict[str, Any]:
    return {"name": (value or {}).get("name", "world")}


def greet(ctx: Any) -> dict[str, Any]:
    return {"greeting": f"Hello, {ctx.input['name']}!"}


def shout(ctx: Any) -> dict[str, Any]:
    return {"greeting": ctx.outputs["greet"]["greeting"].upper()}


def count(ctx: Any) -> dict[str, Any]:
    text = ctx.outputs["shout"]["greeting"]
    return {"greeting": text, "letters": sum(ch.isalpha() for ch in text)}


workflow = define_workflow(
    name="hello",
    title=lambda ctx: f"hello {ctx.input['name']}",
    start_at="greet",
    input_schema={
        "type": ["object", "null"],
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 100}},
        "additionalProperties": False,
    },
    input=normalise,
    nodes={
        "greet": compute(greet),
        "shout": compute(shout),
        "count": compute(count),
    },
    edges=[
        {"from": "greet", "to": "shout"},
        {"from": "shout", "to": "count"},
    ],
)
