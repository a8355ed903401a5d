/**
 * How the bridge and the Pi extension reach the workflow server: one request out, its response back, over
 * the server's Unix socket (`config.socketPath`) as an ordinary `pi-workflows.client.v1`
 * client (client-protocol.md § Transports, § Commands and uncertain results).
 *
 * Each transport attempt opens a connection, reads the server's `hello`, writes the
 * canonical request frame and a newline, and waits for the response with the same
 * `requestId`. The server HOLDS an `interaction.submit` response until the submission's
 * durable outcome (accepted, adopted or rejected), so there is no response timeout: the
 * runner's node deadline bounds the whole step. A dropped connection (or an `unavailable`
 * answer: the server is stopping) is retried with a NEW `requestId` and the SAME
 * idempotency key and payload, which adopts whatever the server stored; the retries are
 * bounded with exponential back-off. An abort (pi's tool signal) stops waiting at once;
 * an accepted command is not undone.
 *
 * Nothing here writes to stdout or stderr, and errors never quote a frame: tool
 * arguments are private.
 */

import { randomUUID } from "node:crypto";
import { createConnection, type Socket } from "node:net";

import {
  MAX_FRAME_BYTES,
  decodeClientMessage,
  encodeClientMessage,
  type ClientMessage,
  type RequestMessage,
  type ResponseMessage,
} from "./protocol.ts";

export interface ServerTransport {
  /**
   * Send `request` and wait for its response. Its `requestId` is replaced per
   * transport attempt; every other field (the durable identity) is sent unchanged.
   */
  exchange(request: RequestMessage, signal?: AbortSignal): Promise<ResponseMessage>;
}

export interface RetryPolicy {
  /** Transport attempts in all (the first one included). */
  attempts: number;
  /** Pause before the second attempt; it doubles per attempt up to `maxDelayMs`. */
  firstDelayMs: number;
  maxDelayMs: number;
}

/** About 30 s of retries in all: enough for a server restart, bounded for a dead one. */
export const DEFAULT_RETRY: RetryPolicy = { attempts: 12, firstDelayMs: 100, maxDelayMs: 3000 };

/** The tool call was aborted (pi's signal): the wait stopped, nothing was undone. */
export class AbortedError extends Error {
  override name = "AbortedError";
  constructor() {
    super("The workflow tool call was aborted.");
  }
}

/** Every attempt lost its connection (or the server was unavailable each time). */
export class ServerUnreachableError extends Error {
  override name = "ServerUnreachableError";
  constructor(
    message: string,
    /** The last attempt's connect error code (`ENOENT`: no socket file; `ECONNREFUSED`: nobody listens), if it failed so. */
    readonly connectCode: string | null = null,
  ) {
    super(message);
  }
}

/** One attempt failed in a way a retry with the same identity may fix. */
class RetryableError extends Error {
  override name = "RetryableError";
  constructor(
    message: string,
    readonly connectCode: string | null = null,
  ) {
    super(message);
  }
}

/** The peer broke the protocol on this connection (a retry would not help). */
export class ProtocolError extends Error {
  override name = "ProtocolError";
}

export const NEWLINE = 0x0a;

/**
 * Splits a byte stream into frame bodies (without their newlines), never buffering
 * past the frame limit, as Python's `FrameDecoder` does.
 */
export class FrameSplitter {
  private buffer: Buffer = Buffer.alloc(0);

  feed(chunk: Buffer): Uint8Array[] {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    const frames: Uint8Array[] = [];
    let start = 0;
    for (;;) {
      const end = this.buffer.indexOf(NEWLINE, start);
      if (end < 0) break;
      frames.push(new Uint8Array(this.buffer.subarray(start, end)));
      start = end + 1;
    }
    this.buffer = this.buffer.subarray(start);
    if (this.buffer.length > MAX_FRAME_BYTES) {
      throw new ProtocolError(`the server sent a frame over the ${MAX_FRAME_BYTES}-byte limit`);
    }
    return frames;
  }
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new AbortedError());
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new AbortedError());
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * Open a long-lived client connection whose decoded messages go to `onMessage` while it
 * is `current()`. A broken stream or a socket error destroys it; `onClose` runs once it
 * is closed (the caller decides whether and when to connect again).
 */
export function openMessageSocket(
  socketPath: string,
  handlers: {
    current(socket: Socket): boolean;
    onMessage(socket: Socket, message: ClientMessage): void;
    onClose(socket: Socket): void;
  },
): Socket {
  const socket = createConnection({ path: socketPath });
  const splitter = new FrameSplitter();
  socket.on("data", (chunk: Buffer) => {
    try {
      for (const body of splitter.feed(chunk)) {
        if (!handlers.current(socket)) return;
        handlers.onMessage(socket, decodeClientMessage(body));
      }
    } catch {
      socket.destroy(); // a broken stream: the caller connects again
    }
  });
  socket.on("error", () => socket.destroy());
  socket.on("close", () => handlers.onClose(socket));
  return socket;
}

