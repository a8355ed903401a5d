"""What every server actor shares: failures are reported, never silent.

Implements the house rule "no actor fails silently" (style-examples.md § For our
project, 4). pykka stops an actor whose `tell` handler raises and only logs it;
`on_failure` here tells the server, which shuts down cleanly and says why.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import pykka

__all__ = ["ActorFailureHandler", "Reply", "ServerActor", "tell_if_alive", "wait_reply"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ActorFailureHandler = Callable[[str, BaseException | None], None]
"""Called with the actor name and its exception when an actor dies unexpectedly."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The result of a request to an actor: a value or the error it raised."""

    value: Any = None
    """What the work returned."""
    error: BaseException | None = None
    """What the work raised, if anything; the actor itself keeps running."""

    def unwrap(self) -> Any:
        """Return the value or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value


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


def tell_if_alive(ref: pykka.ActorRef[Any], message: Any) -> None:
    """`tell`, dropping the message if the actor stopped: a reply that comes back during
    the server's stop must not fail the actor that delivers it (the database actor)."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


def wait_reply(send: Callable[[Callable[[Reply], None]], None], timeout: float) -> Any:
    """Send a request whose answer comes as a `Reply` callback, and wait for it.

    For threads outside the actor system (CLI-facing server code, tests); an actor
    never calls it, since it would block that actor.

    Raises:
        TimeoutError: no reply within `timeout` seconds.
    """
    done = threading.Event()
    box: list[Reply] = []

    def deliver(reply: Reply) -> None:
        box.append(reply)
        done.set()

    send(deliver)
    if not done.wait(timeout):
        raise TimeoutError(f"no reply within {timeout} s")
    return box[0].unwrap()
