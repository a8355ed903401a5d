/**
 * `/resource-manager` (resource-commands.ts): argument parsing, with one clear error for
 * a missing argument, a bad name or bad JSON, none of which repeats the spec; and the
 * text of the list, get, apply, reconcile and delete answers from the server's receipts.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { JsonValue } from "../../pi_workflows/pi/common/canonical.ts";
import {
  applyReport,
  deleteReport,
  GET_PASSES,
  parseResourceManagerArgs,
  parseSpec,
  readyWords,
  reconcileReport,
  resourceListReport,
  resourceReport,
  RM_USAGE,
  SPEC_SEND_LIMIT,
  when,
} from "../../pi_workflows/pi/extension/resource-commands.ts";

const T0 = Date.UTC(2026, 11, 3, 19, 0, 0);

type JsonObject = { [key: string]: JsonValue };

function message(parsed: ReturnType<typeof parseResourceManagerArgs>): string {
  assert.equal(parsed.kind, "error", JSON.stringify(parsed));
  return (parsed as { message: string }).message;
}

test("list takes nothing or all; nothing and help show the usage", () => {
  assert.deepEqual(parseResourceManagerArgs("list"), { kind: "list", all: false });
  assert.deepEqual(parseResourceManagerArgs("  list   all "), { kind: "list", all: true });
  assert.match(message(parseResourceManagerArgs("list review")), /takes nothing, or all/);
  assert.deepEqual(parseResourceManagerArgs(""), { kind: "help" });
  assert.deepEqual(parseResourceManagerArgs("help"), { kind: "help" });
  for (const sub of ["list [all]", "get MANAGER KEY", "apply MANAGER KEY JSON", "reconcile MANAGER KEY", "delete MANAGER KEY"]) {
    assert.ok(RM_USAGE.includes(`/resource-manager ${sub}`), sub);
  }
  const unknown = message(parseResourceManagerArgs("show review pr-1"));
  assert.ok(unknown.startsWith('Unknown /resource-manager command "show".\n'), unknown);
  assert.ok(unknown.endsWith(RM_USAGE));
});

test("get, reconcile and delete take exactly a manager and a key", () => {
  assert.deepEqual(parseResourceManagerArgs("get review pr-1"), { kind: "get", manager: "review", key: "pr-1" });
  assert.deepEqual(parseResourceManagerArgs(" reconcile  review  pr-1 "), { kind: "reconcile", manager: "review", key: "pr-1" });
  assert.deepEqual(parseResourceManagerArgs("delete review pr-1"), { kind: "delete", manager: "review", key: "pr-1" });
  assert.equal(message(parseResourceManagerArgs("get")), "Name the manager and the key: /resource-manager get MANAGER KEY.");
  assert.equal(message(parseResourceManagerArgs("delete review")), "Name the manager and the key: /resource-manager delete MANAGER KEY.");
  assert.match(message(parseResourceManagerArgs("get review pr-1 extra")), /takes a manager and a key, nothing more/);
  assert.match(message(parseResourceManagerArgs("get -review pr-1")), /manager name is a letter or digit/);
  assert.match(message(parseResourceManagerArgs(`get review ${"k".repeat(257)}`)), /at most 256 characters/);
  assert.deepEqual(parseResourceManagerArgs(`get review ${"k".repeat(256)}`), { kind: "get", manager: "review", key: "k".repeat(256) });
});

test("apply takes a manager, a key and the spec as JSON; the rest of the line is the spec", () => {
  assert.deepEqual(parseResourceManagerArgs('apply review pr-1 {"pr": 1, "labels": ["a b"]}'), {
    kind: "apply",
    manager: "review",
    key: "pr-1",
    spec: { pr: 1, labels: ["a b"] },
  });
  assert.deepEqual(parseResourceManagerArgs("apply review pr-1 null"), { kind: "apply", manager: "review", key: "pr-1", spec: null });
  assert.equal(message(parseResourceManagerArgs("apply review")), "Name the manager and the key: /resource-manager apply MANAGER KEY JSON.");
  assert.equal(message(parseResourceManagerArgs("apply review pr-1")), 'Give the spec as JSON: /resource-manager apply MANAGER KEY {"pr": 42}.');
});

test("a bad spec gets one clear error that never repeats the spec", () => {
  const secret = "sk-hunter2-do-not-show";
  for (const text of [`{"token": "${secret}"`, `{token: ${secret}}`, `{"token": "${secret}", "n": 1e400}`]) {
    const error = message(parseResourceManagerArgs(`apply review pr-1 ${text}`));
    assert.ok(!error.includes(secret) && !error.includes("token"), error);
    assert.match(error, /^The spec (is not valid JSON|has no JSON form)/);
  }
  const big = `{"blob": "${secret}${"x".repeat(SPEC_SEND_LIMIT)}"}`;
  const tooBig = parseSpec(big);
  assert.ok("kind" in tooBig);
  assert.match(tooBig.message, /^The spec is \d+ bytes of JSON; \/resource-manager apply sends at most \d+\.$/);
  assert.ok(!tooBig.message.includes(secret));
  assert.deepEqual(parseSpec('{"pr": 42}'), { spec: { pr: 42 } });
});

test("list shows manager, key, generation, the Ready condition, updated and delivery", () => {
  const receipt: JsonObject = {
    resources: [
      {
        manager: "review",
        key: "pr-1",
        project: "/work/proj",
        generation: 2,
        observedGeneration: 1,
        resourceVersion: 5,
        conditions: [
          { type: "Reviewed", status: "True", reason: "Done" },
          { type: "Ready", status: "False", reason: "Waiting", message: "on CI" },
        ],
        finalizers: [],
        deletionRequestedAt: null,
        updatedAt: T0,
        queue: { availableAt: T0 + 61_000, retries: 2, reason: "error" },
        reconciling: false,
      },
      {
        manager: "summaries",
        key: "docs",
        project: "/work/other",
        generation: 1,
        observedGeneration: 1,
        resourceVersion: 3,
        conditions: [],
        finalizers: ["cleanup"],
        deletionRequestedAt: T0,
        updatedAt: T0,
        queue: null,
        reconciling: true,
      },
    ],
  };
  assert.equal(
    resourceListReport(receipt, false),
    [
      "review/pr-1  gen 2 (observed 1)  Ready=False (Waiting)  updated 2026-12-03 19:00:00Z  queued (error) due 2026-12-03 19:01:01Z, retry 2",
      "summaries/docs  gen 1 (observed 1)  Ready not reported  updated 2026-12-03 19:00:00Z  reconciling, deleting",
    ].join("\n"),
  );
  const all = resourceListReport(receipt, true).split("\n");
  assert.ok(all[0]?.endsWith("  in /work/proj") && all[1]?.endsWith("  in /work/other"), all.join("\n"));
  assert.equal(resourceListReport({ resources: [] }, false), "No resources in this project. Add one with /resource-manager apply MANAGER KEY JSON.");
  assert.equal(resourceListReport({ resources: [] }, true), "No resources. Add one with /resource-manager apply MANAGER KEY JSON.");
  assert.equal(readyWords([{ type: "Ready", status: "True", reason: "" }]), "Ready=True");
  assert.equal(when(undefined), "-");
});

test("get is a short summary: versions, delivery, conditions, child runs, the last passes; no spec", () => {
  const passes: JsonObject[] = Array.from({ length: GET_PASSES + 2 }, (_, i) => ({
    reconcileId: `rec-${i}`,
    generation: 2,
    outcome: i === 0 ? "requeued" : "settled",
    requeueReason: i === 0 ? "waitingForChild" : null,
    errorClass: null,
    startedAt: T0 - i * 1000,
    durationMs: i === 1 ? null : 12,
  }));
  const resource: JsonObject = {
    uid: "res-1",
    manager: "review",
    project: "/work/proj",
    key: "pr-1",
    resourceVersion: 7,
    generation: 2,
    observedGeneration: 2,
    spec: { token: "sk-secret" },
    status: { phase: "reviewing" },
    conditions: [{ type: "Ready", status: "Unknown", reason: "Reviewing", message: "one child run\nsecond line" }],
    finalizers: ["cleanup"],
    deletionRequestedAt: null,
    sourceDigest: "sha256:00",
    createdAt: T0,
    updatedAt: T0,
  };
  const view: JsonObject = {
    resource,
    queue: null,
    childRuns: [{ requestKey: "review", workflow: "review-pr", runId: "run-00ab", status: "running", reservedAt: T0 }],
    effects: [],
    recentPasses: passes,
  };
  const lines = resourceReport(view).split("\n");
  assert.deepEqual(lines.slice(0, 9), [
    "review/pr-1  gen 2 (observed 2)  version 7",
    "state: settled",
    "updated: 2026-12-03 19:00:00Z",
    "finalizers: cleanup",
    "conditions:",
    "  Ready=Unknown Reviewing: one child run",
    "child runs:",
    "  review  run-00ab  review-pr  running",
    "last passes (newest first):",
  ]);
  assert.equal(lines[9], "  2026-12-03 19:00:00Z  gen 2  requeued  12 ms  waitingForChild");
  assert.equal(lines[10], "  2026-12-03 18:59:59Z  gen 2  settled");
  assert.equal(lines.length, 9 + GET_PASSES + 1);
  assert.equal(lines.at(-1), "  … 2 more: pi-workflows resource-manager get");
  assert.ok(!lines.join("\n").includes("sk-secret"));
  const empty = resourceReport({ ...view, childRuns: [], recentPasses: [], resource: { ...resource, conditions: [], finalizers: [] } });
  assert.ok(empty.includes("conditions: none\nchild runs: none\nlast passes: none"), empty);
});

test("apply, reconcile and delete say what the server did, as the CLI does", () => {
  const target = { manager: "review", key: "pr-1" };
  const base = { uid: "res-1", ...target, resourceVersion: 1, generation: 1 };
  assert.equal(applyReport(target, { ...base, created: true, changed: true, specChanged: true }), "review/pr-1 generation 1 version 1 (created)");
  assert.equal(applyReport(target, { ...base, generation: 2, resourceVersion: 4, created: false, changed: true, specChanged: true }), "review/pr-1 generation 2 version 4 (new spec)");
  assert.equal(applyReport(target, { ...base, created: false, changed: false, specChanged: false }), "review/pr-1 generation 1 version 1 (unchanged)");
  assert.equal(reconcileReport(target, { availableAt: T0 }), "review/pr-1 queued, due 2026-12-03 19:00:00Z");
  assert.equal(deleteReport(target, { removed: true, finalizers: [] }), "review/pr-1 deleted");
  assert.equal(deleteReport(target, { removed: false, finalizers: ["cleanup"] }), "review/pr-1 is being deleted; waiting for its finalizers: cleanup");
});
