/**
 * The `pi-workflows.client.v1` envelope for the bridge: decode and encode one frame body
 * (the bytes of one message, without its newline), checked against the same schema file
 * Python uses (`pi_workflows/wire/schemas/client.v1.schema.json`, shipped beside this
 * folder as package data).
 *
 * Order of checks on decode, as tests/fixtures/wire/README.md defines and Python does:
 * size (`FrameTooLargeError`), canonical JSON (`CanonicalJSONError`), then the schema
 * (`ProtocolViolation`: not an object, or not a valid message). Errors are short and
 * name only schema locations, never message content.
 */

import { readFileSync } from "node:fs";

import { dumps, loads, type JsonValue } from "./canonical.ts";
import { Validator } from "./schema.ts";

export const CLIENT_SCHEMA = "pi-workflows.client.v1";

/** The frame limit of every channel, counted without the newline (1 MiB). */
export const MAX_FRAME_BYTES = 1024 * 1024;

/** The schema files by the names Python's `validate` takes. */
export const SCHEMA_NAMES = ["client.v1", "runner.v1", "channel.v1", "worker-launch.v1"] as const;
export type SchemaName = (typeof SCHEMA_NAMES)[number];

/** The body is longer than `MAX_FRAME_BYTES` (the corpus's `framing` class). */
export class FrameTooLargeError extends Error {
  override name = "FrameTooLargeError";
}

/** Canonical JSON that is not a valid message of its schema (the `schema` class). */
export class ProtocolViolation extends Error {
  override name = "ProtocolViolation";
  constructor(
    message: string,
    readonly schemaName: string,
    readonly keyword: string,
    readonly location: string,
  ) {
    super(message);
  }
}

export type Outcome = "accepted" | "adopted" | "rejected" | "conflict" | "notFound" | "claimLost" | "unavailable";

export interface SafeError {
  code: string;
  message: string;
}

export interface HelloMessage {
  schema: typeof CLIENT_SCHEMA;
  type: "hello";
  connectionId: string;
  packageVersion: string;
}

export interface RequestMessage {
  schema: typeof CLIENT_SCHEMA;
  type: "request";
  requestId: string;
  clientId: string;
  operation: string;
  idempotencyKey: string;
  payload: { [key: string]: JsonValue };
  runId?: string;
  expectedRevision?: number;
}

export interface ResponseMessage {
  schema: typeof CLIENT_SCHEMA;
  type: "response";
  requestId: string;
  outcome: Outcome;
  revision?: number;
  receipt?: { [key: string]: JsonValue };
  error?: SafeError;
}

export interface EventMessage {
  schema: typeof CLIENT_SCHEMA;
  type: "event";
  subscriptionId: string;
  kind:
    | "runList"
    | "runSnapshot"
    | "runPatch"
    | "runPage"
    | "sessionSnapshot"
    | "unavailable"
    | "maintenanceProgress";
  revision: number;
  payload: { [key: string]: JsonValue };
}

export type ClientMessage = HelloMessage | RequestMessage | ResponseMessage | EventMessage;

const validators = new Map<SchemaName, Validator>();

function validatorFor(name: SchemaName): Validator {
  let validator = validators.get(name);
  if (validator === undefined) {
    // The schemas ship in the same Python package: pi_workflows/wire/schemas/.
    const file = new URL(`../../wire/schemas/${name}.schema.json`, import.meta.url);
    validator = new Validator(JSON.parse(readFileSync(file, "utf8")) as boolean | { [k: string]: unknown });
    validators.set(name, validator);
  }
  return validator;
}

/** Check a decoded value against one protocol schema. Throws `ProtocolViolation`. */
export function validate(name: SchemaName, value: unknown): void {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new ProtocolViolation(`message violates ${name} at /: a message must be a JSON object`, name, "type", "");
  }
  const failure = validatorFor(name).validate(value);
  if (failure !== null) {
    const where = failure.location || "/";
    throw new ProtocolViolation(`message violates ${name} at ${where}: ${failure.reason}`.slice(0, 200), name, failure.keyword, failure.location);
  }
}

/** Decode one frame body of any protocol schema (the fixture corpus covers all four). */
export function decodeFrame(name: SchemaName, frame: Uint8Array): { [key: string]: JsonValue } {
  if (frame.length > MAX_FRAME_BYTES) {
    throw new FrameTooLargeError(`message exceeds the ${MAX_FRAME_BYTES}-byte frame limit`);
  }
  const value = loads(frame);
  validate(name, value);
  return value as { [key: string]: JsonValue };
}

/** Validate a message and return its canonical bytes (no newline). */
export function encodeFrame(name: SchemaName, message: unknown): Uint8Array {
  validate(name, message);
  const body = dumps(message);
  if (body.length > MAX_FRAME_BYTES) {
    throw new FrameTooLargeError(`message of ${body.length} bytes exceeds the ${MAX_FRAME_BYTES}-byte frame limit`);
  }
  return body;
}

/** Decode one `pi-workflows.client.v1` frame body. */
export function decodeClientMessage(frame: Uint8Array): ClientMessage {
  return decodeFrame("client.v1", frame) as unknown as ClientMessage;
}

/** Validate a client message and return its canonical bytes (no newline). */
export function encodeClientMessage(message: ClientMessage): Uint8Array {
  return encodeFrame("client.v1", message);
}
