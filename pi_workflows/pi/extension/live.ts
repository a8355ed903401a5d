/**
 * One `run` subscription held across server restarts: the view the widget and status
 * line show (client-protocol.md § Subscriptions and reconnection).
 *
 * It keeps one connection and one subscription. A `runSnapshot` replaces the held view;
 * a `runPatch` applies only to the view held at exactly its `baseRevision`, otherwise
 * the watch subscribes again without a revision and so gets a snapshot. When the
 * connection is lost (or was never made: the server starts later) it tries again once
 * per second with an unreferenced timer, sending the revision it holds. It never writes
 * to stdout or stderr.
 */

import { randomUUID } from "node:crypto";
import type { Socket } from "node:net";

import type { JsonValue } from "../common/canonical.ts";
import { CLIENT_SCHEMA, encodeClientMessage, type ClientMessage, type RequestMessage } from "../common/protocol.ts";
import { NEWLINE, isRefusal, openMessageSocket } from "../common/transport.ts";
import { applyPatch, PatchError, type PatchOperation } from "./patch.ts";

export const RECONNECT_MS = 1000;

export type WatchState = "connecting" | "live" | "lost" | "notFound" | "gone";

export interface WatchListener {
  /** A new complete view of the run (after a snapshot or a patch). */
  onView(view: JsonValue, revision: number): void;
  /** The subscription's condition changed (no view change). */
  onState(state: WatchState): void;
}

export class RunWatch {
  private socket: Socket | null = null;
  private timer: NodeJS.Timeout | null = null;
  private connectionId: string | null = null;
  private subscribeRequestId: string | null = null;
  private subscriptionId: string | null = null;
  private view: JsonValue | null = null;
  private revision: number | null = null;
  private stopped = false;
  /** Connections opened so far (tests and diagnostics). */
  connections = 0;

  constructor(
    readonly socketPath: string,
    readonly clientId: string,
    readonly runId: string,
    private readonly listener: WatchListener,
  ) {}

  start(): void {
    this.connect();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.socket?.destroy();
    this.socket = null;
  }

  get heldView(): JsonValue | null {
    return this.view;
  }

  private connect(): void {
    if (this.stopped || this.socket !== null) return;
    this.listener.onState("connecting");
    this.connectionId = null;
    this.subscriptionId = null;
    // A broken stream closes the socket: reconnect and take a snapshot.
    this.socket = openMessageSocket(this.socketPath, {
      current: (socket) => this.socket === socket,
      onMessage: (socket, message) => this.onMessage(socket, message),
      onClose: (socket) => this.onClose(socket),
    });
  }

  private onClose(socket: Socket): void {
    if (this.socket !== socket) return;
    this.socket = null;
    if (this.stopped) return;
    this.listener.onState("lost");
    this.timer = setTimeout(() => {
      this.timer = null;
      this.connect();
    }, RECONNECT_MS);
    this.timer.unref(); // a pending reconnect never keeps pi alive
  }

  private write(socket: Socket, message: ClientMessage): void {
    socket.write(Buffer.concat([Buffer.from(encodeClientMessage(message)), Buffer.from([NEWLINE])]));
  }

  private subscribe(socket: Socket): void {
    const payload: { [key: string]: JsonValue } = { kind: "run" };
    if (this.revision !== null) payload.revision = this.revision; // patches from here, if retained
    this.subscribeRequestId = `extension-${randomUUID()}`;
    const request: RequestMessage = {
      schema: CLIENT_SCHEMA,
      type: "request",
      requestId: this.subscribeRequestId,
      clientId: this.clientId,
      operation: "view.subscribe",
      idempotencyKey: `${this.clientId}-view.subscribe-${randomUUID()}`,
      runId: this.runId,
      payload,
    };
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
      socket.destroy(); // the server closes this connection (stopping, or at its cap)
      return;
    }
    if (message.type === "response" && message.requestId === this.subscribeRequestId) {
      if (message.outcome === "accepted" || message.outcome === "adopted") {
        this.subscriptionId = String(message.receipt?.subscriptionId ?? "");
        this.listener.onState("live");
      } else if (message.outcome === "notFound") {
        this.listener.onState("notFound");
        this.stop();
      } else {
        socket.destroy(); // unavailable (stopping): try again later
      }
      return;
    }
    if (message.type !== "event" || message.subscriptionId !== this.subscriptionId) return;
    if (message.kind === "runSnapshot") {
      this.accept(message.payload, message.revision);
    } else if (message.kind === "runPatch") {
      this.patch(socket, message.payload, message.revision);
    } else if (message.kind === "unavailable") {
      this.listener.onState("gone"); // the run disappeared (pruned)
      this.stop();
    }
  }

  private accept(view: JsonValue, revision: number): void {
    this.view = view;
    this.revision = revision;
    this.listener.onView(view, revision);
  }

  private patch(socket: Socket, payload: { [key: string]: JsonValue }, revision: number): void {
    const base = payload.baseRevision;
    const operations = payload.operations as unknown as PatchOperation[];
    if (this.view !== null && this.revision !== null && base === this.revision && Array.isArray(operations)) {
      try {
        this.accept(applyPatch(this.view, operations), revision);
        return;
      } catch (error) {
        if (!(error instanceof PatchError)) throw error;
      }
    }
    // Another base: drop the revision and reconnect, which subscribes for a snapshot.
    this.revision = null;
    socket.destroy();
  }
}
