/**
 * The `WorkflowMessageCoordinator`: one per Pi session, it presents the origin session's
 * workflow messages in Pi and reports the active branch and the model turns back
 * (workflow-server.md § Interactive Pi execution; client-protocol.md § Origin-session
 * activity). It handles every message kind the same way.
 *
 * - It keeps one `SessionLink` (one connection attempt, one coordinator subscription)
 *   and polls once a second, so an open session recovers after the server starts late
 *   or restarts. Polling alone sends nothing: reports go out only after a connection,
 *   after a send's entry appears, and after a model turn ends.
 * - After every connection it waits for the complete session view and reports the
 *   active branch before it sends a message or reports a turn.
 * - A send happens only for the view's `nextMessage` (named only to the active epoch),
 *   never twice for an ID in the in-memory queued map, and only after a synchronous final
 *   check (Pi idle, no pending input, the hidden ID absent from the branch, this
 *   connection still the coordinator) with no `await` between that check and
 *   `pi.sendMessage()`. The message ID rides in the custom entry's `details` (hidden
 *   from the model), which is the branch evidence the server adopts.
 * - `agent_start` / `agent_end` become `workflowTurn.report` starts and ends with a turn
 *   ID made here and kept across reconnects. They are buffered until the view is there
 *   and the message is confirmed `sent`, then reported in order. The server alone
 *   decides whether a turn is workflow work (`active`, `settled` or `absent`).
 * - A turn whose start receipt says `visibleReply` answers an assistant-message step:
 *   its end report carries the turn's final visible assistant text (`assistantText`,
 *   bounded to fit one frame), which the server settles the step with.
 *
 * - Each turn's session events (`recorder.ts`) are recorded from its `agent_start` and sent
 *   with `sessionEvents.record` once its start is accepted, in order, before its end
 *   report; a reconnect re-sends what was not acknowledged (the server stores each seq once).
 *
 * Nothing here writes to stdout or stderr: prompts and results are private.
 */

import { createHash, randomUUID } from "node:crypto";

import type { JsonValue } from "../common/canonical.ts";
import type { ResponseMessage } from "../common/protocol.ts";
import { TurnRecording } from "./recorder.ts";
import { LinkLostError, SessionLink } from "./session-link.ts";

type JsonObject = { [key: string]: JsonValue };

/** The custom message type of every workflow message the coordinator sends. */
export const MESSAGE_TYPE = "pi-workflows.message";
export const POLL_MS = 1000;
/** Kinds whose message starts a model turn; decisions and notifications are passive. */
const TURN_KINDS = new Set(["step", "terminal", "follow_up"]);
/** The most UTF-8 bytes of JSON-encoded reply text one end report carries (frames are 1 MiB). */
export const MAX_REPLY_BYTES = 768 * 1024;
/** A running turn's recorded events go out at most this long after they happened. */
export const RECORD_FLUSH_MS = 250;

/** What the coordinator needs from Pi (documented extension APIs only). */
export interface PiSide {
  isIdle(): boolean;
  hasPendingMessages(): boolean;
  /** `ctx.sessionManager.getBranch()`. */
  branch(): readonly BranchEntry[];
  /** `pi.sendMessage(message, options)`. */
  send(message: { customType: string; content: string; display: boolean; details: JsonObject }, triggerTurn: boolean): void;
}

export interface BranchEntry {
  type: string;
  id: string;
  customType?: string;
  details?: unknown;
  message?: { role?: string };
}

export type StopReason = "completed" | "aborted" | "error";

/** One Pi model turn, from its `agent_start` until the server settles it. */
interface Turn {
  turnId: string;
  /** The message this turn is reported against; null until bound. */
  messageId: string | null;
  runId: string | null;
  /** A message sent by this coordinator just before the turn started (it waits for it). */
  awaiting: string | null;
  startAccepted: boolean;
  /** The start receipt asked for the turn's visible reply (an assistant-message step). */
  visibleReply: boolean;
  /** `text`: the turn's final visible assistant text (null: none). */
  end: { stopReason: StopReason; responseEntryId: string | null; text: string | null } | null;
  /** The turn's session events (null: recording is off). */
  recording: TurnRecording | null;
}

