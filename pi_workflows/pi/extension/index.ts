/**
 * pi-workflows' Pi extension: `/workflow`, `/piw` and `/resource-manager` commands, and a
 * widget and status line for the run this session started.
 *
 * Install it with `pi-workflows pi-extension install` (a link in Pi's extensions folder)
 * or load it once with `pi -e "$(pi-workflows pi-extension path)"`. pi compiles it with
 * jiti; there is no build step.
 *
 * It is an ordinary `pi-workflows.client.v1` client of the workflow server's Unix socket
 * (found as locate.ts says). It never opens SQLite, never runs workflow code and never
 * derives a status: what it shows is the server's `display` object. It uses only
 * documented extension APIs: `registerCommand`, `registerShortcut`, `ctx.ui.notify`,
 * `ctx.ui.setWidget`, `ctx.ui.setStatus`, `ctx.cwd`, `pi.appendEntry` with `ctx.sessionManager.getBranch()`
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
 * The widget and status line project the session view the coordinator holds (its one
 * connection and one subscription): its `activeRun` (the active run, or the retained
 * terminal run), nothing when it has none. `Shift+Up` / `Shift+Down` scroll the widget
 * (widget.ts).
 *
 * `/piw` opens the `piw` viewer on the session's run in a new tmux window when Pi runs
 * inside tmux, else it prints the command to run (piw.ts).
 *
 * `/resource-manager` lists, shows, applies, reconciles and deletes resources of this
 * project through the server's `resourceManager.*` operations (resource-commands.ts).
 */

import { randomUUID } from "node:crypto";
import { realpathSync, rmSync } from "node:fs";

import { SessionManager, type ExtensionAPI, type ExtensionCommandContext, type ExtensionContext } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";

import type { JsonValue } from "../common/canonical.ts";
import { CommandFailedError, ServerClient } from "./client.ts";
import { MESSAGE_TYPE, WorkflowMessageCoordinator, type BranchEntry, type CoordinatorEvents, type PiSide } from "./coordinator.ts";
import { answerRun, parseWorkflowArgs, USAGE, type Parsed } from "./commands.ts";
import { recordingOn, sessionEventOf } from "./recorder.ts";
import { TOOL_DESCRIPTION, TOOL_NAME, TOOL_PARAMETERS, WorkflowTool, type ToolParams, type ToolResult } from "./tool.ts";
import { socketPathFor, stateDir } from "./locate.ts";
import { canOpenPiw, EXTENSION_DIR, openInTmux, parsePiwArgs, planPiw, type PiwArgs } from "./piw.ts";
import {
  applyReport,
  deleteReport,
  parseResourceManagerArgs,
  reconcileReport,
  resourceListReport,
  resourceReport,
  RM_USAGE,
  type RmParsed,
} from "./resource-commands.ts";
import { displayOf, listReport, STATUS_KEY, statusReport, statusText, WIDGET_KEY, widgetText } from "./render.ts";
import { carryEntries, reopenHint, savedMarker, sessionState } from "./saved-session.ts";
import { SCROLL_DOWN_KEY, SCROLL_UP_KEY, WidgetScroll, WINDOW_LINES } from "./widget.ts";

type Ui = ExtensionContext["ui"];

/** The project a resource belongs to: the folder's real path, as the CLI resolves it. */
function projectPath(cwd: string): string {
  try {
    return realpathSync(cwd);
  } catch {
    return cwd; // gone or unreadable: the server answers for the path as given
  }
}

const LIST_LIMIT = 20;
/** The custom session entry naming the run this session follows (`pi.appendEntry`; not model context). */
export const RUN_ENTRY = "pi-workflows.run";
/** A connection condition, not a run status: shown under the last view while it lasts. */
const LOST_NOTE = "connection to the workflow server lost; reconnecting";

/**
 * The event buses of the Pi runtimes this extension is loaded into (one per resource
 * load; `/reload` reuses it after `session_shutdown`). With the extension installed, `pi
 * -e PATH` loads a second copy, and Pi refuses two owners of the `workflow` tool: the
 * second copy finds the first one's bus here and registers nothing (`-e` loads first).
 */
