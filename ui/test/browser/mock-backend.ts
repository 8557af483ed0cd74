// Stands in for the Tauri shell in the browser test: answers the popover's
// commands from fixtures, then mounts the real app. `?scenario=` picks how the
// backend behaves; every call is recorded in `window.__ondoIpcCalls`. In
// 'thinking', Qwen3 is downloaded, its template has the Think switch, and it
// reasons before an answer in Markdown.
import type { Channel } from '@tauri-apps/api/core';
import { mockIPC, mockWindows } from '@tauri-apps/api/mocks';
import type {
  ChatEvent,
  ChatMessage,
  CommandError,
  LocalServerState,
  DownloadEvent,
  DownloadSummary,
  PooledModel,
  RunRecord,
  SplitView,
} from '../../src/lib/backend';
import {
  cachedQwen,
  chatRunCold,
  demoRun,
  doctorReport,
  doctorReportWithoutKernels,
  emptyModelsView,
  kernelsMissing,
  memorySnapshot,
  modelsViewWithQwen,
  preparedTinyModel,
  qwen06b,
  qwen4bFit,
} from '../fixtures';
import { chatSettings } from '../fixtures-settings';

type Scenario = 'ok' | 'generation-fails' | 'no-kernels' | 'server' | 'thinking';

declare global {
  interface Window {
    __ondoIpcCalls: { cmd: string; payload: unknown }[];
  }
}

const scenario = (new URLSearchParams(location.search).get('scenario') ?? 'ok') as Scenario;
window.__ondoIpcCalls = [];

/** Slow enough for the busy state to render, quick enough for the test. */
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const generationFailed: CommandError = {
  kind: 'mlx',
  message:
    'MLX failed while generating: [malloc] Unable to allocate 4294967296 bytes; if memory ran out, try a smaller model or a shorter context',
};

/** The mock's one download (Qwen3 0.6B): the first call stops at 42% and
 * waits for a pause; the next continues from there and completes. */
const download = {
  total: qwen06b.entry.size_bytes,
  calls: 0,
  complete: false,
  cancel: null as (() => void) | null,
};

async function downloadModel(model: string, channel: Channel<DownloadEvent>): Promise<DownloadSummary> {
  const send = (event: DownloadEvent) => channel.onmessage(event);
  const progress = (done: number, bytesPerSecond: number): DownloadEvent => ({
    event: 'progress',
    file: 'model.safetensors',
    file_bytes: done - 4_000_000,
    file_total_bytes: download.total - 4_000_000,
    done_bytes: done,
    total_bytes: download.total,
    bytes_per_second: bytesPerSecond,
    eta_seconds: (download.total - done) / bytesPerSecond,
  });
  download.calls += 1;
  const resuming = download.calls > 1;
  const present = resuming ? 0.42 * download.total : 0;
  send({ event: 'planned', model, commit: 'abc123', files: 4, total_bytes: download.total, present_bytes: present });
  if (!resuming) {
    send({ event: 'file_done', file: 'config.json', verified: true, fetched_bytes: 4_000_000 });
    await pause(50);
    send(progress(0.42 * download.total, 12_400_000));
    await new Promise<void>((resolve) => (download.cancel = resolve));
    throw { kind: 'cancelled', message: 'The download was paused; download again to continue.' } satisfies CommandError;
  }
  await pause(100);
  send(progress(0.8 * download.total, 15_000_000));
  await pause(150);
  send(progress(download.total, 15_000_000));
  download.complete = true;
  return {
    model,
    commit: 'abc123',
    snapshot_dir: '/home/me/.cache/huggingface/hub/models--mlx-community--Qwen3-0.6B-4bit/snapshots/abc123',
    files: 4,
    total_bytes: download.total,
    fetched_bytes: 0.58 * download.total,
    download_ms: 300,
  };
}

/** The mock's chats: the model is loaded once (the first answer is cold),
 * and each conversation's KV cache holds the tokens it has seen. */
const chat = {
  loaded: false,
  /** Tokens cached per conversation id. */
  cached: new Map<string, number>(),
  stop: new Map<string, () => void>(),
};

/** About four characters a token, as a rough tokenizer would count. */
const tokens = (messages: ChatMessage[]) =>
  messages.reduce((sum, message) => sum + 4 + Math.ceil(message.content.length / 4), 0);

/** What the thinking model reasons, then answers (with HTML in it that
 * must stay text), a piece at a time. */
const thinkingReply = {
  reasoning: ['The user wants a file listing.', ' Show the command,', ' then explain the flags in a table.'],
  answer: [
    '## Listing files\n\n',
    'Use **ls** with two flags:\n\n',
    '```sh\nls -la ~/Documents  # every file, the hidden ones too, with sizes and dates\nls -la ~/Downloads\n```\n\n',
    '| Flag | Shows |\n|:--|:--|\n| `-l` | sizes and dates |\n| `-a` | hidden files |\n\n',
    'Never paste `<script>` tags or <img src=x onerror=alert(1)> into a shell.',
  ],
};

async function chatSendThinking(think: boolean, channel: Channel<ChatEvent>): Promise<RunRecord> {
  const send = (event: ChatEvent) => channel.onmessage(event);
  await pause(50);
  send({ event: 'started', load_kind: 'warm', load_ms: 0, prompt_tokens: 31, cached_tokens: 0 });
  await pause(50);
  if (think) {
    for (const reasoning of thinkingReply.reasoning) {
      send({ event: 'delta', text: '', reasoning });
      await pause(80);
    }
  }
  for (const text of thinkingReply.answer) {
    send({ event: 'delta', text, reasoning: '' });
    await pause(40);
  }
  return {
    ...chatRunCold,
    run_id: 'run-chat-thinking',
    model_id: cachedQwen.id,
    load_kind: 'warm',
    load_ms: 0,
    ttft_ms: 41.2,
    prompt_tokens: 31,
    prefill_tokens: 31,
    generated_tokens: think ? 118 : 70,
    reasoning_tokens: think ? 48 : 0,
    reasoning_ms: think ? 3_240 : 0,
    decode_tps: 38.4,
  };
}

