/**
 * The `workflow` tool of the headless bridge: its parameters, the step it serves, and
 * how a call becomes an `interaction.submit` / `interaction.update` request and how the
 * server's response becomes the tool result.
 *
 * One pi child serves one attempt of one agent step. The runner writes the step's
 * contract to a canonical JSON file and names it in `PI_WORKFLOWS_BRIDGE_CONFIG`.
 * Nothing here writes to stdout or stderr: tool arguments are private.
 */

import { createHash, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { canonicalText, loads, type JsonValue } from "../common/canonical.ts";
import { CLIENT_SCHEMA, encodeClientMessage, type RequestMessage, type ResponseMessage } from "../common/protocol.ts";

export const BRIDGE_CONFIG_ENV = "PI_WORKFLOWS_BRIDGE_CONFIG";
export const BRIDGE_CONFIG_SCHEMA = "pi-workflows.bridge-config.v1";
export const TOOL_NAME = "workflow";

/** The step this pi child works on (written by the runner; see pi_workflows/pi). */
export interface BridgeConfig {
  schema: typeof BRIDGE_CONFIG_SCHEMA;
  runId: string;
  /** The step's interactive request ID (`interactionId` in the request payload). */
  interactionId: string;
  step: string;
  attempt: string;
  clientId: string;
  /** The node's `output_schema`; null accepts any JSON value. */
  outputSchema: JsonValue;
  /** The server's Unix socket (written by the runner); null: every call fails. */
  socketPath: string | null;
}

/** What a call asked for, and for which step. */
export interface ToolParams {
  action?: string;
  step?: string;
  attempt?: string;
  output?: unknown;
  update?: { type: string; key: string; data: { [key: string]: JsonValue } };
}

/** A tool result as pi's `AgentToolResult` (text for the model, details for the host). */
export interface ToolResult {
  content: { type: "text"; text: string }[];
  details: { [key: string]: JsonValue };
  terminate?: boolean;
}

const STRING_FIELDS = ["runId", "interactionId", "step", "attempt", "clientId"] as const;

/**
 * Read the step's configuration. Returns null when the variable is unset, and throws a
 * short error (no content, no path) when the file is unreadable or malformed.
 */
export function loadBridgeConfig(env: NodeJS.ProcessEnv): BridgeConfig | null {
  const path = env[BRIDGE_CONFIG_ENV];
  if (!path) return null;
  let value: JsonValue;
  try {
    value = loads(new Uint8Array(readFileSync(path)));
  } catch {
    throw new Error("the bridge configuration is unreadable or not canonical JSON");
  }
  if (value === null || typeof value !== "object" || Array.isArray(value) || value.schema !== BRIDGE_CONFIG_SCHEMA) {
    throw new Error(`the bridge configuration is not a ${BRIDGE_CONFIG_SCHEMA} object`);
  }
  for (const field of STRING_FIELDS) {
    if (typeof value[field] !== "string" || value[field] === "") {
      throw new Error(`the bridge configuration has no ${field}`);
    }
  }
  const socketPath = value.socketPath ?? null;
  if (socketPath !== null && typeof socketPath !== "string") throw new Error("the bridge configuration's socketPath is not a string");
  return { ...(value as unknown as BridgeConfig), outputSchema: value.outputSchema ?? null, socketPath };
}

/**
 * The tool's JSON Schema: one flat object, no `anyOf` (providers reject unions at the
 * top), `action` required and every other property optional; `execute` then checks
 * the fields each action needs. `output` is the step's output schema.
 */
export function toolParameters(config: BridgeConfig | null): { [key: string]: JsonValue } {
  const output = config?.outputSchema;
  const outputSchema: { [key: string]: JsonValue } =
    output !== null && output !== undefined && typeof output === "object" && !Array.isArray(output) ? { ...output } : {};
  outputSchema.description = "submit: the step's result.";
  return {
    type: "object",
    properties: {
      action: { type: "string", enum: ["submit", "update"], description: "submit hands in the step's output; update reports progress." },
      step: { type: "string", description: "The step id from the step contract." },
      attempt: { type: "string", description: "The attempt id from the step contract." },
      output: outputSchema,
      update: {
        type: "object",
        description: "update: one progress record.",
        properties: { type: { type: "string" }, key: { type: "string" }, data: { type: "object" } },
        required: ["type", "key", "data"],
        additionalProperties: false,
      },
    },
    required: ["action"],
    additionalProperties: false,
  };
}

function sha256(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

/** The durable identity of one tool call: the same call always maps to the same keys. */
export function callIdentity(config: BridgeConfig, toolCallId: string): { idempotencyKey: string; submissionId: string } {
  const digest = sha256(canonicalText(["pi-workflows.bridge.tool-call", config.interactionId, toolCallId]));
  return { idempotencyKey: `tool-call-${digest}`, submissionId: `submission-${digest.slice(0, 32)}` };
}

/** The step contract checks, in the snapshot's order: action, step, then attempt. */
export function checkCall(config: BridgeConfig | null, params: ToolParams): BridgeConfig {
  if (config === null) throw new Error("No workflow step is pending in this Pi process.");
  if (params.action !== "submit" && params.action !== "update") throw new Error('action must be "submit" or "update".');
  if (params.step !== config.step) throw new Error(`Wrong step id: the pending step is "${config.step}".`);
  if (params.attempt !== config.attempt) {
    throw new Error(`Stale attempt id: the pending attempt of step "${config.step}" is "${config.attempt}".`);
  }
  if (params.action === "submit" && !Object.prototype.hasOwnProperty.call(params, "output")) {
    throw new Error("submit needs an output (it may be null).");
  }
  if (params.action === "update" && params.update === undefined) throw new Error("update needs an update {type, key, data}.");
  return config;
}

/** The request for one call; `requestId` names this transport attempt only. */
export function buildRequest(config: BridgeConfig, toolCallId: string, params: ToolParams, requestId: string = randomUUID()): RequestMessage {
  const { idempotencyKey, submissionId } = callIdentity(config, toolCallId);
  const payload: { [key: string]: JsonValue } =
    params.action === "submit"
      ? { interactionId: config.interactionId, submissionId, value: (params.output ?? null) as JsonValue }
      : { interactionId: config.interactionId, update: (params.update ?? null) as unknown as JsonValue };
  return {
    schema: CLIENT_SCHEMA,
    type: "request",
    requestId,
    clientId: config.clientId,
    operation: params.action === "submit" ? "interaction.submit" : "interaction.update",
    idempotencyKey,
    runId: config.runId,
    payload,
  };
}

/** Encode a request (validated, canonical); throws if the output has no JSON form. */
export function requestFrame(request: RequestMessage): Uint8Array {
  return encodeClientMessage(request);
}

/**
 * The tool result for the server's answer. An acceptance ends the turn (`terminate`);
 * a rejection is thrown, so pi hands the stored actionable error to the model as the
 * tool result and the model can correct itself.
 */
export function toolResult(config: BridgeConfig, action: "submit" | "update", response: ResponseMessage): ToolResult {
  const outcome = response.outcome;
  if (outcome === "accepted" || outcome === "adopted") {
    if (action === "update") {
      return { content: [{ type: "text", text: "Workflow update recorded." }], details: { outcome } };
    }
    return {
      content: [
        {
          type: "text",
          text: `Output accepted for step ${config.step}. If the workflow continues, the next step arrives as a new message. End your turn now.`,
        },
      ],
      details: { outcome },
      terminate: true,
    };
  }
  const reason = response.error?.message ?? "no reason was given";
  if (outcome === "rejected") {
    throw new Error(action === "submit" ? `Output rejected for step ${config.step}: ${reason}` : `Update rejected: ${reason}`);
  }
  if (outcome === "claimLost" || outcome === "notFound") {
    throw new Error(`Step ${config.step} is no longer awaiting output (${outcome}).`);
  }
  throw new Error(`The workflow server did not take the ${action} (${outcome}): ${reason}`);
}
