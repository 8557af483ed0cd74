import { describe, expect, it } from 'vitest';
import { cachedQwen, chatRunCold, chatRunWarm, partialLlama } from '../../test/fixtures';
import type { RunRecord } from './backend';
import {
  applyChatEvent,
  chatFooterParts,
  chatLiveState,
  chatModelOptions,
  formatThinkingTime,
  historyOf,
  reasoningSummary,
  type ChatTurn,
} from './chat';

describe('chat helpers', () => {
  it('offers the tiny model first, then only complete library models', () => {
    expect(chatModelOptions([cachedQwen, partialLlama])).toEqual([
      { value: 'tiny', label: 'Built-in tiny (speed test, random weights)' },
      { value: cachedQwen.id, label: cachedQwen.id },
    ]);
  });

  it('leaves out a model whose architecture Ondo does not run yet', () => {
    const mamba = {
      ...cachedQwen,
      id: 'someone/mamba-2.8b',
      model_type: 'mamba',
      unsupported: 'not supported yet: model_type mamba (Ondo runs: llama, mistral, qwen2, qwen3)',
    };
    expect(chatModelOptions([cachedQwen, mamba]).map((option) => option.value)).toEqual(['tiny', cachedQwen.id]);
    const embedder = { ...cachedQwen, id: 'mlx-community/Qwen3-Embedding-0.6B-4bit', embedding: true };
    expect(chatModelOptions([cachedQwen, embedder]).map((option) => option.value)).toEqual(['tiny', cachedQwen.id]);
  });

  it('offers the model split over several machines while the split runs, even where only its share is here', () => {
    const split = {
      ask: { model: partialLlama.id, hosts: ['localhost', 'studio-2.local'], split: 'pipeline' as const },
      state: { state: 'serving' as const, url: 'http://127.0.0.1:40123' },
      lines: [],
    };
    expect(chatModelOptions([cachedQwen, partialLlama], split)).toEqual([
      { value: 'tiny', label: 'Built-in tiny (speed test, random weights)' },
      { value: cachedQwen.id, label: cachedQwen.id },
      { value: partialLlama.id, label: `${partialLlama.id} (split by layers over 2 machines)` },
    ]);
    const ended = { ...split, state: { state: 'ended' as const, reason: 'stopped' } };
    expect(chatModelOptions([cachedQwen, partialLlama], ended).map((option) => option.value)).toEqual([
      'tiny',
      cachedQwen.id,
    ]);
  });

  it('writes the footer of a cold and of a warm answer', () => {
    expect(chatFooterParts(chatRunCold)).toEqual([
      'cold · load 15.0 ms',
      'TTFT 8.50 ms',
      'prompt 12 tok · prefill 3,790 tok/s',
      '16 tok · decode 383 tok/s',
      'peak 7.40 MiB',
    ]);
    expect(chatFooterParts(chatRunWarm).slice(0, 3)).toEqual([
      'warm',
      'TTFT 3.10 ms',
      'prompt 42 tok (30 cached) · prefill 3,870 tok/s',
    ]);
  });

  it('follows an answer from prefill to decode', () => {
    const answer: ChatTurn = { role: 'assistant', content: '', phase: 'prefilling', deltas: 0 };
    expect(chatLiveState(answer)).toBe('prefilling…');
    applyChatEvent(answer, { event: 'started', load_kind: 'warm', load_ms: 0, prompt_tokens: 42, cached_tokens: 30 });
    expect(chatLiveState(answer)).toBe('warm · prefilling… prompt 42 tok (30 cached)');
    applyChatEvent(answer, { event: 'delta', text: 'Hel', reasoning: '' });
    applyChatEvent(answer, { event: 'delta', text: 'lo', reasoning: '' });
    expect(answer.content).toBe('Hello');
    expect(chatLiveState(answer)).toBe('warm · decoding… 2 tok');
  });

  it("keeps a thinking model's reasoning apart from its answer", () => {
    const answer: ChatTurn = { role: 'assistant', content: '', phase: 'prefilling', started: null, deltas: 0 };
    applyChatEvent(answer, { event: 'started', load_kind: 'warm', load_ms: 0, prompt_tokens: 9, cached_tokens: 0 });
    applyChatEvent(answer, { event: 'delta', text: '', reasoning: 'The user greets' });
    applyChatEvent(answer, { event: 'delta', text: '', reasoning: ' me.' });
    expect(answer.reasoning).toBe('The user greets me.');
    expect(answer.content).toBe('');
    expect(chatLiveState(answer)).toBe('warm · thinking… 2 tok');
    applyChatEvent(answer, { event: 'delta', text: 'Hello!', reasoning: '' });
    expect(answer.content).toBe('Hello!');
    expect(answer.reasoning).toBe('The user greets me.');
    expect(chatLiveState(answer)).toBe('warm · decoding… 3 tok');
  });

  it('says how long the model thought and how much: the page clock first, then the record', () => {
    const answer: ChatTurn = { role: 'assistant', content: '', phase: 'prefilling', deltas: 0 };
    applyChatEvent(answer, { event: 'delta', text: '', reasoning: 'Hm, ' }, 1_000);
    applyChatEvent(answer, { event: 'delta', text: '', reasoning: 'two and two.' }, 2_000);
    expect(reasoningSummary(answer)).toBe('Thinking…');
    applyChatEvent(answer, { event: 'delta', text: 'Four.', reasoning: '' }, 3_400);
    expect(reasoningSummary(answer)).toBe('Thought for 2.4 s · 16 characters');
    answer.record = { ...chatRunCold, reasoning_tokens: 1_234, reasoning_ms: 65_400 };
    expect(reasoningSummary(answer)).toBe('Thought for 1 min 5 s · 1,234 tokens');
    expect(chatFooterParts(answer.record)[3]).toBe('16 tok (1,234 thinking) · decode 383 tok/s');
  });

  it('an answer stopped while thinking still says it thought', () => {
    const answer: ChatTurn = { role: 'assistant', content: '', phase: 'prefilling', deltas: 0 };
    applyChatEvent(answer, { event: 'delta', text: '', reasoning: 'Let me see' }, 0);
    answer.phase = 'stopped';
    expect(reasoningSummary(answer)).toBe('Thought first · 10 characters');
  });

  it('writes thinking times as people read them', () => {
    expect(formatThinkingTime(420)).toBe('0.4 s');
    expect(formatThinkingTime(3_240)).toBe('3.2 s');
    expect(formatThinkingTime(12_600)).toBe('13 s');
    expect(formatThinkingTime(125_000)).toBe('2 min 5 s');
  });

  it('puts the images and what encoding them took right after the load', () => {
    expect(chatFooterParts({ ...chatRunCold, images: 1, image_tokens: 256, image_encode_ms: 41 }).slice(0, 3)).toEqual([
      'cold · load 15.0 ms',
      '1 image · encode 41.0 ms',
      'TTFT 8.50 ms',
    ]);
    expect(chatFooterParts({ ...chatRunWarm, images: 2, image_tokens: 512, image_encode_ms: 1_234 })[1]).toBe(
      '2 images · encode 1.23 s',
    );
    // Both images' tokens came from the conversation's cache: nothing encoded.
    expect(chatFooterParts({ ...chatRunWarm, images: 2, image_tokens: 512, image_encode_ms: 0 })[1]).toBe(
      '2 images · encode 0 ms (cached)',
    );
    // A record written before images were recorded, or of a text prompt, has no such part.
    const { images: _images, image_tokens: _tokens, image_encode_ms: _encode, ...older } = chatRunCold;
    expect(chatFooterParts(older as RunRecord)).toEqual(chatFooterParts(chatRunCold));
    expect(chatFooterParts(chatRunCold)).toHaveLength(5);
  });

  it('sends each turn with its images every time, as bare base64', () => {
    const cat = { name: 'cat.png', dataUrl: 'data:image/png;base64,iVBORw==', base64: 'iVBORw==' };
    const dog = { name: 'dog.jpg', dataUrl: 'data:image/jpeg;base64,/9j/4A==', base64: '/9j/4A==' };
    const turns: ChatTurn[] = [
      { role: 'user', content: 'Which is bigger?', images: [cat, dog] },
      { role: 'assistant', content: 'The dog.', phase: 'done', record: chatRunCold },
      { role: 'user', content: '', images: [cat] },
      { role: 'assistant', content: 'A cat again.', phase: 'done', record: chatRunWarm },
      { role: 'user', content: 'Thanks', images: [] },
    ];
    expect(historyOf(turns)).toEqual([
      { role: 'user', content: 'Which is bigger?', images: ['iVBORw==', '/9j/4A=='] },
      { role: 'assistant', content: 'The dog.' },
      { role: 'user', content: '', images: ['iVBORw=='] },
      { role: 'assistant', content: 'A cat again.' },
      { role: 'user', content: 'Thanks' },
    ]);
    // A message without images has no `images` key at all.
    expect('images' in (historyOf(turns)[4] ?? {})).toBe(false);
  });

  it('sends every message with text, as plain role and content', () => {
    const turns: ChatTurn[] = [
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: '', phase: 'stopped', record: chatRunCold },
      { role: 'user', content: 'Again' },
    ];
    expect(historyOf(turns)).toEqual([
      { role: 'user', content: 'Hi' },
      { role: 'user', content: 'Again' },
    ]);
  });
});
