/**
 * The model's `workflow` tool in an origin Pi session (workflow-server.md § Interactive
 * Pi execution): `submit` hands in the open agent step's output, `update` reports its
 * progress, and `answer` answers an ordinary checkpoint the session's run waits at.
 *
 * The step is found from the branch: the workflow message entry the coordinator sent
 * for that step and attempt carries (hidden from the model) the step's exact request ID
 * and run. Each call goes on the coordinator's own connection with the session's
 * coordinator authority (`sessionId`, `coordinatorEpoch`) and an idempotency key and
 * submission ID derived from the tool call, so a retry after a reconnect (a new request
 * ID, a newer epoch) adopts what the server stored. The server validates; a rejection
 * goes back to the model as the tool's error so it can correct itself. A protected
 * human decision is never answered here (the server refuses it): a person uses
 * `/workflow answer`.
 */

import { createHash } from "node:crypto";

import { canonicalText, type JsonValue } from "../common/canonical.ts";
import type { ResponseMessage } from "../common/protocol.ts";
import type { BranchEntry, WorkflowMessageCoordinator } from "./coordinator.ts";
import { entryMessageId } from "./coordinator.ts";
import { LinkLostError } from "./session-link.ts";

type JsonObject = { [key: string]: JsonValue };

export const TOOL_NAME = "workflow";
/** How long a call waits for the coordinator connection (a server restart). */
const CONNECT_WAIT_MS = 30_000;
/** How long a tool call waits for its own turn's start report (then it goes anyway). */
const TURN_REPORT_WAIT_MS = 10_000;
/** Transport attempts of one call (each after the connection is back). */
const ATTEMPTS = 5;

export interface ToolParams {
  action?: string;
  step?: string;
  attempt?: string;
  output?: unknown;
  update?: { type: string; key: string; data: JsonObject };
  answer?: unknown;
}

export interface ToolResult {
  content: { type: "text"; text: string }[];
  details: JsonObject;
  terminate?: boolean;
}

/** The tool's JSON Schema: one flat object, `action` required (providers reject unions). */
export const TOOL_PARAMETERS: JsonObject = {
  type: "object",
  properties: {
    action: {
      type: "string",
      enum: ["submit", "update", "answer"],
      description: "submit hands in the step's output; update reports progress; answer answers a checkpoint.",
    },
    step: { type: "string", description: "submit/update: the step id from the step contract." },
    attempt: { type: "string", description: "submit/update: the attempt id from the step contract." },
    output: { description: "submit: the step's result, as the contract's JSON Schema says." },
    update: {
      type: "object",
      description: "update: one progress record.",
      properties: { type: { type: "string" }, key: { type: "string" }, data: { type: "object" } },
      required: ["type", "key", "data"],
      additionalProperties: false,
    },
    answer: { description: "answer: the checkpoint's answer." },
  },
  required: ["action"],
  additionalProperties: false,
};

export const TOOL_DESCRIPTION =
  'Complete the workflow step this session presented: call with action "submit", the step and attempt ids from the step contract, and your output. ' +
  'Use action "update" with {type, key, data} to report progress, and action "answer" with an answer for a checkpoint the workflow waits at. ' +
  "The step is complete only after the tool accepts; if it reports a validation error, correct the output and call again.";

/** The step a workflow message entry on the branch presented. */
interface PresentedStep {
  requestId: string;
  runId: string;
}

/** The newest step message entry on the branch for `step` and `attempt`. */
export function presentedStep(branch: readonly BranchEntry[], step: string, attempt: string): PresentedStep | null {
  let found: PresentedStep | null = null;
  for (const entry of branch) {
    if (entryMessageId(entry) === null) continue;
    const details = entry.details as { kind?: unknown; step?: unknown; attempt?: unknown; sourceId?: unknown; runId?: unknown };
    if (details.kind !== "step" || details.step !== step || details.attempt !== attempt) continue;
    if (typeof details.sourceId === "string" && typeof details.runId === "string") {
      found = { requestId: details.sourceId, runId: details.runId };
    }
  }
  return found;
}

function digest(parts: JsonValue): string {
  return createHash("sha256").update(canonicalText(parts), "utf8").digest("hex");
}

/** The durable identity of one tool call: the same call always maps to the same keys. */
export function callIdentity(target: string, toolCallId: string): { idempotencyKey: string; submissionId: string } {
  const hash = digest(["pi-workflows.extension.tool-call", target, toolCallId]);
  return { idempotencyKey: `tool-call-${hash}`, submissionId: `submission-${hash.slice(0, 32)}` };
}

function text(value: string, details: JsonObject, terminate = false): ToolResult {
  const result: ToolResult = { content: [{ type: "text", text: value }], details };
  if (terminate) result.terminate = true;
  return result;
}

