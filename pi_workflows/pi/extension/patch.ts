/**
 * Applying a `runPatch` event: the RFC 6902 subset (`add`, `remove`, `replace`, RFC 6901
 * pointers) that pi_workflows/wire/view_patch.py `diff_views` writes. A patch applies
 * only to the view held at exactly its `baseRevision`; anything else is a `PatchError`
 * and the caller takes a fresh snapshot instead.
 */

import type { JsonValue } from "../common/canonical.ts";

export interface PatchOperation {
  op: "add" | "remove" | "replace";
  path: string;
  value?: JsonValue;
}

export class PatchError extends Error {
  override name = "PatchError";
}

type Container = JsonValue[] | { [key: string]: JsonValue };

function tokens(path: string): string[] {
  if (path === "") return [];
  if (!path.startsWith("/")) throw new PatchError("a patch path must start with /");
  return path
    .slice(1)
    .split("/")
    .map((t) => t.replace(/~1/g, "/").replace(/~0/g, "~"));
}

function isContainer(value: JsonValue | undefined): value is Container {
  return value !== null && typeof value === "object";
}

function child(container: JsonValue, token: string): JsonValue {
  if (Array.isArray(container)) {
    const index = /^[0-9]+$/.test(token) ? Number(token) : -1;
    if (index >= 0 && index < container.length) return container[index]!;
  } else if (isContainer(container) && Object.prototype.hasOwnProperty.call(container, token)) {
    return container[token]!;
  }
  throw new PatchError("a patch path names a missing member");
}

function setMember(parent: { [key: string]: JsonValue }, key: string, value: JsonValue): void {
  // defineProperty: a "__proto__" key stays an ordinary own key, as in the decoder.
  Object.defineProperty(parent, key, { value, enumerable: true, writable: true, configurable: true });
}

function applyOne(document: JsonValue, operation: PatchOperation): JsonValue {
  const path = tokens(operation.path);
  const value = structuredClone(operation.value ?? null);
  if (path.length === 0) {
    if (operation.op === "remove") throw new PatchError("cannot remove the whole document");
    return value;
  }
  let parent = document;
  for (const token of path.slice(0, -1)) parent = child(parent, token);
  const last = path[path.length - 1]!;
  if (Array.isArray(parent)) {
    if (operation.op === "add" && last === "-") {
      parent.push(value);
      return document;
    }
    if (!/^[0-9]+$/.test(last)) throw new PatchError("an array index must be a number");
    const index = Number(last);
    if (operation.op === "add" && index <= parent.length) parent.splice(index, 0, value);
    else if (operation.op === "replace" && index < parent.length) parent[index] = value;
    else if (operation.op === "remove" && index < parent.length) parent.splice(index, 1);
    else throw new PatchError(`cannot ${operation.op} array item ${index}`);
    return document;
  }
  if (!isContainer(parent)) throw new PatchError("a patch path goes through a value that is not a container");
  const has = Object.prototype.hasOwnProperty.call(parent, last);
  if (operation.op === "add" || (operation.op === "replace" && has)) setMember(parent, last, value);
  else if (operation.op === "remove" && has) delete parent[last];
  else throw new PatchError(`cannot ${operation.op} a member`);
  return document;
}

/** A new document: `document` with `operations` applied in order (it is not changed). */
export function applyPatch(document: JsonValue, operations: readonly PatchOperation[]): JsonValue {
  let result = structuredClone(document);
  for (const operation of operations) result = applyOne(result, operation);
  return result;
}
