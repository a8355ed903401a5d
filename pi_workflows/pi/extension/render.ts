/**
 * Text for the widget, the status line and command output, from the server's views.
 *
 * Only the server computes a run's status (client-protocol.md § Run and session views):
 * everything shown here is copied from the view's `display` object (status, current node
 * or waiting node, reason, controls), never derived from other fields.
 */

import type { JsonValue } from "../common/canonical.ts";

export const WIDGET_KEY = "pi-workflows";
export const STATUS_KEY = "pi-workflows";

type JsonObject = { [key: string]: JsonValue };

export interface Display {
  status: string;
  controls: string[];
  next: string[];
  parked: boolean;
  currentNode?: string;
  waitingOn?: string;
  reason?: string;
  reasonText?: string;
  action?: string;
  question?: string;
  choices: { id: string; input?: string }[];
}

function isObject(value: JsonValue | undefined): value is JsonObject {
  return value !== null && value !== undefined && typeof value === "object" && !Array.isArray(value);
}

function text(value: JsonValue | undefined): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

function names(value: JsonValue | undefined): string[] {
  return Array.isArray(value) ? value.filter((c): c is string => typeof c === "string") : [];
}

/** The `display` object of a run view or run-list item (null when it has none). */
export function displayOf(view: JsonValue | undefined): Display | null {
  if (!isObject(view) || !isObject(view.display)) return null;
  const display = view.display;
  const status = text(display.status);
  if (status === undefined) return null;
  const choices = Array.isArray(display.choices)
    ? display.choices.filter(isObject).map((c) => ({ id: String(c.id ?? ""), ...(text(c.input) ? { input: text(c.input) } : {}) }))
    : [];
  const shown: Display = { status, controls: names(display.controls), next: names(display.next), parked: display.parked === true, choices };
  for (const key of ["currentNode", "waitingOn", "reason", "reasonText", "action", "question"] as const) {
    const value = text(display[key]);
    if (value !== undefined) shown[key] = value;
  }
  return shown;
}

/** Stands for the answer a person types in an advised `/workflow answer` (the one word
 * of an advised command not typed as shown). */
export const ANSWER_PLACEHOLDER = "JSON";

/** A waiting decision's first choice as an answer, or the placeholder. */
function decisionExample(display: Display): string {
  const first = display.choices[0];
  if (first === undefined || first.id === "") return ANSWER_PLACEHOLDER;
  const value: { [key: string]: JsonValue } = { choice: first.id };
  if (first.input) value.input = { [first.input]: "..." };
  return JSON.stringify(value);
}

/**
 * Pi's command for each step a view advises or allows (`display.next`, `display.controls`):
 * the one table from a server name to what a person types here. A step Pi cannot perform
 * (an effect's recovery, the run's log, the state check: the CLI's) and the model's own
 * `submit` and `update` have none and are not shown, so no internal name reaches a person.
 */
export const PI_COMMANDS: { readonly [step: string]: ((runId: string, display: Display) => string) | undefined } = {
  pause: (runId) => `/workflow pause ${runId}`,
  resume: (runId) => `/workflow resume ${runId}`,
  cancel: (runId) => `/workflow cancel ${runId}`,
  restart: (runId) => `/workflow restart ${runId}`,
  answer: (runId) => `/workflow answer ${runId} ${ANSWER_PLACEHOLDER}`,
  "human-answer": (runId, display) => `/workflow answer ${runId} ${decisionExample(display)}`,
  show: (runId) => `/workflow status ${runId}`,
  review: (runId) => `/workflow status ${runId}`,
};

/** What a placeholder of an advised command means, shown once beside it. */
const NOTES: { readonly [step: string]: string | undefined } = {
  answer: `${ANSWER_PLACEHOLDER}: the answer, as the checkpoint asks`,
};

export interface PiAdvice {
  /** The server's words (they name no command). */
  action?: string;
  /** The advised steps' commands, in order. */
  commands: string[];
  /** What a placeholder means. */
  notes: string[];
  /** The commands of the other controls allowed now. */
  also: string[];
}

/** The view's advice as `/workflow` commands: `next` in order, then the other controls. */
export function adviceOf(runId: string, display: Display): PiAdvice {
  const commands: string[] = [];
  const notes: string[] = [];
  const also: string[] = [];
  const add = (step: string, into: string[]): void => {
    const make = PI_COMMANDS[step];
    if (make === undefined) return;
    const command = make(runId, display);
    if (commands.includes(command) || also.includes(command)) return;
    into.push(command);
    const note = NOTES[step];
    if (note !== undefined && !notes.includes(note)) notes.push(note);
  };
  for (const step of display.next) add(step, commands);
  for (const control of display.controls) if (!display.next.includes(control)) add(control, also);
  return { ...(display.action ? { action: display.action } : {}), commands, notes, also };
}

/** The advice as lines: the words, one command a line, then the other commands. */
function adviceLines(advice: PiAdvice): string[] {
  const lines: string[] = [];
  if (advice.action) lines.push(`what to do: ${firstLine(advice.action)}`);
  lines.push(...advice.commands.map((command) => `  ${command}`));
  lines.push(...advice.notes.map((note) => `  (${note})`));
  if (advice.also.length) lines.push("allowed now:", ...advice.also.map((command) => `  ${command}`));
  return lines;
}

/** The status as shown: `queued (parked)` for a run held until someone resumes it. */
export function statusWords(display: Display): string {
  return display.parked ? `${display.status} (parked)` : display.status;
}

