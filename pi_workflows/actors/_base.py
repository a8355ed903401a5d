"""What every server actor shares: failures are reported, never silent.

Implements the house rule "no actor fails silently" (style-examples.md § For our
project, 4). pykka stops an actor whose `tell` handler raises and only logs it;
`on_failure` here tells the server, which shuts down cleanly and says why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

import pykka

from pi_workflows._address import Address, Done, Reply, ReplyBox

__all__ = [
    "ActorFailureHandler",
    "Address",
    "Done",
    "Reply",
    "ServerActor",
    "answer",
    "wait_reply",
]

log = logging.getLogger(__name__)

ActorFailureHandler = Callable[[str, BaseException | None], None]
"""Called with the actor name and its exception when an actor dies unexpectedly."""


class ServerActor(pykka.ThreadingActor):
    """Base class: a named actor that reports its own death to the server."""

    name: str = "actor"

    def __init__(self, on_actor_failure: ActorFailureHandler) -> None:
        super().__init__()
        self._on_actor_failure = on_actor_failure

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Runs in the actor's thread after an unhandled error stopped it."""
        log.error(
            "actor stopped by an unexpected error",
            extra={"action": "actor.failed", "actor": self.name},
            exc_info=exception_value,
        )
        self._on_actor_failure(self.name, exception_value)


def answer(reply_to: Address | None, tag: Any, reply: Reply) -> None:
    """Tell `reply_to` the `Done` of a request, if anyone waits and is still there.

    A reply that comes back during the server's stop must not fail the actor that
    delivers it (a stopped asker's `ActorRef` raises `ActorDeadError`).
    """
    if reply_to is not None:
        with contextlib.suppress(pykka.ActorDeadError):
            reply_to.tell(Done(tag, reply))


def wait_reply(send: Callable[[Address], None], timeout: float) -> Any:
    """Send a request whose answer comes as a `Done` to the given address, and wait.

    For threads outside the actor system (the server's start and stop, resolver
    threads, tests); an actor never calls it, since it would block that actor.

    Raises:
        TimeoutError: no reply within `timeout` seconds.
    """
    box = ReplyBox()
    send(box)
    return box.wait(timeout)
