/**
 * `/piw` (piw.ts): which run and which command, inside tmux or not, and a real private
 * tmux server opening the viewer's command in a window named `piw` or a split. The
 * `piw` program here is a small script that writes its arguments to a file (the viewer
 * is tested on its own), so the test sees exactly what tmux ran.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { canOpenPiw, findPiw, openInTmux, parsePiwArgs, PIW_WINDOW, planPiw, shellCommand, tmuxArgs } from "../../pi_workflows/pi/extension/piw.ts";
import { PIW_LINE, widgetText } from "../../pi_workflows/pi/extension/render.ts";

const RUN = "run-0a1b2c3d";
const SESSION = "0b9c7e52-5d1a-4f7e-9a0e-3c2b1d4e5f60";
const TMUX_BIN = "/usr/bin/tmux";
const WAIT_MS = 10_000;

interface Place {
  root: string;
  bin: string; // holds the fake `piw`
  argvFile: string; // what the fake `piw` was run with
  empty: string; // an extension folder with no `piw` installed near it
}

function place(): Place {
  const root = mkdtempSync(join(tmpdir(), "piw-cmd-"));
  const bin = join(root, "bin");
  const empty = join(root, "ext", "a", "b", "c", "d", "e", "f", "g");
  mkdirSync(bin);
  mkdirSync(empty, { recursive: true });
  const argvFile = join(root, "argv.txt");
  // One argument a line, then stay: a pane whose command exits closes with its window.
  writeFileSync(join(bin, "piw"), `#!/bin/sh\nprintf '%s\\n' "$@" > '${argvFile}.tmp' && mv '${argvFile}.tmp' '${argvFile}'\nexec sleep 60\n`);
  chmodSync(join(bin, "piw"), 0o755);
  return { root, bin, argvFile, empty };
}

async function waitFor<T>(what: string, probe: () => T | null): Promise<T> {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const found = probe();
    if (found !== null) return found;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

test("/piw takes an optional split and an optional run ID, nothing else", () => {
  assert.deepEqual(parsePiwArgs(""), { kind: "piw", place: "window", runId: null });
  assert.deepEqual(parsePiwArgs(`  ${RUN} `), { kind: "piw", place: "window", runId: RUN });
  assert.deepEqual(parsePiwArgs(`split ${RUN}`), { kind: "piw", place: "split", runId: RUN });
  assert.deepEqual(parsePiwArgs(`${RUN} split`), { kind: "piw", place: "split", runId: RUN });
  for (const bad of ["window", `${RUN} ${RUN}`, "split split", "run-"]) {
    const parsed = parsePiwArgs(bad);
    assert.equal(parsed.kind, "error", bad);
    assert.match((parsed as { message: string }).message, /Usage: \/piw \[split\] \[RUN_ID\]/);
  }
});

test("outside tmux, /piw gives the exact command: piw on PATH, the state folder when not the default", () => {
  const at = place();
  try {
    const env = { PATH: at.bin, HOME: homedir() };
    const plain = planPiw(RUN, "window", env, at.empty);
    assert.deepEqual(plain, { kind: "print", command: `piw ${RUN}`, why: "Pi is not running inside tmux." });
    const agent = join(at.root, "my agent"); // a space: the command quotes it
    const moved = planPiw(RUN, "window", { ...env, PI_CODING_AGENT_DIR: agent }, at.empty);
    assert.equal(moved.command, `piw --state-dir '${join(agent, "workflows")}' ${RUN}`);
    const state = join(at.root, "state");
    assert.equal(planPiw(RUN, "split", { ...env, PI_WORKFLOWS_STATE_DIR: state }, at.empty).command, `piw --state-dir ${state} ${RUN}`);
    // The default folder named explicitly is still the default: no option.
    assert.equal(planPiw(RUN, "window", { ...env, PI_CODING_AGENT_DIR: join(homedir(), ".pi", "agent") }, at.empty).command, `piw ${RUN}`);
    assert.equal(canOpenPiw(env, at.empty), false, "the widget does not name /piw outside tmux");
    // The session's own run: piw gets the session, so its Clear acts on that session's view.
    assert.equal(planPiw(RUN, "window", env, at.empty, SESSION).command, `piw --session ${SESSION} ${RUN}`);
    assert.equal(planPiw(RUN, "split", { ...env, PI_WORKFLOWS_STATE_DIR: state }, at.empty, SESSION).command, `piw --state-dir ${state} --session ${SESSION} ${RUN}`);
  } finally {
    rmSync(at.root, { recursive: true, force: true });
  }
});

test("piw off PATH is the one installed with the package, by its path; none at all is said", () => {
  const at = place();
  try {
    // A virtualenv: <venv>/lib/python3.11/site-packages/pi_workflows/pi/extension, <venv>/bin/piw.
    const venv = join(at.root, "venv");
    const extension = join(venv, "lib", "python3.11", "site-packages", "pi_workflows", "pi", "extension");
    mkdirSync(extension, { recursive: true });
    mkdirSync(join(venv, "bin"));
    writeFileSync(join(venv, "bin", "piw"), "#!/bin/sh\n");
    chmodSync(join(venv, "bin", "piw"), 0o755);
    const env = { PATH: "/nonexistent", HOME: homedir() };
    assert.deepEqual(findPiw(env, extension), { path: join(venv, "bin", "piw"), onPath: false });
    assert.equal(planPiw(RUN, "window", env, extension).command, `${join(venv, "bin", "piw")} ${RUN}`);
    const none = planPiw(RUN, "window", { ...env, TMUX: "/tmp/x,1,0" }, at.empty);
    assert.equal(none.kind, "print");
    assert.equal(none.command, `piw ${RUN}`);
    assert.match((none as { why: string }).why, /piw program was not found/);
  } finally {
    rmSync(at.root, { recursive: true, force: true });
  }
});

test("inside tmux, /piw plans tmux new-window -n piw (or a split) running piw by its path", () => {
  const at = place();
  try {
    const state = join(at.root, "state");
    const env = { PATH: `${at.bin}:/usr/bin:/bin`, HOME: homedir(), TMUX: "/tmp/tmux-1/default,1,0", PI_WORKFLOWS_STATE_DIR: state };
    const plan = planPiw(RUN, "window", env, at.empty);
    assert.deepEqual(plan, {
      kind: "tmux",
      tmux: TMUX_BIN,
      args: ["new-window", "-n", PIW_WINDOW, "--", join(at.bin, "piw"), "--state-dir", state, RUN],
      command: `piw --state-dir ${state} ${RUN}`,
    });
    assert.deepEqual(tmuxArgs("split", ["piw", RUN]), ["split-window", "-v", "--", "piw", RUN]);
    const own = planPiw(RUN, "split", env, at.empty, SESSION);
    assert.deepEqual(own.kind === "tmux" ? own.args : [], ["split-window", "-v", "--", join(at.bin, "piw"), "--state-dir", state, "--session", SESSION, RUN]);
    assert.equal(own.command, `piw --state-dir ${state} --session ${SESSION} ${RUN}`);
    assert.equal(canOpenPiw(env, at.empty), true);
    assert.equal(canOpenPiw({ ...env, TMUX: "" }, at.empty), false, "an empty $TMUX is not tmux");
    assert.equal(canOpenPiw({ ...env, PATH: at.bin }, at.empty), false, "no tmux program");
    assert.equal(planPiw(RUN, "window", { ...env, PATH: at.bin }, at.empty).kind, "print");
  } finally {
    rmSync(at.root, { recursive: true, force: true });
  }
});

test("the widget names /piw only where /piw opens the viewer", () => {
  const view = { runId: RUN, workflow: "w", display: { status: "running", currentNode: "a", controls: ["pause"], next: [] } };
  assert.ok(!widgetText(view)!.includes(PIW_LINE));
  assert.ok(!widgetText(view, false)!.some((line) => line.includes("/piw")));
  const shown = widgetText(view, true)!;
  assert.deepEqual(shown, [`workflow w ${RUN}: running`, "at node: a", "allowed now:", `  /workflow pause ${RUN}`, PIW_LINE]);
});

/** A private tmux server (its own socket name), with one detached session. */
function tmuxServer(name: string): { env: NodeJS.ProcessEnv; tmux: (...args: string[]) => string; pane: string } {
  const tmux = (...args: string[]): string => execFileSync(TMUX_BIN, ["-L", name, "-f", "/dev/null", ...args], { encoding: "utf8", env: { ...process.env, TMUX: "" } }).trim();
  tmux("new-session", "-d", "-s", "pi", "-x", "160", "-y", "48");
  const [socket, pid, session, pane] = tmux("display-message", "-p", "-t", "pi", "#{socket_path}|#{pid}|#{session_id}|#{pane_id}").split("|");
  // What tmux sets in each of its panes: Pi runs in this pane.
  const env = { ...process.env, TMUX: `${socket},${pid},${session!.replace("$", "")}`, TMUX_PANE: pane! };
  return { env, tmux, pane: pane! };
}

