"""Where answers go: an address to `tell`, the `Done` message that carries a `Reply`.

Implements the house rule that messages carry data, never code (style-examples.md § For
our project, 3): a request names the address its answer goes to and a tag that says, as
data, what the answer is about. An actor's `ActorRef` is an address; so are the router's
loop (`server/_router.py`) and a `ReplyBox` that a thread outside the actors waits on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Address", "Done", "Reply", "ReplyBox"]


class Address(Protocol):
    """Anything a message can be told to without blocking (`pykka.ActorRef` is one)."""

    def tell(self, message: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """The result of a request: a value or the error it raised."""

    value: Any = None
    """What the work returned."""
    error: BaseException | None = None
    """What the work raised, if anything; whoever did the work keeps running."""

    def unwrap(self) -> Any:
        """Return the value or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True, slots=True)
class Done:
    """The answer to a request, told to the address the request named."""

    tag: Any
    """What the asker attached to its request, returned as it was: data that says what
    the answer is about (a runner epoch, a pending request), never a callable."""
    reply: Reply


class ReplyBox:
    """An address for a thread outside the actors: keeps the first `Done`, and `wait`s.

    **Blocking:** `wait` blocks its caller up to `timeout` seconds; `tell` never blocks.
    An actor never waits on a box (it would block its mailbox).
    """

    def __init__(self) -> None:
        self._done = threading.Event()
        self._reply: Reply | None = None

    def tell(self, message: Any) -> None:
        if self._reply is None:
            self._reply = message.reply if isinstance(message, Done) else Reply(message)
            self._done.set()

    def wait(self, timeout: float) -> Any:
        """The answer's value (or its error, raised).

        Raises:
            TimeoutError: no answer within `timeout` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"no reply within {timeout} s")
        assert self._reply is not None
        return self._reply.unwrap()
