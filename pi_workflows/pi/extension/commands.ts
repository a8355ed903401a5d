/**
 * Parsing `/workflow` arguments. Pure functions: no I/O, so node's test runner covers them
 * (`answerRun` does its I/O through the `call` it is given).
 */

import type { JsonValue } from "../common/canonical.ts";
import { canonicalText } from "../common/canonical.ts";

export const USAGE = [
  "Usage:",
  "  /workflow start NAME [JSON]      start a workflow run in this project",
  "  /workflow list                   the newest runs",
  "  /workflow status [RUN_ID]        one run (default: the run this session started)",
  "  /workflow pause|resume|cancel [RUN_ID]",
  "  /workflow restart [RUN_ID]       run a finished run again from the start, with its current source",
  "  /workflow answer [RUN_ID] JSON   answer the checkpoint or decision the run waits at",
  "  /workflow followup [RUN_ID] TEXT  a request for the model once the run has finished",
  "  /workflow clear                  remove the finished run from this session's view",
  "  /workflow adopt RUN_ID           take over a run whose own Pi session cannot come back",
  "  /piw [split] [RUN_ID]            watch the run in piw: a new tmux window (or a split), else the command to run",
  "  /resource-manager help           resources of resource managers: list, get, apply, reconcile, delete",
].join("\n");

export type Parsed =
  | { kind: "start"; workflow: string; input: JsonValue }
  | { kind: "list" }
  | { kind: "clear" }
  | { kind: "status" | "pause" | "resume" | "cancel" | "restart"; runId: string | null }
  | { kind: "answer"; runId: string | null; answer: JsonValue }
  | { kind: "followup"; runId: string | null; text: string }
  | { kind: "adopt"; runId: string }
  | { kind: "help" }
  | { kind: "error"; message: string };

const RUN_ID = /^run-[A-Za-z0-9_-]+$/;

function splitFirst(text: string): [string, string] {
  const trimmed = text.trim();
  const space = trimmed.search(/\s/);
  return space < 0 ? [trimmed, ""] : [trimmed.slice(0, space), trimmed.slice(space + 1).trim()];
}

/** `/workflow ARGS` as a command. */
export function parseWorkflowArgs(args: string): Parsed {
  const [sub, rest] = splitFirst(args);
  switch (sub) {
    case "":
    case "help":
      return { kind: "help" };
    case "start": {
      const [workflow, json] = splitFirst(rest);
      if (!workflow) return { kind: "error", message: "Name the workflow: /workflow start NAME [JSON]." };
      if (!json) return { kind: "start", workflow, input: {} };
      const input = parseInput(json, "workflow input", '{"name": "Ada"}');
      return "message" in input ? input : { kind: "start", workflow, input: input.value };
    }
    case "list":
      return rest ? { kind: "error", message: "/workflow list takes no arguments." } : { kind: "list" };
    case "clear":
      return rest ? { kind: "error", message: "/workflow clear takes no arguments." } : { kind: "clear" };
    case "status":
    case "pause":
    case "resume":
    case "cancel":
    case "restart": {
      if (!rest) return { kind: sub, runId: null };
      if (!RUN_ID.test(rest)) return { kind: "error", message: `/workflow ${sub} takes one run ID (run-…), or none for this session's run.` };
      return { kind: sub, runId: rest };
    }
    case "answer": {
      let [first, json] = splitFirst(rest);
      let runId: string | null = null;
      if (RUN_ID.test(first)) runId = first;
      else json = rest;
      if (!json) return { kind: "error", message: 'Give the answer as JSON: /workflow answer {"approved": true} (a decision: {"choice": "approve"}).' };
      const answer = parseInput(json, "answer", '{"approved": true}');
      return "message" in answer ? answer : { kind: "answer", runId, answer: answer.value };
    }
    case "followup": {
      const [first, remainder] = splitFirst(rest);
      const runId = RUN_ID.test(first) ? first : null;
      const text = runId === null ? rest : remainder;
      if (!text) return { kind: "error", message: "Give the follow-up text: /workflow followup Now write the changelog." };
      return { kind: "followup", runId, text };
    }
    case "adopt":
      if (!RUN_ID.test(rest)) return { kind: "error", message: "Name the run to adopt: /workflow adopt RUN_ID (see /workflow list)." };
      return { kind: "adopt", runId: rest };
    default:
      return { kind: "error", message: `Unknown /workflow command "${sub.slice(0, 40)}".\n${USAGE}` };
  }
}

/** JSON the user typed; the value must have a canonical form (no 1e400). */
function parseInput(text: string, what: string, example: string): { value: JsonValue } | { kind: "error"; message: string } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { kind: "error", message: `The ${what} is not valid JSON; pass a value such as ${example}.` };
  }
  try {
    canonicalText(value);
  } catch {
    return { kind: "error", message: `The ${what} has no JSON form the server accepts (a number out of range?).` };
  }
  return { value: value as JsonValue };
}

type JsonObject = { [key: string]: JsonValue };

/** How `answerRun` sends one command (`ServerClient.call`). */
export type AnswerCall = (
  operation: string,
  payload: JsonObject,
  options: { runId: string },
) => Promise<{ receipt: JsonObject }>;

/** The refusal `run.answer` gives when the run waits at a protected human decision. */
export const PROTECTED_DECISION = "protectedDecision";

function refusalCode(error: unknown): string | null {
  const response = (error as { response?: { error?: { code?: unknown } } } | null)?.response;
  const code = response?.error?.code;
  return typeof code === "string" ? code : null;
}

/**
 * `/workflow answer`: a person's answer. An ordinary checkpoint takes `run.answer`; the
 * server refuses that for a protected human decision (`protectedDecision`), which a
 * person answers with `decision.answer` from this session (source channel `pi`). The
 * model's `workflow` tool has no such path. `decision` says which one answered.
 */
export async function answerRun(
  call: AnswerCall,
  runId: string,
  answer: JsonValue,
): Promise<{ receipt: JsonObject; decision: boolean }> {
  try {
    const { receipt } = await call("run.answer", { answer }, { runId });
    return { receipt, decision: false };
  } catch (error) {
    if (refusalCode(error) !== PROTECTED_DECISION) throw error;
  }
  const { receipt } = await call("decision.answer", { answer, sourceChannel: "pi" }, { runId });
  return { receipt, decision: true };
}