export class WorkflowTool {
  constructor(
    private readonly coordinator: () => WorkflowMessageCoordinator | null,
    private readonly branch: () => readonly BranchEntry[],
    private readonly onContinuation: (runId: string) => void,
  ) {}

  async execute(toolCallId: string, params: ToolParams, signal?: AbortSignal): Promise<ToolResult> {
    switch (params.action) {
      case "submit":
      case "update":
        return this.step(toolCallId, params, params.action, signal);
      case "answer":
        return this.answer(toolCallId, params, signal);
      default:
        throw new Error('action must be "submit", "update" or "answer".');
    }
  }

  private async step(toolCallId: string, params: ToolParams, action: "submit" | "update", signal?: AbortSignal): Promise<ToolResult> {
    if (typeof params.step !== "string" || typeof params.attempt !== "string") {
      throw new Error(`${action} needs the step and attempt ids from the step contract.`);
    }
    const presented = presentedStep(this.branch(), params.step, params.attempt);
    if (presented === null) {
      throw new Error(`No workflow step "${params.step}" with attempt "${params.attempt}" was presented in this session; use the ids from the newest step contract.`);
    }
    const { idempotencyKey, submissionId } = callIdentity(presented.requestId, toolCallId);
    let payload: JsonObject;
    if (action === "submit") {
      if (!Object.prototype.hasOwnProperty.call(params, "output")) throw new Error("submit needs an output (it may be null).");
      payload = { interactionId: presented.requestId, submissionId, value: (params.output ?? null) as JsonValue };
    } else {
      if (params.update === undefined) throw new Error("update needs an update {type, key, data}.");
      payload = { interactionId: presented.requestId, update: params.update as unknown as JsonValue };
    }
    const operation = action === "submit" ? "interaction.submit" : "interaction.update";
    const response = await this.send(operation, payload, presented.runId, idempotencyKey, signal);
    if (response.outcome === "accepted" || response.outcome === "adopted") {
      if (action === "update") return text("Workflow update recorded.", { outcome: response.outcome });
      return text(
        `Output accepted for step ${params.step}. If the workflow continues, the next step arrives as a new message. End your turn now.`,
        { outcome: response.outcome },
        true,
      );
    }
    const reason = response.error?.message ?? "no reason was given";
    if (response.outcome === "rejected") {
      throw new Error(action === "submit" ? `Output rejected for step ${params.step}: ${reason}` : `Update rejected: ${reason}`);
    }
    throw new Error(`The workflow server did not take the ${action} (${response.outcome}): ${reason}`);
  }

  private async answer(toolCallId: string, params: ToolParams, signal?: AbortSignal): Promise<ToolResult> {
    if (!Object.prototype.hasOwnProperty.call(params, "answer")) throw new Error("answer needs an answer value.");
    const view = this.coordinator()?.heldView;
    const run = view?.activeRun as { runId?: unknown } | null | undefined;
    if (typeof run?.runId !== "string") throw new Error("No workflow run of this session waits for an answer.");
    const { idempotencyKey } = callIdentity(run.runId, toolCallId);
    const response = await this.send("run.answer", { answer: (params.answer ?? null) as JsonValue }, run.runId, idempotencyKey, signal);
    if (response.outcome === "accepted" || response.outcome === "adopted") {
      const continuation = response.receipt?.continuationRunId;
      if (typeof continuation === "string") this.onContinuation(continuation);
      return text(
        `Answer accepted${typeof continuation === "string" ? `; the workflow continues as ${continuation}` : ""}. End your turn now.`,
        { outcome: response.outcome },
        true,
      );
    }
    throw new Error(`Answer not taken (${response.error?.code ?? response.outcome}): ${response.error?.message ?? "no reason was given"}`);
  }

  /** One durable call on the coordinator connection, retried after a lost connection. */
  private async send(operation: string, payload: JsonObject, runId: string, idempotencyKey: string, signal?: AbortSignal): Promise<ResponseMessage> {
    let last: Error = new Error("no attempt was made");
    for (let attempt = 0; attempt < ATTEMPTS; attempt += 1) {
      const coordinator = this.coordinator();
      if (coordinator === null) throw new Error("This Pi session has no workflow coordinator.");
      const epoch = await coordinator.whenCoordinator(CONNECT_WAIT_MS, signal);
      await coordinator.whenTurnReported(TURN_REPORT_WAIT_MS, signal);
      try {
        return await coordinator.connection.request(
          operation,
          { ...payload, sessionId: coordinator.sessionId, coordinatorEpoch: epoch },
          { runId, idempotencyKey },
        );
      } catch (error) {
        if (!(error instanceof LinkLostError)) throw error;
        last = error; // the same identity again once the coordinator is back: it adopts
      }
    }
    throw last;
  }
}