async function chatSend(conversationId: string, messages: ChatMessage[], channel: Channel<ChatEvent>): Promise<RunRecord> {
  const send = (event: ChatEvent) => channel.onmessage(event);
  const cold = !chat.loaded;
  chat.loaded = true;
  const prompt = tokens(messages);
  const cached = Math.min(chat.cached.get(conversationId) ?? 0, prompt);
  let stopped = false;
  chat.stop.set(conversationId, () => (stopped = true));
  await pause(cold ? 150 : 50);
  send({ event: 'started', load_kind: cold ? 'cold' : 'warm', load_ms: cold ? 15 : 0, prompt_tokens: prompt, cached_tokens: cached });
  await pause(100);
  const words = ['The', ' sky', ' scatters', ' blue', ' light', ' more', ' than', ' red', '.'];
  let generated = 0;
  let text = '';
  for (const word of words) {
    if (stopped) break;
    send({ event: 'delta', text: word, reasoning: '' });
    text += word;
    generated += 1;
    await pause(60);
  }
  chat.stop.delete(conversationId);
  chat.cached.set(conversationId, prompt + generated);
  return {
    ...chatRunCold,
    run_id: `run-chat-${prompt}-${cached}`,
    load_kind: cold ? 'cold' : 'warm',
    load_ms: cold ? 15 : 0,
    ttft_ms: cold ? 8.5 : 3.1,
    prompt_tokens: prompt,
    cached_tokens: cached,
    prefill_tokens: prompt - cached,
    generated_tokens: generated,
    decode_tps: cold ? 382.7 : 401.2,
    stop_reason: stopped ? 'cancelled' : 'eos',
  };
}

/** The tiny model stays warm after a generation, as the pool keeps it. */
let warm = false;
const warmTiny: PooledModel = {
  model_id: 'tiny',
  model_dir: '/home/me/.local/share/ondo/models/tiny',
  weights_bytes: 7_340_032,
  kv_cache_bytes: 1_048_576,
  idle_ms: 0,
  expires_in_ms: 600_000,
  busy: false,
};

/** The local server in the 'server' scenario: answering curl, 12 served. */
const serving: LocalServerState = {
  state: 'on',
  status: {
    url: 'http://127.0.0.1:11480',
    requests_served: 12,
    waiting: 0,
    in_flight: { route: 'POST /v1/chat/completions', model: 'tiny', user_agent: 'curl/8.5.0', running_ms: 120 },
  },
};

mockWindows('main');
mockIPC(async (cmd, payload) => {
  window.__ondoIpcCalls.push({ cmd, payload });
  switch (cmd) {
    case 'startup_check':
      if (scenario === 'no-kernels') throw kernelsMissing;
      return null;
    case 'doctor_report':
      return scenario === 'no-kernels' ? doctorReportWithoutKernels : doctorReport;
    case 'list_models':
      return download.complete || scenario === 'thinking' ? modelsViewWithQwen : emptyModelsView;
    case 'chat_features': {
      const { model } = payload as { model: string };
      return { thinking_switch: model === cachedQwen.id, sees_images: false };
    }
    case 'memory_now':
      return memorySnapshot;
    case 'pool_status':
      return { resident: warm ? [warmTiny] : [], events: [] };
    case 'unload_model':
      warm = false;
      return true;
    case 'fit_model': {
      const { model } = payload as { model: string };
      if (model === 'nobody/nothing') {
        throw { kind: 'repo_not_found', message: `No model ${model} on Hugging Face; check the id` } satisfies CommandError;
      }
      return qwen4bFit;
    }
    case 'download_model': {
      const { model, onEvent } = payload as { model: string; onEvent: Channel<DownloadEvent> };
      return downloadModel(model, onEvent);
    }
    case 'cancel_download': {
      const cancel = download.cancel;
      download.cancel = null;
      cancel?.();
      return cancel !== null;
    }
    case 'prepare_builtin_model':
      await pause(150);
      return preparedTinyModel;
    case 'run_test_generation':
      await pause(300);
      if (scenario === 'generation-fails') throw generationFailed;
      warm = true;
      return demoRun;
    case 'get_settings':
      return chatSettings;
    case 'chat_send': {
      const { model, conversationId, messages, think, onEvent } = payload as {
        model: string;
        conversationId: string;
        messages: ChatMessage[];
        think: boolean | null;
        onEvent: Channel<ChatEvent>;
      };
      if (model === cachedQwen.id) return chatSendThinking(think === true, onEvent);
      return chatSend(conversationId, messages, onEvent);
    }
    case 'chat_stop': {
      const { conversationId } = payload as { conversationId: string };
      const stop = chat.stop.get(conversationId);
      stop?.();
      return stop !== undefined;
    }
    case 'chat_forget': {
      const { conversationId } = payload as { conversationId: string };
      chat.cached.delete(conversationId);
      return null;
    }
    case 'server_status':
      return scenario === 'server' ? serving : ({ state: 'off' } satisfies LocalServerState);
    case 'split_status':
      return { status: null, last_ask: null } satisfies SplitView;
    case 'plugin:window|hide':
      return null;
    default:
      throw { kind: 'internal', message: `the mock backend has no command ${cmd}` } satisfies CommandError;
  }
}, { shouldMockEvents: true });

await import('../../src/main');