export interface CoordinatorEvents {
  /** A message was handed to `pi.sendMessage()` (tests and the benchmark observe this). */
  onSent?(messageId: string): void;
  /** A turn report came back with its receipt. */
  onTurnReceipt?(turnId: string, receipt: JsonObject): void;
  /** A complete session view arrived (the widget and status line project it). */
  onView?(view: JsonObject): void;
  /** The connection closed, or could not be opened. */
  onLost?(): void;
}

export interface CoordinatorOptions {
  /** Record each workflow turn's session events (default true). */
  record?: boolean;
}

function isObject(value: JsonValue | undefined | unknown): value is JsonObject {
  return value !== null && value !== undefined && typeof value === "object" && !Array.isArray(value);
}

function accepted(response: ResponseMessage): boolean {
  return response.outcome === "accepted" || response.outcome === "adopted";
}

/** The hidden message ID of a workflow message entry, if `entry` is one. */
export function entryMessageId(entry: BranchEntry): string | null {
  if (entry.type !== "custom_message" || entry.customType !== MESSAGE_TYPE) return null;
  const details = entry.details as { messageId?: unknown } | undefined;
  return typeof details?.messageId === "string" ? details.messageId : null;
}

/** The text Pi shows and the model reads for one workflow message. */
export function messageText(kind: string, value: JsonValue): string {
  if (kind === "terminal" && isObject(value) && typeof value.outcome === "string") {
    const lines = [`Workflow ${String(value.workflow ?? "")} (${String(value.runId ?? "")}) finished: ${value.outcome}.`];
    if (typeof value.reason === "string") lines.push(`Reason: ${value.reason}`);
    if ("output" in value) lines.push(`Output: ${JSON.stringify(value.output)}`);
    if (value.outputTooLarge === true) lines.push("Its output is too large to show here: see /workflow status.");
    lines.push("Tell the user the outcome briefly.");
    return lines.join("\n");
  }
  if (isObject(value)) {
    const prompt = typeof value.prompt === "string" ? value.prompt : typeof value.text === "string" ? value.text : null;
    if (prompt !== null) {
      const contract = value.contract;
      if (kind === "step" && value.reminder !== undefined && isObject(contract)) {
        return `${prompt}\nWorkflow step contract: step "${String(contract.step)}", attempt "${String(contract.attempt)}".`;
      }
      return prompt;
    }
  }
  return `Workflow ${kind} message:\n${JSON.stringify(value, null, 2)}`;
}

/** `completed`, `aborted` or `error` from the assistant messages of one `agent_end`. */
export function stopReasonOf(messages: readonly unknown[]): StopReason {
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index] as { role?: unknown; stopReason?: unknown } | null;
    if (message?.role !== "assistant") continue;
    if (message.stopReason === "aborted") return "aborted";
    if (message.stopReason === "error") return "error";
    return "completed";
  }
  return "error"; // the turn ended with no assistant reply at all
}

/** The final visible assistant text of one `agent_end`: the text blocks of the last
 * assistant message that has any (thinking and tool calls are not visible text). */
export function finalReplyText(messages: readonly unknown[]): string | null {
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index] as { role?: unknown; content?: unknown } | null;
    if (message?.role !== "assistant") continue;
    const content = message.content;
    const texts = typeof content === "string"
      ? [content]
      : Array.isArray(content)
        ? content.filter((block) => block?.type === "text" && typeof block.text === "string").map((block) => String(block.text))
        : [];
    const text = texts.join("");
    if (text.trim() !== "") return text;
  }
  return null;
}

