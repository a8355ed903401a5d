/**
 * `/workflow answer` routing (commands.ts `answerRun`): an ordinary checkpoint is answered
 * with `run.answer`; a protected human decision, which the server refuses there with
 * `protectedDecision`, goes to `decision.answer` with source channel `pi`. Any other
 * refusal is the user's error as it is, with no second command.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import type { JsonValue } from "../../pi_workflows/pi/common/canonical.ts";
import { CommandFailedError } from "../../pi_workflows/pi/extension/client.ts";
import { answerRun, type AnswerCall } from "../../pi_workflows/pi/extension/commands.ts";

type Sent = { operation: string; payload: { [key: string]: JsonValue }; runId: string };

function refusing(code: string | null, sent: Sent[]): AnswerCall {
  return async (operation, payload, options) => {
    sent.push({ operation, payload, runId: options.runId });
    if (operation === "run.answer" && code !== null) {
      throw new CommandFailedError({
        schema: "pi-workflows.client.v1",
        type: "response",
        requestId: "r-1",
        outcome: "rejected",
        error: { code, message: "refused" },
      });
    }
    return { receipt: { continuationRunId: "run-next" } };
  };
}

test("an ordinary checkpoint is answered with run.answer alone", async () => {
  const sent: Sent[] = [];
  const answered = await answerRun(refusing(null, sent), "run-1", { approved: true });
  assert.equal(answered.decision, false);
  assert.deepEqual(sent, [{ operation: "run.answer", payload: { answer: { approved: true } }, runId: "run-1" }]);
});

test("a protected decision goes to decision.answer from the pi channel", async () => {
  const sent: Sent[] = [];
  const answered = await answerRun(refusing("protectedDecision", sent), "run-1", { choice: "approve" });
  assert.equal(answered.decision, true);
  assert.equal(answered.receipt.continuationRunId, "run-next");
  assert.deepEqual(
    sent.map((s) => s.operation),
    ["run.answer", "decision.answer"],
  );
  assert.deepEqual(sent[1].payload, { answer: { choice: "approve" }, sourceChannel: "pi" });
});

test("another refusal is reported as it is, with no second command", async () => {
  const sent: Sent[] = [];
  await assert.rejects(answerRun(refusing("notWaiting", sent), "run-1", 1), /refused/);
  assert.equal(sent.length, 1);
});
