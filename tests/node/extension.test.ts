/**
 * The Pi extension's pure parts: `/workflow` argument parsing, the widget and status
 * text (copied from the server's `display`, never derived), the state folder rule, and
 * `runPatch` application (cross-checked against Python's `diff_views` by
 * tests/pi/test_extension_typescript.py through tests/node/patch_apply.ts).
 */

import assert from "node:assert/strict";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { NoServerError, ServerClient } from "../../pi_workflows/pi/extension/client.ts";
import { parseWorkflowArgs } from "../../pi_workflows/pi/extension/commands.ts";
import { boundedReply, entryMessageId, finalReplyText, MESSAGE_TYPE, messageText, stopReasonOf } from "../../pi_workflows/pi/extension/coordinator.ts";
import { callIdentity, presentedStep } from "../../pi_workflows/pi/extension/tool.ts";
import { socketPathFor, stateDir } from "../../pi_workflows/pi/extension/locate.ts";
import { applyPatch, PatchError } from "../../pi_workflows/pi/extension/patch.ts";
import { displayOf, listReport, PI_COMMANDS, REASON_LINES, statusReport, statusText, widgetText } from "../../pi_workflows/pi/extension/render.ts";

test("start takes a name and optional JSON input", () => {
  assert.deepEqual(parseWorkflowArgs("start hello"), { kind: "start", workflow: "hello", input: {} });
  assert.deepEqual(parseWorkflowArgs('  start   hello   {"name": "Ada", "n": [1, 2]} '), {
    kind: "start",
    workflow: "hello",
    input: { name: "Ada", n: [1, 2] },
  });
  assert.deepEqual(parseWorkflowArgs("start hello null"), { kind: "start", workflow: "hello", input: null });
  assert.equal(parseWorkflowArgs("start").kind, "error");
});

test("bad JSON and values without a canonical form are refused", () => {
  const bad = parseWorkflowArgs("start hello {name: 1}");
  assert.equal(bad.kind, "error");
  assert.match((bad as { message: string }).message, /not valid JSON/);
  const huge = parseWorkflowArgs("start hello 1e400");
  assert.match((huge as { message: string }).message, /no JSON form/);
  assert.match((parseWorkflowArgs("answer {x") as { message: string }).message, /answer is not valid JSON/);
});

test("run commands take an optional run ID; answer takes one before its JSON", () => {
  assert.deepEqual(parseWorkflowArgs("status"), { kind: "status", runId: null });
  assert.deepEqual(parseWorkflowArgs("pause run-ab12"), { kind: "pause", runId: "run-ab12" });
  assert.equal(parseWorkflowArgs("cancel not-a-run").kind, "error");
  assert.equal(parseWorkflowArgs("resume run-1 run-2").kind, "error");
  assert.deepEqual(parseWorkflowArgs('answer {"approved": true}'), { kind: "answer", runId: null, answer: { approved: true } });
  assert.deepEqual(parseWorkflowArgs("answer run-9 false"), { kind: "answer", runId: "run-9", answer: false });
  assert.equal(parseWorkflowArgs("answer").kind, "error");
  assert.equal(parseWorkflowArgs("list extra").kind, "error");
  assert.equal(parseWorkflowArgs("").kind, "help");
  assert.equal(parseWorkflowArgs("nope").kind, "error");
});

test("followup takes an optional run ID, then free text", () => {
  assert.deepEqual(parseWorkflowArgs("followup Now write the changelog."), {
    kind: "followup",
    runId: null,
    text: "Now write the changelog.",
  });
  assert.deepEqual(parseWorkflowArgs("followup run-7 Then tag it"), { kind: "followup", runId: "run-7", text: "Then tag it" });
  assert.equal(parseWorkflowArgs("followup").kind, "error");
  assert.equal(parseWorkflowArgs("followup run-7").kind, "error");
});

const view = {
  runId: "run-1",
  workflow: "review",
  revision: 12,
  status: "running", // the stored status is NOT what is shown; display is
  display: {
    status: "waiting",
    activity: null,
    controls: ["answer", "pause", "cancel"],
    waitingOn: "review/approve",
    question: "Ship it?",
    reasonText: "needs a human\nmore",
    action: "Answer the checkpoint, or cancel the run.",
    next: ["answer", "cancel"],
  },
};

