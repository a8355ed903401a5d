# ruff: noqa: N999 - workflow files are loaded by path; the stem is the command name
"""summarise: one headless agent step that summarises one file (the `summaries` example).

The input names the file and the SHA-256 digest of the content the manager saw. The
prompt carries the file's text (its first MAX_BYTES bytes), so the model needs no
tools; the run's output is the step's `{"summary": ...}`.
"""

from pathlib import Path
from typing import Any

from pi_workflows import agent, define_workflow

MAX_BYTES = 32_000
"""How much of a file goes into the prompt: a summary of a long file reads its start."""


def prompt(ctx: Any) -> str:
    # Called when the step starts; the prompt is never stored, only sent to the model.
    path = Path(ctx.input["path"])
    with path.open("rb") as file:
        text = file.read(MAX_BYTES).decode("utf-8", errors="replace")
    return (
        f"Summarise the file {path.name} in one or two sentences for someone deciding "
        f"whether to read it. Its text follows between the markers.\n"
        f"<<<\n{text}\n>>>"
    )


workflow = define_workflow(
    name="summarise",
    title=lambda ctx: f"summarise {Path(ctx.input['path']).name}",
    start_at="summarise",
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        },
        "required": ["path", "digest"],
        "additionalProperties": False,
    },
    nodes={
        "summarise": agent(
            prompt=prompt,
            output_schema={
                "type": "object",
                "properties": {"summary": {"type": "string", "minLength": 1, "maxLength": 600}},
                "required": ["summary"],
                "additionalProperties": False,
            },
            tools=[],  # the text is in the prompt: the model only submits
            timeout=300,
        ),
    },
)
