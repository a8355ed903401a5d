"""pi-workflows against DBOS and Restate: the same 3-compute-node workflow, in one run.

Each system runs the same chain of three trivial compute steps, each durable, in a child
process of this script (so the figures come from one process tree and one machine state):

- pi-workflows: `server run --max-workers W` and `WorkflowClient`s (benchmarks/_peers_piw.py);
- DBOS 3.4: `@DBOS.workflow` with three `@DBOS.step`s, SQLite system database in a temp
  folder with journal_mode=WAL and synchronous=FULL set on each connection (_peers_dbos.py);
- Restate 1.7: the server pinned in package.json (from npm) and a restate-sdk service with
  three `ctx.run` steps under hypercorn (_restate_service.py), registered through the admin
  API and called through the ingress. Restate runs WITHOUT NETWORK ACCESS: its child is
  started under `unshare --net` with only `lo` up, because the server reaches for the
  internet as it starts; its telemetry is also off in its configuration (_peers_restate.py).

Printed for each: p50/p90 start -> completed as the client sees it (RUNS one after another),
throughput with CLIENTS concurrent clients for SECONDS, CPU per run over that window (the
system's process tree: user + system of every process, reaped children included; the whole
machine's /proc/stat busy time is printed beside it, and counts other load on a shared
machine). Then the ratios pi-workflows/DBOS and pi-workflows/Restate; for pi-workflows
against DBOS also the cost per extra node (30-node minus 3-node chain p50, per node) and the
database bytes per finished 3-node run (used pages after a WAL checkpoint: page_count -
freelist_count times page_size, over the runs); and pi-workflows' idle `run.get` of a
completed run against a Unix-socket echo of the same frames.

A peer that is not installed is skipped with a one-line message and its ratios print
"skipped". Install the peers: `.venv/bin/pip install -e '.[bench]'` (DBOS, restate-sdk,
hypercorn) and `npm ci --ignore-scripts` (the Restate server); Restate needs `unshare` and
`ip` (util-linux, iproute2) and the right to make a network namespace (root).

Run: .venv/bin/python benchmarks/bench_peers.py [--runs 100] [--seconds 10] [--clients 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _peers_common import commit_floor_s, percentile

PEERS = ("pi-workflows", "DBOS", "Restate")
RESULT = "result.json"


# --- children: each phase of each system in a process of its own -------------------


def child(args: argparse.Namespace) -> None:
    """Run one phase of one system in `args.folder`; write its figures to RESULT."""
    folder: Path = args.folder
    result: dict[str, Any]
    if args.child == "piw-main":
        import _peers_piw  # noqa: PLC0415 - imports pi_workflows only in its child

        result = _peers_piw.main_phase(
            folder, args.runs, args.clients, args.seconds, args.piw_workers, args.get_samples
        )
    elif args.child == "piw-chain":
        import _peers_piw  # noqa: PLC0415

        result = _peers_piw.chain_phase(folder, args.chain_runs, args.long_nodes)
    elif args.child == "dbos-main":
        import _peers_dbos  # noqa: PLC0415 - DBOS comes only with the bench extra

        result = _peers_dbos.main_phase(folder, args.runs, args.clients, args.seconds)
    elif args.child == "dbos-chain":
        import _peers_dbos  # noqa: PLC0415

        result = _peers_dbos.chain_phase(folder, args.chain_runs, args.long_nodes)
    elif args.child == "restate-main":
        import _peers_restate  # noqa: PLC0415

        result = _peers_restate.main_phase(folder, args.runs, args.clients, args.seconds)
    else:
        raise SystemExit(f"unknown child {args.child!r}")
    (folder / RESULT).write_text(json.dumps(result))


def _child_args(args: argparse.Namespace, phase: str, folder: Path) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        phase,
        "--folder",
        str(folder),
        *("--runs", str(args.runs), "--seconds", str(args.seconds)),
        *("--clients", str(args.clients), "--chain-runs", str(args.chain_runs)),
        *("--long-nodes", str(args.long_nodes), "--get-samples", str(args.get_samples)),
        *("--piw-workers", str(args.piw_workers)),
    ]


def run_child(args: argparse.Namespace, phase: str, root: Path) -> dict[str, Any]:
    """Run `phase` in a child (Restate's in a network namespace); return its figures.

    Raises:
        RuntimeError: the child failed or wrote no figures (its last lines say why).
    """
    folder = root / phase
    folder.mkdir()
    command = _child_args(args, phase, folder)
    if phase.startswith("restate"):
        # Only `lo`, brought up inside: the server cannot reach anything off this machine.
        command = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
        command += _child_args(args, phase, folder)
    timeout = 300 + 2 * args.runs + 3 * args.seconds + 2 * args.chain_runs
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{phase} did not finish in {timeout:.0f} s") from exc
    result = folder / RESULT
    if done.returncode != 0 or not result.exists():
        tail = " | ".join((done.stderr.strip() or "no output").splitlines()[-4:])
        raise RuntimeError(f"{phase} failed (exit {done.returncode}): {tail}")
    figures: dict[str, Any] = json.loads(result.read_text())
    return figures


# --- which peers can run here --------------------------------------------------------


def _missing(*modules: str) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name) is None]


def dbos_absent() -> str | None:
    missing = _missing("dbos", "sqlalchemy")
    if missing:
        return f"{', '.join(missing)} not installed (pip install -e '.[bench]')"
    return None


def restate_absent() -> str | None:
    import _peers_restate  # noqa: PLC0415 - no optional imports at module level

    missing = _missing("restate", "hypercorn")
    if missing:
        return f"{', '.join(missing)} not installed (pip install -e '.[bench]')"
    if _peers_restate.server_binary() is None:
        return "restate-server is not in node_modules (npm ci --ignore-scripts)"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing, and Restate runs only in a network namespace"
    probe = subprocess.run(
        ["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"cannot make a network namespace here ({why}), and Restate runs only in one"
    return None


# --- report --------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.2f} ms"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def describe(name: str, figures: dict[str, Any], args: argparse.Namespace) -> None:
    samples = figures["samples"]
    done = max(figures["completed"], 1)
    print(f"--- {name} ---")
    print(
        f"start -> completed ({len(samples)} one after another): p50 {ms(percentile(samples, 0.5))}"
        f"   p90 {ms(percentile(samples, 0.9))}   min {ms(min(samples))}"
    )
    print(
        f"throughput: {figures['completed']} runs in {args.seconds:g} s = "
        f"{figures['per_s']:.1f} runs/s ({args.clients} clients)"
    )
    print(
        f"CPU per run: {ms(figures['cpu_tree_s'] / done)} (process tree)   "
        f"{ms(figures['cpu_machine_s'] / done)} (whole machine, /proc/stat)"
    )
    for error in figures["errors"][:3]:
        print(f"  client error: {error}")


def ratio_line(label: str, value: float | None, target: str, met: bool | None, why: str) -> None:
    shown = f"{value:8.2f}x" if value is not None else f"skipped ({why})"
    verdict = "" if met is None else ("MET" if met else "NOT MET")
    print(f"{label} {shown}   target {target} {verdict}".rstrip())


def per_node(chain: dict[str, Any]) -> tuple[float, float]:
    """(cost per extra node, fixed cost of a run) from the chains' p50s."""
    short, long = percentile(chain["short"], 0.5), percentile(chain["long"], 0.5)
    node = (long - short) / (chain["long_nodes"] - 3)
    return node, short - 3 * node


def bytes_per_run(figures: dict[str, Any], beyond_empty: bool = False) -> float:
    """Used bytes over finished runs; `beyond_empty`: less the empty database's bytes.

    The first is the figure as defined (used pages after a checkpoint, over the runs);
    the second is what it tends to over many runs, whatever the benchmark's size.
    """
    size = figures["database"]
    used = size["used_bytes"] - (size["empty_bytes"] if beyond_empty else 0)
    return float(used / max(size["runs"], 1))


def ratios(results: dict[str, dict[str, Any]], why: dict[str, str]) -> None:
    ours = results["pi-workflows"]
    skipped = {peer: f"{peer} not run, see above" for peer in why}
    print("--- ratios (pi-workflows / peer; lower is better except throughput) ---")

    def p50(figures: dict[str, Any]) -> float:
        return percentile(figures["samples"], 0.5)

    def p90(figures: dict[str, Any]) -> float:
        return percentile(figures["samples"], 0.9)

    def cpu(figures: dict[str, Any]) -> float:
        return float(figures["cpu_tree_s"] / max(figures["completed"], 1))

    targets: dict[str, list[tuple[str, Any, str, float | None, bool]]] = {
        "DBOS": [
            ("p50", p50, "<= 1.0", 1.0, False),
            ("p90", p90, "none (reported)", None, False),
            ("throughput", lambda f: f["per_s"], ">= 1.0", 1.0, True),
            ("CPU per run", cpu, "<= 2.0", 2.0, False),
        ],
        "Restate": [
            ("p50", p50, "none (reported)", None, False),
            ("p90", p90, "none (reported)", None, False),
            ("throughput", lambda f: f["per_s"], ">= 0.5 (goal >= 1.0)", 0.5, True),
            ("CPU per run", cpu, "none (reported)", None, False),
        ],
    }
    for peer, rows in targets.items():
        theirs = results.get(peer)
        for label, measure, target, bound, higher in rows:
            value = None
            if theirs is not None and measure(theirs) > 0:
                value = measure(ours) / measure(theirs)
            met = (
                None
                if value is None or bound is None
                else (value >= bound if higher else value <= bound)
            )
            ratio_line(f"pi-workflows/{peer} {label}:", value, target, met, skipped.get(peer, ""))
    dbos, chains = results.get("DBOS"), results.get("chains")
    node_ratio = bytes_ratio = growth_ratio = None
    if dbos is not None and chains is not None:
        node_ratio = per_node(chains["pi-workflows"])[0] / per_node(chains["DBOS"])[0]
        bytes_ratio = bytes_per_run(ours) / bytes_per_run(dbos)
        growth_ratio = bytes_per_run(ours, True) / bytes_per_run(dbos, True)
    node_bound = node_ratio is not None and node_ratio <= 1.0
    ratio_line(
        "pi-workflows/DBOS cost per extra node:",
        node_ratio,
        "<= 1.0",
        None if node_ratio is None else node_bound,
        skipped.get("DBOS", ""),
    )
    ratio_line(
        "pi-workflows/DBOS database bytes per run:",
        bytes_ratio,
        "<= 3.0",
        None if bytes_ratio is None else bytes_ratio <= 3.0,
        skipped.get("DBOS", ""),
    )
    ratio_line(
        "pi-workflows/DBOS database bytes per run beyond the empty database:",
        growth_ratio,
        "<= 3.0",
        None if growth_ratio is None else growth_ratio <= 3.0,
        skipped.get("DBOS", ""),
    )
    idle = ours["idle_get"]
    get_ratio = idle["get_p50"] / idle["echo_p50"]
    ratio_line("run.get idle / Unix-socket echo:", get_ratio, "<= 5.0", get_ratio <= 5.0, "")


def report(
    results: dict[str, dict[str, Any]], why: dict[str, str], args: argparse.Namespace
) -> None:
    for name in PEERS:
        if name in results:
            describe(name, results[name], args)
        else:
            print(f"--- {name} skipped: {why[name]} ---")
    ours = results["pi-workflows"]
    print(f"(pi-workflows: server run --max-workers {ours['workers']})")
    if "DBOS" in results:
        pragmas = results["DBOS"]["pragmas"]
        print(
            f"(DBOS: SQLite journal_mode={pragmas.get('journal_mode')} "
            f"synchronous={pragmas.get('synchronous')} (2 = FULL))"
        )
    if "Restate" in results:
        print(f"(Restate: server {results['Restate']['version']}, in its own network namespace)")
    print("--- pi-workflows against DBOS: chains and storage ---")
    chains = results.get("chains", {})
    for name in ("pi-workflows", "DBOS"):
        if name in chains:
            node, fixed = per_node(chains[name])
            print(
                f"{name}: cost per extra node {ms(node)} ({chains[name]['long_nodes']}-node minus "
                f"3-node chain p50, {len(chains[name]['short'])} of each); fixed cost {ms(fixed)}"
            )
        if name in results:
            size = results[name]["database"]
            growth = bytes_per_run(results[name], True)
            print(
                f"{name}: database {size['used_bytes']} bytes used for {size['runs']} finished "
                f"runs = {bytes_per_run(results[name]):.0f} bytes per run (the ratio's figure); "
                f"{size['empty_bytes']} bytes before the first run, so {growth:.0f} bytes per "
                "run beyond the empty database"
            )
    idle = ours["idle_get"]
    print(
        f"run.get of a completed run, idle: p50 {idle['get_p50'] * 1e6:.0f} us; Unix-socket echo "
        f"of the same frames ({idle['request_bytes']} B out, {idle['reply_bytes']} B back): "
        f"p50 {idle['echo_p50'] * 1e6:.0f} us"
    )
    ratios(results, why)


# --- the whole run -------------------------------------------------------------------


def measure(
    args: argparse.Namespace, root: Path
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Run each system's phases; return the figures and why a peer has none."""
    results: dict[str, dict[str, Any]] = {}
    why: dict[str, str] = {}
    chains: dict[str, dict[str, Any]] = {}
    wanted = {name.strip().lower() for name in args.peers.split(",")}
    absent = {
        "DBOS": dbos_absent() if "dbos" in wanted else "not asked for (--peers)",
        "Restate": restate_absent() if "restate" in wanted else "not asked for (--peers)",
    }
    results["pi-workflows"] = run_child(args, "piw-main", root)
    chains["pi-workflows"] = run_child(args, "piw-chain", root)
    if absent["DBOS"] is None:
        results["DBOS"] = run_child(args, "dbos-main", root)
        chains["DBOS"] = run_child(args, "dbos-chain", root)
    if absent["Restate"] is None:
        results["Restate"] = run_child(args, "restate-main", root)
    results["chains"] = chains
    why.update({name: reason for name, reason in absent.items() if reason is not None})
    return results, why


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs one after another, for p50/p90")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput window")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients for throughput")
    parser.add_argument(
        "--chain-runs", type=int, default=20, help="runs of each chain, per node cost"
    )
    parser.add_argument("--long-nodes", type=int, default=30, help="nodes in the long chain")
    parser.add_argument("--get-samples", type=int, default=300, help="idle run.get samples")
    parser.add_argument("--piw-workers", type=int, default=4, help="the server's --max-workers")
    parser.add_argument("--peers", default="dbos,restate", help="peers to run (comma-separated)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.long_nodes <= 3 or min(args.runs, args.clients, args.chain_runs) < 1:
        parser.error("--long-nodes must exceed 3; --runs, --clients, --chain-runs be >= 1")
    return args


def main() -> None:
    args = parse()
    if args.child is not None:
        child(args)
        return
    print(
        f"bench_peers: 3 compute nodes; {os.cpu_count()} CPUs; load {load()} (1, 5, 15 min) "
        f"at start; {shlex.join(sys.argv[1:]) or 'default sizes'}"
    )
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="piw-peers-"))
    began = time.perf_counter()
    try:
        floor = commit_floor_s(root)
        results, why = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results, why, args)
    print(
        f"(a tiny SQLite commit, WAL + synchronous=FULL, in the same temp folder: p50 {floor * 1e6:.0f} us)"
    )
    print(f"(load {load()} at the end; benchmark wall time {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