/** Where the run is, and what its checkpoint or decision asks. */
function placeLines(display: Display): string[] {
  const lines: string[] = [];
  if (display.currentNode) lines.push(`at node: ${display.currentNode}`);
  else if (display.waitingOn) lines.push(`waiting on: ${display.waitingOn}`);
  if (display.question) lines.push(`question: ${firstLine(display.question)}`);
  if (display.choices.length) lines.push(`choices: ${display.choices.map((c) => c.id).join(", ")}`);
  return lines;
}

function firstLine(value: string, limit = 200): string {
  const line = value.split("\n", 1)[0] ?? "";
  return line.length > limit ? `${line.slice(0, limit - 1)}…` : line;
}

/** At most this many lines of a reason in the widget (the widget scrolls over them). */
export const REASON_LINES = 40;

/** The reason as widget lines: every line (bounded), the first one labelled. */
function reasonLines(display: Display): string[] {
  const reason = display.reasonText ?? display.reason;
  if (!reason) return [];
  const lines = reason.split("\n").filter((line, index) => index === 0 || line.trim() !== "");
  const shown = lines.slice(0, REASON_LINES).map((line, index) => (index === 0 ? `reason: ${firstLine(line)}` : `  ${firstLine(line)}`));
  if (lines.length > REASON_LINES) shown.push(`  … ${lines.length - REASON_LINES} more lines: /workflow status`);
  return shown;
}

/** The widget's line for `/piw`, shown only where it opens the viewer itself (inside tmux). */
export const PIW_LINE = "watch it: /piw (opens piw in a new tmux window)";

/**
 * The widget's full text for a run view (render it through widget.ts's window, which
 * keeps this first line, with the run ID, on screen): the status line, where the run is
 * and what it asks, what to do with each advised `/workflow` command and the other
 * commands allowed now, so they stay in the first window, `/piw` when `piwOpens` (it can
 * open the viewer here), then the whole reason.
 */
export function widgetText(view: JsonValue, piwOpens = false): string[] | undefined {
  const display = displayOf(view);
  if (display === null || !isObject(view)) return undefined;
  const name = text(view.workflow) ?? "workflow";
  const runId = text(view.runId) ?? "";
  const lines = [`workflow ${name} ${runId}: ${statusWords(display)}`, ...placeLines(display)];
  lines.push(...adviceLines(adviceOf(runId, display)));
  if (piwOpens) lines.push(PIW_LINE);
  return [...lines, ...reasonLines(display)];
}

/** The status line for a run view. */
export function statusText(view: JsonValue): string | undefined {
  const display = displayOf(view);
  if (display === null || !isObject(view)) return undefined;
  const where = display.currentNode ?? display.waitingOn;
  return `workflow ${text(view.workflow) ?? ""}: ${statusWords(display)}${where ? ` (${where})` : ""}`;
}

/** At most this many lines of a failed attempt's traceback in `/workflow status`. */
export const TRACEBACK_LINES = 40;

/** The newest failed attempt of the view's trace: its node, error and traceback. */
function failureLines(view: JsonObject): string[] {
  const trace = isObject(view.trace) ? view.trace : {};
  const items = Array.isArray(trace.items) ? trace.items.filter(isObject) : [];
  const failed = [...items].reverse().find((item) => item.outcome === "failed" || item.outcome === "timed_out");
  if (failed === undefined) return [];
  const lines = [`failed attempt: ${text(failed.node) ?? "?"} (visit ${String(failed.visit)}, attempt ${String(failed.attempt)})`];
  const error = text(failed.error);
  if (error) lines.push(`error: ${firstLine(error, 1000)}`);
  const traceback = isObject(failed.traceback) ? failed.traceback : null;
  const body = traceback === null ? undefined : text(traceback.text);
  if (body !== undefined) {
    const all = body.replace(/\n+$/, "").split("\n");
    lines.push("traceback:", ...all.slice(-TRACEBACK_LINES).map((line) => `  ${line}`));
    if (all.length > TRACEBACK_LINES) lines.push(`  (its last ${TRACEBACK_LINES} of ${all.length} lines)`);
  } else if (traceback !== null && isObject(traceback.ref)) {
    lines.push(`traceback: ${String(traceback.ref.byteCount)} bytes, too long to show here`);
  }
  return lines;
}

/** `/workflow status`: a run view as a few lines, with what to do and, for a
 * failed run, the failed attempt's error and traceback. */
export function statusReport(view: JsonValue): string {
  const display = displayOf(view);
  if (display === null || !isObject(view)) return "The server sent a run view without a display.";
  const runId = text(view.runId) ?? "?";
  const head = `${runId}  ${statusWords(display)}  ${text(view.workflow) ?? ""}`;
  const reason = display.reasonText ?? display.reason;
  const lines = [head, ...placeLines(display)];
  if (reason) lines.push(`reason: ${firstLine(reason)}`);
  lines.push(...adviceLines(adviceOf(runId, display)), ...failureLines(view));
  if (typeof view.revision === "number") lines.push(`revision ${view.revision}`);
  return lines.join("\n");
}

/** `/workflow list`: one line per run-list item, newest first, with the node it is at. */
export function listReport(items: readonly JsonValue[], more: boolean): string {
  if (items.length === 0) return "No workflow runs yet. Start one with /workflow start NAME [JSON].";
  const lines = items.map((item) => {
    const display = displayOf(item);
    const object = isObject(item) ? item : {};
    const where = display?.currentNode ?? display?.waitingOn;
    const status = display === null ? "?" : statusWords(display);
    return `${text(object.runId) ?? "?"}  ${status}  ${text(object.workflow) ?? ""}${where ? `  at ${where}` : ""}`;
  });
  if (more) lines.push("… older runs: pi-workflows run list");
  return lines.join("\n");
}
