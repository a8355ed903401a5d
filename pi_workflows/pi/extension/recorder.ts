/**
 * The session record of one workflow turn, on the extension's side (client-protocol.md §
 * Origin-session activity; workflow-server.md § Interactive requests): Pi's events between
 * `agent_start` and `agent_end`, numbered from 0 and sent with `sessionEvents.record` in
 * batches once the server owns the turn.
 *
 * - Text, thinking and tool-call deltas of the same block are coalesced (each event at most
 *   `MAX_DELTA_CHARS`, a longer delta split), so a long reply costs a few events, not one
 *   per token, and every event fits the server's limit whole.
 * - An event stays buffered until a batch holding it is accepted: a reconnect re-sends it
 *   with the same seq, and the server stores each (turn, seq) once.
 * - An event too large for a frame keeps only its identifying fields (`omitted`,
 *   `byteCount`), the way the server keeps one above its limit.
 * - A `messageEnd` names its Pi entry, which Pi appends right after the extensions saw
 *   the event: the batch waits for it (briefly), then goes without it.
 *
 * Nothing here logs: recorded content is private.
 */

import type { JsonValue } from "../common/canonical.ts";
import type { BranchEntry } from "./coordinator.ts";

type JsonObject = { [key: string]: JsonValue };

/** The server's batch limit (`MAX_BATCH_EVENTS` in domain/_session_record.py). */
export const MAX_BATCH_EVENTS = 512;
/** The most UTF-8 bytes of events one batch carries; a frame is 1 MiB. */
export const MAX_BATCH_BYTES = 640 * 1024;
/** An event above this keeps only its IDs (the server's limit is 64 KiB less 256). */
export const MAX_EVENT_BYTES = 60 * 1024;
/** A `messageEnd`'s verbatim message above this is not sent (the entry keeps no copy). */
export const MAX_MESSAGE_BYTES = 256 * 1024;
/** A coalesced delta grows to at most this many characters. */
export const MAX_DELTA_CHARS = 8 * 1024;
/** How long a `messageEnd` waits for Pi to append its entry. */
export const ENTRY_WAIT_MS = 2000;

/** The variable that turns the session record off (`off`, `0`, `false` or `no`). */
export const RECORD_ENV = "PI_WORKFLOWS_SESSION_RECORD";

/** Whether this Pi records workflow turns (on unless the variable turns it off). */
export function recordingOn(env: Record<string, string | undefined>): boolean {
  const value = (env[RECORD_ENV] ?? "").trim().toLowerCase();
  return !["off", "0", "false", "no"].includes(value);
}

const DELTA_TYPES = new Set(["textDelta", "thinkingDelta", "toolCallDelta"]);

/** `text` in pieces of at most `size` UTF-16 units, never splitting a surrogate pair. */
export function pieces(text: string, size: number): string[] {
  const out: string[] = [];
  let start = 0;
  while (start < text.length) {
    let end = Math.min(text.length, start + size);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && last >= 0xd800 && last <= 0xdbff) end -= 1;
    out.push(text.slice(start, end));
    start = end;
  }
  return out;
}

const ID_FIELDS = ["toolCallId", "entryId", "name", "role", "contentIndex", "stopReason"] as const;

function bytes(value: JsonValue): number {
  return Buffer.byteLength(JSON.stringify(value), "utf8");
}

/** The event, or its identifying fields when it is too large to send whole (a
 * `messageEnd`'s `message` is the entry's content, bounded on its own). */
export function bounded(event: JsonObject): JsonObject {
  const { message, ...fields } = event;
  const size = bytes(fields);
  if (size <= MAX_EVENT_BYTES) return event;
  const kept: JsonObject = { seq: event.seq!, type: event.type!, omitted: true, byteCount: size };
  for (const key of ID_FIELDS) {
    const value = event[key];
    if (value !== undefined && (typeof value !== "string" || value.length <= 256)) kept[key] = value;
  }
  if (message !== undefined) kept.message = message;
  return kept;
}

interface Pending {
  event: JsonObject;
  /** A `messageEnd`'s Pi message, until its entry ID is found (then cleared). */
  message?: unknown;
  /** `Date.now()` when it was recorded (the entry wait). */
  at: number;
  /** It went out in a batch once: it never changes again (a resend must be identical). */
  sent: boolean;
}

export interface RecordBatch {
  events: JsonObject[];
  final?: { count: number; failure?: string };
}

