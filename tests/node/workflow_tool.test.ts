/**
 * The bridge's `workflow` tool logic: the step contract checks, the request it builds
 * for a tool call (canonical, schema-valid, with a durable identity derived from the
 * call), the flat parameter schema, and how a server response becomes the tool result.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { dumps } from "../../pi_workflows/pi/common/canonical.ts";
import { CLIENT_SCHEMA, decodeClientMessage, type ResponseMessage } from "../../pi_workflows/pi/common/protocol.ts";
import { SocketTransport, UnconfiguredTransport, selectTransport } from "../../pi_workflows/pi/common/transport.ts";
import {
  BRIDGE_CONFIG_ENV,
  BRIDGE_CONFIG_SCHEMA,
  buildRequest,
  callIdentity,
  checkCall,
  loadBridgeConfig,
  requestFrame,
  toolParameters,
  toolResult,
  type BridgeConfig,
} from "../../pi_workflows/pi/bridge/workflow-tool.ts";

const config: BridgeConfig = {
  schema: BRIDGE_CONFIG_SCHEMA,
  runId: "run-1",
  interactionId: "request-abc",
  step: "plan",
  attempt: "attempt-1",
  clientId: "bridge-1",
  outputSchema: { type: "object", properties: { summary: { type: "string" } }, required: ["summary"] },
  socketPath: null,
};

function response(outcome: ResponseMessage["outcome"], message?: string): ResponseMessage {
  const base: ResponseMessage = { schema: CLIENT_SCHEMA, type: "response", requestId: "r", outcome };
  return message === undefined ? base : { ...base, error: { code: "invalidOutput", message } };
}

test("a submit call becomes a canonical, schema-valid interaction.submit request", () => {
  const request = buildRequest(config, "call_1", { action: "submit", step: "plan", attempt: "attempt-1", output: { summary: "é ok" } });
  const frame = requestFrame(request);
  const decoded = decodeClientMessage(frame);
  assert.deepEqual(decoded, request);
  assert.equal(request.operation, "interaction.submit");
  assert.equal(request.runId, "run-1");
  assert.deepEqual(request.payload, {
    interactionId: "request-abc",
    submissionId: callIdentity(config, "call_1").submissionId,
    value: { summary: "é ok" },
  });
});

test("the same tool call keeps its idempotency key and submission id; another call does not", () => {
  const first = buildRequest(config, "call_1", { action: "submit", step: "plan", attempt: "attempt-1", output: 1 });
  const retry = buildRequest(config, "call_1", { action: "submit", step: "plan", attempt: "attempt-1", output: 1 });
  const other = buildRequest(config, "call_2", { action: "submit", step: "plan", attempt: "attempt-1", output: 1 });
  assert.notEqual(first.requestId, retry.requestId, "a request id names one transport attempt");
  assert.equal(first.idempotencyKey, retry.idempotencyKey);
  assert.deepEqual(first.payload, retry.payload);
  assert.notEqual(first.idempotencyKey, other.idempotencyKey);
  assert.notEqual(first.payload.submissionId, other.payload.submissionId);
  assert.ok(first.idempotencyKey.length <= 256);
});

test("an update call becomes interaction.update with the update record", () => {
  const update = { type: "progress", key: "main", data: { completed: 1, total: 2, unit: "files" } };
  const request = buildRequest(config, "call_9", { action: "update", step: "plan", attempt: "attempt-1", update });
  assert.equal(request.operation, "interaction.update");
  assert.deepEqual(request.payload, { interactionId: "request-abc", update });
  decodeClientMessage(requestFrame(request));
});

test("the step contract checks name what is wrong", () => {
  assert.throws(() => checkCall(null, { action: "submit" }), /No workflow step is pending/);
  assert.throws(() => checkCall(config, { action: "list" }), /action must be/);
  assert.throws(() => checkCall(config, { action: "submit", step: "other", attempt: "attempt-1", output: 1 }), /Wrong step id/);
  assert.throws(() => checkCall(config, { action: "submit", step: "plan", attempt: "attempt-0", output: 1 }), /Stale attempt id/);
  assert.throws(() => checkCall(config, { action: "submit", step: "plan", attempt: "attempt-1" }), /needs an output/);
  assert.equal(checkCall(config, { action: "submit", step: "plan", attempt: "attempt-1", output: null }), config);
});

test("the parameters are one flat object whose output is the step's schema", () => {
  const parameters = toolParameters(config) as { [key: string]: any };
  assert.equal(parameters.type, "object");
  assert.deepEqual(parameters.required, ["action"]);
  assert.equal(parameters.additionalProperties, false);
  assert.ok(!("anyOf" in parameters) && !("oneOf" in parameters));
  assert.deepEqual(parameters.properties.output.required, ["summary"]);
  assert.deepEqual(parameters.properties.action.enum, ["submit", "update"]);
  assert.deepEqual(Object.keys(toolParameters(null)["properties"] as object).sort(), ["action", "attempt", "output", "step", "update"]);
});

test("acceptance ends the turn; rejection is thrown with the stored actionable error", () => {
  const accepted = toolResult(config, "submit", response("accepted"));
  assert.equal(accepted.terminate, true);
  assert.match(accepted.content[0]!.text, /Output accepted for step plan/);
  assert.equal(toolResult(config, "submit", response("adopted")).terminate, true);
  assert.equal(toolResult(config, "update", response("accepted")).terminate, undefined);
  assert.throws(() => toolResult(config, "submit", response("rejected", "summary is required")), /Output rejected for step plan: summary is required/);
  assert.throws(() => toolResult(config, "submit", response("claimLost")), /no longer awaiting output/);
  assert.throws(() => toolResult(config, "submit", response("unavailable", "server stopping")), /did not take the submit \(unavailable\)/);
});

test("without a server socket every call fails, saying so, and an abort wins", async () => {
  const request = buildRequest(config, "call_1", { action: "submit", step: "plan", attempt: "attempt-1", output: [1, 2] });
  assert.ok(selectTransport(config) instanceof UnconfiguredTransport);
  assert.ok(selectTransport({ socketPath: "/nonexistent/host.sock" }) instanceof SocketTransport);
  await assert.rejects(selectTransport(config).exchange(request), /no server socket configured/);
  const aborted = new AbortController();
  aborted.abort();
  await assert.rejects(new UnconfiguredTransport().exchange(request, aborted.signal), /aborted/);
});

test("a socket that never answers is retried a bounded number of times, then named unreachable", async () => {
  const request = buildRequest(config, "call_1", { action: "submit", step: "plan", attempt: "attempt-1", output: 1 });
  const transport = new SocketTransport(join(tmpdir(), `piw-no-server-${process.pid}.sock`), { attempts: 3, firstDelayMs: 1, maxDelayMs: 2 });
  await assert.rejects(transport.exchange(request), /could not be reached after 3 attempts: connection failed \(ENOENT\)/);
});

test("the configuration file is canonical JSON; a bad one is refused without its content", () => {
  const folder = mkdtempSync(join(tmpdir(), "piw-bridge-"));
  try {
    const path = join(folder, "bridge.json");
    writeFileSync(path, dumps(config));
    assert.deepEqual(loadBridgeConfig({ [BRIDGE_CONFIG_ENV]: path }), config);
    assert.equal(loadBridgeConfig({}), null);
    writeFileSync(path, JSON.stringify(config, null, 1));
    assert.throws(() => loadBridgeConfig({ [BRIDGE_CONFIG_ENV]: path }), /not canonical JSON/);
    writeFileSync(path, dumps({ ...config, step: "" }));
    assert.throws(() => loadBridgeConfig({ [BRIDGE_CONFIG_ENV]: path }), /has no step/);
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
});
