/**
 * A small JSON Schema (draft 2020-12) validator for the protocol schemas in
 * `pi_workflows/wire/schemas/`, so the bridge checks messages against the same files
 * Python does. It knows exactly the keywords those files use and refuses a schema with
 * any other (an unknown keyword is never silently ignored). `pattern` is ECMA-262 with
 * the `u` flag; `unevaluatedProperties` sees the properties evaluated by `properties`,
 * `additionalProperties`, `$ref`, `allOf`, `oneOf` and `if`/`then`/`else`, as 2020-12
 * defines. The pi runtime resolves no npm packages for the bridge, hence no library.
 */

type Schema = boolean | { [keyword: string]: unknown };

/** The first reason a value does not match: a keyword and a JSON pointer, no content. */
export interface SchemaFailure {
  keyword: string;
  location: string;
  reason: string;
}

/** A schema uses something this validator does not implement. */
export class UnsupportedSchemaError extends Error {
  override name = "UnsupportedSchemaError";
}

const ANNOTATIONS = new Set(["$schema", "$id", "$defs", "$comment", "title", "description", "examples", "default"]);
const KEYWORDS = new Set([
  "$ref",
  "type",
  "const",
  "enum",
  "required",
  "properties",
  "additionalProperties",
  "unevaluatedProperties",
  "allOf",
  "oneOf",
  "anyOf",
  "not",
  "if",
  "then",
  "else",
  "items",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "pattern",
  "minimum",
  "maximum",
]);

type Outcome = { ok: true; evaluated: Set<string> } | { ok: false; failure: SchemaFailure };

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a) && Array.isArray(b)) {
    return a.length === b.length && a.every((item, index) => jsonEqual(item, b[index]));
  }
  if (isObject(a) && isObject(b)) {
    const keys = Object.keys(a);
    return (
      keys.length === Object.keys(b).length &&
      keys.every((key) => Object.prototype.hasOwnProperty.call(b, key) && jsonEqual(a[key], b[key]))
    );
  }
  return false;
}

function typeMatches(name: string, value: unknown): boolean {
  switch (name) {
    case "null":
      return value === null;
    case "boolean":
      return typeof value === "boolean";
    case "string":
      return typeof value === "string";
    case "number":
      return typeof value === "number";
    case "integer":
      return typeof value === "number" && Number.isInteger(value);
    case "array":
      return Array.isArray(value);
    case "object":
      return isObject(value);
    default:
      throw new UnsupportedSchemaError(`unknown type ${name}`);
  }
}

function pointer(location: string, part: string | number): string {
  return `${location}/${String(part).replace(/~/g, "~0").replace(/\//g, "~1")}`;
}

function codePoints(text: string): number {
  let count = 0;
  for (const _ of text) count += 1;
  return count;
}

export class Validator {
  private readonly patterns = new Map<string, RegExp>();

  constructor(private readonly root: Schema) {
    this.check(root, "#");
  }

  /** Null if `value` matches the root schema, else the first failure found. */
  validate(value: unknown): SchemaFailure | null {
    const outcome = this.evaluate(this.root, value, "");
    return outcome.ok ? null : outcome.failure;
  }

  /** Refuse, once and up front, any schema that uses a keyword we do not implement. */
  private check(schema: unknown, where: string): void {
    if (typeof schema === "boolean") return;
    if (!isObject(schema)) throw new UnsupportedSchemaError(`${where} is not a schema`);
    for (const [keyword, value] of Object.entries(schema)) {
      if (keyword === "$defs" || keyword === "properties") {
        for (const [name, sub] of Object.entries(value as Record<string, unknown>)) this.check(sub, `${where}/${keyword}/${name}`);
      } else if (keyword === "allOf" || keyword === "oneOf" || keyword === "anyOf") {
        (value as unknown[]).forEach((sub, index) => this.check(sub, `${where}/${keyword}/${index}`));
      } else if (["not", "if", "then", "else", "items", "additionalProperties", "unevaluatedProperties"].includes(keyword)) {
        this.check(value, `${where}/${keyword}`);
      } else if (keyword === "$ref") {
        this.resolve(String(value));
      } else if (keyword === "pattern") {
        this.regex(String(value));
      } else if (!ANNOTATIONS.has(keyword) && !KEYWORDS.has(keyword)) {
        throw new UnsupportedSchemaError(`${where} uses the unsupported keyword ${keyword}`);
      }
    }
  }

  private resolve(ref: string): Schema {
    if (!ref.startsWith("#/$defs/") || !isObject(this.root)) {
      throw new UnsupportedSchemaError(`only local #/$defs references are supported`);
    }
    const defs = this.root.$defs;
    const target = isObject(defs) ? defs[ref.slice("#/$defs/".length)] : undefined;
    if (target === undefined) throw new UnsupportedSchemaError(`unresolved reference ${ref}`);
    return target as Schema;
  }

  private regex(pattern: string): RegExp {
    let compiled = this.patterns.get(pattern);
    if (compiled === undefined) {
      compiled = new RegExp(pattern, "u");
      this.patterns.set(pattern, compiled);
    }
    return compiled;
  }