test("inside a real tmux, /piw opens a window named piw running piw on the run", { timeout: 30_000 }, async () => {
  const at = place();
  const name = `piw-test-${process.pid}-window`;
  const server = tmuxServer(name);
  try {
    const state = join(at.root, "state");
    const env = { ...server.env, PATH: `${at.bin}:${server.env.PATH ?? "/usr/bin:/bin"}`, PI_WORKFLOWS_STATE_DIR: state };
    const plan = planPiw(RUN, "window", env, at.empty);
    assert.equal(plan.kind, "tmux");
    if (plan.kind !== "tmux") return;
    assert.deepEqual(await openInTmux(plan.tmux, plan.args, env), { ok: true });
    const argv = await waitFor("the piw command's arguments", () => (existsSync(at.argvFile) ? readFileSync(at.argvFile, "utf8") : null));
    assert.deepEqual(argv.trimEnd().split("\n"), ["--state-dir", state, RUN]);
    const windows = server.tmux("list-windows", "-t", "pi", "-F", "#{window_name}").split("\n");
    assert.equal(windows.length, 2);
    assert.ok(windows.includes(PIW_WINDOW), windows.join(","));
    assert.match(server.tmux("list-panes", "-t", `pi:${PIW_WINDOW}`, "-F", "#{pane_current_command}"), /sleep|piw|sh/);
  } finally {
    execFileSync(TMUX_BIN, ["-L", name, "kill-server"], { stdio: "ignore" });
    rmSync(at.root, { recursive: true, force: true });
  }
});

