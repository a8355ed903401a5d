/**
 * pi-workflows' headless bridge extension, loaded into `pi --mode rpc` with `-e`.
 *
 * It registers one tool, `workflow`, whose `submit` hands in the pending step's output
 * and whose `update` reports progress. The step comes from the file named by
 * `PI_WORKFLOWS_BRIDGE_CONFIG`; each call becomes an `interaction.submit` /
 * `interaction.update` request in `pi-workflows.client.v1` (canonical JSON), sent with
 * the step's exact request ID, a submission ID and an idempotency key derived from the
 * tool call. An accepted submission ends the turn; a rejection goes back to the model
 * as the tool's error so it can correct itself.
 *
 * pi loads TypeScript with jiti, so this folder ships as source, with no build step.
 * It imports only node built-ins, `typebox` (which pi's loader provides) and its own
 * files, and it never writes to stdout or stderr: tool arguments are private.
 */

import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";

import { selectTransport } from "../common/transport.ts";
import {
  TOOL_NAME,
  buildRequest,
  checkCall,
  loadBridgeConfig,
  toolParameters,
  toolResult,
  type BridgeConfig,
  type ToolParams,
  type ToolResult,
} from "./workflow-tool.ts";

export default function workflowBridge(pi: ExtensionAPI): void {
  // A factory that throws makes pi exit before it is ready; a bad configuration only
  // makes every call fail, with a reason the model and the runner can see.
  let config: BridgeConfig | null = null;
  let configError: string | null = null;
  try {
    config = loadBridgeConfig(process.env);
  } catch (error) {
    configError = (error as Error).message;
  }
  const transport = config === null ? null : selectTransport(config);

  pi.registerTool({
    name: TOOL_NAME,
    label: "Workflow",
    promptSnippet: "workflow: submit the pending workflow step's output, or report its progress",
    // One call at a time: a submission's outcome decides whether the next call is needed.
    executionMode: "sequential",
    description:
      "Complete the pending workflow step: call with action \"submit\", the step and attempt ids from the step contract, and your output. " +
      "Use action \"update\" with {type, key, data} to report progress. Complete only after the tool accepts; if it reports a validation error, correct the output and call again.",
    parameters: Type.Unsafe<ToolParams>(toolParameters(config)),
    async execute(toolCallId: string, params: ToolParams, signal: AbortSignal | undefined): Promise<ToolResult> {
      if (configError !== null) throw new Error(`The workflow bridge is misconfigured: ${configError}.`);
      const step = checkCall(config, params);
      const action = params.action as "submit" | "update";
      // Built (and so checked: canonical, schema-valid) once; each transport attempt
      // sends it with a fresh request ID and the same durable identity.
      const request = buildRequest(step, toolCallId, params);
      const response = await transport!.exchange(request, signal);
      return toolResult(step, action, response);
    },
  });
}
