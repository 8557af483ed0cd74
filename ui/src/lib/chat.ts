// The chat's bookkeeping and the footer under each answer. Pure functions,
// so the wording and the rounding are unit-tested.
import type { ChatEvent, ChatMessage, LibraryModel, RunRecord, SplitStatus } from './backend';
import { formatBytes, formatCount, formatMs, formatTps } from './format';
import type { ChatImage } from './images';
import { splitModelLabel } from './split';

/** The model id the shell reads as the built-in tiny model. */
export const TINY_MODEL = 'tiny';
export const TINY_MODEL_LABEL = 'Built-in tiny (speed test, random weights)';

/** Where an answer is: waiting for its first token, writing, or finished. */
export type AnswerPhase = 'prefilling' | 'decoding' | 'done' | 'stopped';

/** One message as the conversation view shows it. */
export interface ChatTurn {
  role: 'user' | 'assistant';
  content: string;
  /** User only: the images the message shows, in the order they were attached. */
  images?: ChatImage[];
  /** Assistant only: where the answer is. */
  phase?: AnswerPhase;
  /** Assistant only: the `started` event, once the prompt is being prefilled. */
  started?: Extract<ChatEvent, { event: 'started' }> | null;
  /** Assistant only: what a thinking model reasoned before answering. */
  reasoning?: string;
  /** Assistant only: when the first reasoning and the first answer text
   * arrived (ms, the page's clock), for "Thought for" before the record. */
  reasoningFrom?: number;
  reasoningUntil?: number;
  /** Assistant only: text pieces received so far (about one per token). */
  deltas?: number;
  /** Assistant only: the run's record once the answer is finished. */
  record?: RunRecord | null;
}

/**
 * The models a chat can use: the tiny model, then complete library models
 * the engine runs, less embedding models (they make vectors, not replies).
 */
export function chatModelOptions(
  library: LibraryModel[],
  split: SplitStatus | null = null,
): { value: string; label: string }[] {
  const options = [
    { value: TINY_MODEL, label: TINY_MODEL_LABEL },
    ...library
      .filter((model) => model.complete && model.unsupported === null && !model.embedding)
      .map((model) => ({ value: model.id, label: model.id })),
  ];
  // A model split over several machines answers through them while the
  // split runs (this Mac may hold only its share of it).
  if (split && split.state.state !== 'ended') {
    const label = splitModelLabel(split);
    const listed = options.find((option) => option.value === split.ask.model);
    if (listed) listed.label = label;
    else options.push({ value: split.ask.model, label });
  }
  return options;
}