  private evaluate(schema: Schema, value: unknown, location: string): Outcome {
    if (schema === true) return { ok: true, evaluated: new Set() };
    if (schema === false) return fail("false", location, "no value is allowed here");
    const evaluated = new Set<string>();
    const s = schema;

    const local = this.localKeywords(s, value, location);
    if (local !== null) return local;

    if (s.$ref !== undefined) {
      const outcome = this.evaluate(this.resolve(String(s.$ref)), value, location);
      if (!outcome.ok) return outcome;
      outcome.evaluated.forEach((name) => evaluated.add(name));
    }
    if (isObject(value) && isObject(s.properties)) {
      for (const [name, sub] of Object.entries(s.properties)) {
        if (!Object.prototype.hasOwnProperty.call(value, name)) continue;
        const outcome = this.evaluate(sub as Schema, value[name], pointer(location, name));
        if (!outcome.ok) return outcome;
        evaluated.add(name);
      }
    }
    if (isObject(value) && s.additionalProperties !== undefined) {
      const declared = isObject(s.properties) ? s.properties : {};
      for (const name of Object.keys(value)) {
        if (Object.prototype.hasOwnProperty.call(declared, name)) continue;
        const outcome = this.evaluate(s.additionalProperties as Schema, value[name], pointer(location, name));
        if (!outcome.ok) return unknownField(outcome, "additionalProperties", pointer(location, name));
        evaluated.add(name);
      }
    }
    if (Array.isArray(value) && s.items !== undefined) {
      for (let index = 0; index < value.length; index += 1) {
        const outcome = this.evaluate(s.items as Schema, value[index], pointer(location, index));
        if (!outcome.ok) return outcome;
      }
    }
    for (const sub of (s.allOf as Schema[] | undefined) ?? []) {
      const outcome = this.evaluate(sub, value, location);
      if (!outcome.ok) return outcome;
      outcome.evaluated.forEach((name) => evaluated.add(name));
    }
    if (s.anyOf !== undefined) {
      const passing = (s.anyOf as Schema[]).map((sub) => this.evaluate(sub, value, location)).filter((o) => o.ok);
      if (passing.length === 0) return fail("anyOf", location, "matches none of the allowed shapes");
      passing.forEach((o) => o.ok && o.evaluated.forEach((name) => evaluated.add(name)));
    }
    if (s.oneOf !== undefined) {
      const passing = (s.oneOf as Schema[]).map((sub) => this.evaluate(sub, value, location)).filter((o) => o.ok);
      if (passing.length !== 1) return fail("oneOf", location, "must match exactly one allowed shape");
      passing.forEach((o) => o.ok && o.evaluated.forEach((name) => evaluated.add(name)));
    }
    if (s.not !== undefined && this.evaluate(s.not as Schema, value, location).ok) {
      return fail("not", location, "field combination is not allowed");
    }
    if (s.if !== undefined) {
      const condition = this.evaluate(s.if as Schema, value, location);
      const branch = condition.ok ? s.then : s.else;
      if (condition.ok) condition.evaluated.forEach((name) => evaluated.add(name));
      if (branch !== undefined) {
        const outcome = this.evaluate(branch as Schema, value, location);
        if (!outcome.ok) return outcome;
        outcome.evaluated.forEach((name) => evaluated.add(name));
      }
    }
    if (isObject(value) && s.unevaluatedProperties !== undefined) {
      for (const name of Object.keys(value)) {
        if (evaluated.has(name)) continue;
        const outcome = this.evaluate(s.unevaluatedProperties as Schema, value[name], pointer(location, name));
        if (!outcome.ok) return unknownField(outcome, "unevaluatedProperties", pointer(location, name));
        evaluated.add(name);
      }
    }
    return { ok: true, evaluated };
  }

  /** The keywords that look at this value alone; null if they all pass. */
  private localKeywords(s: Record<string, unknown>, value: unknown, location: string): Outcome | null {
    if (s.type !== undefined) {
      const types = Array.isArray(s.type) ? (s.type as string[]) : [String(s.type)];
      if (!types.some((name) => typeMatches(name, value))) return fail("type", location, `expected ${types.join(" or ")}`);
    }
    if (s.const !== undefined && !jsonEqual(s.const, value)) {
      return fail("const", location, "value is not one of the allowed values");
    }
    if (s.enum !== undefined && !(s.enum as unknown[]).some((allowed) => jsonEqual(allowed, value))) {
      return fail("enum", location, "value is not one of the allowed values");
    }
    if (isObject(value) && s.required !== undefined) {
      const missing = (s.required as string[]).filter((name) => !Object.prototype.hasOwnProperty.call(value, name));
      if (missing.length) return fail("required", location, `missing required field ${missing.map((m) => `'${m}'`).join(", ")}`);
    }
    if (typeof value === "string") {
      const length = s.minLength !== undefined || s.maxLength !== undefined ? codePoints(value) : 0;
      if (s.minLength !== undefined && length < Number(s.minLength)) return fail("minLength", location, `violates minLength ${String(s.minLength)}`);
      if (s.maxLength !== undefined && length > Number(s.maxLength)) return fail("maxLength", location, `violates maxLength ${String(s.maxLength)}`);
      if (s.pattern !== undefined && !this.regex(String(s.pattern)).test(value)) {
        return fail("pattern", location, "string does not match the required pattern");
      }
    }
    if (typeof value === "number") {
      if (s.minimum !== undefined && value < Number(s.minimum)) return fail("minimum", location, `violates minimum ${String(s.minimum)}`);
      if (s.maximum !== undefined && value > Number(s.maximum)) return fail("maximum", location, `violates maximum ${String(s.maximum)}`);
    }
    if (Array.isArray(value)) {
      if (s.minItems !== undefined && value.length < Number(s.minItems)) return fail("minItems", location, `violates minItems ${String(s.minItems)}`);
      if (s.maxItems !== undefined && value.length > Number(s.maxItems)) return fail("maxItems", location, `violates maxItems ${String(s.maxItems)}`);
    }
    return null;
  }
}

function fail(keyword: string, location: string, reason: string): Outcome {
  return { ok: false, failure: { keyword, location, reason } };
}

function unknownField(outcome: Outcome, keyword: string, location: string): Outcome {
  // A false subschema under (un)evaluatedProperties means the field is unknown.
  if (!outcome.ok && outcome.failure.keyword === "false") return fail(keyword, location, "unknown field");
  return outcome;
}
