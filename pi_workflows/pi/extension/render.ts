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
  currentNode?: string;
  waitingOn?: string;
  reason?: string;
  reasonText?: string;
  action?: string;
}

function isObject(value: JsonValue | undefined): value is JsonObject {
  return value !== null && value !== undefined && typeof value === "object" && !Array.isArray(value);
}

function text(value: JsonValue | undefined): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

/** The `display` object of a run view or run-list item (null when it has none). */
export function displayOf(view: JsonValue | undefined): Display | null {
  if (!isObject(view) || !isObject(view.display)) return null;
  const display = view.display;
  const status = text(display.status);
  if (status === undefined) return null;
  const controls = Array.isArray(display.controls) ? display.controls.filter((c): c is string => typeof c === "string") : [];
  const shown: Display = { status, controls };
  for (const key of ["currentNode", "waitingOn", "reason", "reasonText", "action"] as const) {
    const value = text(display[key]);
    if (value !== undefined) shown[key] = value;
  }
  return shown;
}

/** One line: where the run is and why, from the display. */
function whereAndWhy(display: Display): string[] {
  const lines: string[] = [];
  if (display.currentNode) lines.push(`at node: ${display.currentNode}`);
  else if (display.waitingOn) lines.push(`waiting on: ${display.waitingOn}`);
  const reason = display.reasonText ?? display.reason;
  if (reason) lines.push(`reason: ${firstLine(reason)}`);
  if (display.action) lines.push(`action: ${firstLine(display.action)}`);
  return lines;
}

function firstLine(value: string, limit = 200): string {
  const line = value.split("\n", 1)[0] ?? "";
  return line.length > limit ? `${line.slice(0, limit - 1)}…` : line;
}

function controlsLine(display: Display): string {
  return display.controls.length ? `controls: ${display.controls.join(", ")}` : "controls: none";
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

/**
 * The widget's full text for a run view (render it through widget.ts's window): the
 * status line, where the run is, its controls and action first, so they stay in the
 * first window, then the whole reason.
 */
export function widgetText(view: JsonValue): string[] | undefined {
  const display = displayOf(view);
  if (display === null || !isObject(view)) return undefined;
  const name = text(view.workflow) ?? "workflow";
  const runId = text(view.runId) ?? "";
  const lines = [`workflow ${name} ${runId}: ${display.status}`];
  if (display.currentNode) lines.push(`at node: ${display.currentNode}`);
  else if (display.waitingOn) lines.push(`waiting on: ${display.waitingOn}`);
  lines.push(controlsLine(display));
  if (display.action) lines.push(`action: ${firstLine(display.action)}`);
  return [...lines, ...reasonLines(display)];
}

/** The status line for a run view. */
export function statusText(view: JsonValue): string | undefined {
  const display = displayOf(view);
  if (display === null || !isObject(view)) return undefined;
  const where = display.currentNode ?? display.waitingOn;
  return `workflow ${text(view.workflow) ?? ""}: ${display.status}${where ? ` (${where})` : ""}`;
}

/** `/workflow status` and `/piw`: a run view as a few lines. */
export function statusReport(view: JsonValue): string {
  const display = displayOf(view);
  if (display === null || !isObject(view)) return "The server sent a run view without a display.";
  const head = `${text(view.runId) ?? "?"}  ${display.status}  ${text(view.workflow) ?? ""}`;
  const revision = typeof view.revision === "number" ? [`revision ${view.revision}`] : [];
  return [head, ...whereAndWhy(display), controlsLine(display), ...revision].join("\n");
}

/** `/workflow list`: one line per run-list item, newest first. */
export function listReport(items: readonly JsonValue[], more: boolean): string {
  if (items.length === 0) return "No workflow runs yet. Start one with /workflow start NAME [JSON].";
  const lines = items.map((item) => {
    const display = displayOf(item);
    const object = isObject(item) ? item : {};
    const where = display?.currentNode ?? display?.waitingOn;
    return `${text(object.runId) ?? "?"}  ${display?.status ?? "?"}  ${text(object.workflow) ?? ""}${where ? `  at ${where}` : ""}`;
  });
  if (more) lines.push("… older runs: pi-workflows run list");
  return lines.join("\n");
}
