/**
 * How the bridge reaches the workflow server: one request frame out, one response back.
 *
 * STUB (issue 12, next step). `StubTransport` does not talk to the server yet. It
 * checks the request frame with the real decoder and answers `accepted`, encoded and
 * decoded through the real codec, so everything around the socket is exercised. The
 * stub also returns the canonical request frame, which `workflow-bridge.ts` puts in the
 * tool result's details, so tests can check on pi's RPC stream that Python's decoder
 * accepts the exact bytes the bridge would send.
 *
 * TODO(issue 12): a `SocketTransport` for `config.socketPath`: connect to the server's
 * Unix socket, read its `hello`, write `frame + "\n"`, and wait for the response with the
 * same `requestId` (the server holds an `interaction.submit` response open until the
 * submission is accepted, adopted or rejected). After a reconnect, resend with a new
 * `requestId` and the same idempotency key and payload, which adopts the stored outcome.
 * On `signal` abort stop waiting (an accepted command is not undone). Then drop
 * `requestFrame` from the details.
 */

import { CLIENT_SCHEMA, decodeClientMessage, encodeClientMessage, type ResponseMessage } from "./protocol.ts";
import type { BridgeConfig } from "./workflow-tool.ts";

export interface Exchange {
  response: ResponseMessage;
  /** The canonical request text, returned by the stub only (for tests). */
  requestFrame?: string;
}

export interface ServerTransport {
  /** Send one request frame body (no newline) and wait for its response. */
  exchange(frame: Uint8Array, signal?: AbortSignal): Promise<Exchange>;
}

/** Accepts every well-formed request without sending it anywhere (see above). */
export class StubTransport implements ServerTransport {
  async exchange(frame: Uint8Array, signal?: AbortSignal): Promise<Exchange> {
    if (signal?.aborted) throw new Error("The workflow tool call was aborted.");
    const request = decodeClientMessage(frame);
    if (request.type !== "request") throw new Error("the bridge sends only requests");
    const answer: ResponseMessage = {
      schema: CLIENT_SCHEMA,
      type: "response",
      requestId: request.requestId,
      outcome: "accepted",
      receipt: { stub: true },
    };
    const response = decodeClientMessage(encodeClientMessage(answer)) as ResponseMessage;
    return { response, requestFrame: new TextDecoder().decode(frame) };
  }
}

/** The transport for this step: the stub until the socket transport is written. */
export function selectTransport(_config: BridgeConfig): ServerTransport {
  return new StubTransport();
}