export class TurnRecording {
  private readonly pending: Pending[] = [];
  private nextSeq = 0;
  /** The batch in flight: how many pending events it holds, and whether it ends the capture. */
  private inFlight: { count: number; final: boolean } | null = null;
  private ended = false;
  private finalSent = false;
  private failure: string | null = null;

  get seqCount(): number {
    return this.nextSeq;
  }

  /** True while something is left to send (events, or the end of the capture). */
  get due(): boolean {
    return this.pending.length > 0 || (this.ended && !this.finalSent);
  }

  /**
   * Worth a batch now: the turn ended, an event waited `afterMs`, or a full batch is
   * buffered. A short turn then costs no round trip while it runs.
   */
  ripe(afterMs: number, now: number = Date.now()): boolean {
    if (this.ended) return this.due;
    const unsent = this.pending.filter((item) => !item.sent);
    return unsent.length >= MAX_BATCH_EVENTS || (unsent.length > 0 && now - unsent[0]!.at >= afterMs);
  }

  /** Record one event (its `seq` is assigned here); a long delta becomes several. */
  add(type: string, fields: JsonObject, message?: unknown): void {
    if (this.ended) return;
    if (DELTA_TYPES.has(type) && typeof fields.delta === "string" && fields.delta.length > MAX_DELTA_CHARS) {
      for (const piece of pieces(fields.delta, MAX_DELTA_CHARS)) this.add(type, { ...fields, delta: piece });
      return;
    }
    const last = this.pending.at(-1);
    if (
      DELTA_TYPES.has(type) &&
      last !== undefined &&
      !last.sent &&
      last.event.type === type &&
      last.event.contentIndex === fields.contentIndex &&
      typeof last.event.delta === "string" &&
      typeof fields.delta === "string" &&
      last.event.delta.length + fields.delta.length <= MAX_DELTA_CHARS
    ) {
      last.event.delta += fields.delta; // coalesced: one event for a run of deltas
      return;
    }
    this.pending.push({ event: { seq: this.nextSeq, type, ...fields }, message, at: Date.now(), sent: false });
    this.nextSeq += 1;
  }

  /** The turn ended: the capture closes with its count (and a failure code, if any). */
  end(failure: string | null = null): void {
    this.ended = true;
    if (failure !== null && this.failure === null) this.failure = failure;
  }

  /**
   * The next batch to send, or null when nothing is due (or a `messageEnd` still waits
   * for its entry). `branch` is Pi's current branch, where saved messages are found.
   */
  nextBatch(branch: readonly BranchEntry[], now: number = Date.now()): RecordBatch | null {
    if (this.inFlight !== null) return null;
    const events: JsonObject[] = [];
    let size = 0;
    for (const item of this.pending) {
      if (events.length >= MAX_BATCH_EVENTS) break;
      if (item.message !== undefined && !this.resolveEntry(item, branch, now)) break;
      const event = bounded(item.event);
      const eventSize = bytes(event);
      if (events.length > 0 && size + eventSize > MAX_BATCH_BYTES) break;
      events.push(event);
      size += eventSize;
    }
    for (const item of this.pending.slice(0, events.length)) item.sent = true;
    const final = this.ended && !this.finalSent && events.length === this.pending.length;
    if (events.length === 0 && !final) return null;
    this.inFlight = { count: events.length, final };
    const batch: RecordBatch = { events };
    if (final) {
      batch.final = { count: this.nextSeq };
      if (this.failure !== null) batch.final.failure = this.failure;
    }
    return batch;
  }

  /** The batch in flight was stored (accepted): drop its events. */
  stored(): void {
    if (this.inFlight === null) return;
    this.pending.splice(0, this.inFlight.count);
    if (this.inFlight.final) this.finalSent = true;
    this.inFlight = null;
  }

  /** The batch in flight went unanswered (the connection closed): send it again later. */
  unsent(): void {
    this.inFlight = null;
  }

  /** The server will never take this turn's events: nothing more is sent. */
  abandon(): void {
    this.pending.length = 0;
    this.inFlight = null;
    this.ended = true;
    this.finalSent = true;
  }

