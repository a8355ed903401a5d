/**
 * The bridge's SocketTransport against the REAL workflow server. Not a `*.test.ts`:
 * tests/pi/test_bridge_typescript.py starts a `WorkflowServer` with one run whose agent
 * step has a pending request, then runs this file with node's test runner and the
 * step's identity in the environment (PIW_SOCKET, PIW_RUN_ID, PIW_INTERACTION_ID,
 * PIW_STEP, PIW_ATTEMPT). The tests run in order and share that one request.
 *
 * A relay between the transport and the server drops the first connection right after
 * the server's response arrives (it never reaches the bridge): a connection lost after
 * the commit, as client-protocol.md § Commands and uncertain results describes.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createConnection, createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { decodeClientMessage, type RequestMessage } from "../../pi_workflows/pi/common/protocol.ts";
import { AbortedError, SocketTransport } from "../../pi_workflows/pi/common/transport.ts";
import { BRIDGE_CONFIG_SCHEMA, buildRequest, toolResult, type BridgeConfig } from "../../pi_workflows/pi/bridge/workflow-tool.ts";

function required(name: string): string {
  const value = process.env[name];
  assert.ok(value, `${name} is set by tests/pi/test_bridge_typescript.py`);
  return value;
}

const config: BridgeConfig = {
  schema: BRIDGE_CONFIG_SCHEMA,
  runId: required("PIW_RUN_ID"),
  interactionId: required("PIW_INTERACTION_ID"),
  step: required("PIW_STEP"),
  attempt: required("PIW_ATTEMPT"),
  clientId: "bridge-transport-test",
  outputSchema: null,
  socketPath: required("PIW_SOCKET"),
};
const quickRetry = { attempts: 5, firstDelayMs: 20, maxDelayMs: 200 };

function submit(toolCallId: string, output: unknown): RequestMessage {
  return buildRequest(config, toolCallId, { action: "submit", step: config.step, attempt: config.attempt, output });
}

/** Frames split on newlines, decoded (every frame the relay sees must decode). */
function framesOf(onFrame: (body: Uint8Array) => void): (chunk: Buffer) => void {
  let buffer = Buffer.alloc(0);
  return (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    for (let end = buffer.indexOf(0x0a); end >= 0; end = buffer.indexOf(0x0a)) {
      onFrame(new Uint8Array(buffer.subarray(0, end)));
      buffer = buffer.subarray(end + 1);
    }
  };
}

interface Relay {
  path: string;
  requests: RequestMessage[];
  dropped: number;
  close(): Promise<void>;
}

/** A Unix-socket relay to the server that swallows the first response and drops that connection. */
async function relay(upstreamPath: string): Promise<Relay> {
  const folder = mkdtempSync(join(tmpdir(), "piw-relay-"));
  const path = join(folder, "relay.sock");
  const requests: RequestMessage[] = [];
  const sockets = new Set<Socket>();
  const state: Relay = {
    path,
    requests,
    dropped: 0,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(folder, { recursive: true, force: true });
    },
  };
  const server: Server = createServer((client) => {
    const upstream = createConnection({ path: upstreamPath });
    sockets.add(client).add(upstream);
    const drop = state.dropped === 0;
    client.on(
      "data",
      framesOf((body) => {
        const message = decodeClientMessage(body);
        if (message.type === "request") requests.push(message);
        upstream.write(Buffer.concat([Buffer.from(body), Buffer.from("\n")]));
      }),
    );
    upstream.on(
      "data",
      framesOf((body) => {
        const message = decodeClientMessage(body);
        if (drop && message.type === "response") {
          state.dropped += 1; // committed by the server, never seen by the bridge
          client.destroy();
          upstream.destroy();
          return;
        }
        if (!client.destroyed) client.write(Buffer.concat([Buffer.from(body), Buffer.from("\n")]));
      }),
    );
    for (const [one, other] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      one.on("error", () => other.destroy());
      one.on("close", () => other.destroy());
    }
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  return state;
}

test("hello, then one request and its response over the server's socket", async () => {
  const transport = new SocketTransport(config.socketPath!, quickRetry);
  const status: RequestMessage = {
    schema: "pi-workflows.client.v1",
    type: "request",
    requestId: "unused",
    clientId: config.clientId,
    operation: "server.status",
    idempotencyKey: "bridge-transport-test-status",
    payload: {},
  };
  const response = await transport.exchange(status);
  assert.equal(response.outcome, "accepted");
  assert.notEqual(response.requestId, "unused", "each transport attempt has its own request id");
});

test("an invalid output is held until the validation child rejects it, with the actionable error", async () => {
  const transport = new SocketTransport(config.socketPath!, quickRetry);
  const response = await transport.exchange(submit("call_invalid", { wrong: 1 }));
  assert.equal(response.outcome, "rejected");
  assert.equal(response.error?.code, "submissionRejected");
  assert.match(response.error?.message ?? "", /summary/, "the error names what is missing");
  assert.throws(() => toolResult(config, "submit", response), /Output rejected for step/);
});

test("an abort ends the wait for a held response; the command itself goes on", async () => {
  const transport = new SocketTransport(config.socketPath!, quickRetry);
  const controller = new AbortController();
  // The workflow's validate takes 1.5 s, so the response is still held when the abort
  // lands; a wait that ignored the signal would resolve with the acceptance instead.
  const timer = setTimeout(() => controller.abort(), 300);
  try {
    await assert.rejects(transport.exchange(submit("call_valid", { summary: "done" }), controller.signal), AbortedError);
  } finally {
    clearTimeout(timer);
  }
});

test("a connection lost after the commit is retried with a new request id and the same key, and adopts", async () => {
  const through = await relay(config.socketPath!);
  try {
    const request = submit("call_valid", { summary: "done" });
    const response = await new SocketTransport(through.path, quickRetry).exchange(request);
    assert.equal(through.dropped, 1, "the first response was swallowed and its connection dropped");
    assert.equal(response.outcome, "adopted", "the retry adopts the stored acceptance");
    assert.equal(toolResult(config, "submit", response).terminate, true);
    const [first, second, ...more] = through.requests;
    assert.equal(more.length, 0);
    assert.ok(first && second);
    assert.notEqual(first.requestId, second.requestId);
    assert.equal(first.idempotencyKey, second.idempotencyKey);
    assert.equal(first.idempotencyKey, request.idempotencyKey);
    assert.deepEqual(first.payload, second.payload);
    assert.deepEqual(first.payload, request.payload);
  } finally {
    await through.close();
  }
});

test("the same tool call sent again later adopts the same outcome; an abort stops the wait", async () => {
  const transport = new SocketTransport(config.socketPath!, quickRetry);
  const again = await transport.exchange(submit("call_valid", { summary: "done" }));
  assert.equal(again.outcome, "adopted");
  const conflicting = await transport.exchange(submit("call_valid", { summary: "other" }));
  assert.equal(conflicting.outcome, "conflict");
  const aborted = new AbortController();
  aborted.abort();
  await assert.rejects(transport.exchange(submit("call_late", { summary: "x" }), aborted.signal), /aborted/);
});
