"""The Restate side of bench_peers.py: a service whose handler runs a chain of `ctx.run` steps.

`Chain/run` takes `{"nodes": N}` and runs N journaled steps, each adding one to its
predecessor's output, as the other systems' chains do. Served by hypercorn on the
address given (bench_peers.py passes 127.0.0.1 inside its network namespace):

    python benchmarks/_restate_service.py 127.0.0.1:9080

Only the `bench` extra installs restate-sdk and hypercorn.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import restate

chain = restate.Service("Chain")


def step(previous: dict[str, int] | None) -> dict[str, int]:
    return {"i": 1 if previous is None else previous["i"] + 1}


@chain.handler()
async def run(ctx: restate.Context, request: dict[str, Any]) -> dict[str, int] | None:
    output: dict[str, int] | None = None
    for k in range(int(request["nodes"])):
        output = await ctx.run_typed(f"n{k}", step, restate.RunOptions(), output)
    return output


app = restate.app([chain])


def main() -> None:
    import hypercorn.asyncio  # noqa: PLC0415
    import hypercorn.config  # noqa: PLC0415

    config = hypercorn.config.Config()
    config.bind = [sys.argv[1]]
    config.accesslog = None
    config.errorlog = "-"
    config.loglevel = "WARNING"
    asyncio.run(hypercorn.asyncio.serve(app, config))


if __name__ == "__main__":
    main()