  /** Fill in a `messageEnd`'s entry ID from the branch; false: wait for it. */
  private resolveEntry(item: Pending, branch: readonly BranchEntry[], now: number): boolean {
    const entryId = entryOf(item.message, branch);
    if (entryId === null && now - item.at < ENTRY_WAIT_MS) return false;
    if (entryId !== null) item.event.entryId = entryId;
    // Pi's message object may hold undefined fields: send its JSON form.
    const message = toJson(item.message);
    if (message !== null && typeof message === "object" && bytes(message) <= MAX_MESSAGE_BYTES) {
      item.event.message = message;
    } else if (message !== null && typeof message === "object") {
      item.event.messageOmitted = true;
    }
    item.message = undefined;
    return true;
  }
}

/** The ID of the branch entry Pi saved `message` as (newest first), or null. */
export function entryOf(message: unknown, branch: readonly BranchEntry[]): string | null {
  const details = (message as { role?: unknown; details?: { messageId?: unknown } } | null) ?? null;
  for (let index = branch.length - 1; index >= 0; index -= 1) {
    const entry = branch[index]!;
    if (entry.type === "message" && (entry as { message?: unknown }).message === message) return entry.id;
    if (
      details?.role === "custom" &&
      entry.type === "custom_message" &&
      typeof details.details?.messageId === "string" &&
      (entry.details as { messageId?: unknown } | undefined)?.messageId === details.details.messageId
    ) {
      return entry.id;
    }
  }
  return null;
}

/** One session event made from a Pi extension event, or null for one not recorded. */
export interface SessionEvent {
  type: string;
  fields: JsonObject;
  /** A `messageEnd`'s Pi message (the entry's verbatim content). */
  message?: unknown;
}

function text(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

/** The JSON form of a Pi value (undefined fields dropped; a value with none is null). */
export function toJson(value: unknown): JsonValue {
  try {
    return value === undefined ? null : (JSON.parse(JSON.stringify(value)) as JsonValue);
  } catch {
    return null;
  }
}

/** The session event of a Pi `message_start`, `message_update`, `message_end`,
 * `tool_execution_start` or `tool_execution_end` (the names of the extension API). */
export function sessionEventOf(event: { type: string; [key: string]: unknown }): SessionEvent | null {
  switch (event.type) {
    case "message_start": {
      const role = text((event.message as { role?: unknown } | undefined)?.role) ?? "assistant";
      return { type: "messageStart", fields: { role } };
    }
    case "message_update":
      return updateOf(event.assistantMessageEvent as { type?: unknown; [key: string]: unknown } | undefined);
    case "message_end": {
      const message = event.message as { role?: unknown; stopReason?: unknown } | undefined;
      const fields: JsonObject = { role: text(message?.role) ?? "assistant" };
      const stopReason = text(message?.stopReason);
      if (stopReason !== null) fields.stopReason = stopReason;
      return { type: "messageEnd", fields, message: message ?? null };
    }
    case "tool_execution_start":
      return {
        type: "toolStart",
        fields: { toolCallId: String(event.toolCallId ?? ""), name: String(event.toolName ?? ""), arguments: toJson(event.args) },
      };
    case "tool_execution_end":
      return {
        type: "toolEnd",
        fields: { toolCallId: String(event.toolCallId ?? ""), isError: event.isError === true, result: toJson(event.result) },
      };
    default:
      return null;
  }
}

function updateOf(update: { type?: unknown; [key: string]: unknown } | undefined): SessionEvent | null {
  if (update === undefined) return null;
  const contentIndex = typeof update.contentIndex === "number" ? update.contentIndex : 0;
  const delta = text(update.delta);
  switch (update.type) {
    case "text_delta":
      return delta === null ? null : { type: "textDelta", fields: { contentIndex, delta } };
    case "thinking_delta":
      return delta === null ? null : { type: "thinkingDelta", fields: { contentIndex, delta } };
    case "toolcall_delta": {
      if (delta === null) return null;
      const fields: JsonObject = { contentIndex, delta };
      const block = (update.partial as { content?: unknown[] } | undefined)?.content?.[contentIndex] as
        | { id?: unknown; name?: unknown }
        | undefined;
      if (typeof block?.id === "string") fields.toolCallId = block.id;
      if (typeof block?.name === "string") fields.name = block.name;
      return { type: "toolCallDelta", fields };
    }
    case "toolcall_end": {
      const call = update.toolCall as { id?: unknown; name?: unknown; arguments?: unknown } | undefined;
      return {
        type: "toolCallEnd",
        fields: { contentIndex, toolCallId: String(call?.id ?? ""), name: String(call?.name ?? ""), arguments: toJson(call?.arguments) },
      };
    }
    default:
      return null;
  }
}
