// The shell's commands as the pages call them. The types and the calls come
// from `bindings.ts`, generated from the Rust commands (src-tauri/tests/
// bindings.rs fails when it is stale), so a renamed field or argument breaks
// `npm run check` instead of a page at run time. What is written here by
// hand: Channels turned into callbacks, the settings' read shape, and the
// map from an app-wide event's name to its payload (both generated as
// `AppEvent` from src-tauri/src/events.rs).
import { Channel } from '@tauri-apps/api/core';
import { listen, type UnlistenFn } from '@tauri-apps/api/event';
import {
  commands,
  ERROR_KINDS,
  type AppEvent,
  type AppSettings as AppSettingsSent,
  type BenchEvent,
  type BenchRequest,
  type ChatEvent,
  type ChatMessage,
  type CommandError,
  type DownloadEvent,
  type ErrorKind,
  type GenerationSettings as GenerationSettingsSent,
  type LocalServerSettings as LocalServerSettingsSent,
} from './bindings';

export { ERROR_KINDS };

export type {
  AppView,
  BenchEvent,
  BenchRequest,
  BenchResult,
  CatalogEntry,
  CatalogOffer,
  ChatEvent,
  ChatFeatures,
  ChatMessage,
  Check,
  ClientInFlight,
  CommandError,
  DemoRun,
  DoctorReport,
  DownloadEvent,
  DownloadSummary,
  ErrorKind,
  Exported,
  FitEstimate,
  LibraryModel,
  LoadKind,
  LocalServerState,
  LoopShape,
  MemorySample,
  MemorySnapshot,
  ModelChoice,
  ModelsView,
  NavigateView,
  PoolEvent,
  PooledModel,
  PoolStatus,
  PreparedModel,
  PressureLevel,
  PromptCacheStatus,
  ReportFormat,
  RunFilter,
  RunRecord,
  ServerFailure,
  ServerStatus,
  SplitAsk,
  SplitKind,
  SplitState,
  SplitStatus,
  SplitView,
  Summary,
  Theme,
  Verdict,
  Backend as ComputeBackend,
  CaseSummary as BenchCaseSummary,
} from './bindings';

/** Generation settings as the backend sends them: every field present
 * (`null` where unset). The Rust type fills missing fields with defaults,
 * so what the pages send may leave fields out. */
export type GenerationSettings = Required<GenerationSettingsSent>;

/** The local server's settings as the backend sends them: every field present. */
export type LocalServerSettings = Required<LocalServerSettingsSent>;

/** The Settings screen's values as `get_settings` sends them: every field
 * present. */
export type AppSettings = Omit<Required<AppSettingsSent>, 'generation' | 'local_server'> & {
  generation: GenerationSettings;
  local_server: LocalServerSettings;
};

/** The app-wide events the shell emits: each name with its payload, from
 * the generated `AppEvent` (the settings in their read shape). */
export type AppEvents = {
  [E in AppEvent as E['name']]: E['name'] extends 'ondo://settings-changed' ? AppSettings : E['payload'];
};

/** The generated list has every kind of the generated union. */
type UnlistedKind = Exclude<ErrorKind, (typeof ERROR_KINDS)[number]>;
const everyKindListed: [UnlistedKind] extends [never] ? true : UnlistedKind = true;
void everyKindListed;

/** The prompt and output limit of the popover's test generation. */
export const TEST_PROMPT = 'Explain in one sentence why the sky is blue.';
export const TEST_MAX_TOKENS = 32;

export function isCommandError(value: unknown): value is CommandError {
  return (
    typeof value === 'object' &&
    value !== null &&
    (ERROR_KINDS as readonly unknown[]).includes((value as CommandError).kind) &&
    typeof (value as CommandError).message === 'string'
  );
}

/** Turns anything a rejected invoke may carry into a CommandError: Tauri's
 * own refusals (a plain string) and anything unknown become `internal`. */
export function toCommandError(reason: unknown): CommandError {
  if (isCommandError(reason)) return reason;
  return { kind: 'internal', message: messageOf(reason) };
}

function messageOf(reason: unknown): string {
  if (reason instanceof Error) return reason.message;
  const message = typeof reason === 'object' && reason !== null ? (reason as { message?: unknown }).message : undefined;
  return typeof message === 'string' ? message : String(reason);
}

/** A Channel that hands each message to `onEvent`. */
function channelTo<T>(onEvent: (event: T) => void): Channel<T> {
  const channel = new Channel<T>();
  channel.onmessage = onEvent;
  return channel;
}

export const backend = {
  ...commands,
  /** Downloads `model`, calling `onEvent` with progress; resolves when done. */
  downloadModel: (model: string, onEvent: (event: DownloadEvent) => void) =>
    commands.downloadModel(model, channelTo(onEvent)),
  /** Answers the last user message of `messages` with `model` ("tiny", a
   * folder or a downloaded repo id), streaming to `onEvent`; resolves with the
   * run's record (the footer's numbers). */
  chatSend: (
    model: string,
    conversationId: string,
    systemPrompt: string | null,
    messages: ChatMessage[],
    settings: GenerationSettingsSent,
    /** The Think switch where the model has one (`chatFeatures`); null otherwise. */
    think: boolean | null,
    onEvent: (event: ChatEvent) => void,
  ) => commands.chatSend(model, conversationId, systemPrompt, messages, settings, think, channelTo(onEvent)),
  /** Every field is present in what the backend sends (see AppSettings). */
  getSettings: () => commands.getSettings() as Promise<AppSettings>,
  /** The Settings screen always sends every field. */
  setSettings: (settings: AppSettings) => commands.setSettings(settings),
  /** Runs a benchmark plan, calling `onEvent` with progress; every run is
   * recorded under the returned bench id. */
  runBenchmark: (request: BenchRequest, onEvent: (event: BenchEvent) => void) =>
    commands.runBenchmark(request, channelTo(onEvent)),
  /** Listens to one of the shell's app-wide events. */
  onAppEvent: <K extends keyof AppEvents>(
    name: K,
    handler: (payload: AppEvents[K]) => void,
  ): Promise<UnlistenFn> => listen<AppEvents[K]>(name, (event) => handler(event.payload)),
};

export type Backend = typeof backend;