test("the widget and status line copy the server's display, its advice as /workflow commands", () => {
  // Status, place, what to do and its commands first (the first scroll window), then the reason.
  assert.deepEqual(widgetText(view), [
    "workflow review run-1: waiting",
    "waiting on: review/approve",
    "question: Ship it?",
    "what to do: Answer the checkpoint, or cancel the run.",
    "  /workflow answer run-1 JSON",
    "  /workflow cancel run-1",
    "  (JSON: the answer, as the checkpoint asks)",
    "allowed now:",
    "  /workflow pause run-1",
    "reason: needs a human",
    "  more",
  ]);
  assert.equal(statusText(view), "workflow review: waiting (review/approve)");
  assert.equal(widgetText({ runId: "run-1" }), undefined, "no display, no widget");
  assert.equal(widgetText(null), undefined, "a session view with no run shows nothing");
  assert.match(statusReport(view), /^run-1 {2}waiting {2}review\n/);
  assert.match(statusReport(view), /\n {2}\/workflow answer run-1 JSON\n/);
  assert.match(statusReport(view), /revision 12$/);
  assert.equal(listReport([view], true), "run-1  waiting  review  at review/approve\n… older runs: pi-workflows run list");
  assert.match(listReport([], false), /No workflow runs yet/);
});

test("the widget's reason is bounded, and a display without one shows no reason line", () => {
  const long = { ...view, display: { status: "failed", controls: ["restart"], action: "see the log", next: ["show", "restart"], reasonText: Array.from({ length: 60 }, (_, i) => `line ${i}`).join("\n") } };
  const lines = widgetText(long)!;
  assert.deepEqual(lines.slice(0, 5), ["workflow review run-1: failed", "what to do: see the log", "  /workflow status run-1", "  /workflow restart run-1", "reason: line 0"]);
  assert.equal(lines.length, 4 + REASON_LINES + 1);
  assert.equal(lines.at(-1), `  … ${60 - REASON_LINES} more lines: /workflow status`);
  const running = { runId: "run-2", workflow: "ask", display: { status: "running", controls: ["pause", "cancel"], currentNode: "ask" } };
  assert.deepEqual(widgetText(running), ["workflow ask run-2: running", "at node: ask", "allowed now:", "  /workflow pause run-2", "  /workflow cancel run-2"]);
});

test("advice names only /workflow commands; what Pi cannot do, and internal names, are not shown", () => {
  const ambiguous = {
    runId: "run-3",
    workflow: "pay",
    display: {
      status: "ambiguous",
      controls: ["recoverConfirm", "recoverRetry", "cancel"],
      action: "Check the external system, then confirm that the effect happened or retry it, or cancel the run.",
      next: ["recoverConfirm", "recoverRetry", "cancel"],
      reasonText: "An external effect may have been applied without a receipt.",
    },
  };
  const shown = widgetText(ambiguous)!.join("\n");
  assert.match(shown, /\/workflow cancel run-3/);
  assert.doesNotMatch(shown, /recover|Confirm|Retry|pi-workflows/, "no recovery in Pi, no internal name");
  const parked = { runId: "run-4", workflow: "w", display: { status: "queued", parked: true, controls: ["resume", "pause", "cancel"], next: ["logs", "resume", "cancel"], action: "Read the run's log.", waitingOn: "b" } };
  assert.deepEqual(widgetText(parked)!.slice(0, 5), ["workflow w run-4: queued (parked)", "waiting on: b", "what to do: Read the run's log.", "  /workflow resume run-4", "  /workflow cancel run-4"]);
  const decision = { runId: "run-5", workflow: "d", display: { status: "waiting", controls: ["human-answer", "pause", "cancel"], next: ["human-answer", "cancel"], action: "A person answers.", choices: [{ id: "approve", label: "Approve" }] } };
  assert.ok(widgetText(decision)!.includes('  /workflow answer run-5 {"choice":"approve"}'));
  for (const step of Object.keys(PI_COMMANDS)) {
    const command = PI_COMMANDS[step]!("run-6", displayOf({ display: { status: "waiting", controls: [] } })!);
    assert.equal(parseWorkflowArgs(command.replace(/^\/workflow /, "").replace(" JSON", " {}")).kind === "error", false, command);
  }
});