/** A fresh conversation id. */
export function newConversationId(): string {
  if (typeof crypto !== 'undefined' && typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  // Only where randomUUID is missing (old test environments).
  return `conv-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

/** What goes to `chat_send`: every message with text or images, as plain
 * objects. Every turn sends its images again each time, in the same place:
 * the shell reuses an image's cached tokens only where the history matches. */
export function historyOf(turns: ChatTurn[]): ChatMessage[] {
  return turns
    .filter((turn) => turn.content.length > 0 || (turn.images?.length ?? 0) > 0)
    .map((turn) => {
      const message: ChatMessage = { role: turn.role, content: turn.content };
      if (turn.images && turn.images.length > 0) message.images = turn.images.map((image) => image.base64);
      return message;
    });
}

/** Applies one streamed event, received at `now` (ms), to the answer being written. */
export function applyChatEvent(answer: ChatTurn, event: ChatEvent, now: number = Date.now()): void {
  if (event.event === 'started') {
    answer.started = event;
  } else {
    if (event.reasoning) {
      answer.reasoning = (answer.reasoning ?? '') + event.reasoning;
      answer.reasoningFrom ??= now;
    }
    if (event.text && answer.reasoningFrom !== undefined) answer.reasoningUntil ??= now;
    answer.content += event.text;
    answer.deltas = (answer.deltas ?? 0) + 1;
    answer.phase = 'decoding';
  }
}

/** Whether the answer is still in its reasoning: thinking, nothing answered yet. */
export function isThinking(answer: ChatTurn): boolean {
  return answer.phase === 'decoding' && answer.content === '' && (answer.reasoning ?? '') !== '';
}

/** Seconds as "Thought for" says them: "0.4 s", "12 s", "2 min 5 s". */
export function formatThinkingTime(ms: number): string {
  const seconds = ms / 1000;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const whole = Math.round(seconds);
  return `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

/** The reasoning's one-line summary: "Thinking…" while it lasts, then how
 * long it took and how long it is. The run's record has the engine's own
 * figures (the reasoning tokens' decode time and count); until it arrives,
 * the page's clock and the text's length stand in. */
export function reasoningSummary(answer: ChatTurn): string {
  if (isThinking(answer)) return 'Thinking…';
  const record = answer.record;
  if (record && record.reasoning_tokens > 0) {
    const time = record.reasoning_ms ?? 0;
    return `Thought for ${formatThinkingTime(time)} · ${formatCount(record.reasoning_tokens)} tokens`;
  }
  const characters = `${formatCount((answer.reasoning ?? '').length)} characters`;
  if (answer.reasoningFrom !== undefined && answer.reasoningUntil !== undefined) {
    return `Thought for ${formatThinkingTime(answer.reasoningUntil - answer.reasoningFrom)} · ${characters}`;
  }
  return `Thought first · ${characters}`;
}

function loadPart(kind: string, loadMs: number | null): string {
  return kind === 'cold' ? `cold · load ${formatMs(loadMs)}` : 'warm';
}

function promptPart(promptTokens: number, cachedTokens: number, fromDiskMs: number | null = null): string {
  const from = fromDiskMs === null ? '' : `, read from disk in ${formatMs(fromDiskMs)}`;
  const cached = cachedTokens > 0 ? ` (${formatCount(cachedTokens)} cached${from})` : '';
  return `prompt ${formatCount(promptTokens)} tok${cached}`;
}

/** The generated tokens that were thinking, when some were: every one is
 * decoded and timed like the answer's. */
function reasoningPart(record: RunRecord): string {
  return record.reasoning_tokens > 0 ? ` (${formatCount(record.reasoning_tokens)} thinking)` : '';
}

/** The images the prompt showed and what encoding them took (part of the
 * time to first token); 0 ms means the conversation's cache held their
 * tokens. Null for a prompt without images. */
function imagesPart(record: RunRecord): string | null {
  const count = record.images ?? 0;
  if (count <= 0) return null;
  const encodeMs = record.image_encode_ms ?? null;
  const encode = encodeMs === 0 ? '0 ms (cached)' : formatMs(encodeMs);
  return `${formatCount(count)} ${count === 1 ? 'image' : 'images'} · encode ${encode}`;
}

/** The footer under a finished answer, one entry per cost, in the order
 * they were paid: load, images, prompt, answer, memory. */
export function chatFooterParts(record: RunRecord): string[] {
  const images = imagesPart(record);
  return [
    loadPart(record.load_kind, record.load_ms),
    ...(images === null ? [] : [images]),
    `TTFT ${formatMs(record.ttft_ms)}`,
    `${promptPart(record.prompt_tokens, record.cached_tokens, record.prefix_source === 'disk' ? (record.prefix_read_ms ?? 0) : null)} · prefill ${formatTps(record.prefill_tps)}`,
    `${formatCount(record.generated_tokens)} tok${reasoningPart(record)} · decode ${formatTps(record.decode_tps)}`,
    `peak ${formatBytes(record.mlx_peak_bytes)}`,
  ];
}

/** The live line while an answer is written: "cold · load 15.0 ms · prefilling… prompt 42 tok". */
export function chatLiveState(answer: ChatTurn): string {
  const parts: string[] = [];
  const started = answer.started;
  if (started) parts.push(loadPart(started.load_kind, started.load_ms));
  if (answer.phase === 'decoding') {
    const count = answer.deltas ?? 0;
    parts.push(`${isThinking(answer) ? 'thinking' : 'decoding'}… ${formatCount(count)} tok`);
  } else {
    parts.push(started ? `prefilling… ${promptPart(started.prompt_tokens, started.cached_tokens)}` : 'prefilling…');
  }
  return parts.join(' · ');
}
