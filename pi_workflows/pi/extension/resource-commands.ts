/**
 * `/resource-manager`: parsing its arguments and the text of its answers, from the
 * server's `resourceManager.*` receipts. Pure functions (no I/O), so node's test runner
 * covers them; index.ts sends the requests. An error never repeats a spec value.
 */

import type { JsonValue } from "../common/canonical.ts";
import { canonicalText } from "../common/canonical.ts";
import { MAX_FRAME_BYTES } from "../common/protocol.ts";

export const RM_USAGE = [
  "Usage:",
  "  /resource-manager list [all]            resources of this project (all: of every project)",
  "  /resource-manager get MANAGER KEY       one resource: conditions, child runs, recent passes",
  "  /resource-manager apply MANAGER KEY JSON  create the resource in this project, or give it this spec",
  "  /resource-manager reconcile MANAGER KEY  ask for a reconcile pass now",
  "  /resource-manager delete MANAGER KEY    delete it (after its manager's cleanup pass, if it has finalizers)",
  "A manager is a NAME.resource_manager.py file in .pi/resource-managers/ of this project or of the agent dir.",
].join("\n");

/** Room kept in one request frame for the envelope, manager, key and project (as the CLI). */
const ENVELOPE_ROOM = 8192;
/** The largest spec `apply` sends, in bytes of canonical JSON: it travels in one frame. */
export const SPEC_SEND_LIMIT = MAX_FRAME_BYTES - ENVELOPE_ROOM;
/** The server's rules for a manager name and a key (domain/_resource_ops.py). */
const MANAGER_NAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;
const MAX_KEY_CHARS = 256;

export type ResourceTarget = { manager: string; key: string };

export type RmParsed =
  | { kind: "list"; all: boolean }
  | ({ kind: "get" | "reconcile" | "delete" } & ResourceTarget)
  | ({ kind: "apply"; spec: JsonValue } & ResourceTarget)
  | { kind: "help" }
  | { kind: "error"; message: string };

function splitFirst(text: string): [string, string] {
  const trimmed = text.trim();
  const space = trimmed.search(/\s/);
  return space < 0 ? [trimmed, ""] : [trimmed.slice(0, space), trimmed.slice(space + 1).trim()];
}

/** MANAGER KEY at the start of `rest`, and what follows them. */
function target(sub: string, rest: string, form: string): { target: ResourceTarget; tail: string } | { kind: "error"; message: string } {
  const [manager, afterManager] = splitFirst(rest);
  const [key, tail] = splitFirst(afterManager);
  if (!manager || !key) return { kind: "error", message: `Name the manager and the key: /resource-manager ${sub} ${form}.` };
  if (!MANAGER_NAME.test(manager)) {
    return { kind: "error", message: "A manager name is a letter or digit, then up to 127 letters, digits, '-' or '_'." };
  }
  if ([...key].length > MAX_KEY_CHARS) return { kind: "error", message: `A key is at most ${MAX_KEY_CHARS} characters.` };
  return { target: { manager, key }, tail };
}

/** The spec as typed: JSON with a canonical form, small enough for one request.
 * No message quotes the text: a spec may hold private values. */
export function parseSpec(text: string): { spec: JsonValue } | { kind: "error"; message: string } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { kind: "error", message: `The spec is not valid JSON; pass a value such as {"pr": 42}.` };
  }
  let canonical: string;
  try {
    canonical = canonicalText(value);
  } catch {
    return { kind: "error", message: "The spec has no JSON form the server accepts (a number out of range?)." };
  }
  const size = Buffer.byteLength(canonical, "utf8");
  if (size > SPEC_SEND_LIMIT) {
    return { kind: "error", message: `The spec is ${size} bytes of JSON; /resource-manager apply sends at most ${SPEC_SEND_LIMIT}.` };
  }
  return { spec: value as JsonValue };
}

/** `/resource-manager ARGS` as a command. */
export function parseResourceManagerArgs(args: string): RmParsed {
  const [sub, rest] = splitFirst(args);
  switch (sub) {
    case "":
    case "help":
      return { kind: "help" };
    case "list":
      if (rest === "") return { kind: "list", all: false };
      if (rest === "all") return { kind: "list", all: true };
      return { kind: "error", message: "/resource-manager list takes nothing, or all (every project's resources)." };
    case "get":
    case "reconcile":
    case "delete": {
      const found = target(sub, rest, "MANAGER KEY");
      if ("kind" in found) return found;
      if (found.tail) return { kind: "error", message: `/resource-manager ${sub} takes a manager and a key, nothing more.` };
      return { kind: sub, ...found.target };
    }
    case "apply": {
      const found = target(sub, rest, "MANAGER KEY JSON");
      if ("kind" in found) return found;
      if (!found.tail) return { kind: "error", message: 'Give the spec as JSON: /resource-manager apply MANAGER KEY {"pr": 42}.' };
      const spec = parseSpec(found.tail);
      return "kind" in spec ? spec : { kind: "apply", ...found.target, spec: spec.spec };
    }
    default:
      return { kind: "error", message: `Unknown /resource-manager command "${sub.slice(0, 40)}".\n${RM_USAGE}` };
  }
}

// --- text of the answers -------------------------------------------------------------------

type JsonObject = { [key: string]: JsonValue };

function isObject(value: JsonValue | undefined): value is JsonObject {
  return value !== null && value !== undefined && typeof value === "object" && !Array.isArray(value);
}

function objects(value: JsonValue | undefined): JsonObject[] {
  return Array.isArray(value) ? value.filter(isObject) : [];
}

function word(value: JsonValue | undefined, empty = "-"): string {
  return value === null || value === undefined || value === "" ? empty : String(value);
}