test("a failed run's /workflow status shows the failed attempt's error and traceback", () => {
  const failed = {
    runId: "run-7",
    workflow: "boom",
    display: { status: "failed", controls: ["restart"], next: ["show", "restart"], action: "Fix it.", reasonText: "nodeFailed: b: RuntimeError: no" },
    trace: { items: [{ node: "b", visit: 1, attempt: 1, outcome: "failed", error: "RuntimeError: no", traceback: { text: "Traceback (most recent call last):\n  File x\nRuntimeError: no\n" } }] },
  };
  const report = statusReport(failed);
  assert.match(report, /failed attempt: b \(visit 1, attempt 1\)\nerror: RuntimeError: no\ntraceback:\n {2}Traceback/);
});

test("restart takes an optional run ID", () => {
  assert.deepEqual(parseWorkflowArgs("restart"), { kind: "restart", runId: null });
  assert.deepEqual(parseWorkflowArgs("restart run-ab12"), { kind: "restart", runId: "run-ab12" });
  assert.equal(parseWorkflowArgs("restart nope").kind, "error");
});

test("the state folder: PI_WORKFLOWS_STATE_DIR, else <agent dir>/workflows", () => {
  assert.equal(stateDir({ PI_WORKFLOWS_STATE_DIR: "/s" }), "/s");
  assert.equal(stateDir({ PI_CODING_AGENT_DIR: "/a", PI_WORKFLOWS_STATE_DIR: " " }), "/a/workflows");
  assert.equal(stateDir({}), join(homedir(), ".pi", "agent", "workflows"));
  assert.equal(stateDir({ PI_CODING_AGENT_DIR: "~/x" }), join(homedir(), "x", "workflows"));
  assert.equal(socketPathFor("/s"), "/s/host/host.sock");
});

test("a patch leaves its input unchanged and refuses a path the view lacks", () => {
  const before = { a: [1, 2], b: { c: 1 } };
  const after = applyPatch(before, [
    { op: "add", path: "/a/-", value: 3 },
    { op: "replace", path: "/b/c", value: 2 },
    { op: "add", path: "/__proto__", value: 1 },
  ]);
  assert.deepEqual(before, { a: [1, 2], b: { c: 1 } });
  assert.deepEqual(Object.keys(after as object), ["a", "b", "__proto__"]);
  assert.throws(() => applyPatch(before, [{ op: "replace", path: "/missing", value: 1 }]), PatchError);
  assert.throws(() => applyPatch(before, [{ op: "remove", path: "/a/5" }]), PatchError);
  assert.throws(() => applyPatch(before, [{ op: "remove", path: "" }]), PatchError);
});

test("a command with no server behind the socket fails at once, saying how to start one", async () => {
  const client = new ServerClient(join(tmpdir(), `piw-no-server-${process.pid}.sock`), "extension-test");
  const started = Date.now();
  await assert.rejects(client.call("run.list", { limit: 1 }), NoServerError);
  await assert.rejects(client.call("run.list"), /Start it with `pi-workflows server start`/);
  assert.ok(Date.now() - started < 5000, "two attempts, no long back-off");
  const one = client.request("run.pause", {}, { runId: "run-1" });
  const two = client.request("run.pause", {}, { runId: "run-1" });
  assert.notEqual(one.idempotencyKey, two.idempotencyKey, "each user command is its own durable request");
  assert.equal(one.runId, "run-1");
});

test("clear takes no arguments", () => {
  assert.deepEqual(parseWorkflowArgs("clear"), { kind: "clear" });
  assert.equal(parseWorkflowArgs("clear now").kind, "error");
});

