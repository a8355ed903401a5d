/**
 * The extension's commands to the workflow server: one `pi-workflows.client.v1` request
 * per user command over the server's Unix socket, through the bridge's `SocketTransport`
 * (client-protocol.md § Commands and uncertain results).
 *
 * Each invocation gets ONE idempotency key, kept for every transport attempt; each
 * attempt gets a new request ID. A connection lost after the commit is retried once and
 * adopts the stored receipt, as the Python client does. No server (no socket, or nobody
 * listening) is reported at once as `NoServerError`, naming the command that starts one.
 */

import { randomUUID } from "node:crypto";

import type { JsonValue } from "../common/canonical.ts";
import { CLIENT_SCHEMA, type RequestMessage, type ResponseMessage } from "../common/protocol.ts";
import { AbortedError, ServerUnreachableError, SocketTransport, type RetryPolicy } from "../common/transport.ts";

/** The first attempt and one reconnect retry, as `WorkflowClient.request`. */
export const COMMAND_RETRY: RetryPolicy = { attempts: 2, firstDelayMs: 200, maxDelayMs: 200 };
/** How long a command waits for its response (a start waits for its resolver child). */
export const COMMAND_TIMEOUT_MS = 60_000;

export const START_HINT = "pi-workflows server start";

/** Nobody listens on the server socket. */
export class NoServerError extends Error {
  override name = "NoServerError";
  constructor() {
    super(`The workflow server is not running. Start it with \`${START_HINT}\` in a terminal, then try again.`);
  }
}

/** The server answered with an outcome other than accepted or adopted. */
export class CommandFailedError extends Error {
  override name = "CommandFailedError";
  constructor(readonly response: ResponseMessage) {
    const code = response.error?.code ?? response.outcome;
    super(`${response.outcome} (${code}): ${response.error?.message ?? "the server gave no reason"}`);
  }
}

export interface CommandOptions {
  runId?: string;
  timeoutMs?: number;
}

export class ServerClient {
  private readonly transport: SocketTransport;

  constructor(
    readonly socketPath: string,
    readonly clientId: string,
    retry: RetryPolicy = COMMAND_RETRY,
  ) {
    this.transport = new SocketTransport(socketPath, retry, "extension");
  }

  /** A fresh durable identity for one user command (shared by its transport attempts). */
  newKey(operation: string): string {
    return `${this.clientId}-${operation}-${randomUUID()}`;
  }

  request(operation: string, payload: { [key: string]: JsonValue }, options: CommandOptions = {}): RequestMessage {
    const request: RequestMessage = {
      schema: CLIENT_SCHEMA,
      type: "request",
      requestId: "replaced-per-attempt",
      clientId: this.clientId,
      operation,
      idempotencyKey: this.newKey(operation),
      payload,
    };
    if (options.runId !== undefined) request.runId = options.runId;
    return request;
  }

  /** Send one command; the response whatever its outcome. Throws `NoServerError`. */
  async send(request: RequestMessage, timeoutMs: number = COMMAND_TIMEOUT_MS): Promise<ResponseMessage> {
    const signal = AbortSignal.timeout(timeoutMs);
    try {
      return await this.transport.exchange(request, signal);
    } catch (error) {
      if (error instanceof ServerUnreachableError && (error.connectCode === "ENOENT" || error.connectCode === "ECONNREFUSED")) {
        throw new NoServerError();
      }
      if (error instanceof AbortedError) {
        throw new Error(`The workflow server did not answer ${request.operation} within ${Math.round(timeoutMs / 1000)} s.`);
      }
      throw error;
    }
  }

  /** Send one command and return its receipt; throws `CommandFailedError` unless accepted or adopted. */
  async call(
    operation: string,
    payload: { [key: string]: JsonValue } = {},
    options: CommandOptions = {},
  ): Promise<{ receipt: { [key: string]: JsonValue }; response: ResponseMessage }> {
    const response = await this.send(this.request(operation, payload, options), options.timeoutMs);
    if (response.outcome !== "accepted" && response.outcome !== "adopted") throw new CommandFailedError(response);
    return { receipt: response.receipt ?? {}, response };
  }
}
