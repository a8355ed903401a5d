/**
 * Not a `*.test.ts`: tests/pi/test_extension_typescript.py writes cases made by Python's
 * `diff_views` to the file in PIW_PATCH_CASES ([{old, new, ops}]) and runs this file;
 * the extension's `applyPatch(old, ops)` must give `new` for every one.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import type { JsonValue } from "../../pi_workflows/pi/common/canonical.ts";
import { applyPatch, type PatchOperation } from "../../pi_workflows/pi/extension/patch.ts";

const file = process.env.PIW_PATCH_CASES;
assert.ok(file, "PIW_PATCH_CASES is set by tests/pi/test_extension_typescript.py");
const cases = JSON.parse(readFileSync(file, "utf8")) as { old: JsonValue; new: JsonValue; ops: PatchOperation[] }[];

test(`${cases.length} diffs made by Python apply to exactly the new view`, () => {
  assert.ok(cases.length > 0);
  cases.forEach((item, index) => {
    assert.deepEqual(applyPatch(item.old, item.ops), item.new, `case ${index}`);
  });
});
