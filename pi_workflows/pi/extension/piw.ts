/**
 * `/piw [split] [RUN_ID]`: the `piw` viewer on a run. Inside tmux (`$TMUX`, and a `tmux`
 * program) it opens `piw RUN_ID` in a new tmux window named `piw`, or a split; elsewhere,
 * or when tmux fails, it gives the exact command to run in a terminal.
 *
 * The new window gets the tmux server's environment, not Pi's, so the command names what
 * Pi's environment chose: the `piw` program by its path, and `--state-dir DIR` when the
 * extension's state folder is not the default one. On the session's own run it passes
 * `--session SESSION_ID`, so piw's Clear stops this session retaining the finished run.
 */

import { spawn } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { homedir } from "node:os";
import { delimiter, dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { stateDir } from "./locate.ts";

export const PIW_PROGRAM = "piw";
/** The tmux window's name (`tmux new-window -n piw`). */
export const PIW_WINDOW = "piw";
/** How long `tmux new-window` may take (a client command: it returns once the window exists). */
export const TMUX_TIMEOUT_MS = 5_000;

export type PiwPlace = "window" | "split";

export type PiwArgs = { kind: "piw"; place: PiwPlace; runId: string | null } | { kind: "error"; message: string };

const RUN_ID = /^run-[A-Za-z0-9_-]+$/;
const PIW_USAGE = "Usage: /piw [split] [RUN_ID] (default: this session's run, in a new tmux window).";

/** `/piw ARGS`: an optional `split` (a split of Pi's pane instead of a window) and a run ID. */
export function parsePiwArgs(args: string): PiwArgs {
  let place: PiwPlace = "window";
  let runId: string | null = null;
  for (const word of args.trim().split(/\s+/).filter((w) => w !== "")) {
    if (word === "split" && place === "window") place = "split";
    else if (RUN_ID.test(word) && runId === null) runId = word;
    else return { kind: "error", message: `/piw does not take "${word.slice(0, 40)}". ${PIW_USAGE}` };
  }
  return { kind: "piw", place, runId };
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** `name` as the shell would find it on `$PATH`, or null. */
export function findOnPath(name: string, env: NodeJS.ProcessEnv): string | null {
  for (const folder of (env.PATH ?? "").split(delimiter)) {
    if (!folder || !isAbsolute(folder)) continue; // a relative entry depends on the cwd
    const candidate = join(folder, name);
    if (executable(candidate)) return candidate;
  }
  return null;
}

/** This extension's folder: `pi_workflows/pi/extension/` of the installed package. */
export const EXTENSION_DIR = dirname(fileURLToPath(import.meta.url));

/** How far up from the extension folder a virtualenv's `bin/` can be
 * (`<venv>/lib/pythonX.Y/site-packages/pi_workflows/pi/extension`). */
const INSTALL_DEPTH = 6;

/**
 * The `piw` program: on `$PATH`, else the one installed with this package (the `bin/`
 * of the virtualenv or prefix it is installed in, or a checkout's `.venv/bin/`).
 * `onPath` says whether a shell finds it as plain `piw`.
 */
export function findPiw(env: NodeJS.ProcessEnv, extensionDir: string = EXTENSION_DIR): { path: string; onPath: boolean } | null {
  const found = findOnPath(PIW_PROGRAM, env);
  if (found !== null) return { path: found, onPath: true };
  let folder = resolve(extensionDir);
  for (let depth = 0; depth < INSTALL_DEPTH; depth += 1) {
    folder = dirname(folder);
    for (const bin of [join(folder, "bin"), join(folder, ".venv", "bin")]) {
      const candidate = join(bin, PIW_PROGRAM);
      if (executable(candidate)) return { path: candidate, onPath: false };
    }
  }
  return null;
}

/** The state folder a `piw` without options uses (no `$PI_CODING_AGENT_DIR` in its shell). */
export function defaultStateDir(): string {
  return join(homedir(), ".pi", "agent", "workflows");
}

/**
 * `piw`'s argv for a run: `--state-dir DIR` first when the extension's folder is not the
 * default, then `--session SESSION_ID` when the run is the Pi session's own (`sessionId`).
 */
export function piwArgv(program: string, runId: string, env: NodeJS.ProcessEnv, sessionId: string | null = null): string[] {
  const state = stateDir(env);
  const options = resolve(state) === resolve(defaultStateDir()) ? [] : ["--state-dir", state];
  const session = sessionId === null ? [] : ["--session", sessionId];
  return [program, ...options, ...session, runId];
}

/** One word as a POSIX shell reads it. */
function shellWord(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/** An argv as a command line to paste into a shell. */
export function shellCommand(argv: readonly string[]): string {
  return argv.map(shellWord).join(" ");
}

/** tmux's arguments that open `argv` in a new window named `piw`, or below Pi's pane. */
export function tmuxArgs(place: PiwPlace, argv: readonly string[]): string[] {
  const open = place === "window" ? ["new-window", "-n", PIW_WINDOW] : ["split-window", "-v"];
  return [...open, "--", ...argv]; // several words: tmux runs them without a shell
}

/** What `/piw` does: open the viewer through tmux, or say the command to run. */
export type PiwPlan =
  | { kind: "tmux"; tmux: string; args: string[]; command: string }
  | { kind: "print"; command: string; why: string };

/** Inside tmux: `$TMUX` is set (tmux sets it in every pane) and a `tmux` program is found. */
export function tmuxProgram(env: NodeJS.ProcessEnv): string | null {
  return (env.TMUX ?? "").trim() === "" ? null : findOnPath("tmux", env);
}

/** Whether `/piw` can open the viewer itself here (the widget names it only then). */
export function canOpenPiw(env: NodeJS.ProcessEnv, extensionDir: string = EXTENSION_DIR): boolean {
  return tmuxProgram(env) !== null && findPiw(env, extensionDir) !== null;
}

/**
 * The plan for `/piw` on `runId` in `place`, from Pi's environment; `sessionId` is the Pi
 * session's ID when `runId` is that session's own run (else null).
 */
export function planPiw(
  runId: string,
  place: PiwPlace,
  env: NodeJS.ProcessEnv,
  extensionDir: string = EXTENSION_DIR,
  sessionId: string | null = null,
): PiwPlan {
  const piw = findPiw(env, extensionDir);
  // A shell finds `piw` on its PATH; a tmux window may not have Pi's PATH, so it gets the path.
  const command = shellCommand(piwArgv(piw?.onPath ? PIW_PROGRAM : (piw?.path ?? PIW_PROGRAM), runId, env, sessionId));
  const tmux = tmuxProgram(env);
  if (piw === null) {
    return { kind: "print", command, why: "The piw program was not found (it comes with pi-workflows)." };
  }
  if (tmux === null) return { kind: "print", command, why: "Pi is not running inside tmux." };
  return { kind: "tmux", tmux, args: tmuxArgs(place, piwArgv(piw.path, runId, env, sessionId)), command };
}

/** What opening a tmux window gave: done, or the first line of why not. */
export type TmuxResult = { ok: true } | { ok: false; reason: string };

/**
 * Run `tmux ARGS` and wait for it to exit (tmux opens the window and returns; the
 * viewer runs in tmux's server, never as Pi's child). Detached in its own process group
 * so Pi's terminal signals do not reach it; stopped by its PID after `timeoutMs`.
 */
export function openInTmux(tmux: string, args: readonly string[], env: NodeJS.ProcessEnv, timeoutMs: number = TMUX_TIMEOUT_MS): Promise<TmuxResult> {
  return new Promise((done) => {
    let stderr = "";
    let settled = false;
    const finish = (result: TmuxResult): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      done(result);
    };
    const child = spawn(tmux, args, { env, detached: true, stdio: ["ignore", "ignore", "pipe"] });
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      if (stderr.length < 1000) stderr += chunk;
    });
    const timer = setTimeout(() => {
      if (child.pid !== undefined) child.kill("SIGKILL");
      finish({ ok: false, reason: `tmux did not answer within ${timeoutMs / 1000} s` });
    }, timeoutMs);
    child.on("error", (error) => finish({ ok: false, reason: `tmux could not be run (${(error as NodeJS.ErrnoException).code ?? "error"})` }));
    child.on("close", (code, signal) => {
      if (code === 0) return finish({ ok: true });
      const line = stderr.trim().split("\n", 1)[0]?.slice(0, 200) ?? "";
      finish({ ok: false, reason: line || `tmux exited with ${code ?? signal}` });
    });
  });
}
