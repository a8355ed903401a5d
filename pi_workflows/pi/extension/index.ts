/**
 * pi-workflows' Pi extension: `/workflow` and `/piw` commands, and a widget and status
 * line for the run this session started.
 *
 * Install it with `pi-workflows pi-extension install` (a link in Pi's extensions folder)
 * or load it once with `pi -e "$(pi-workflows pi-extension path)"`. pi compiles it with
 * jiti; there is no build step.
 *
 * It is an ordinary `pi-workflows.client.v1` client of the workflow server's Unix socket
 * (found as locate.ts says). It never opens SQLite, never runs workflow code and never
 * derives a status: what it shows is the server's `display` object. It uses only
 * documented extension APIs: `registerCommand`, `ctx.ui.notify`, `ctx.ui.setWidget`,
 * `ctx.ui.setStatus`, `ctx.cwd`, `pi.appendEntry` with `ctx.sessionManager.getBranch()`
 * (the run the session follows survives a Pi restart), `pi.sendMessage`,
 * `pi.registerTool` (the model's `workflow` tool, tool.ts), `ctx.isIdle()`, `ctx.hasPendingMessages()`, `ctx.sessionManager.getSessionId()`, and
 * the `session_start`, `session_shutdown`, `agent_start`, `agent_end` and `message_end`
 * events.
 *
 * The session's `WorkflowMessageCoordinator` (coordinator.ts) presents the origin
 * session's workflow messages and reports the branch and the model turns. The origin
 * session is the Pi session's ID, or, on a branch that holds a run entry recorded with
 * an origin (a fork copies it), that origin: a fork is a branch change of the same
 * origin session.
 *
 * Not built yet (issue 14): widget scrolling, the widget projected from the session view
 * (it follows the run's own view, which shows the same display), referenced (over
 * 16 KiB) message content.
 */

import { randomUUID } from "node:crypto";

import type { ExtensionAPI, ExtensionContext } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";

import type { JsonValue } from "../common/canonical.ts";
import { ServerClient } from "./client.ts";
import { MESSAGE_TYPE, WorkflowMessageCoordinator, type BranchEntry, type PiSide } from "./coordinator.ts";
import { answerRun, parseWorkflowArgs, USAGE, type Parsed } from "./commands.ts";
import { RunWatch, type WatchState } from "./live.ts";
import { TOOL_DESCRIPTION, TOOL_NAME, TOOL_PARAMETERS, WorkflowTool, type ToolParams, type ToolResult } from "./tool.ts";
import { socketPathFor, stateDir } from "./locate.ts";
import { listReport, STATUS_KEY, statusReport, statusText, WIDGET_KEY, widgetLines } from "./render.ts";

type Ui = ExtensionContext["ui"];

const LIST_LIMIT = 20;
/** The custom session entry naming the run this session follows (`pi.appendEntry`; not model context). */
export const RUN_ENTRY = "pi-workflows.run";
const CONNECTION_WORDS: Partial<Record<WatchState, string>> = {
  lost: "connection to the workflow server lost; reconnecting",
  notFound: "the server has no such run",
  gone: "the run is no longer stored on the server",
};

