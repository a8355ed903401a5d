/**
 * Canonical JSON (RFC 8785, JCS) for the bridge: the same bytes Python's
 * `pi_workflows.wire.canonical` writes and accepts.
 *
 * Encoding is ECMAScript's own: `JSON.stringify` of numbers and strings is exactly what
 * RFC 8785 prescribes, and JavaScript's default string order is UTF-16 code-unit order.
 * Decoding is strict: the bytes must be UTF-8 without a byte order mark, parse as JSON
 * with no repeated key and no lone surrogate, and equal the canonical form of the value
 * they parse to (so white space, key order, number forms and escapes are all checked).
 */

/** Deepest nesting of arrays and objects with a canonical form (Python's limit too). */
export const MAX_NESTING_DEPTH = 255;

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** Base class of every canonical JSON failure (the corpus's `canonical` class). */
export class CanonicalJSONError extends Error {
  override name = "CanonicalJSONError";
}

/** The bytes are not JSON (syntax, invalid UTF-8, lone surrogate escape, too deep). */
export class InvalidJSONError extends CanonicalJSONError {
  override name = "InvalidJSONError";
}

/** The bytes are JSON but not canonical, or an object repeats a key. */
export class NonCanonicalError extends CanonicalJSONError {
  override name = "NonCanonicalError";
}

/** The value has no canonical JSON form (NaN, an infinity, a lone surrogate, a non-JSON type). */
export class NotSerializableError extends CanonicalJSONError {
  override name = "NotSerializableError";
}

function hasLoneSurrogate(text: string): boolean {
  return !text.isWellFormed(); // a lone surrogate has no UTF-8 form
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function encodeInto(value: unknown, parts: string[], depth: number): void {
  if (value === null) {
    parts.push("null");
  } else if (value === true) {
    parts.push("true");
  } else if (value === false) {
    parts.push("false");
  } else if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new NotSerializableError("NaN and infinities have no JSON form");
    parts.push(JSON.stringify(value)); // ECMAScript Number::toString, as RFC 8785 § 3.2.2.3
  } else if (typeof value === "string") {
    if (hasLoneSurrogate(value)) throw new NotSerializableError("a string contains a lone surrogate");
    parts.push(JSON.stringify(value)); // RFC 8785 § 3.2.2.2 is JSON.stringify's escaping
  } else if (Array.isArray(value)) {
    if (depth >= MAX_NESTING_DEPTH) {
      throw new NotSerializableError(`the value nests deeper than ${MAX_NESTING_DEPTH} levels`);
    }
    parts.push("[");
    value.forEach((item: unknown, index: number) => {
      if (index) parts.push(",");
      encodeInto(item, parts, depth + 1);
    });
    parts.push("]");
  } else if (isPlainObject(value)) {
    if (depth >= MAX_NESTING_DEPTH) {
      throw new NotSerializableError(`the value nests deeper than ${MAX_NESTING_DEPTH} levels`);
    }
    parts.push("{");
    // The default sort compares UTF-16 code units: RFC 8785 § 3.2.3.
    Object.keys(value)
      .sort()
      .forEach((key, index) => {
        if (index) parts.push(",");
        if (hasLoneSurrogate(key)) throw new NotSerializableError("a key contains a lone surrogate");
        parts.push(JSON.stringify(key), ":");
        encodeInto(value[key], parts, depth + 1);
      });
    parts.push("}");
  } else {
    throw new NotSerializableError(`a value of type ${typeof value} has no JSON form`);
  }
}

/** The canonical JSON text of `value`. Throws `NotSerializableError`. */
export function canonicalText(value: unknown): string {
  const parts: string[] = [];
  encodeInto(value, parts, 0);
  return parts.join("");
}

const encoder = new TextEncoder();

/** The canonical UTF-8 bytes of `value`. Throws `NotSerializableError`. */
export function dumps(value: unknown): Uint8Array {
  return encoder.encode(canonicalText(value));
}

// ---------------------------------------------------------------------------
// A strict JSON parser: RFC 8259 grammar, no repeated keys, no lone surrogate escapes.

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

class Parser {
  private index = 0;

  constructor(private readonly text: string) {}

  parseDocument(): JsonValue {
    const value = this.value(0);
    if (this.index !== this.text.length) this.fail("unexpected data after the JSON value");
    return value;
  }

  private fail(reason: string): never {
    throw new InvalidJSONError(`not valid JSON: ${reason} at character ${this.index}`);
  }

  private skipWhitespace(): void {
    while (this.index < this.text.length) {
      const c = this.text.charCodeAt(this.index);
      if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) return;
      this.index += 1;
    }
  }

  private value(depth: number): JsonValue {
    this.skipWhitespace();
    const c = this.text[this.index];
    let result: JsonValue;
    if (c === "{") result = this.object(depth + 1);
    else if (c === "[") result = this.array(depth + 1);
    else if (c === '"') result = this.string();
    else if (c === "t") result = this.literal("true", true);
    else if (c === "f") result = this.literal("false", false);
    else if (c === "n") result = this.literal("null", null);
    else result = this.number();
    this.skipWhitespace();
    return result;
  }

  private literal<T extends JsonValue>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.index)) this.fail("unexpected character");
    this.index += word.length;
    return value;
  }

  private number(): number {
    NUMBER.lastIndex = this.index;
    const match = NUMBER.exec(this.text);
    if (match === null) this.fail("unexpected character");
    this.index += match[0].length;
    return Number(match[0]);
  }

  private string(): string {
    this.index += 1; // the opening quote
    let out = "";
    let start = this.index;
    for (;;) {
      if (this.index >= this.text.length) this.fail("unterminated string");
      const code = this.text.charCodeAt(this.index);
      if (code === 0x22) {
        out += this.text.slice(start, this.index);
        this.index += 1;
        return out;
      }
      if (code < 0x20) this.fail("raw control character in a string");
      if (code !== 0x5c) {
        this.index += 1;
        continue;
      }
      out += this.text.slice(start, this.index);
      out += this.escape();
      start = this.index;
    }
  }

  private escape(): string {
    const kind = this.text[this.index + 1];
    this.index += 2;
    switch (kind) {
      case '"':
        return '"';
      case "\\":
        return "\\";
      case "/":
        return "/";
      case "b":
        return "\b";
      case "f":
        return "\f";
      case "n":
        return "\n";
      case "r":
        return "\r";
      case "t":
        return "\t";
      case "u": {
        const unit = this.hex4();
        if (unit >= 0xdc00 && unit <= 0xdfff) this.fail("lone surrogate escape");
        if (unit < 0xd800 || unit > 0xdbff) return String.fromCharCode(unit);
        if (this.text.startsWith("\\u", this.index)) {
          this.index += 2;
          const low = this.hex4();
          if (low >= 0xdc00 && low <= 0xdfff) return String.fromCharCode(unit, low);
        }
        return this.fail("lone surrogate escape");
      }
      default:
        return this.fail("invalid escape");
    }
  }

  private hex4(): number {
    const digits = this.text.slice(this.index, this.index + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(digits)) this.fail("invalid unicode escape");
    this.index += 4;
    return Number.parseInt(digits, 16);
  }

  private array(depth: number): JsonValue[] {
    if (depth > MAX_NESTING_DEPTH) this.fail(`nesting deeper than ${MAX_NESTING_DEPTH} levels`);
    this.index += 1;
    const items: JsonValue[] = [];
    this.skipWhitespace();
    if (this.text[this.index] === "]") {
      this.index += 1;
      return items;
    }
    for (;;) {
      items.push(this.value(depth));
      const c = this.text[this.index];
      this.index += 1;
      if (c === "]") return items;
      if (c !== ",") this.fail("expected , or ]");
    }
  }

  private object(depth: number): { [key: string]: JsonValue } {
    if (depth > MAX_NESTING_DEPTH) this.fail(`nesting deeper than ${MAX_NESTING_DEPTH} levels`);
    this.index += 1;
    const result: { [key: string]: JsonValue } = {};
    this.skipWhitespace();
    if (this.text[this.index] === "}") {
      this.index += 1;
      return result;
    }
    for (;;) {
      this.skipWhitespace();
      if (this.text[this.index] !== '"') this.fail("expected a string key");
      const key = this.string();
      this.skipWhitespace();
      if (this.text[this.index] !== ":") this.fail("expected :");
      this.index += 1;
      const item = this.value(depth);
      if (Object.prototype.hasOwnProperty.call(result, key)) {
        throw new NonCanonicalError("an object repeats a key");
      }
      // defineProperty, not assignment: a "__proto__" key stays an ordinary own key.
      Object.defineProperty(result, key, { value: item, enumerable: true, writable: true, configurable: true });
      const c = this.text[this.index];
      this.index += 1;
      if (c === "}") return result;
      if (c !== ",") this.fail("expected , or }");
    }
  }
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * Parse canonical JSON bytes.
 *
 * Throws `InvalidJSONError` (not UTF-8, not JSON, a lone surrogate escape, too deep)
 * or `NonCanonicalError` (a repeated key, or bytes that differ from the canonical form).
 */
export function loads(data: Uint8Array): JsonValue {
  let text: string;
  try {
    text = strictUtf8.decode(data); // a byte order mark stays and fails to parse
  } catch {
    throw new InvalidJSONError("not valid JSON: the bytes are not UTF-8");
  }
  const value = new Parser(text).parseDocument();
  let again: string;
  try {
    again = canonicalText(value);
  } catch (error) {
    if (error instanceof NotSerializableError) {
      throw new NonCanonicalError("JSON holds a number with no canonical form");
    }
    throw error;
  }
  if (again !== text) {
    let offset = 0;
    while (offset < again.length && offset < text.length && again[offset] === text[offset]) offset += 1;
    throw new NonCanonicalError(`JSON is not in canonical form (RFC 8785); first difference at character ${offset}`);
  }
  return value;
}
