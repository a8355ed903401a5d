/**
 * The coordinator's one connection to the workflow server: it holds the origin
 * session's `sessionView` subscription with `coordinator: true` (which claims the
 * session's active coordinator epoch) and carries the coordinator's requests, because
 * the epoch belongs to this connection (workflow-server.md § Live client protocol).
 *
 * `ensure()` opens a connection only when none exists or is being opened: the
 * coordinator calls it once a second, so a session opened before the server started, or
 * across a server restart, gets exactly one connection and one subscription back.
 * Requests on the connection are multiplexed by request ID (a held `interaction.submit`
 * does not block a turn report). A lost connection fails every request still waiting on
 * it; the caller decides whether to retry with the same durable identity. Nothing here
 * writes to stdout or stderr.
 */

import { randomUUID } from "node:crypto";
import type { Socket } from "node:net";

import type { JsonValue } from "../common/canonical.ts";
import {
  CLIENT_SCHEMA,
  encodeClientMessage,
  type ClientMessage,
  type RequestMessage,
  type ResponseMessage,
} from "../common/protocol.ts";
import { NEWLINE, isRefusal, openMessageSocket } from "../common/transport.ts";

type JsonObject = { [key: string]: JsonValue };

/** The connection ended before the response came (the server may have committed). */
export class LinkLostError extends Error {
  override name = "LinkLostError";
  constructor() {
    super("the connection to the workflow server closed before its answer");
  }
}

export interface LinkListener {
  /** A complete `pi-workflows.session-view.v1` document for this connection. */
  onView(view: JsonObject): void;
  /** The connection closed (or could not be opened). */
  onLost(): void;
}

interface Waiting {
  resolve(response: ResponseMessage): void;
  reject(error: Error): void;
}

export class SessionLink {
  private socket: Socket | null = null;
  private connectionId: string | null = null;
  private subscriptionId: string | null = null;
  /** The coordinator epoch this connection's subscription was granted. */
  epoch: number | null = null;
  private readonly waiting = new Map<string, Waiting>();
  private stopped = false;
  /** Connections that reached a hello (tests and diagnostics). */
  connections = 0;

  constructor(
    readonly socketPath: string,
    readonly clientId: string,
    readonly sessionId: string,
    private readonly listener: LinkListener,
  ) {}

  /** True while a connection is open and its coordinator subscription is installed. */
  get live(): boolean {
    return this.socket !== null && this.subscriptionId !== null;
  }

  /** Open the one connection, unless it is open or being opened. */
  ensure(): void {
    if (this.stopped || this.socket !== null) return;
    this.connectionId = null;
    this.subscriptionId = null;
    // A broken stream closes the socket: the next poll connects again.
    this.socket = openMessageSocket(this.socketPath, {
      current: (socket) => this.socket === socket,
      onMessage: (socket, message) => this.onMessage(socket, message),
      onClose: (socket) => this.onClose(socket),
    });
  }

  stop(): void {
    this.stopped = true;
    this.socket?.destroy();
  }

  /**
   * Send one request on this connection and wait for its response. Rejects with
   * `LinkLostError` when the connection is not live or closes first.
   */
  request(operation: string, payload: JsonObject, options: { runId?: string; idempotencyKey?: string } = {}): Promise<ResponseMessage> {
    const socket = this.socket;
    if (socket === null || this.subscriptionId === null) return Promise.reject(new LinkLostError());
    const requestId = `extension-${randomUUID()}`;
    const request: RequestMessage = {
      schema: CLIENT_SCHEMA,
      type: "request",
      requestId,
      clientId: this.clientId,
      operation,
      idempotencyKey: options.idempotencyKey ?? `${this.clientId}-${operation}-${randomUUID()}`,
      payload,
    };
    if (options.runId !== undefined) request.runId = options.runId;
    return new Promise((resolve, reject) => {
      this.waiting.set(requestId, { resolve, reject });
      try {
        this.write(socket, request);
      } catch (error) {
        this.waiting.delete(requestId);
        reject(error as Error);
      }
    });
  }

  private onClose(socket: Socket): void {
    if (this.socket !== socket) return;
    this.socket = null;
    this.connectionId = null;
    this.subscriptionId = null;
    this.epoch = null;
    const waiting = [...this.waiting.values()];
    this.waiting.clear();
    for (const entry of waiting) entry.reject(new LinkLostError());
    if (!this.stopped) this.listener.onLost();
  }

  private write(socket: Socket, message: ClientMessage): void {
    socket.write(Buffer.concat([Buffer.from(encodeClientMessage(message)), Buffer.from([NEWLINE])]));
  }

  private subscribe(socket: Socket): void {
    const requestId = `extension-${randomUUID()}`;
    const request: RequestMessage = {
      schema: CLIENT_SCHEMA,
      type: "request",
      requestId,
      clientId: this.clientId,
      operation: "view.subscribe",
      idempotencyKey: `${this.clientId}-view.subscribe-${randomUUID()}`,
      payload: { kind: "sessionView", sessionId: this.sessionId, coordinator: true },
    };
    this.waiting.set(requestId, {
      resolve: (response) => {
        if (response.outcome === "accepted" || response.outcome === "adopted") {
          this.subscriptionId = String(response.receipt?.subscriptionId ?? "");
          const epoch = response.receipt?.coordinatorEpoch;
          this.epoch = typeof epoch === "number" ? epoch : null;
        } else {
          socket.destroy(); // refused (stopping, or at a cap): the next poll tries again
        }
      },
      reject: () => undefined,
    });
    this.write(socket, request);
  }

  private onMessage(socket: Socket, message: ClientMessage): void {
    if (this.connectionId === null) {
      if (message.type !== "hello") throw new Error("no hello");
      this.connectionId = message.connectionId;
      this.connections += 1;
      this.subscribe(socket);
      return;
    }
    if (isRefusal(message, this.connectionId)) {
      socket.destroy();
      return;
    }
    if (message.type === "response") {
      const entry = this.waiting.get(message.requestId);
      if (entry === undefined) return;
      this.waiting.delete(message.requestId);
      entry.resolve(message);
      return;
    }
    if (message.type !== "event" || message.subscriptionId !== this.subscriptionId) return;
    if (message.kind === "sessionSnapshot") this.listener.onView(message.payload);
  }
}
