/**
 * The widget's scroll window: a bounded number of lines over the full widget text, moved
 * by `Shift+Up` / `Shift+Down` (registered in index.ts). Pure: no Pi, no I/O, so node's
 * test runner covers it (RPC mode cannot send keys).
 *
 * The text itself comes from render.ts (copied from the server's `display`); this only
 * chooses which lines are visible and adds one hint line when some are not.
 */

/** Lines of widget text visible at once. */
export const WINDOW_LINES = 8;

export const SCROLL_UP_KEY = "shift+up";
export const SCROLL_DOWN_KEY = "shift+down";

export interface WidgetWindow {
  /** The visible lines, plus a hint line when the text is longer than the window. */
  lines: string[];
  /** The first visible line's index, clamped to the text. */
  offset: number;
}

/** The largest useful offset for `count` lines in a window of `size`. */
function lastOffset(count: number, size: number): number {
  return Math.max(0, count - size);
}

/** The window over `text` from `offset` (clamped), `size` lines tall. */
export function windowOf(text: readonly string[], offset: number, size: number = WINDOW_LINES): WidgetWindow {
  const height = Math.max(1, Math.floor(size));
  const from = Math.min(Math.max(0, Math.floor(offset)), lastOffset(text.length, height));
  const lines = text.slice(from, from + height);
  if (text.length > height) {
    const to = from + lines.length;
    lines.push(`lines ${from + 1}-${to} of ${text.length} (Shift+Up/Shift+Down to scroll)`);
  }
  return { lines, offset: from };
}

/**
 * The scroll position of one widget. A new text for the same run keeps the position
 * (clamped); another run's text starts at the top.
 */
export class WidgetScroll {
  private text: readonly string[] = [];
  private key: string | null = null;
  private offset = 0;

  constructor(readonly size: number = WINDOW_LINES) {}

  /** Replace the text; `key` names what it shows (the run ID). */
  set(key: string | null, text: readonly string[]): void {
    if (key !== this.key) this.offset = 0;
    this.key = key;
    this.text = text;
    this.offset = windowOf(text, this.offset, this.size).offset;
  }

  /** Move the window by `delta` lines (negative: up); true when it moved. */
  scroll(delta: number): boolean {
    const before = this.offset;
    this.offset = windowOf(this.text, this.offset + delta, this.size).offset;
    return this.offset !== before;
  }

  /** The visible window (no lines when there is no text). */
  window(): WidgetWindow {
    return windowOf(this.text, this.offset, this.size);
  }
}
