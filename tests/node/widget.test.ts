/**
 * The widget's scroll window (widget.ts), and the pinned pi's own extension loader and
 * shortcut resolution taking the extension's `Shift+Up` / `Shift+Down` (RPC mode cannot
 * send keys, so the real-pi tests prove the window's first position and this proves the
 * keys are registered and not refused as a built-in conflict).
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { discoverAndLoadExtensions, ExtensionRunner } from "@mariozechner/pi-coding-agent";
// Not a public export: pi's interactive mode resolves shortcuts against this manager.
import { KeybindingsManager } from "../../node_modules/@mariozechner/pi-coding-agent/dist/core/keybindings.js";

import { SCROLL_DOWN_KEY, SCROLL_UP_KEY, WINDOW_LINES, WidgetScroll, windowOf } from "../../pi_workflows/pi/extension/widget.ts";

const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const text = (count: number, tag = "l"): string[] => Array.from({ length: count }, (_, i) => `${tag}${i}`);

test("a text that fits is shown whole, with no hint", () => {
  assert.deepEqual(windowOf(text(3), 0), { lines: ["l0", "l1", "l2"], offset: 0 });
  assert.deepEqual(windowOf(text(WINDOW_LINES), 5), { lines: text(WINDOW_LINES), offset: 0 }, "no offset to scroll to");
  assert.deepEqual(windowOf([], 2), { lines: [], offset: 0 });
});

test("a longer text shows one window and says where it is", () => {
  const shown = windowOf(text(12), 0);
  assert.deepEqual(shown.lines.slice(0, WINDOW_LINES), text(12).slice(0, WINDOW_LINES));
  assert.equal(shown.lines.length, WINDOW_LINES + 1);
  assert.equal(shown.lines.at(-1), "lines 1-8 of 12 (Shift+Up/Shift+Down to scroll)");
  assert.deepEqual(windowOf(text(12), 2).lines.slice(0, 2), ["l2", "l3"]);
  assert.equal(windowOf(text(12), 2).lines.at(-1), "lines 3-10 of 12 (Shift+Up/Shift+Down to scroll)");
  // Offsets are clamped: the last window ends at the last line, never past it.
  assert.deepEqual(windowOf(text(12), 99), { lines: [...text(12).slice(4), "lines 5-12 of 12 (Shift+Up/Shift+Down to scroll)"], offset: 4 });
  assert.equal(windowOf(text(12), -3).offset, 0);
  assert.deepEqual(windowOf(text(3), 1, 2).lines, ["l1", "l2", "lines 2-3 of 3 (Shift+Up/Shift+Down to scroll)"]);
});

test("pinned lines stay on top while the rest scrolls under them", () => {
  const shown = windowOf(text(12), 3, WINDOW_LINES, 1);
  assert.deepEqual(shown.lines.slice(0, WINDOW_LINES), ["l0", ...text(12).slice(4, 11)]);
  assert.equal(shown.lines.at(-1), "lines 5-11 of 12 (Shift+Up/Shift+Down to scroll)");
  assert.deepEqual(windowOf(text(12), 99, WINDOW_LINES, 1).lines.slice(0, 2), ["l0", "l5"], "clamped");
  assert.deepEqual(windowOf(text(3), 5, WINDOW_LINES, 1), { lines: ["l0", "l1", "l2"], offset: 0 });
  const scroll = new WidgetScroll(WINDOW_LINES, 1);
  scroll.set("run-1", text(12));
  scroll.scroll(2);
  assert.equal(scroll.window().lines[0], "l0", "the run's line stays");
  assert.equal(scroll.window().lines[1], "l3");
});

test("scrolling moves one line at a time within the text, and a new run starts at the top", () => {
  const scroll = new WidgetScroll();
  assert.deepEqual(scroll.window().lines, [], "no text yet");
  assert.equal(scroll.scroll(1), false);
  scroll.set("run-1", text(10));
  assert.equal(scroll.scroll(-1), false, "already at the top");
  assert.equal(scroll.scroll(1), true);
  assert.equal(scroll.window().lines[0], "l1");
  assert.equal(scroll.scroll(1), true);
  assert.equal(scroll.scroll(1), false, "the last window is shown");
  assert.equal(scroll.window().lines[0], "l2");
  scroll.set("run-1", text(11, "m")); // a new view of the same run keeps the position
  assert.equal(scroll.window().lines[0], "m2");
  scroll.set("run-1", text(9, "n")); // a shorter one clamps it
  assert.equal(scroll.window().lines[0], "n1");
  scroll.set("run-2", text(10, "o")); // another run starts at the top
  assert.equal(scroll.window().lines[0], "o0");
  scroll.set(null, []);
  assert.deepEqual(scroll.window().lines, []);
});

test("the pinned pi loads the extension and takes Shift+Up and Shift+Down with no conflict", async () => {
  const entry = join(REPO, "pi_workflows", "pi", "extension", "index.ts");
  const empty = mkdtempSync(join(tmpdir(), "piw-shortcuts-")); // no other extension is found
  const loaded = await discoverAndLoadExtensions([entry], empty, empty).finally(() => rmSync(empty, { recursive: true }));
  assert.deepEqual(loaded.errors, []);
  assert.equal(loaded.extensions.length, 1);
  const [extension] = loaded.extensions;
  assert.deepEqual(
    [...extension!.shortcuts.keys()].sort(),
    [SCROLL_DOWN_KEY, SCROLL_UP_KEY].sort(),
  );
  assert.deepEqual([SCROLL_UP_KEY, SCROLL_DOWN_KEY], ["shift+up", "shift+down"], "the key ids keybindings.md names");
  const runner = new ExtensionRunner(loaded.extensions, loaded.runtime, REPO, undefined as never, undefined as never);
  const shortcuts = runner.getShortcuts(new KeybindingsManager().getEffectiveConfig());
  assert.ok(shortcuts.has(SCROLL_UP_KEY) && shortcuts.has(SCROLL_DOWN_KEY));
  assert.deepEqual(runner.getShortcutDiagnostics(), [], "no built-in shortcut uses either key");
});
