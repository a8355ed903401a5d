/**
 * Where the workflow server listens, found the way the Python side finds it
 * (pi_workflows/_paths.py, pi_workflows/wire/client.py `socket_path_for`):
 * the state folder is `$PI_WORKFLOWS_STATE_DIR`, else `<agent dir>/workflows`, where the
 * agent dir is Pi's documented `$PI_CODING_AGENT_DIR`, else `~/.pi/agent`; the socket is
 * `<state dir>/host/host.sock`.
 */

import { homedir } from "node:os";
import { join, resolve } from "node:path";

export const STATE_DIR_ENV = "PI_WORKFLOWS_STATE_DIR";
export const AGENT_DIR_ENV = "PI_CODING_AGENT_DIR";

function expandHome(path: string): string {
  return path === "~" || path.startsWith("~/") ? join(homedir(), path.slice(1)) : path;
}

/** Pi's agent directory: `$PI_CODING_AGENT_DIR`, else `~/.pi/agent`. */
export function agentDir(env: NodeJS.ProcessEnv): string {
  const configured = (env[AGENT_DIR_ENV] ?? "").trim();
  return configured ? resolve(expandHome(configured)) : join(homedir(), ".pi", "agent");
}

/** The workflow state folder: `$PI_WORKFLOWS_STATE_DIR`, else `<agent dir>/workflows`. */
export function stateDir(env: NodeJS.ProcessEnv): string {
  const configured = (env[STATE_DIR_ENV] ?? "").trim();
  return configured ? resolve(expandHome(configured)) : join(agentDir(env), "workflows");
}

/** The server's client socket of a state folder. */
export function socketPathFor(state: string): string {
  return join(state, "host", "host.sock");
}
