"""Test and demonstration helpers that ship with the package.

`FakeProvider` is a scripted model provider on 127.0.0.1 for the real `pi` binary;
`make demo`, the benchmarks and the tests run agent steps against it. `FakeTelegram`
is a scripted Telegram Bot API on 127.0.0.1 for the channel adapter child.
`perform_with_calls` lets a test run its own `CallUnit` on the database actor.
"""

from pi_workflows.testing._fake_provider import (
    FAKE_API_KEY,
    FAKE_MODEL,
    FAKE_PROVIDER,
    FakeProvider,
    ProviderError,
    RecordedRequest,
    ScriptedReply,
    ScriptedTurn,
    Stall,
    ToolCall,
    Turn,
    bash_turn,
    text_turn,
    workflow_submit_turn,
    workflow_update_turn,
)
from pi_workflows.testing._fake_telegram import (
    FAKE_BOT_TOKEN,
    FAKE_CHAT_ID,
    BotApiError,
    DropConnection,
    FakeTelegram,
    Hang,
    RecordedCall,
    TelegramMessage,
)
from pi_workflows.testing._units import CallUnit, perform_with_calls

__all__ = [
    "FAKE_API_KEY",
    "FAKE_BOT_TOKEN",
    "FAKE_CHAT_ID",
    "FAKE_MODEL",
    "FAKE_PROVIDER",
    "BotApiError",
    "CallUnit",
    "DropConnection",
    "FakeProvider",
    "FakeTelegram",
    "Hang",
    "ProviderError",
    "RecordedCall",
    "RecordedRequest",
    "ScriptedReply",
    "ScriptedTurn",
    "Stall",
    "TelegramMessage",
    "ToolCall",
    "Turn",
    "bash_turn",
    "perform_with_calls",
    "text_turn",
    "workflow_submit_turn",
    "workflow_update_turn",
]