const LOADED = Symbol.for("pi-workflows.extension.loaded");

/** What `withOriginSession` runs, given the origin session's ID: the run it started or
 * adopted, and the first line of the notice to show in that session. */
type OriginAct = (sessionId: string) => Promise<{ runId: string; notice: string }>;

function loadedBuses(): WeakSet<object> {
  const holder = globalThis as { [LOADED]?: WeakSet<object> };
  holder[LOADED] ??= new WeakSet<object>();
  return holder[LOADED];
}

export default function piWorkflowsExtension(pi: ExtensionAPI): void {
  const buses = loadedBuses();
  if (buses.has(pi.events)) return; // already loaded into this Pi (installed and -e): step aside
  buses.add(pi.events);
  const clientId = `pi-extension-${randomUUID().slice(0, 12)}`;
  const socketPath = socketPathFor(stateDir(process.env));
  const client = new ServerClient(socketPath, clientId);
  let ui: Ui | null = null;
  let runId: string | null = null; // the run this session started (or answered into): commands' default
  let context: ExtensionContext | null = null; // the session's latest context
  let coordinator: WorkflowMessageCoordinator | null = null;

  const side: PiSide = {
    isIdle: () => context?.isIdle() ?? false,
    hasPendingMessages: () => context?.hasPendingMessages() ?? true,
    branch: () => (context?.sessionManager.getBranch() ?? []) as unknown as BranchEntry[],
    send: (message, triggerTurn) => pi.sendMessage(message, triggerTurn ? { triggerTurn: true } : {}),
  };

  // Pi's environment does not change while it runs: whether `/piw` can open a tmux window is known now.
  const piwOpens = canOpenPiw(process.env);

  const notify = (text: string, level: "info" | "warning" | "error" = "info"): void => ui?.notify(text, level);

  // --- the widget and status line: a projection of the coordinator's session view ---
  // The first line (workflow, run ID and status) stays on screen while the rest scrolls.
  const scroll = new WidgetScroll(WINDOW_LINES, 1);
  let shownRun: JsonValue | null = null; // the session view's `activeRun` (with a display)
  let lost = false;
  let painted = { widget: "null", status: "null" }; // what the UI shows (nothing yet)

  /** Show what is held; each of setWidget and setStatus only when its text changed. */
  function paint(): void {
    if (ui === null) return;
    let lines: string[] | undefined;
    let status: string | undefined;
    if (shownRun !== null) {
      lines = scroll.window().lines;
      if (lost) lines = [...lines, LOST_NOTE]; // the last view stays, with a note
      status = statusText(shownRun);
    }
    const widget = JSON.stringify(lines ?? null);
    const line = JSON.stringify(status ?? null);
    if (painted.widget !== widget) ui.setWidget(WIDGET_KEY, lines);
    if (painted.status !== line) ui.setStatus(STATUS_KEY, status);
    painted = { widget, status: line };
  }

  const viewEvents: CoordinatorEvents = {
    onView(view) {
      const run = view.activeRun ?? null;
      shownRun = displayOf(run) !== null ? run : null;
      lost = false;
      const id = (run as { runId?: unknown } | null)?.runId;
      // A run this session got while it followed none (started or adopted as Pi saved the
      // session, which replaced the extension): record it, so commands and a restarted
      // Pi follow it.
      if (runId === null && typeof id === "string") adopt(id);
      scroll.set(typeof id === "string" ? id : null, widgetText(run, piwOpens) ?? []);
      paint();
    },
    onLost() {
      lost = true;
      paint();
    },
  };

  function scrollWidget(delta: number, ctx: ExtensionContext): void {
    ui = ctx.ui;
    if (scroll.scroll(delta)) paint();
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
    runId = id; // the widget shows the session view, not this run
  }

  function targetRun(explicit: string | null, verb: string): string {
    // A run recorded after this session started (a session saved for it) counts too.
    const id = explicit ?? runId ?? (context !== null ? restoredRun(context) : null);
    if (id === null) {
      throw new Error(`No run was started in this Pi session; name one: /workflow ${verb} RUN_ID (see /workflow list).`);
    }
    return id;
  }

  /**
   * Run `act` with an origin session Pi can reopen; show its notice, with the command
   * that reopens the session, in that session. A saved session (or one Pi never saves,
   * `--no-session`) is used as it is, and so is an unsaved one while a model reply runs
   * (Pi saves it when the reply ends). An idle unsaved one is saved first
   * (saved-session.ts): a `SessionManager` on the same file writes its entries and the
   * marker, Pi switches to that file (`ctx.switchSession`), and `act` runs there, with
   * the saved session's ID, once the switch is done. The run it starts or adopts is
   * recorded in that session when its view arrives (`onView`).
   */
  async function withOriginSession(ctx: ExtensionCommandContext, act: OriginAct): Promise<void> {
    const file = ctx.sessionManager.getSessionFile();
    const state = sessionState(file);
    const busy = !ctx.isIdle() || ctx.hasPendingMessages(); // a model reply saves it soon
    if (coordinator === null || file === undefined || state === "saved" || busy) {
      const sessionId = coordinator?.sessionId ?? ctx.sessionManager.getSessionId();
      const { runId: id, notice } = await act(sessionId);
      adopt(id);
      notify(`${notice}\n${reopenHint(file, id, state === "saved")}`);
      return;
    }
    const saved = SessionManager.open(file, ctx.sessionManager.getSessionDir(), ctx.sessionManager.getCwd());
    carryEntries(saved, ctx.sessionManager.getBranch(), new Set([RUN_ENTRY]));
    saved.appendMessage(savedMarker(ctx.model)); // Pi writes the file with its first assistant message
    if (sessionState(file) !== "saved") {
      throw new Error("Pi did not save this session, so nothing was started; send the model a first message, then try again.");
    }
    const sessionId = saved.getSessionId();
    let shown: { ui: Ui; text: string; level: "info" | "error" } | null = null;
    const switched = await ctx.switchSession(file, {
      withSession: async (next) => {
        try {
          const { runId: id, notice } = await act(sessionId);
          shown = { ui: next.ui, text: `${notice}\n${reopenHint(file, id)}`, level: "info" };
        } catch (error) {
          shown = { ui: next.ui, text: (error as Error).message, level: "error" };
        }
      },
    });
    if (switched.cancelled) {
      // Nothing refers to the file written above: remove it, so Pi keeps its own session.
      rmSync(file, { force: true });
      notify("Pi did not switch to the saved session (an extension cancelled it); nothing was started.", "error");
      return;
    }
    // Shown once the switch is done: Pi draws the reopened session after `withSession`.
    const notice = shown as { ui: Ui; text: string; level: "info" | "error" } | null;
    notice?.ui.notify(notice.text, notice.level);
  }

  async function runCommand(parsed: Parsed, ctx: ExtensionCommandContext): Promise<void> {
    const cwd = ctx.cwd;
    switch (parsed.kind) {
      case "help":
        notify(USAGE);
        return;
      case "error":
        notify(parsed.message, "error");
        return;
      case "start": {
        const payload: { [key: string]: JsonValue } = { workflow: parsed.workflow, input: parsed.input, projectPath: cwd };
        if (coordinator === null) {
          const { receipt } = await client.call("run.start", payload);
          const started = String(receipt.runId);
          adopt(started);
          notify(`Started workflow ${parsed.workflow}: ${started}`);
          return;
        }
        // Started from this Pi session: the run is interactive, its agent steps run here,
        // so the session is saved before the server accepts the run.
        await withOriginSession(ctx, async (sessionId) => {
          const { receipt } = await client.call("run.start", { ...payload, originSessionId: sessionId });
          const started = String(receipt.runId);
          return { runId: started, notice: `Started workflow ${parsed.workflow}: ${started}` };
        });
        return;
      }
      case "adopt": {
        await adoptRun(parsed.runId, ctx);
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
      case "restart": {
        const id = targetRun(parsed.runId, "restart");
        // A new run from the start, of the workflow's source as it is now; it runs where
        // the run ran (an interactive run in its origin session).
        const { receipt, response } = await client.call("run.restart", {}, { runId: id });
        const restarted = String(receipt.runId);
        if (id === runId) adopt(restarted);
        const again = response.outcome === "adopted" ? " (already done)" : "";
        notify(`Restarted ${id} as ${restarted}${again}`);
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

  /**
   * `/workflow adopt RUN_ID`: after a confirmation that names the run and its step, this
   * session becomes the run's origin session (`run.adopt`), so its step is presented
   * here once. The server refuses while the run's own session is open in a Pi.
   */
  async function adoptRun(id: string, ctx: ExtensionCommandContext): Promise<void> {
    if (coordinator === null) throw new Error("This Pi session has no workflow coordinator; reopen Pi and try again.");
    const { receipt: view } = await client.call("run.get", {}, { runId: id });
    const display = displayOf(view);
    const workflow = typeof view.workflow === "string" ? view.workflow : "workflow";
    const step = display?.waitingOn ?? display?.currentNode;
    const at = step ? `at step ${step}` : "";
    const ok = await ctx.ui.confirm(
      `Adopt workflow run ${id}?`,
      `Run ${id} (${workflow}, ${display?.status ?? "unknown"}${at ? ` ${at}` : ""}) continues in this Pi session: ` +
        `its step is presented here once, and its old Pi session no longer gets it.`,
    );
    if (!ok) {
      notify(`Not adopted: ${id} is unchanged.`);
      return;
    }
    await withOriginSession(ctx, async (sessionId) => {
      await client.call("run.adopt", { sessionId }, { runId: id });
      const where = step ? `its step ${step} is presented in this session` : "its next step is presented in this session";
      return { runId: id, notice: `Adopted ${id}: ${where}.` };
    });
  }

  /** The session's run: the session view's active (or retained terminal) run, else the one it follows. */
  function sessionRun(): string | null {
    const shown = (shownRun as { runId?: unknown } | null)?.runId;
    if (typeof shown === "string") return shown;
    return runId ?? (context !== null ? restoredRun(context) : null);
  }

  /**
   * `/piw [split] [RUN_ID]`: the run in a new tmux window named `piw` (or a split) when Pi
   * runs inside tmux, else (or when tmux fails) the exact command to run. tmux starts the
   * viewer in its own server: Pi waits only for `tmux new-window` to return.
   */
  async function openViewer(parsed: PiwArgs): Promise<void> {
    if (parsed.kind === "error") {
      notify(parsed.message, "error");
      return;
    }
    // A named run must exist: a mistyped ID gets the server's refusal, not a window.
    if (parsed.runId !== null) await client.call("run.get", {}, { runId: parsed.runId });
    const own = sessionRun();
    const id = parsed.runId ?? own;
    if (id === null) {
      notify("No workflow run in this Pi session to watch: start one with /workflow start NAME, or name one: /piw RUN_ID (see /workflow list).", "warning");
      return;
    }
    // The session's own run: piw gets the session, so its Clear acts on this session's view.
    const session = id === own && coordinator !== null ? coordinator.sessionId : null;
    const plan = planPiw(id, parsed.place, process.env, EXTENSION_DIR, session);
    if (plan.kind === "print") {
      notify(`${plan.why} To watch ${id} in piw, run this in a terminal:\n  ${plan.command}`);
      return;
    }
    const opened = await openInTmux(plan.tmux, plan.args, process.env);
    if (opened.ok) {
      notify(`Opened ${id} in piw, in a new tmux ${parsed.place === "window" ? "window named piw" : "split below this pane"}.`);
      return;
    }
    notify(`tmux did not open piw: ${opened.reason}. To watch ${id} in piw, run this in a terminal:\n  ${plan.command}`, "warning");
  }

  /**
   * `/resource-manager ...`: one `resourceManager.*` request. The project is Pi's cwd as
   * the CLI names it (its real path), so Pi and `pi-workflows resource-manager` in the
   * same folder see the same resources. A refusal is prefixed with MANAGER/KEY (the
   * server never echoes them); no message carries the spec.
   */
  async function runResourceCommand(parsed: RmParsed, ctx: ExtensionCommandContext): Promise<void> {
    if (parsed.kind === "help") return notify(RM_USAGE);
    if (parsed.kind === "error") return notify(parsed.message, "error");
    const project = projectPath(ctx.cwd);
    if (parsed.kind === "list") {
      const payload: { [key: string]: JsonValue } = parsed.all ? {} : { projectPath: project };
      const { receipt } = await client.call("resourceManager.list", payload);
      return notify(resourceListReport(receipt, parsed.all));
    }
    const target = { manager: parsed.manager, key: parsed.key };
    const payload: { [key: string]: JsonValue } = { ...target, projectPath: project };
    try {
      switch (parsed.kind) {
        case "get":
          return notify(resourceReport((await client.call("resourceManager.get", payload)).receipt));
        case "apply": {
          const { receipt } = await client.call("resourceManager.apply", { ...payload, spec: parsed.spec });
          return notify(applyReport(target, receipt));
        }
        case "reconcile":
          return notify(reconcileReport(target, (await client.call("resourceManager.reconcile", payload)).receipt));
        case "delete":
          return notify(deleteReport(target, (await client.call("resourceManager.delete", payload)).receipt));
      }
    } catch (error) {
      if (error instanceof CommandFailedError) throw new Error(`${parsed.manager}/${parsed.key}: ${error.message}`);
      throw error;
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
    // Another session (or a fork) shows its own view: nothing until it arrives.
    shownRun = null;
    lost = false;
    paint();
    coordinator = new WorkflowMessageCoordinator(socketPath, `${clientId}-coordinator`, originSession(ctx), side, viewEvents, {
      record: recordingOn(process.env),
    });
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
    record(event);
    const message = event.message as { role?: string; customType?: string };
    if (message.role === "custom" && message.customType === MESSAGE_TYPE) coordinator?.messageEnd();
  });

  // The session record of workflow turns (recorder.ts): the coordinator keeps only the
  // events of a running turn, and sends them once the server owns that turn.
  function record(event: { type: string }): void {
    const recorded = coordinator === null ? null : sessionEventOf(event as { type: string; [key: string]: unknown });
    if (recorded !== null) coordinator?.record(recorded.type, recorded.fields, recorded.message);
  }
  pi.on("message_start", async (event) => record(event));
  pi.on("message_update", async (event) => record(event));
  pi.on("tool_execution_start", async (event) => record(event));
  pi.on("tool_execution_end", async (event) => record(event));

  pi.on("session_shutdown", async () => {
    buses.delete(pi.events); // a reload loads the extension into this Pi again
    coordinator?.stop();
    coordinator = null;
    context = null;
    ui = null; // a replaced session's UI is stale (docs/extensions.md, session replacement)
  });

  pi.registerCommand("workflow", {
    description: "Start and control pi-workflows runs: /workflow start NAME [JSON], list, status, pause, resume, cancel, restart, answer, followup, clear, adopt",
    handler: async (args, ctx) => {
      ui = ctx.ui;
      context = ctx;
      await guarded(() => runCommand(parseWorkflowArgs(args), ctx));
    },
  });

  pi.registerCommand("resource-manager", {
    description: "Resources of pi-workflows resource managers: /resource-manager list [all], get MANAGER KEY, apply MANAGER KEY JSON, reconcile, delete",
    handler: async (args, ctx) => {
      ui = ctx.ui;
      context = ctx;
      await guarded(() => runResourceCommand(parseResourceManagerArgs(args), ctx));
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

  pi.registerShortcut(SCROLL_UP_KEY, {
    description: "Scroll the workflow widget up",
    handler: (ctx) => scrollWidget(-1, ctx),
  });
  pi.registerShortcut(SCROLL_DOWN_KEY, {
    description: "Scroll the workflow widget down",
    handler: (ctx) => scrollWidget(1, ctx),
  });

  pi.registerCommand("piw", {
    description: "Watch this session's workflow run in the piw viewer: a new tmux window (/piw split: a split), else the command to run",
    handler: async (args, ctx) => {
      ui = ctx.ui;
      context = ctx;
      await guarded(() => openViewer(parsePiwArgs(args)));
    },
  });
}
