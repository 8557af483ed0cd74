// The chat's bookkeeping and the footer under each answer. Pure functions,
// so the wording and the rounding are unit-tested.
import type { ChatEvent, ChatMessage, LibraryModel, RunRecord } from './backend';
import { formatBytes, formatCount, formatMs, formatTps } from './format';

/** The model id the shell reads as the built-in tiny model. */
export const TINY_MODEL = 'tiny';
export const TINY_MODEL_LABEL = 'Built-in tiny (speed test, random weights)';

/** Where an answer is: waiting for its first token, writing, or finished. */
export type AnswerPhase = 'prefilling' | 'decoding' | 'done' | 'stopped';

/** One message as the conversation view shows it. */
export interface ChatTurn {
  role: 'user' | 'assistant';
  content: string;
  /** Assistant only: where the answer is. */
  phase?: AnswerPhase;
  /** Assistant only: the `started` event, once the prompt is being prefilled. */
  started?: Extract<ChatEvent, { event: 'started' }> | null;
  /** Assistant only: what a thinking model reasoned before answering. */
  reasoning?: string;
  /** Assistant only: text pieces received so far (about one per token). */
  deltas?: number;
  /** Assistant only: the run's record once the answer is finished. */
  record?: RunRecord | null;
}

/** The models a chat can use: the tiny model, then complete library models the engine runs. */
export function chatModelOptions(library: LibraryModel[]): { value: string; label: string }[] {
  return [
    { value: TINY_MODEL, label: TINY_MODEL_LABEL },
    ...library
      .filter((model) => model.complete && model.unsupported === null)
      .map((model) => ({ value: model.id, label: model.id })),
  ];
}

/** A fresh conversation id. */
export function newConversationId(): string {
  if (typeof crypto !== 'undefined' && typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  // Only where randomUUID is missing (old test environments).
  return `conv-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

/** What goes to `chat_send`: every message with text, as plain objects. */
export function historyOf(turns: ChatTurn[]): ChatMessage[] {
  return turns
    .filter((turn) => turn.content.length > 0)
    .map((turn) => ({ role: turn.role, content: turn.content }));
}

/** Applies one streamed event to the answer being written. */
export function applyChatEvent(answer: ChatTurn, event: ChatEvent): void {
  if (event.event === 'started') {
    answer.started = event;
  } else {
    answer.content += event.text;
    if (event.reasoning) answer.reasoning = (answer.reasoning ?? '') + event.reasoning;
    answer.deltas = (answer.deltas ?? 0) + 1;
    answer.phase = 'decoding';
  }
}

function loadPart(kind: string, loadMs: number | null): string {
  return kind === 'cold' ? `cold · load ${formatMs(loadMs)}` : 'warm';
}

function promptPart(promptTokens: number, cachedTokens: number): string {
  const cached = cachedTokens > 0 ? ` (${formatCount(cachedTokens)} cached)` : '';
  return `prompt ${formatCount(promptTokens)} tok${cached}`;
}

/** The footer under a finished answer, one entry per cost. */
export function chatFooterParts(record: RunRecord): string[] {
  return [
    loadPart(record.load_kind, record.load_ms),
    `TTFT ${formatMs(record.ttft_ms)}`,
    `${promptPart(record.prompt_tokens, record.cached_tokens)} · prefill ${formatTps(record.prefill_tps)}`,
    `${formatCount(record.generated_tokens)} tok · decode ${formatTps(record.decode_tps)}`,
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
    const thinking = answer.content === '' && (answer.reasoning ?? '') !== '';
    parts.push(`${thinking ? 'thinking' : 'decoding'}… ${formatCount(count)} tok`);
  } else {
    parts.push(started ? `prefilling… ${promptPart(started.prompt_tokens, started.cached_tokens)}` : 'prefilling…');
  }
  return parts.join(' · ');
}
