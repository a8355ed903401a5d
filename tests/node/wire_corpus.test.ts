/**
 * The language-neutral wire fixture corpus through the bridge's TypeScript codec, as
 * tests/wire/test_fixture_corpus.py runs it through Python's: each valid fixture is
 * canonical, decodes, validates and re-encodes to the same bytes; each invalid fixture
 * fails with the error class tests/fixtures/wire/manifest.json names, and no other.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { CanonicalJSONError, dumps, loads } from "../../pi_workflows/pi/common/canonical.ts";
import {
  FrameTooLargeError,
  MAX_FRAME_BYTES,
  ProtocolViolation,
  decodeFrame,
  encodeFrame,
  type SchemaName,
} from "../../pi_workflows/pi/common/protocol.ts";

const corpus = new URL("../fixtures/wire/", import.meta.url);
const manifest = JSON.parse(readFileSync(new URL("manifest.json", corpus), "utf8")) as {
  frameLimitBytes: number;
  prefixes: Record<string, string>;
  invalid: Record<string, "framing" | "canonical" | "schema">;
};
const errorClasses = { framing: FrameTooLargeError, canonical: CanonicalJSONError, schema: ProtocolViolation };

function files(folder: string): string[] {
  return readdirSync(new URL(`${folder}/`, corpus))
    .filter((name) => name.endsWith(".json"))
    .sort();
}

function schemaFor(name: string): SchemaName {
  const prefix = Object.keys(manifest.prefixes).find((p) => name.startsWith(p));
  assert.ok(prefix, `${name} has no known prefix`);
  return manifest.prefixes[prefix]!.replace(/\.schema\.json$/, "") as SchemaName;
}

function bytesOf(folder: string, name: string): Uint8Array {
  return new Uint8Array(readFileSync(new URL(`${folder}/${name}`, corpus)));
}

const valid = files("valid");
const invalid = files("invalid");

test("the manifest covers every invalid file, and the frame limit agrees", () => {
  assert.ok(valid.length >= 90 && invalid.length >= 90);
  assert.deepEqual(Object.keys(manifest.invalid).sort(), invalid);
  assert.equal(manifest.frameLimitBytes, MAX_FRAME_BYTES);
});

for (const name of valid) {
  test(`valid/${name}`, () => {
    const data = bytesOf("valid", name);
    const schema = schemaFor(name);
    assert.ok(!data.includes(0x0a), "a frame body never contains a newline");
    assert.deepEqual(dumps(loads(data)), data, "valid fixtures are canonical");
    const message = decodeFrame(schema, data);
    assert.deepEqual(encodeFrame(schema, message), data);
  });
}

for (const name of invalid) {
  test(`invalid/${name}`, () => {
    const data = bytesOf("invalid", name);
    const schema = schemaFor(name);
    const expected = manifest.invalid[name]!;
    assert.throws(
      () => decodeFrame(schema, data),
      (error: unknown) => {
        assert.ok(error instanceof errorClasses[expected], `${name}: got ${String(error)}`);
        for (const [other, cls] of Object.entries(errorClasses)) {
          if (other !== expected) assert.ok(!(error instanceof cls), `${name}: also a ${other} error`);
        }
        assert.ok((error as Error).message.length <= 200, "errors are short and bounded");
        return true;
      },
    );
    if (expected === "schema") {
      // Canonical JSON with the wrong shape: the encoder refuses it too.
      assert.throws(() => encodeFrame(schema, loads(data)), ProtocolViolation);
    }
  });
}