test("a turn's end is derived from its assistant messages", () => {
  assert.equal(stopReasonOf([{ role: "user" }, { role: "assistant", stopReason: "toolUse" }, { role: "assistant", stopReason: "stop" }]), "completed");
  assert.equal(stopReasonOf([{ role: "assistant", stopReason: "stop" }, { role: "assistant", stopReason: "aborted" }]), "aborted");
  assert.equal(stopReasonOf([{ role: "assistant", stopReason: "error" }, { role: "toolResult" }]), "error");
  assert.equal(stopReasonOf([{ role: "custom" }]), "error");
});

test("a workflow message's text is its prompt; a reminder names its contract", () => {
  assert.equal(messageText("step", { prompt: "Do it", contract: { step: "ask", attempt: "a-1" } }), "Do it");
  assert.match(messageText("step", { prompt: "Still waiting", contract: { step: "ask", attempt: "a-1" }, reminder: 1 }), /step "ask", attempt "a-1"/);
  assert.equal(messageText("notification", { text: "Deployed" }), "Deployed");
  assert.match(messageText("terminal", { runId: "run-1", workflow: "ask", outcome: "failed", reason: "boom" }), /^Workflow ask \(run-1\) finished: failed\.\nReason: boom/);
  assert.match(messageText("follow_up", { other: 1 }), /^Workflow follow_up message:/);
});

test("the tool finds the presented step from the branch's hidden entry details", () => {
  const entry = (id: string, details: object) => ({ type: "custom_message", id, customType: MESSAGE_TYPE, details });
  const branch = [
    entry("e1", { messageId: "m1", kind: "step", step: "ask", attempt: "a-1", sourceId: "request-a-1", runId: "run-1" }),
    { type: "custom_message", id: "e2", customType: "other", details: { messageId: "m2", kind: "step", step: "ask", attempt: "a-2", sourceId: "x", runId: "y" } },
    entry("e3", { messageId: "m3", kind: "notification", sourceId: "n", runId: "run-1" }),
  ];
  assert.deepEqual(presentedStep(branch, "ask", "a-1"), { requestId: "request-a-1", runId: "run-1" });
  assert.equal(presentedStep(branch, "ask", "a-2"), null, "only the extension's own entries count");
  assert.equal(entryMessageId(branch[2]!), "m3");
  const one = callIdentity("request-a-1", "call-1");
  assert.deepEqual(callIdentity("request-a-1", "call-1"), one, "the same call, the same durable identity");
  assert.notEqual(callIdentity("request-a-1", "call-2").idempotencyKey, one.idempotencyKey);
  assert.match(one.submissionId, /^submission-[0-9a-f]{32}$/);
});

test("an assistant-message step's reply is the last assistant text of the turn, never thinking or tool calls", () => {
  const turn = [
    { role: "user", content: [{ type: "text", text: "Plan it" }] },
    { role: "assistant", content: [{ type: "text", text: "Let me look." }, { type: "toolCall", name: "read" }], stopReason: "toolUse" },
    { role: "toolResult", content: [{ type: "text", text: "file contents" }] },
    { role: "assistant", content: [{ type: "thinking", thinking: "hidden" }, { type: "text", text: "Ship it " }, { type: "text", text: "on Friday." }], stopReason: "stop" },
  ];
  assert.equal(finalReplyText(turn), "Ship it on Friday.");
  assert.equal(finalReplyText([...turn, { role: "assistant", content: [{ type: "thinking", thinking: "x" }], stopReason: "stop" }]), "Ship it on Friday.");
  assert.equal(finalReplyText([{ role: "assistant", content: "plain" }]), "plain");
  assert.equal(finalReplyText([{ role: "assistant", content: [{ type: "text", text: "  " }] }]), null);
  assert.equal(finalReplyText([{ role: "user", content: "hi" }]), null);
});

test("a reply over the frame budget is cut at a character boundary and says so", () => {
  assert.deepEqual(boundedReply("short", 100), { text: "short", cut: false });
  const cut = boundedReply("é".repeat(100), 42); // 2 bytes each, plus the quotes
  assert.equal(cut.cut, true);
  assert.equal(cut.text, "é".repeat(20));
  const pairs = boundedReply("😀".repeat(10), 11); // never half a surrogate pair
  assert.equal(pairs.text, "😀".repeat(2));
});