test("inside a real tmux, /piw split splits Pi's pane", { timeout: 30_000 }, async () => {
  const at = place();
  const name = `piw-test-${process.pid}-split`;
  const server = tmuxServer(name);
  try {
    const env = { ...server.env, PATH: `${at.bin}:${server.env.PATH ?? "/usr/bin:/bin"}`, PI_WORKFLOWS_STATE_DIR: "", PI_CODING_AGENT_DIR: "", HOME: homedir() };
    const plan = planPiw(RUN, "split", env, at.empty);
    assert.equal(plan.kind, "tmux");
    if (plan.kind !== "tmux") return;
    assert.deepEqual(await openInTmux(plan.tmux, plan.args, env), { ok: true });
    const argv = await waitFor("the piw command's arguments", () => (existsSync(at.argvFile) ? readFileSync(at.argvFile, "utf8") : null));
    assert.deepEqual(argv.trimEnd().split("\n"), [RUN], "the default state folder: no option");
    assert.equal(server.tmux("list-windows", "-t", "pi", "-F", "#{window_name}").split("\n").length, 1, "no new window");
    assert.equal(server.tmux("list-panes", "-t", server.pane, "-F", "#{pane_id}").split("\n").length, 2, "Pi's window is split");
  } finally {
    execFileSync(TMUX_BIN, ["-L", name, "kill-server"], { stdio: "ignore" });
    rmSync(at.root, { recursive: true, force: true });
  }
});

test("a tmux that fails is reported with its reason (the command is then printed)", { timeout: 30_000 }, async () => {
  const at = place();
  try {
    // $TMUX names a server that is not there.
    const env = { ...process.env, PATH: `${at.bin}:/usr/bin:/bin`, TMUX: `${join(at.root, "no-such.sock")},1,0`, TMUX_PANE: "%0" };
    const plan = planPiw(RUN, "window", env, at.empty);
    assert.equal(plan.kind, "tmux");
    if (plan.kind !== "tmux") return;
    const result = await openInTmux(plan.tmux, plan.args, env);
    assert.equal(result.ok, false);
    assert.ok(!result.ok && result.reason.length > 0, JSON.stringify(result));
    assert.ok(!existsSync(at.argvFile), "nothing ran");
    const missing = await openInTmux(join(at.root, "no-tmux"), plan.args, env);
    assert.deepEqual(missing, { ok: false, reason: "tmux could not be run (ENOENT)" });
    assert.equal(shellCommand(["piw", "it's"]), `piw 'it'\\''s'`);
  } finally {
    rmSync(at.root, { recursive: true, force: true });
  }
});