export default function piWorkflowsExtension(pi: ExtensionAPI): void {
  const clientId = `pi-extension-${randomUUID().slice(0, 12)}`;
  const socketPath = socketPathFor(stateDir(process.env));
  const client = new ServerClient(socketPath, clientId);
  let ui: Ui | null = null;
  let runId: string | null = null; // the run this session started (or answered into)
  let watch: RunWatch | null = null;
  let lastLines: string[] | undefined;
  let context: ExtensionContext | null = null; // the session's latest context
  let coordinator: WorkflowMessageCoordinator | null = null;

  const side: PiSide = {
    isIdle: () => context?.isIdle() ?? false,
    hasPendingMessages: () => context?.hasPendingMessages() ?? true,
    branch: () => (context?.sessionManager.getBranch() ?? []) as unknown as BranchEntry[],
    send: (message, triggerTurn) => pi.sendMessage(message, triggerTurn ? { triggerTurn: true } : {}),
  };

  const notify = (text: string, level: "info" | "warning" | "error" = "info"): void => ui?.notify(text, level);

  function showView(view: JsonValue): void {
    lastLines = widgetLines(view);
    ui?.setWidget(WIDGET_KEY, lastLines);
    ui?.setStatus(STATUS_KEY, statusText(view));
  }

  function showState(state: WatchState): void {
    const words = CONNECTION_WORDS[state];
    if (words === undefined) return;
    // A connection condition, not a run status: the last view stays, with a note.
    ui?.setWidget(WIDGET_KEY, [...(lastLines ?? [`workflow run ${runId ?? ""}`]), words]);
  }

  /** The run named by the newest `RUN_ENTRY` on the session's active branch, if any. */
  function restoredRun(ctx: ExtensionContext): string | null {
    let found: string | null = null;
    for (const entry of ctx.sessionManager.getBranch()) {
      if (entry.type !== "custom" || entry.customType !== RUN_ENTRY) continue;
      const data = entry.data as { runId?: unknown } | undefined;
      if (typeof data?.runId === "string") found = data.runId;
    }
    return found;
  }

  /** The origin session of this branch: the first recorded origin, else Pi's session ID. */
  function originSession(ctx: ExtensionContext): string {
    for (const entry of ctx.sessionManager.getBranch()) {
      if (entry.type !== "custom" || entry.customType !== RUN_ENTRY) continue;
      const data = entry.data as { originSessionId?: unknown } | undefined;
      if (typeof data?.originSessionId === "string") return data.originSessionId;
    }
    return ctx.sessionManager.getSessionId();
  }

  /** Follow `id` from now on, and record it in the session so a restarted Pi follows it too. */
  function adopt(id: string): void {
    if (runId !== id) {
      const data: { runId: string; originSessionId?: string } = { runId: id };
      if (coordinator !== null) data.originSessionId = coordinator.sessionId;
      pi.appendEntry(RUN_ENTRY, data);
    }
    follow(id);
  }

  function follow(id: string): void {
    if (runId === id && watch !== null) return;
    watch?.stop();
    runId = id;
    lastLines = undefined;
    watch = new RunWatch(socketPath, `${clientId}-watch`, id, { onView: showView, onState: showState });
    watch.start();
  }

  function targetRun(explicit: string | null, verb: string): string {
    const id = explicit ?? runId;
    if (id === null) {
      throw new Error(`No run was started in this Pi session; name one: /workflow ${verb} RUN_ID (see /workflow list).`);
    }
    return id;
  }

  async function runCommand(parsed: Parsed, cwd: string): Promise<void> {
    switch (parsed.kind) {
      case "help":
        notify(USAGE);
        return;
      case "error":
        notify(parsed.message, "error");
        return;
      case "start": {
        const payload: { [key: string]: JsonValue } = { workflow: parsed.workflow, input: parsed.input, projectPath: cwd };
        // Started from this Pi session: the run is interactive, its agent steps run here.
        if (coordinator !== null) payload.originSessionId = coordinator.sessionId;
        const { receipt } = await client.call("run.start", payload);
        const started = String(receipt.runId);
        adopt(started);
        notify(`Started workflow ${parsed.workflow}: ${started}`);
        return;
      }
      case "clear": {
        if (coordinator === null) throw new Error("This Pi session has no workflow view to clear.");
        const { receipt } = await client.call("sessionView.clearTerminal", { sessionId: coordinator.sessionId });
        const cleared = typeof receipt.clearedRunId === "string" ? receipt.clearedRunId : null;
        notify(cleared === null ? "Nothing to clear: no finished run is shown." : `Cleared ${cleared} from this session's view.`);
        return;
      }
      case "list": {
        const { receipt } = await client.call("run.list", { limit: LIST_LIMIT });
        const items = Array.isArray(receipt.items) ? receipt.items : [];
        notify(listReport(items, receipt.nextCursor !== null && receipt.nextCursor !== undefined));
        return;
      }
      case "status": {
        const id = targetRun(parsed.runId, "status");
        const { receipt } = await client.call("run.get", {}, { runId: id });
        notify(statusReport(receipt));
        return;
      }
      case "pause":
      case "resume":
      case "cancel": {
        const id = targetRun(parsed.runId, parsed.kind);
        const { response } = await client.call(`run.${parsed.kind}`, {}, { runId: id });
        notify(`${parsed.kind}: ${id}${response.outcome === "adopted" ? " (already done)" : ""}`);
        return;
      }
      case "followup": {
        const id = targetRun(parsed.runId, "followup");
        await client.call("followUp.add", { text: parsed.text }, { runId: id });
        notify(`Follow-up queued for ${id}: the model gets it once the run has finished.`);
        return;
      }
      case "answer": {
        const id = targetRun(parsed.runId, "answer");
        // A protected decision is refused by run.answer and goes to decision.answer.
        const { receipt, decision } = await answerRun((op, payload, options) => client.call(op, payload, options), id, parsed.answer);
        const continuation = typeof receipt.continuationRunId === "string" ? receipt.continuationRunId : null;
        if (continuation !== null && (parsed.runId === null || parsed.runId === runId)) adopt(continuation);
        notify(`Answered ${decision ? "the decision of " : ""}${id}${continuation ? `; the workflow continues as ${continuation}` : ""}`);
        return;
      }
    }
  }

  async function guarded(work: () => Promise<void>): Promise<void> {
    try {
      await work();
    } catch (error) {
      notify((error as Error).message, "error");
    }
  }

  pi.on("session_start", async (_event, ctx) => {
    ui = ctx.ui;
    context = ctx;
    // A restarted Pi (or a resumed session) follows the run the session started.
    const restored = restoredRun(ctx);
    if (restored !== null) follow(restored);
    coordinator?.stop();
    coordinator = new WorkflowMessageCoordinator(socketPath, `${clientId}-coordinator`, originSession(ctx), side);
    coordinator.start();
  });

  pi.on("agent_start", async (_event, ctx) => {
    context = ctx;
    coordinator?.agentStart();
  });

  pi.on("agent_end", async (event, ctx) => {
    context = ctx;
    coordinator?.agentEnd(event.messages);
  });

  pi.on("message_end", async (event, ctx) => {
    context = ctx;
    const message = event.message as { role?: string; customType?: string };
    if (message.role === "custom" && message.customType === MESSAGE_TYPE) coordinator?.messageEnd();
  });

  pi.on("session_shutdown", async () => {
    coordinator?.stop();
    coordinator = null;
    context = null;
    watch?.stop();
    watch = null;
    ui = null; // a replaced session's UI is stale (docs/extensions.md, session replacement)
  });

  pi.registerCommand("workflow", {
    description: "Start and control pi-workflows runs: /workflow start NAME [JSON], list, status, pause, resume, cancel, answer, followup, clear",
    handler: async (args, ctx) => {
      ui = ctx.ui;
      context = ctx;
      await guarded(() => runCommand(parseWorkflowArgs(args), ctx.cwd));
    },
  });

  const tool = new WorkflowTool(
    () => coordinator,
    () => side.branch(),
    (continuation) => adopt(continuation),
  );
  pi.registerTool({
    name: TOOL_NAME,
    label: "Workflow",
    promptSnippet: "workflow: submit a workflow step's output, report its progress, or answer a workflow checkpoint",
    // One call at a time: a submission's outcome decides whether the next call is needed.
    executionMode: "sequential",
    description: TOOL_DESCRIPTION,
    parameters: Type.Unsafe<ToolParams>(TOOL_PARAMETERS),
    async execute(toolCallId: string, params: ToolParams, signal: AbortSignal | undefined): Promise<ToolResult> {
      return tool.execute(toolCallId, params, signal);
    },
  });

  pi.registerCommand("piw", {
    description: "How to watch this session's workflow run",
    handler: async (_args, ctx) => {
      ui = ctx.ui;
      await guarded(async () => {
        const hint = "The piw viewer is not built yet; in a terminal, `pi-workflows run watch RUN_ID` follows a run.";
        if (runId === null) {
          notify(`${hint}\nNo run was started in this Pi session (see /workflow list).`);
          return;
        }
        const { receipt } = await client.call("run.get", {}, { runId });
        notify(`${hint}\n${statusReport(receipt)}`);
      });
    },
  });
}