/** The reply cut (at a character boundary) to at most `maxBytes` of UTF-8 JSON; `cut`: it was. */
export function boundedReply(text: string, maxBytes: number = MAX_REPLY_BYTES): { text: string; cut: boolean } {
  const size = (value: string): number => Buffer.byteLength(JSON.stringify(value), "utf8");
  if (size(text) <= maxBytes) return { text, cut: false };
  // Never half a surrogate pair: that also keeps the size growing with the length.
  const head = (length: number): string => {
    const last = text.charCodeAt(length - 1);
    return text.slice(0, length > 0 && last >= 0xd800 && last <= 0xdbff ? length - 1 : length);
  };
  let low = 0;
  let high = text.length;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (size(head(middle)) <= maxBytes) low = middle;
    else high = middle - 1;
  }
  return { text: head(low), cut: true };
}

export class WorkflowMessageCoordinator {
  private readonly link: SessionLink;
  private view: JsonObject | null = null;
  /** The first branch report after the current connection was accepted. */
  private branchReported = false;
  private branchDirty = true;
  private readonly queued = new Map<string, { runId: string; kind: string; confirmed: boolean }>();
  private readonly turns: Turn[] = [];
  /** Referenced message contents (over 16 KiB) loaded with `view.content`, by message ID. */
  private readonly contents = new Map<string, JsonValue>();
  private readonly loading = new Set<string>();
  private timer: NodeJS.Timeout | null = null;
  private busy = false;
  private again = false;
  private stopped = false;
  /** `whenTurnReported` callers, released by the turn reports' settlement. */
  private readonly turnWaiters = new Set<() => void>();
  private readonly recordEvents: boolean;
  private flushTimer: NodeJS.Timeout | null = null;

  constructor(
    socketPath: string,
    clientId: string,
    readonly sessionId: string,
    private readonly pi: PiSide,
    private readonly events: CoordinatorEvents = {},
    options: CoordinatorOptions = {},
  ) {
    this.recordEvents = options.record ?? true;
    this.link = new SessionLink(socketPath, clientId, sessionId, {
      onView: (view) => this.onView(view),
      onLost: () => this.onLost(),
    });
  }

  /** Start polling (at `session_start`). */
  start(): void {
    this.timer = setInterval(() => this.pump(), POLL_MS);
    this.timer.unref(); // polling never keeps pi alive
    this.link.ensure();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    if (this.flushTimer !== null) clearTimeout(this.flushTimer);
    this.flushTimer = null;
    this.link.stop();
    this.settleTurnWaiters();
  }

  /** The connection (for requests that must carry this session's coordinator authority). */
  get connection(): SessionLink {
    return this.link;
  }

  get heldView(): JsonObject | null {
    return this.view;
  }

  /** True while this connection holds the session's active coordinator epoch. */
  get isCoordinator(): boolean {
    return this.link.live && this.view?.coordinator === true;
  }

  /** The active epoch of this connection, once it is the coordinator; else null. */
  get epoch(): number | null {
    return this.isCoordinator ? this.link.epoch : null;
  }

