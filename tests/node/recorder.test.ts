/**
 * The extension's session record of one turn (`recorder.ts`): Pi events become session
 * events, deltas coalesce until they are sent, a batch holds until it is acknowledged and
 * a resend is identical, a `messageEnd` waits for Pi's entry, and nothing exceeds a frame.
 * The server's side (storage, pages, replay) is tests/server/test_session_record.py.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { BranchEntry } from "../../pi_workflows/pi/extension/coordinator.ts";
import {
  ENTRY_WAIT_MS,
  MAX_BATCH_EVENTS,
  MAX_DELTA_CHARS,
  MAX_EVENT_BYTES,
  recordingOn,
  sessionEventOf,
  TurnRecording,
} from "../../pi_workflows/pi/extension/recorder.ts";

const NO_BRANCH: BranchEntry[] = [];

test("Pi's events map to the session event types the server knows", () => {
  assert.deepEqual(sessionEventOf({ type: "message_start", message: { role: "assistant" } }), {
    type: "messageStart",
    fields: { role: "assistant" },
  });
  assert.deepEqual(
    sessionEventOf({ type: "message_update", assistantMessageEvent: { type: "text_delta", contentIndex: 1, delta: "Hi" } }),
    { type: "textDelta", fields: { contentIndex: 1, delta: "Hi" } },
  );
  assert.deepEqual(
    sessionEventOf({
      type: "message_update",
      assistantMessageEvent: { type: "toolcall_delta", contentIndex: 0, delta: '{"a"', partial: { content: [{ id: "call-1", name: "bash" }] } },
    }),
    { type: "toolCallDelta", fields: { contentIndex: 0, delta: '{"a"', toolCallId: "call-1", name: "bash" } },
  );
  assert.deepEqual(
    sessionEventOf({
      type: "message_update",
      assistantMessageEvent: { type: "toolcall_end", contentIndex: 0, toolCall: { id: "call-1", name: "bash", arguments: { command: "ls" } } },
    }),
    { type: "toolCallEnd", fields: { contentIndex: 0, toolCallId: "call-1", name: "bash", arguments: { command: "ls" } } },
  );
  assert.deepEqual(sessionEventOf({ type: "tool_execution_start", toolCallId: "call-1", toolName: "bash", args: { command: "ls" } }), {
    type: "toolStart",
    fields: { toolCallId: "call-1", name: "bash", arguments: { command: "ls" } },
  });
  assert.deepEqual(sessionEventOf({ type: "tool_execution_end", toolCallId: "call-1", toolName: "bash", result: { content: [] }, isError: true }), {
    type: "toolEnd",
    fields: { toolCallId: "call-1", isError: true, result: { content: [] } },
  });
  const message = { role: "assistant", stopReason: "stop", content: [] };
  assert.deepEqual(sessionEventOf({ type: "message_end", message }), {
    type: "messageEnd",
    fields: { role: "assistant", stopReason: "stop" },
    message,
  });
  assert.equal(sessionEventOf({ type: "message_update", assistantMessageEvent: { type: "text_start", contentIndex: 0 } }), null);
  assert.equal(sessionEventOf({ type: "turn_end" }), null);
});

test("recording is on unless the variable turns it off", () => {
  assert.equal(recordingOn({}), true);
  assert.equal(recordingOn({ PI_WORKFLOWS_SESSION_RECORD: "on" }), true);
  for (const off of ["off", "0", "false", "NO"]) assert.equal(recordingOn({ PI_WORKFLOWS_SESSION_RECORD: off }), false);
});

test("deltas of one block coalesce into one event; another block starts a new one", () => {
  const recording = new TurnRecording();
  recording.add("messageStart", { role: "assistant" });
  for (const delta of ["Hel", "lo", " there"]) recording.add("textDelta", { contentIndex: 0, delta });
  recording.add("textDelta", { contentIndex: 1, delta: "x" });
  recording.add("thinkingDelta", { contentIndex: 1, delta: "y" });
  const batch = recording.nextBatch(NO_BRANCH)!;
  assert.deepEqual(batch.events, [
    { seq: 0, type: "messageStart", role: "assistant" },
    { seq: 1, type: "textDelta", contentIndex: 0, delta: "Hello there" },
    { seq: 2, type: "textDelta", contentIndex: 1, delta: "x" },
    { seq: 3, type: "thinkingDelta", contentIndex: 1, delta: "y" },
  ]);
  assert.equal(batch.final, undefined);
});

test("a coalesced delta stays bounded", () => {
  const recording = new TurnRecording();
  const chunk = "a".repeat(1000);
  for (let index = 0; index < 20; index += 1) recording.add("textDelta", { contentIndex: 0, delta: chunk });
  const batch = recording.nextBatch(NO_BRANCH)!;
  assert.ok(batch.events.length > 1);
  for (const event of batch.events) assert.ok(String(event.delta).length <= MAX_DELTA_CHARS);
  assert.equal(batch.events.map((event) => String(event.delta)).join(""), chunk.repeat(20));
});

test("an event once sent never changes: a resend after a lost connection is identical", () => {
  const recording = new TurnRecording();
  recording.add("textDelta", { contentIndex: 0, delta: "one" });
  const first = recording.nextBatch(NO_BRANCH)!;
  assert.equal(recording.nextBatch(NO_BRANCH), null, "one batch in flight at a time");
  recording.add("textDelta", { contentIndex: 0, delta: "two" });
  recording.unsent();
  const again = recording.nextBatch(NO_BRANCH)!;
  assert.deepEqual(again.events[0], first.events[0]);
  assert.deepEqual(again.events[1], { seq: 1, type: "textDelta", contentIndex: 0, delta: "two" });
  recording.stored();
  assert.equal(recording.due, false);
});

test("the end of the turn sends the final count after every event", () => {
  const recording = new TurnRecording();
  recording.add("messageStart", { role: "assistant" });
  recording.add("textDelta", { contentIndex: 0, delta: "x" });
  recording.nextBatch(NO_BRANCH);
  recording.stored();
  recording.end();
  assert.equal(recording.due, true);
  assert.deepEqual(recording.nextBatch(NO_BRANCH), { events: [], final: { count: 2 } });
  recording.stored();
  assert.equal(recording.due, false);
  recording.add("textDelta", { contentIndex: 0, delta: "late" });
  assert.equal(recording.due, false, "nothing is recorded after the end");
});

test("a replaced turn ends its capture as failed", () => {
  const recording = new TurnRecording();
  recording.add("messageStart", { role: "assistant" });
  recording.end("turnReplaced");
  assert.deepEqual(recording.nextBatch(NO_BRANCH)!.final, { count: 1, failure: "turnReplaced" });
});

test("a messageEnd waits for Pi's entry, then names it and carries the message", () => {
  const recording = new TurnRecording();
  const message = { role: "assistant", content: [{ type: "text", text: "Hi" }], stopReason: "stop" };
  recording.add("messageStart", { role: "assistant" });
  recording.add("messageEnd", { role: "assistant", stopReason: "stop" }, message);
  recording.add("toolStart", { toolCallId: "c", name: "bash", arguments: null });
  const waiting = recording.nextBatch(NO_BRANCH)!;
  assert.deepEqual(waiting.events.map((event) => event.type), ["messageStart"], "the batch stops before it");
  recording.stored();
  const branch: BranchEntry[] = [{ type: "message", id: "entry-7", message } as BranchEntry];
  const batch = recording.nextBatch(branch)!;
  assert.deepEqual(batch.events[0], { seq: 1, type: "messageEnd", role: "assistant", stopReason: "stop", entryId: "entry-7", message });
  assert.equal(batch.events[1]!.type, "toolStart");
});

test("a messageEnd whose entry never appears goes without it", () => {
  const recording = new TurnRecording();
  recording.add("messageEnd", { role: "assistant" }, { role: "assistant", content: [] });
  const later = Date.now() + ENTRY_WAIT_MS + 1;
  const batch = recording.nextBatch(NO_BRANCH, later)!;
  assert.equal(batch.events[0]!.entryId, undefined);
  assert.deepEqual(batch.events[0]!.message, { role: "assistant", content: [] });
});

test("a workflow message's entry is found by its hidden message ID", () => {
  const recording = new TurnRecording();
  const message = { role: "custom", customType: "pi-workflows.message", details: { messageId: "msg-1" } };
  recording.add("messageEnd", { role: "custom" }, message);
  const branch = [{ type: "custom_message", id: "entry-3", customType: "pi-workflows.message", details: { messageId: "msg-1" } }];
  assert.equal(recording.nextBatch(branch)!.events[0]!.entryId, "entry-3");
});

test("an event too large for the server keeps only its IDs; batches stay within a frame", () => {
  const recording = new TurnRecording();
  const big = "z".repeat(MAX_EVENT_BYTES * 2);
  recording.add("toolEnd", { toolCallId: "c", isError: false, result: { content: [{ type: "text", text: big }] } });
  for (let index = 0; index < 40; index += 1) recording.add("toolStart", { toolCallId: `c${index}`, name: "bash", arguments: { data: "y".repeat(40_000) } });
  const first = recording.nextBatch(NO_BRANCH)!;
  const event = first.events[0]!;
  assert.equal(event.omitted, true);
  assert.equal(event.toolCallId, "c");
  assert.ok(Number(event.byteCount) > MAX_EVENT_BYTES);
  assert.equal(event.result, undefined);
  assert.ok(Buffer.byteLength(JSON.stringify(first.events)) < 1024 * 1024);
  assert.ok(first.events.length < 41, "the rest goes in the next batch");
});

test("a batch holds at most the server's limit of events", () => {
  const recording = new TurnRecording();
  for (let index = 0; index < MAX_BATCH_EVENTS + 10; index += 1) recording.add("toolStart", { toolCallId: `c${index}`, name: "n" });
  assert.equal(recording.nextBatch(NO_BRANCH)!.events.length, MAX_BATCH_EVENTS);
  recording.stored();
  assert.equal(recording.nextBatch(NO_BRANCH)!.events[0]!.seq, MAX_BATCH_EVENTS);
});

test("a Pi message with undefined fields is sent in its JSON form", () => {
  const recording = new TurnRecording();
  const message = { role: "assistant", content: [{ type: "text", text: "Hi", signature: undefined }], errorMessage: undefined };
  recording.add("messageEnd", { role: "assistant" }, message);
  const batch = recording.nextBatch([{ type: "message", id: "e1", message } as BranchEntry])!;
  assert.deepEqual(batch.events[0]!.message, { role: "assistant", content: [{ type: "text", text: "Hi" }] });
});

test("a delta longer than an event holds is split, whole, never inside a surrogate pair", () => {
  const recording = new TurnRecording();
  const text = "ab😀".repeat(MAX_DELTA_CHARS); // 4 UTF-16 units each
  recording.add("textDelta", { contentIndex: 0, delta: text });
  const batch = recording.nextBatch(NO_BRANCH)!;
  assert.ok(batch.events.length >= 4);
  for (const event of batch.events) {
    const delta = String(event.delta);
    assert.ok(delta.length <= MAX_DELTA_CHARS);
    assert.ok(!/[\ud800-\udbff]$/.test(delta), "no event ends inside a pair");
    assert.equal(event.omitted, undefined);
  }
  assert.equal(batch.events.map((event) => String(event.delta)).join(""), text);
});

test("a running turn's events are ripe after a wait or a full batch; an ended turn's at once", () => {
  const recording = new TurnRecording();
  assert.equal(recording.ripe(250), false, "nothing to send");
  recording.add("messageStart", { role: "assistant" });
  assert.equal(recording.ripe(250, Date.now()), false, "too fresh");
  assert.equal(recording.ripe(250, Date.now() + 300), true, "waited long enough");
  recording.end();
  assert.equal(recording.ripe(250, Date.now()), true, "the end sends at once");
});
