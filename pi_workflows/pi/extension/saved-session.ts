/**
 * A run's origin session must be one Pi can reopen (workflow-server.md § Interactive Pi
 * execution): Pi writes a session file only once the session holds an assistant message
 * (docs/session-format.md; `SessionManager` defers every entry until then), so a run
 * started right after `/new` would name a session that a killed Pi never saved.
 *
 * Pi has no "save now"; its documented way to write a session is a `SessionManager`. For
 * an unsaved session the extension replaces it, through `ctx.newSession({setup})`, with
 * a new one that carries the same entries and one marker message Pi saves at once: an
 * assistant message with `stopReason: "aborted"` and no content, which Pi shows as a
 * one-line note and never sends to the model (pi-ai skips aborted assistant messages)
 * nor counts for usage or compaction. Then the run starts with that session as its
 * origin. These helpers are pure, apart from the file check.
 */

import { existsSync } from "node:fs";

import type { SessionEntry, SessionManager } from "@mariozechner/pi-coding-agent";

/** The model fields of the marker (the session's current model, if it has one). */
export interface MarkerModel {
  api: string;
  provider: string;
  id: string;
}

export type Marker = Parameters<SessionManager["appendMessage"]>[0];

/** What the marker shows in Pi (one line; the model never sees it). */
export const MARKER_NOTE = "Session saved by pi-workflows so that a workflow run can come back to it (not a model reply).";

/** Whether Pi has the session on disk: `saved`, `unsaved` (no file yet), or `ephemeral`. */
export function sessionState(file: string | undefined): "saved" | "unsaved" | "ephemeral" {
  if (file === undefined) return "ephemeral";
  return existsSync(file) ? "saved" : "unsaved";
}

/** The marker message that makes Pi write the session file. */
export function savedMarker(model: MarkerModel | undefined, now: number = Date.now()): Marker {
  const zero = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 };
  return {
    role: "assistant",
    content: [],
    api: model?.api ?? "pi-workflows",
    provider: model?.provider ?? "pi-workflows",
    model: model?.id ?? "pi-workflows",
    usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: zero },
    stopReason: "aborted",
    errorMessage: MARKER_NOTE,
    timestamp: now,
  } as Marker;
}

/**
 * Append the entries of the unsaved session's branch to the new session, in order:
 * messages, extension messages and entries, model and thinking changes, the name.
 * `skip` names custom entry types that must not follow (the run entry of an older run:
 * the new session is its own origin). Labels, summaries and compactions need an
 * assistant reply first, so an unsaved session has none.
 */
export function carryEntries(target: SessionManager, entries: readonly SessionEntry[], skip: ReadonlySet<string>): void {
  for (const entry of entries) {
    switch (entry.type) {
      case "message":
        target.appendMessage(entry.message as Marker);
        break;
      case "custom_message":
        target.appendCustomMessageEntry(entry.customType, entry.content, entry.display, entry.details);
        break;
      case "custom":
        if (!skip.has(entry.customType)) target.appendCustomEntry(entry.customType, entry.data);
        break;
      case "model_change":
        target.appendModelChange(entry.provider, entry.modelId);
        break;
      case "thinking_level_change":
        target.appendThinkingLevelChange(entry.thinkingLevel);
        break;
      case "session_info":
        if (entry.name) target.appendSessionInfo(entry.name);
        break;
      default:
        break;
    }
  }
}

const SHELL_SAFE = /^[A-Za-z0-9_./@%+=:,-]+$/;

/** `path` as one shell word. */
export function shellWord(path: string): string {
  return SHELL_SAFE.test(path) ? path : `'${path.replaceAll("'", "'\\''")}'`;
}

/**
 * The start notice's second line: the exact command that reopens the run's origin
 * session; for a session Pi saves only when the running model reply ends (`saved`
 * false), that and the way out if Pi exits first; for a session Pi never saves (`pi
 * --no-session`), the two ways out.
 */
export function reopenHint(file: string | undefined, runId: string, saved: boolean = true): string {
  if (file === undefined) {
    return (
      "This Pi session is not saved (pi --no-session): if Pi exits, take the run over with " +
      `/workflow adopt ${runId} in another Pi session, or run it without Pi: pi-workflows run resume ${runId} --headless`
    );
  }
  const reopen = `pi --session ${shellWord(file)}`;
  if (!saved) {
    return (
      `Pi saves this session when the model's reply ends; then reopen it with: ${reopen} ` +
      `(if Pi exits before that, take the run over with /workflow adopt ${runId} in another Pi session)`
    );
  }
  return `If Pi exits, reopen this session with: ${reopen}`;
}