/** The connection-level refusal: an `unavailable` event whose subscription is the connection. */
export function isRefusal(message: ClientMessage, connectionId: string | null): boolean {
  return message.type === "event" && message.kind === "unavailable" && message.subscriptionId === connectionId;
}

/** The client.v1 transport over the server's Unix socket (see the file comment). */
export class SocketTransport implements ServerTransport {
  constructor(
    readonly socketPath: string,
    readonly retry: RetryPolicy = DEFAULT_RETRY,
    /** Names this client's transport attempts (`bridge-<uuid>`, `extension-<uuid>`). */
    readonly requestPrefix: string = "bridge",
  ) {}

  async exchange(request: RequestMessage, signal?: AbortSignal): Promise<ResponseMessage> {
    let delay = this.retry.firstDelayMs;
    let last = "no attempt was made";
    let connectCode: string | null = null;
    for (let attempt = 1; attempt <= this.retry.attempts; attempt += 1) {
      if (signal?.aborted) throw new AbortedError();
      // A new request ID per transport attempt: a late answer to an abandoned attempt
      // can never settle this one; the idempotency key and payload stay the same.
      const requestId = `${this.requestPrefix}-${randomUUID()}`;
      const frame = encodeClientMessage({ ...request, requestId });
      try {
        const response = await this.attempt(frame, requestId, signal);
        if (response.outcome !== "unavailable") return response;
        last = `the server was unavailable (${response.error?.code ?? "unavailable"})`;
        connectCode = null;
      } catch (error) {
        if (!(error instanceof RetryableError)) throw error;
        last = error.message;
        connectCode = error.connectCode;
      }
      if (attempt < this.retry.attempts) {
        await sleep(delay, signal);
        delay = Math.min(delay * 2, this.retry.maxDelayMs);
      }
    }
    throw new ServerUnreachableError(`The workflow server could not be reached after ${this.retry.attempts} attempts: ${last}.`, connectCode);
  }

  /** One connection: hello, the request frame, then wait for the matching response. */
  private attempt(frame: Uint8Array, requestId: string, signal: AbortSignal | undefined): Promise<ResponseMessage> {
    return new Promise((resolve, reject) => {
      const socket: Socket = createConnection({ path: this.socketPath });
      const splitter = new FrameSplitter();
      let connectionId: string | null = null;
      let settled = false;

      const finish = (error: Error | null, response?: ResponseMessage): void => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener("abort", onAbort);
        socket.destroy();
        if (error !== null) reject(error);
        else resolve(response!);
      };
      const onAbort = (): void => finish(new AbortedError());
      signal?.addEventListener("abort", onAbort, { once: true });

      const onFrame = (body: Uint8Array): void => {
        let message: ClientMessage;
        try {
          message = decodeClientMessage(body);
        } catch (error) {
          throw new ProtocolError(`the server sent an invalid frame (${(error as Error).name})`);
        }
        if (connectionId === null) {
          if (message.type !== "hello") throw new ProtocolError("the server did not start with a hello");
          connectionId = message.connectionId;
          socket.write(Buffer.concat([Buffer.from(frame), Buffer.from([NEWLINE])]));
          return;
        }
        if (isRefusal(message, connectionId)) throw new RetryableError("the server refused the connection");
        if (message.type === "response" && message.requestId === requestId) finish(null, message);
        // Events, and responses to other request IDs, are not this attempt's to settle.
      };

      socket.on("data", (chunk: Buffer) => {
        try {
          for (const body of splitter.feed(chunk)) {
            if (settled) return;
            onFrame(body);
          }
        } catch (error) {
          finish(error as Error);
        }
      });
      // Connection refused, no socket file, reset, or closed before the response: the
      // server may be restarting; a retry adopts whatever it stored.
      socket.on("error", (error: NodeJS.ErrnoException) => {
        const code = error.code ?? error.name;
        finish(new RetryableError(`connection failed (${code})`, connectionId === null ? code : null));
      });
      socket.on("close", () => finish(new RetryableError("the connection closed before the response")));
    });
  }
}

/** No server socket in the configuration: every call fails, saying so. */
export class UnconfiguredTransport implements ServerTransport {
  async exchange(_request: RequestMessage, signal?: AbortSignal): Promise<ResponseMessage> {
    if (signal?.aborted) throw new AbortedError();
    throw new ServerUnreachableError("The workflow bridge has no server socket configured.");
  }
}

/** The transport for this step's configuration. */
export function selectTransport(config: { socketPath: string | null }): ServerTransport {
  return config.socketPath === null ? new UnconfiguredTransport() : new SocketTransport(config.socketPath);
}
