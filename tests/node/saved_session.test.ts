/**
 * The extension's saved-session helpers (saved-session.ts) and `/workflow adopt`'s
 * parsing: an unsaved session is written to its own file by a real `SessionManager`
 * with its entries and the marker, which Pi keeps out of the model's context; the start
 * notice names the command that reopens the session. (The real pi runs this path in
 * tests/pi/test_stranded_run.py and tests/pi/test_handover.py.)
 */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { buildSessionContext, SessionManager } from "@mariozechner/pi-coding-agent";

import { parseWorkflowArgs, USAGE } from "../../pi_workflows/pi/extension/commands.ts";
import { carryEntries, MARKER_NOTE, reopenHint, savedMarker, sessionState, shellWord } from "../../pi_workflows/pi/extension/saved-session.ts";

test("adopt takes exactly one run ID, and the usage names it", () => {
  assert.deepEqual(parseWorkflowArgs("adopt run-1a2b"), { kind: "adopt", runId: "run-1a2b" });
  assert.equal(parseWorkflowArgs("adopt").kind, "error");
  assert.equal(parseWorkflowArgs("adopt run-1 run-2").kind, "error");
  assert.match(USAGE, /\/workflow adopt RUN_ID/);
});

test("an unsaved session is written to its file with its entries and the marker, which the model never sees", () => {
  const folder = mkdtempSync(join(tmpdir(), "piw-saved-"));
  try {
    const file = join(folder, "origin.jsonl");
    // The session Pi holds in memory: entries, but no assistant message, so no file.
    const live = SessionManager.open(file, folder, folder);
    live.appendModelChange("fake", "fake-model");
    live.appendCustomEntry("other-extension", { kept: true });
    live.appendCustomEntry("pi-workflows.run", { runId: "run-older" });
    live.appendMessage({ role: "user", content: [{ type: "text", text: "hello" }], timestamp: 1 });
    assert.equal(sessionState(file), "unsaved");
    assert.equal(sessionState(undefined), "ephemeral");

    const saved = SessionManager.open(file, folder, folder);
    carryEntries(saved, live.getBranch(), new Set(["pi-workflows.run"]));
    saved.appendMessage(savedMarker({ api: "openai-completions", provider: "fake", id: "fake-model" }, 7));
    assert.equal(sessionState(file), "saved", "Pi's SessionManager wrote the file");

    const lines = readFileSync(file, "utf8").trim().split("\n").map((line) => JSON.parse(line) as { [key: string]: unknown });
    assert.equal(lines[0]?.type, "session");
    assert.equal(lines[0]?.id, saved.getSessionId());
    assert.deepEqual(
      lines.slice(1).map((entry) => entry.type),
      ["model_change", "custom", "message", "message"],
      "the older run's entry does not follow",
    );
    const marker = (lines.at(-1) as { message: { role: string; stopReason: string; errorMessage: string } }).message;
    assert.deepEqual([marker.role, marker.stopReason, marker.errorMessage], ["assistant", "aborted", MARKER_NOTE]);

    // Reopened, the session's model context has the user's message only: an aborted
    // assistant message without content is no reply (pi-ai drops it from requests).
    const reopened = SessionManager.open(file, folder);
    assert.equal(reopened.getSessionId(), saved.getSessionId());
    const context = buildSessionContext(reopened.getEntries());
    const roles = context.messages.map((message) => message.role);
    assert.deepEqual(roles, ["user", "assistant"]);
    assert.equal((context.messages[1] as { stopReason?: string }).stopReason, "aborted");
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
});

test("the start notice names the exact command that reopens the session", () => {
  assert.equal(reopenHint("/home/me/s.jsonl", "run-1"), "If Pi exits, reopen this session with: pi --session /home/me/s.jsonl");
  assert.equal(shellWord("/tmp/a b/it's.jsonl"), "'/tmp/a b/it'\\''s.jsonl'");
  const busy = reopenHint("/s.jsonl", "run-1", false);
  assert.match(busy, /saves this session when the model's reply ends; then reopen it with: pi --session \/s\.jsonl/);
  assert.match(busy, /\/workflow adopt run-1/);
  const ephemeral = reopenHint(undefined, "run-1");
  assert.match(ephemeral, /not saved \(pi --no-session\)/);
  assert.match(ephemeral, /\/workflow adopt run-1/);
  assert.match(ephemeral, /pi-workflows run resume run-1 --headless/);
});
