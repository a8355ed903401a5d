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

/**
 * The window over `text` from `offset` (clamped), `size` lines tall. The first `pinned`
 * lines stay on top whatever the offset (the run's status line with its run ID): the
 * window scrolls over the lines after them.
 */
export function windowOf(text: readonly string[], offset: number, size: number = WINDOW_LINES, pinned = 0): WidgetWindow {
  const height = Math.max(1, Math.floor(size));
  const kept = Math.min(Math.max(0, Math.floor(pinned)), height - 1, text.length);
  const body = text.slice(kept);
  const room = height - kept;
  const from = Math.min(Math.max(0, Math.floor(offset)), lastOffset(body.length, room));
  const lines = [...text.slice(0, kept), ...body.slice(from, from + room)];
  if (text.length > height) {
    const to = kept + from + (lines.length - kept);
    // At the top every line up to `to` shows; scrolled, the pinned ones go unsaid.
    const first = from === 0 ? 1 : kept + from + 1;
    lines.push(`lines ${first}-${to} of ${text.length} (Shift+Up/Shift+Down to scroll)`);
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

  /** `pinned`: lines at the top that never scroll away (the run ID's line). */
  constructor(
    readonly size: number = WINDOW_LINES,
    readonly pinned = 0,
  ) {}

  /** Replace the text; `key` names what it shows (the run ID). */
  set(key: string | null, text: readonly string[]): void {
    if (key !== this.key) this.offset = 0;
    this.key = key;
    this.text = text;
    this.offset = windowOf(text, this.offset, this.size, this.pinned).offset;
  }

  /** Move the window by `delta` lines (negative: up); true when it moved. */
  scroll(delta: number): boolean {
    const before = this.offset;
    this.offset = windowOf(this.text, this.offset + delta, this.size, this.pinned).offset;
    return this.offset !== before;
  }

  /** The visible window (no lines when there is no text). */
  window(): WidgetWindow {
    return windowOf(this.text, this.offset, this.size, this.pinned);
  }
}