  /**
   * Wait until this connection is the session's coordinator (the poll reconnects);
   * the epoch. Rejects after `timeoutMs` or when `signal` aborts.
   */
  async whenCoordinator(timeoutMs: number, signal?: AbortSignal): Promise<number> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const epoch = this.epoch;
      if (epoch !== null) return epoch;
      if (signal?.aborted) throw new Error("The workflow tool call was aborted.");
      if (this.stopped || Date.now() > deadline) {
        throw new Error("This Pi session is not connected to the workflow server as its coordinator; try again shortly.");
      }
      this.pump();
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  /**
   * Wait (at most `timeoutMs`) until the running turn's start is reported, so a tool call
   * made in that turn reaches the server after its turn: otherwise a submission accepted
   * first closes the step, and the late start is refused and the turn goes unrecorded.
   * Returns either way; the submission never depends on it.
   */
  async whenTurnReported(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if (!this.startUnreported() || signal?.aborted || this.stopped) return;
    this.pump();
    await new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        this.turnWaiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, timeoutMs));
      signal?.addEventListener("abort", done, { once: true });
      this.turnWaiters.add(done);
    });
  }

  /** A running turn whose start the server has not accepted yet. */
  private startUnreported(): boolean {
    return this.turns.some((turn) => turn.end === null && !turn.startAccepted);
  }

  /** Release the `whenTurnReported` waiters once no running turn's start is unreported. */
  private settleTurnWaiters(): void {
    if (this.turnWaiters.size === 0 || (!this.stopped && this.startUnreported())) return;
    for (const done of [...this.turnWaiters]) done();
  }

  // --- Pi events ---------------------------------------------------------------------

  agentStart(): void {
    // Every new start replaces any older local copy: an unfinished older turn is over.
    for (const turn of this.turns) {
      if (turn.end === null) {
        turn.end = { stopReason: "error", responseEntryId: null, text: null };
        turn.recording?.end("turnReplaced");
      }
    }
    const awaiting = this.lastUnconfirmedSend();
    this.turns.push({
      turnId: `turn-${randomUUID()}`,
      messageId: null,
      runId: null,
      awaiting,
      startAccepted: false,
      visibleReply: false,
      end: null,
      recording: this.recordEvents ? new TurnRecording() : null,
    });
    this.pump();
  }

  /**
   * One session event of the running turn (`recorder.ts` numbers and coalesces it);
   * outside a turn there is nothing to record. `message`: a `messageEnd`'s Pi message.
   */
  record(type: string, fields: JsonObject, message?: unknown): void {
    const turn = this.turns.findLast((t) => t.end === null);
    if (turn?.recording == null) return;
    turn.recording.add(type, fields, message);
    if (turn.startAccepted) this.flushSoon();
  }

  /** Send the recorded events shortly (one timer at a time). */
  private flushSoon(): void {
    if (this.flushTimer !== null || this.stopped) return;
    this.flushTimer = setTimeout(() => {
      this.flushTimer = null;
      this.pump();
    }, RECORD_FLUSH_MS);
    this.flushTimer.unref();
  }

  agentEnd(messages: readonly unknown[]): void {
    const turn = this.turns.findLast((t) => t.end === null);
    if (turn !== undefined) {
      turn.end = { stopReason: stopReasonOf(messages), responseEntryId: this.lastAssistantEntry(), text: finalReplyText(messages) };
      turn.recording?.end();
    }
    this.settleTurnWaiters(); // an ended turn's start no longer holds a tool call
    this.branchDirty = true; // the turn settled: report the branch (idle) after its end
    this.pumpSoon();
  }

  /** A custom message was appended (our send's entry, if it is a workflow message). */
  messageEnd(): void {
    this.branchDirty = true;
    this.pumpSoon();
  }

  /** Pi may still be finishing the event that called this; look again shortly. */
  private pumpSoon(): void {
    setTimeout(() => this.pump(), 0).unref();
  }

  // --- the server side ---------------------------------------------------------------

  private onView(view: JsonObject): void {
    this.view = view;
    this.events.onView?.(view);
    this.pump();
  }

  private onLost(): void {
    this.view = null;
    this.branchReported = false;
    this.branchDirty = true;
    // Turn IDs are kept: a still-running turn is reported started again (adopted).
    for (const turn of this.turns) turn.startAccepted = false;
    this.events.onLost?.();
  }

  /** Do whatever is due, one step at a time (reports are serialized). */
  pump(): void {
    if (this.stopped) return;
    if (!this.link.live) {
      this.link.ensure();
      return;
    }
    if (this.view === null) return; // wait for the complete view of this connection
    if (this.busy) {
      this.again = true;
      return;
    }
    this.busy = true;
    void this.work().finally(() => {
      this.busy = false;
      if (this.again) {
        this.again = false;
        this.pump();
      }
    });
  }

  private async work(): Promise<void> {
    try {
      if (this.view?.coordinator !== true) return; // fenced: another connection coordinates
      // After every connection: the branch first, before any turn report or send.
      if (!this.branchReported && !(await this.reportBranch())) return;
      if (!(await this.flushTurns())) return;
      if (this.branchDirty) {
        if (!(await this.reportBranch())) return;
        if (!(await this.flushTurns())) return;
      }
      this.maybeSend();
    } catch (error) {
      if (!(error instanceof LinkLostError)) throw error;
    }
  }

  private windowItems(): JsonObject[] {
    const messages = this.view?.messages;
    if (!isObject(messages) || !Array.isArray(messages.items)) return [];
    return messages.items.filter(isObject);
  }

  /** `workflowMessage.reportBranch`: the branch's workflow entries named by the window. */
  private async reportBranch(): Promise<boolean> {
    const known = new Set(this.windowItems().map((item) => String(item.messageId)));
    const entries: JsonObject[] = [];
    for (const entry of this.pi.branch()) {
      const messageId = entryMessageId(entry);
      if (messageId !== null && known.has(messageId)) entries.push({ messageId, entryId: entry.id });
    }
    // Absence proves something only when Pi is idle AND every turn it ran is settled
    // (an idle report would otherwise close an ended turn as lost before its end).
    const idle = this.pi.isIdle() && this.turns.length === 0;
    this.branchDirty = false;
    const response = await this.link.request("workflowMessage.reportBranch", {
      sessionId: this.sessionId,
      entries: entries.slice(0, 256),
      isIdle: idle,
      hasPendingMessages: this.pi.hasPendingMessages(),
    });
    if (!accepted(response)) return false; // fenced or refused: the next view decides
    this.branchReported = true;
    for (const item of entries) {
      const sent = this.queued.get(String(item.messageId));
      if (sent !== undefined) sent.confirmed = true; // the server recorded its entry
    }
    return true;
  }

  /** The newest message this coordinator sent whose entry is not confirmed yet. */
  private lastUnconfirmedSend(): string | null {
    let last: string | null = null;
    for (const [messageId, sent] of this.queued) if (!sent.confirmed && TURN_KINDS.has(sent.kind)) last = messageId;
    return last;
  }

  /** The latest sent message that can hold a turn, per the view's window. */
  private latestSentTurnMessage(): JsonObject | null {
    let latest: JsonObject | null = null;
    for (const item of this.windowItems()) {
      if (item.state === "sent" && TURN_KINDS.has(String(item.kind))) latest = item;
    }
    return latest;
  }

  private bind(turn: Turn): "bound" | "wait" | "none" {
    if (turn.messageId !== null) return "bound";
    if (turn.awaiting !== null) {
      const sent = this.queued.get(turn.awaiting);
      if (sent !== undefined && !sent.confirmed) {
        // Its entry is not reported yet: report it first once it is on the branch.
        if (this.branchHas(turn.awaiting)) this.branchDirty = true;
        return "wait";
      }
      if (sent !== undefined) {
        turn.messageId = turn.awaiting;
        turn.runId = sent.runId;
        return "bound";
      }
    }
    const latest = this.latestSentTurnMessage();
    if (latest === null) return "none";
    turn.messageId = String(latest.messageId);
    turn.runId = String(latest.runId);
    return "bound";
  }

  /** Report buffered turn starts and ends in order; false: stop here for now. */
  private async flushTurns(): Promise<boolean> {
    try {
      return await this.reportTurns();
    } finally {
      this.settleTurnWaiters(); // a start accepted, or a turn dropped as not workflow work
    }
  }

  private async reportTurns(): Promise<boolean> {
    while (this.turns.length > 0) {
      const turn = this.turns[0]!;
      const bound = this.bind(turn);
      if (bound === "wait") return true; // the send's entry is not on the branch yet
      if (bound === "none") {
        this.turns.shift(); // no workflow message could own it: an ordinary turn
        continue;
      }
      if (!turn.startAccepted) {
        const receipt = await this.reportTurn(turn, "started");
        if (receipt === null) return false;
        if (receipt.ownership !== "active") {
          this.turns.shift(); // absent or settled: not (or no longer) workflow work
          continue;
        }
        turn.startAccepted = true;
        turn.visibleReply = receipt.visibleReply === true;
      }
      const recorded = await this.flushRecording(turn);
      if (recorded === "fenced") return false;
      // The end goes after the capture's last batch (a messageEnd may wait for its entry).
      if (turn.end === null || recorded === "wait") return true; // still running
      const receipt = await this.reportTurn(turn, "ended");
      if (receipt === null) return false;
      this.turns.shift();
    }
    return true;
  }

  /**
   * Send the turn's recorded events that are due, batch by batch. `wait`: a batch waits
   * for Pi's entry (a timer pumps again); `fenced`: keep them for a later epoch.
   */
  private async flushRecording(turn: Turn): Promise<"done" | "wait" | "fenced"> {
    const recording = turn.recording;
    if (recording !== null && !recording.ripe(RECORD_FLUSH_MS)) {
      if (recording.due) this.flushSoon(); // a running turn's events wait a little
      return "done";
    }
    while (recording !== null && recording.due) {
      const batch = recording.nextBatch(this.pi.branch());
      if (batch === null) {
        this.flushSoon();
        return "wait";
      }
      const payload: JsonObject = { sessionId: this.sessionId, turnId: turn.turnId, messageId: turn.messageId!, events: batch.events };
      if (batch.final !== undefined) payload.final = batch.final;
      let response: ResponseMessage;
      try {
        response = await this.link.request("sessionEvents.record", payload, { runId: turn.runId! });
      } catch (error) {
        if (!(error instanceof LinkLostError)) {
          recording.abandon(); // a batch that cannot be encoded: never take Pi down for it
          continue;
        }
        recording.unsent(); // the connection closed: the next epoch sends it again
        throw error;
      }
      if (accepted(response)) {
        recording.stored();
      } else if (response.outcome === "claimLost") {
        recording.unsent();
        return "fenced";
      } else {
        recording.abandon(); // refused for good (the server names why in its answer)
      }
    }
    return "done";
  }

  private async reportTurn(turn: Turn, phase: "started" | "ended"): Promise<JsonObject | null> {
    const payload: JsonObject = { sessionId: this.sessionId, messageId: turn.messageId!, turnId: turn.turnId, phase };
    if (phase === "ended") {
      payload.stopReason = turn.end!.stopReason;
      payload.responseEntryId = turn.end!.responseEntryId;
      const text = turn.end!.text;
      if (turn.visibleReply && turn.end!.stopReason === "completed" && text !== null) {
        // An assistant-message step's output: only sent when the server asked for it.
        const reply = boundedReply(text);
        payload.assistantText = reply.text;
        if (reply.cut) payload.assistantTextCut = true;
      }
    }
    const response = await this.link.request("workflowTurn.report", payload, { runId: turn.runId! });
    if (response.outcome === "conflict" || response.outcome === "rejected") {
      return { ownership: "absent" }; // a report the server will never take: drop it
    }
    if (!accepted(response)) return null; // fenced: keep it for a later epoch
    const receipt = response.receipt ?? {};
    this.events.onTurnReceipt?.(turn.turnId, receipt);
    return receipt;
  }

  private lastAssistantEntry(): string | null {
    const branch = this.pi.branch();
    for (let index = branch.length - 1; index >= 0; index -= 1) {
      const entry = branch[index]!;
      if (entry.type === "message" && entry.message?.role === "assistant") return entry.id;
      if (entryMessageId(entry) !== null) return null; // nothing after the workflow message
    }
    return null;
  }

  private branchHas(messageId: string): boolean {
    return this.pi.branch().some((entry) => entryMessageId(entry) === messageId);
  }

  /**
   * The message's content value: inline, or a referenced value once loaded and checked
   * against its digest (undefined until then; the load pumps again when done).
   */
  private contentOf(messageId: string, runId: string, content: JsonValue | undefined): JsonValue | undefined {
    if (!isObject(content)) return undefined;
    if ("value" in content) return content.value ?? null;
    if (this.contents.has(messageId)) return this.contents.get(messageId);
    const ref = content.ref;
    if (!isObject(ref) || typeof ref.digest !== "string" || typeof ref.mediaType !== "string") return undefined;
    if (!this.loading.has(messageId)) {
      this.loading.add(messageId);
      void this.load(runId, ref.digest, ref.mediaType)
        .then((loaded) => {
          if (loaded !== undefined) this.contents.set(messageId, loaded);
        })
        .catch(() => undefined) // a lost connection: the next view loads it again
        .finally(() => {
          this.loading.delete(messageId);
          this.pump();
        });
    }
    return undefined;
  }

  /** `view.content` chunks of one reference, assembled and verified. */
  private async load(runId: string, digest: string, mediaType: string): Promise<JsonValue | undefined> {
    const chunks: Buffer[] = [];
    let offset = 0;
    for (;;) {
      const response = await this.link.request("view.content", { digest, mediaType, offset }, { runId });
      if (!accepted(response)) return undefined;
      const receipt = response.receipt ?? {};
      chunks.push(Buffer.from(String(receipt.data ?? ""), "base64"));
      if (typeof receipt.nextOffset !== "number") break;
      offset = receipt.nextOffset;
    }
    const bytes = Buffer.concat(chunks);
    if (`sha256:${createHash("sha256").update(bytes).digest("hex")}` !== digest) return undefined;
    return JSON.parse(bytes.toString("utf8")) as JsonValue;
  }

  /** Send the view's next message if every condition holds (synchronous to the call). */
  private maybeSend(): void {
    const next = this.view?.nextMessage;
    if (!isObject(next) || typeof next.messageId !== "string") return;
    const messageId = next.messageId;
    if (this.queued.has(messageId)) return;
    const value = this.contentOf(messageId, String(next.runId), next.content);
    if (value === undefined) return; // a referenced content still loading (or unavailable)
    if (this.branchHas(messageId)) {
      this.branchDirty = true; // on the branch already: report it, never send it again
      this.again = true;
      return;
    }
    const kind = String(next.kind);
    const runId = String(next.runId);
    const text = messageText(kind, value);
    const reason = typeof next.reason === "string" ? next.reason : null;
    // The final check and the send, with no await between them.
    if (
      this.stopped ||
      !this.isCoordinator ||
      !this.pi.isIdle() ||
      this.pi.hasPendingMessages() ||
      this.queued.has(messageId) ||
      this.branchHas(messageId)
    ) {
      return;
    }
    this.queued.set(messageId, { runId, kind, confirmed: false });
    const details: JsonObject = { messageId, runId, kind, sourceId: String(next.sourceId) };
    if (reason !== null) details.reason = reason;
    const contract = isObject(value) ? value.contract : undefined;
    if (isObject(contract) && typeof contract.step === "string" && typeof contract.attempt === "string") {
      // The workflow tool finds the step's request from this entry (hidden from the model).
      details.step = contract.step;
      details.attempt = contract.attempt;
    }
    this.pi.send({ customType: MESSAGE_TYPE, content: text, display: true, details }, TURN_KINDS.has(kind));
    this.events.onSent?.(messageId);
    if (!TURN_KINDS.has(kind)) {
      // A passive message (decision, notification) is appended at once and starts no
      // turn, and Pi emits its message_end to RPC listeners only, never to extensions:
      // report the branch now, or its entry waits for an unrelated turn's end.
      this.branchDirty = true;
      this.pumpSoon();
    }
  }
}