function firstLine(value: string, limit = 160): string {
  const line = value.split("\n", 1)[0] ?? "";
  return line.length > limit ? `${line.slice(0, limit - 1)}…` : line;
}

/** A server time (ms since the epoch) as UTC, as the CLI prints it. */
export function when(ms: JsonValue | undefined): string {
  if (typeof ms !== "number") return "-";
  return `${new Date(ms).toISOString().slice(0, 19).replace("T", " ")}Z`;
}

/** The `Ready` condition as `Ready=True (Reason)`, or that there is none yet. */
export function readyWords(conditions: JsonValue | undefined): string {
  const ready = objects(conditions).find((c) => c.type === "Ready");
  if (ready === undefined) return "Ready not reported";
  const reason = typeof ready.reason === "string" && ready.reason ? ` (${ready.reason})` : "";
  return `Ready=${word(ready.status, "?")}${reason}`;
}

/** Where the resource is in delivery: reconciling, queued (why, when) or settled; deleting. */
function deliveryWords(item: JsonObject, reconciling: boolean): string {
  let words: string;
  if (reconciling) words = "reconciling";
  else if (!isObject(item.queue)) words = "settled";
  else {
    const queue = item.queue;
    const retries = typeof queue.retries === "number" && queue.retries > 0 ? `, retry ${queue.retries}` : "";
    words = `queued (${word(queue.reason, "due")}) due ${when(queue.availableAt)}${retries}`;
  }
  return item.deletionRequestedAt !== null && item.deletionRequestedAt !== undefined ? `${words}, deleting` : words;
}

/** `/resource-manager list`: one line per resource (with its project when `all`). */
export function resourceListReport(receipt: JsonObject, all: boolean): string {
  const resources = objects(receipt.resources);
  if (resources.length === 0) {
    const where = all ? "" : " in this project";
    return `No resources${where}. Add one with /resource-manager apply MANAGER KEY JSON.`;
  }
  return resources
    .map((item) => {
      const project = all ? `  in ${word(item.project)}` : "";
      return (
        `${word(item.manager)}/${word(item.key)}  gen ${word(item.generation)} (observed ${word(item.observedGeneration)})  ` +
        `${readyWords(item.conditions)}  updated ${when(item.updatedAt)}  ${deliveryWords(item, item.reconciling === true)}${project}`
      );
    })
    .join("\n");
}

/** At most this many recent passes in `/resource-manager get` (the CLI shows them all). */
export const GET_PASSES = 5;

/** `/resource-manager get`: the resource's versions and delivery, its conditions, child
 * runs and its last passes. The spec and status are left to the CLI (they may be long). */
export function resourceReport(view: JsonObject): string {
  const resource = isObject(view.resource) ? view.resource : {};
  const lines = [
    `${word(resource.manager)}/${word(resource.key)}  gen ${word(resource.generation)} (observed ${word(resource.observedGeneration)})  version ${word(resource.resourceVersion)}`,
    `state: ${deliveryWords({ ...view, deletionRequestedAt: resource.deletionRequestedAt ?? null }, false)}`,
    `updated: ${when(resource.updatedAt)}`,
  ];
  const finalizers = Array.isArray(resource.finalizers) ? resource.finalizers.map(String) : [];
  if (finalizers.length) lines.push(`finalizers: ${finalizers.join(", ")}`);
  const conditions = objects(resource.conditions);
  lines.push(conditions.length ? "conditions:" : "conditions: none");
  for (const c of conditions) {
    const message = typeof c.message === "string" && c.message ? `: ${firstLine(c.message)}` : "";
    lines.push(`  ${word(c.type)}=${word(c.status)} ${word(c.reason)}${message}`);
  }
  const children = objects(view.childRuns);
  lines.push(children.length ? "child runs:" : "child runs: none");
  for (const child of children) lines.push(`  ${word(child.requestKey)}  ${word(child.runId)}  ${word(child.workflow)}  ${word(child.status)}`);
  const passes = objects(view.recentPasses);
  lines.push(passes.length ? `last passes (newest first):` : "last passes: none");
  for (const pass of passes.slice(0, GET_PASSES)) {
    const took = typeof pass.durationMs === "number" ? `  ${pass.durationMs} ms` : "";
    const why = pass.requeueReason ?? pass.errorClass;
    lines.push(`  ${when(pass.startedAt)}  gen ${word(pass.generation)}  ${word(pass.outcome)}${took}${why ? `  ${String(why)}` : ""}`);
  }
  if (passes.length > GET_PASSES) lines.push(`  … ${passes.length - GET_PASSES} more: pi-workflows resource-manager get`);
  return lines.join("\n");
}

/** `/resource-manager apply`'s receipt, as the CLI says it. */
export function applyReport(target: ResourceTarget, receipt: JsonObject): string {
  const change = receipt.created === true ? "created" : receipt.specChanged === true ? "new spec" : receipt.changed === true ? "updated" : "unchanged";
  return `${target.manager}/${target.key} generation ${word(receipt.generation)} version ${word(receipt.resourceVersion)} (${change})`;
}

/** `/resource-manager reconcile`'s receipt. */
export function reconcileReport(target: ResourceTarget, receipt: JsonObject): string {
  return `${target.manager}/${target.key} queued, due ${when(receipt.availableAt)}`;
}

/** `/resource-manager delete`'s receipt. */
export function deleteReport(target: ResourceTarget, receipt: JsonObject): string {
  if (receipt.removed === true) return `${target.manager}/${target.key} deleted`;
  const held = Array.isArray(receipt.finalizers) ? receipt.finalizers.map(String).join(", ") : "";
  return `${target.manager}/${target.key} is being deleted; waiting for its finalizers: ${held || "-"}`;
}
