import { cleanup, createEvent, fireEvent, render, screen, waitFor, within } from '@testing-library/svelte';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { chatRunCold, chatRunWarm, emptyModelsView, modelsViewWithQwen, partialLlama } from '../../test/fixtures';
import { chatSettings } from '../../test/fixtures-settings';
import type { ChatEvent, ChatMessage, CommandError, RunRecord, SplitView } from '../lib/backend';
import ChatSection from './ChatSection.svelte';

afterEach(cleanup);

const QWEN = 'mlx-community/Qwen3-0.6B-4bit';

/** One `chat_send` the test drives: stream events, then finish or fail it. */
interface PendingChat {
  messages: ChatMessage[];
  send: (event: ChatEvent) => void;
  finish: (record: RunRecord) => void;
  fail: (error: CommandError) => void;
}

function fakeApi({ settingsFail = false, seesImages = false } = {}) {
  const pending: PendingChat[] = [];
  let ids = 0;
  const api = {
    listModels: vi.fn(async () => ({ ...modelsViewWithQwen, library: [...modelsViewWithQwen.library, partialLlama] })),
    getSettings: vi.fn(async () => {
      if (settingsFail) throw { kind: 'internal', message: 'settings unreadable' };
      return chatSettings;
    }),
    chatSend: vi.fn(
      (
        _model: string,
        _id: string,
        _system: string | null,
        messages: ChatMessage[],
        _settings: unknown,
        _think: boolean | null,
        onEvent: (event: ChatEvent) => void,
      ) =>
        new Promise<RunRecord>((resolve, reject) => {
          pending.push({ messages, send: onEvent, finish: resolve, fail: reject });
        }),
    ),
    chatStop: vi.fn(async () => true),
    chatForget: vi.fn(async () => null),
    splitStatus: vi.fn(async (): Promise<SplitView> => ({ status: null, last_ask: null })),
    // Qwen3's template reads enable_thinking; the tiny model's does not.
    // `seesImages` makes every model one with a vision tower.
    chatFeatures: vi.fn(async (model: string) => ({ thinking_switch: model === QWEN, sees_images: seesImages })),
  };
  const latest = (): PendingChat => {
    const chat = pending.at(-1);
    if (!chat) throw new Error('no chat_send was made');
    return chat;
  };
  const makeId = () => `conv-${++ids}`;
  return { api, latest, makeId };
}

const started = (cached = 0): ChatEvent => ({
  event: 'started',
  load_kind: cached ? 'warm' : 'cold',
  load_ms: cached ? 0 : 15,
  prompt_tokens: cached ? 42 : 12,
  cached_tokens: cached,
});

function message(): HTMLTextAreaElement {
  return screen.getByRole('textbox', { name: 'Message' }) as HTMLTextAreaElement;
}

async function type(text: string): Promise<void> {
  await fireEvent.input(message(), { target: { value: text } });
}

async function pressEnter(shiftKey = false): Promise<void> {
  await fireEvent.keyDown(message(), { key: 'Enter', shiftKey });
}

const log = () => screen.getByRole('log', { name: 'Conversation' });

const MiB = 1024 * 1024;

/** A PNG file of the first four bytes of a PNG header, "iVBORw==" in base64. */
function png(name = 'cat.png'): File {
  return new File([new Uint8Array([0x89, 0x50, 0x4e, 0x47])], name, { type: 'image/png' });
}

const sendButton = () => screen.getByRole('button', { name: 'Send' }) as HTMLButtonElement;

/** Picks files through the Attach image button's file input. */
async function pick(...files: File[]): Promise<void> {
  await fireEvent.change(screen.getByTestId('chat-image-input'), { target: { files } });
}

const attached = () => screen.queryByRole('list', { name: 'Attached images' });

/** Waits for an attached image's thumbnail in the compose area (files are read asynchronously). */
async function thumbnail(name: string): Promise<HTMLImageElement> {
  const list = await screen.findByRole('list', { name: 'Attached images' });
  return (await within(list).findByRole('img', { name })) as HTMLImageElement;
}

describe('ChatSection', () => {
  it('lists the tiny model and complete library models, tiny first', async () => {
    const { api, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    const picker = screen.getByRole('combobox', { name: 'Model' }) as HTMLSelectElement;
    await waitFor(() => expect(picker.options.length).toBe(2));
    expect([...picker.options].map((option) => option.textContent)).toEqual([
      'Built-in tiny (speed test, random weights)',
      'mlx-community/Qwen3-0.6B-4bit',
    ]);
    expect(picker.value).toBe('tiny');
  });

  it('streams the answer in order, then shows the footer; the second turn is warm with cached tokens', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('Hello there');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    expect(api.chatSend).toHaveBeenCalledWith(
      'tiny',
      'conv-1',
      null,
      [{ role: 'user', content: 'Hello there' }],
      chatSettings.generation,
      null,
      expect.any(Function),
    );
    expect(message().value).toBe('');
    expect(document.activeElement).toBe(message());
    expect((await screen.findByTestId('chat-live')).textContent).toBe('prefilling…');

    const chat = latest();
    chat.send(started());
    await waitFor(() => expect(screen.getByTestId('chat-live').textContent).toBe('cold · load 15.0 ms · prefilling… prompt 12 tok'));
    for (const text of ['One', ' two', ' three']) chat.send({ event: 'delta', text, reasoning: '' });
    await waitFor(() => expect(screen.getByTestId('chat-assistant').textContent).toContain('One two three'));
    expect(screen.getByTestId('chat-live').textContent).toBe('cold · load 15.0 ms · decoding… 3 tok');
    expect(screen.getByRole('button', { name: 'Stop' })).toBeTruthy();

    chat.finish(chatRunCold);
    const footer = await screen.findByTestId('chat-footer');
    expect(footer.textContent).toContain('cold · load 15.0 ms');
    expect(footer.textContent).toContain('TTFT 8.50 ms');
    expect(footer.textContent).toContain('prompt 12 tok · prefill 3,790 tok/s');
    expect(footer.textContent).toContain('16 tok · decode 383 tok/s');
    expect(footer.textContent).toContain('peak 7.40 MiB');
    expect(screen.queryByTestId('chat-live')).toBeNull();
    expect(screen.getByRole('button', { name: 'Send' })).toBeTruthy();

    await type('And again');
    await fireEvent.click(screen.getByRole('button', { name: 'Send' }));
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledTimes(2));
    const second = latest();
    expect(second.messages).toEqual([
      { role: 'user', content: 'Hello there' },
      { role: 'assistant', content: 'One two three' },
      { role: 'user', content: 'And again' },
    ]);
    expect(api.chatSend.mock.calls[1]?.[1]).toBe('conv-1');
    second.send(started(30));
    second.send({ event: 'delta', text: 'Four', reasoning: '' });
    second.finish(chatRunWarm);
    await waitFor(() => expect(screen.getAllByTestId('chat-footer').length).toBe(2));
    const warm = screen.getAllByTestId('chat-footer')[1]?.textContent ?? '';
    expect(warm).toContain('warm');
    expect(warm).not.toContain('cold');
    expect(warm).toContain('prompt 42 tok (30 cached)');
  });

  it('Stop calls chatStop and keeps the partial answer, marked stopped', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('Tell me a story');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    const chat = latest();
    chat.send(started());
    chat.send({ event: 'delta', text: 'Once upon', reasoning: '' });
    await fireEvent.click(await screen.findByRole('button', { name: 'Stop' }));
    expect(api.chatStop).toHaveBeenCalledWith('conv-1');
    chat.finish({ ...chatRunCold, generated_tokens: 2, stop_reason: 'cancelled' });
    await screen.findByTestId('chat-stopped');
    expect(screen.getByTestId('chat-assistant').textContent).toContain('Once upon');
    expect(screen.getByTestId('chat-footer').textContent).toContain('2 tok');
    expect(screen.queryByRole('alert')).toBeNull();
  });

  it('a stop that rejects with cancelled still keeps the partial answer', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('Go');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    latest().send({ event: 'delta', text: 'Part', reasoning: '' });
    await fireEvent.click(await screen.findByRole('button', { name: 'Stop' }));
    latest().fail({ kind: 'cancelled', message: 'stopped' });
    await screen.findByTestId('chat-stopped');
    expect(screen.getByTestId('chat-assistant').textContent).toContain('Part');
    expect(screen.queryByRole('alert')).toBeNull();
  });

  it('New conversation forgets the old id, clears the view and uses a fresh id', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('First');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    latest().send({ event: 'delta', text: 'Reply', reasoning: '' });
    latest().finish(chatRunCold);
    await screen.findByTestId('chat-footer');

    await fireEvent.click(screen.getByRole('button', { name: 'New conversation' }));
    expect(api.chatForget).toHaveBeenCalledWith('conv-1');
    expect(within(log()).queryByTestId('chat-user')).toBeNull();
    expect(within(log()).queryByTestId('chat-assistant')).toBeNull();

    await type('Second');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledTimes(2));
    expect(api.chatSend.mock.calls[1]?.[1]).toBe('conv-2');
    expect(latest().messages).toEqual([{ role: 'user', content: 'Second' }]);
  });

  it('an error is shown and the message goes back in the box', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('Will fail');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    latest().fail({ kind: 'model_unavailable', message: 'The model folder is gone.' });
    const alert = await screen.findByRole('alert');
    expect(alert.dataset.kind).toBe('model_unavailable');
    expect(alert.textContent).toContain('The model folder is gone.');
    expect(message().value).toBe('Will fail');
    expect(within(log()).queryByTestId('chat-user')).toBeNull();
    expect((screen.getByRole('button', { name: 'Send' }) as HTMLButtonElement).disabled).toBe(false);
  });

  it('Enter sends, Shift+Enter does not', async () => {
    const { api, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('line one');
    await pressEnter(true);
    expect(api.chatSend).not.toHaveBeenCalled();
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
  });

  it('does not send an empty message', async () => {
    const { api, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('   ');
    await pressEnter();
    expect(api.chatSend).not.toHaveBeenCalled();
    expect((screen.getByRole('button', { name: 'Send' }) as HTMLButtonElement).disabled).toBe(true);
  });

  it('renders what the user and the model write as text, never as HTML', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('<b>x</b>');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    latest().send({ event: 'delta', text: '<img src=x onerror=alert(1)> and <script>alert(2)</script>', reasoning: '' });
    latest().send({ event: 'delta', text: '', reasoning: '' });
    latest().finish(chatRunCold);
    await screen.findByTestId('chat-footer');
    expect(screen.getByTestId('chat-user').textContent).toContain('<b>x</b>');
    expect(log().querySelector('b, img, script, [onerror]')).toBeNull();
    const answer = screen.getByTestId('chat-answer').textContent;
    expect(answer).toContain('<img src=x onerror=alert(1)>');
    expect(answer).toContain('<script>alert(2)</script>');
  });

  it('shows the answer as Markdown, with a Copy button on each code block', async () => {
    const writeText = vi.fn(async (_text: string) => {});
    Object.defineProperty(navigator, 'clipboard', { value: { writeText }, configurable: true });
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('How do I list files?');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    latest().send({ event: 'delta', text: '## Listing\n\n- use **ls**\n\n```sh\nls -la\n```\n', reasoning: '' });
    latest().finish(chatRunCold);
    await screen.findByTestId('chat-footer');
    const answer = screen.getByTestId('chat-answer');
    expect(within(answer).getByRole('heading', { name: 'Listing' })).toBeTruthy();
    expect(answer.querySelector('li strong')?.textContent).toBe('ls');
    const copy = within(answer).getByRole('button', { name: 'Copy sh code' });
    await fireEvent.click(copy);
    await waitFor(() => expect(writeText).toHaveBeenCalledWith('ls -la\n'));
    await waitFor(() => expect(copy.textContent).toBe('Copied'));
  });

  it("shows a thinking model's reasoning folded apart from the answer, which the history keeps alone", async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await type('Hi');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    latest().send({ event: 'delta', text: '', reasoning: 'A greeting; answer briefly.' });
    const reasoning = await screen.findByTestId('chat-reasoning');
    const toggle = within(reasoning).getByRole('button');
    expect(toggle.getAttribute('aria-expanded')).toBe('true');
    expect(toggle.textContent).toContain('Thinking…');
    expect(screen.getByTestId('chat-reasoning-text').textContent).toBe('A greeting; answer briefly.');
    expect(screen.getByTestId('chat-live').textContent).toContain('thinking… 1 tok');
    latest().send({ event: 'delta', text: 'Hello!', reasoning: '' });
    await waitFor(() => expect(toggle.getAttribute('aria-expanded')).toBe('false'));
    expect(screen.queryByTestId('chat-reasoning-text')).toBeNull();
    expect(toggle.textContent).toMatch(/Thought for \d+\.\d s · 27 characters/);
    latest().finish({ ...chatRunCold, reasoning_tokens: 6, reasoning_ms: 3240 });
    await screen.findByTestId('chat-footer');
    expect(toggle.textContent).toContain('Thought for 3.2 s · 6 tokens');
    expect(screen.getByTestId('chat-footer').textContent).toContain('16 tok (6 thinking) · decode');
    // A button: Enter and Space open it from the keyboard as a click does.
    toggle.focus();
    await fireEvent.click(toggle);
    expect(toggle.getAttribute('aria-expanded')).toBe('true');
    expect(screen.getByTestId('chat-reasoning-text').id).toBe(toggle.getAttribute('aria-controls'));
    await fireEvent.click(toggle);
    expect(screen.queryByTestId('chat-reasoning-text')).toBeNull();
    await type('Again');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledTimes(2));
    expect(latest().messages).toEqual([
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello!' },
      { role: 'user', content: 'Again' },
    ]);
  });

  it('offers the Think switch where the template reads it, per conversation', async () => {
    const { api, latest, makeId } = fakeApi();
    render(ChatSection, { api, makeId });
    await waitFor(() => expect(api.chatFeatures).toHaveBeenCalledWith('tiny'));
    expect(screen.queryByRole('switch', { name: /Think/ })).toBeNull();
    const picker = screen.getByRole('combobox', { name: 'Model' }) as HTMLSelectElement;
    await waitFor(() => expect(picker.options.length).toBe(2));
    await fireEvent.change(picker, { target: { value: QWEN } });
    const think = (await screen.findByRole('switch', { name: /Think/ })) as HTMLInputElement;
    expect(think.checked).toBe(true);

    await type('Hi');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    expect(api.chatSend.mock.calls[0]?.[5]).toBe(true);
    expect(think.disabled).toBe(true);
    latest().finish(chatRunCold);
    await waitFor(() => expect(think.disabled).toBe(false));

    await fireEvent.click(think);
    expect(think.checked).toBe(false);
    await type('Quick one');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledTimes(2));
    expect(api.chatSend.mock.calls[1]?.[5]).toBe(false);
    latest().finish(chatRunWarm);

    // A new conversation starts with the switch on again.
    await fireEvent.click(screen.getByRole('button', { name: 'New conversation' }));
    expect(((await screen.findByRole('switch', { name: /Think/ })) as HTMLInputElement).checked).toBe(true);

    // Back to a model without the switch: none is shown and none is sent.
    await fireEvent.change(picker, { target: { value: 'tiny' } });
    await waitFor(() => expect(screen.queryByRole('switch', { name: /Think/ })).toBeNull());
    await type('Plain');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledTimes(3));
    expect(api.chatSend.mock.calls[2]?.[5]).toBeNull();
  });

  it('sends the system prompt, and empty settings when they cannot be read', async () => {
    const { api, makeId } = fakeApi({ settingsFail: true });
    api.listModels.mockImplementation(async () => emptyModelsView);
    render(ChatSection, { api, makeId });
    await fireEvent.click(screen.getByText('System prompt'));
    await fireEvent.input(screen.getByRole('textbox', { name: 'System prompt' }), { target: { value: 'Be brief.' } });
    await type('Hi');
    await pressEnter();
    await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
    expect(api.chatSend.mock.calls[0]?.[2]).toBe('Be brief.');
    expect(api.chatSend.mock.calls[0]?.[4]).toEqual({});
    expect(screen.queryByRole('alert')).toBeNull();
  });
  describe('images', () => {
    it('attaches a picked image, sends it with the message and shows it in the log; later turns send it again', async () => {
      const { api, latest, makeId } = fakeApi({ seesImages: true });
      render(ChatSection, { api, makeId });
      const attach = screen.getByRole('button', { name: 'Attach image' });
      const input = screen.getByTestId('chat-image-input') as HTMLInputElement;
      expect(input.type).toBe('file');
      expect(input.accept).toBe('image/png,image/jpeg,image/webp,image/gif');
      expect(input.multiple).toBe(true);
      const click = vi.spyOn(input, 'click');
      await fireEvent.click(attach);
      expect(click).toHaveBeenCalledOnce();

      await pick(png());
      const pending = await thumbnail('cat.png');
      expect(pending.src).toBe('data:image/png;base64,iVBORw==');

      await type('What is this?');
      await pressEnter();
      await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
      expect(latest().messages).toEqual([{ role: 'user', content: 'What is this?', images: ['iVBORw=='] }]);
      expect(attached()).toBeNull();
      const sent = within(screen.getByTestId('chat-user')).getByRole('img', { name: 'cat.png' }) as HTMLImageElement;
      expect(sent.src).toBe('data:image/png;base64,iVBORw==');
      expect(screen.getByTestId('chat-user').textContent).toContain('What is this?');

      latest().send({ event: 'delta', text: 'A cat.', reasoning: '' });
      latest().finish({ ...chatRunCold, images: 1, image_tokens: 256, image_encode_ms: 41.2 });
      expect((await screen.findByTestId('chat-footer')).textContent).toContain('cold · load 15.0 ms · 1 image · encode 41.2 ms · TTFT');

      await type('What colour is it?');
      await pressEnter();
      await waitFor(() => expect(api.chatSend).toHaveBeenCalledTimes(2));
      expect(latest().messages).toEqual([
        { role: 'user', content: 'What is this?', images: ['iVBORw=='] },
        { role: 'assistant', content: 'A cat.' },
        { role: 'user', content: 'What colour is it?' },
      ]);
      latest().finish({ ...chatRunWarm, images: 1, image_tokens: 256, image_encode_ms: 0 });
      await waitFor(() => expect(screen.getAllByTestId('chat-footer').length).toBe(2));
      expect(screen.getAllByTestId('chat-footer')[1]?.textContent).toContain('1 image · encode 0 ms (cached)');
    });

    it('sends an image without text', async () => {
      const { api, latest, makeId } = fakeApi({ seesImages: true });
      render(ChatSection, { api, makeId });
      expect(sendButton().disabled).toBe(true);
      await pick(png('first.png'), png('second.png'));
      await thumbnail('second.png, image 2 of 2');
      expect(sendButton().disabled).toBe(false);
      await fireEvent.click(sendButton());
      await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
      expect(latest().messages).toEqual([{ role: 'user', content: '', images: ['iVBORw==', 'iVBORw=='] }]);
      const user = screen.getByTestId('chat-user');
      expect(within(user).getAllByRole('img').map((image) => image.getAttribute('alt'))).toEqual([
        'first.png, image 1 of 2',
        'second.png, image 2 of 2',
      ]);
      expect(user.querySelector('p.text')).toBeNull();
    });

    it('removes an attached image by its × button', async () => {
      const { api, latest, makeId } = fakeApi({ seesImages: true });
      render(ChatSection, { api, makeId });
      await pick(png('keep.png'), png('drop.png'));
      await screen.findByRole('button', { name: 'Remove image drop.png' });
      await fireEvent.click(screen.getByRole('button', { name: 'Remove image drop.png' }));
      const list = attached() as HTMLElement;
      expect(within(list).getAllByRole('img').map((image) => image.getAttribute('alt'))).toEqual(['keep.png']);
      expect(document.activeElement).toBe(message());
      await fireEvent.click(screen.getByRole('button', { name: 'Remove image keep.png' }));
      expect(attached()).toBeNull();
      expect(sendButton().disabled).toBe(true);
      await type('Just text');
      await pressEnter();
      await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
      expect(latest().messages).toEqual([{ role: 'user', content: 'Just text' }]);
    });

    it('says a model that reads text only cannot take the image, and does not send it', async () => {
      const { api, makeId } = fakeApi();
      render(ChatSection, { api, makeId });
      await waitFor(() => expect(api.chatFeatures).toHaveBeenCalledWith('tiny'));
      await pick(png());
      await thumbnail('cat.png');
      const note = await screen.findByRole('status');
      expect(note.textContent).toContain(
        'This model reads text only; choose a model that sees images (Gemma 3 4B and larger, or Qwen3-VL), or remove the image.',
      );
      await type('What is this?');
      expect(sendButton().disabled).toBe(true);
      await pressEnter();
      await fireEvent.submit(sendButton().form as HTMLFormElement);
      expect(api.chatSend).not.toHaveBeenCalled();

      await fireEvent.click(screen.getByRole('button', { name: 'Remove image cat.png' }));
      expect(screen.queryByTestId('chat-text-only')).toBeNull();
      expect(sendButton().disabled).toBe(false);
    });

    it('a conversation with images cannot go on with a model that reads text only', async () => {
      const { api, latest, makeId } = fakeApi();
      // The tiny model stands in for one with a vision tower; Qwen3 reads text only.
      api.chatFeatures.mockImplementation(async (model: string) => ({ thinking_switch: false, sees_images: model === 'tiny' }));
      render(ChatSection, { api, makeId });
      await pick(png());
      await thumbnail('cat.png');
      await pressEnter();
      await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
      latest().finish({ ...chatRunCold, images: 1, image_tokens: 256, image_encode_ms: 41 });
      await screen.findByTestId('chat-footer');

      const picker = screen.getByRole('combobox', { name: 'Model' }) as HTMLSelectElement;
      await waitFor(() => expect(picker.options.length).toBe(2));
      await fireEvent.change(picker, { target: { value: QWEN } });
      expect((await screen.findByTestId('chat-text-only')).textContent).toBe(
        'This model reads text only and this conversation has images; choose a model that sees images (Gemma 3 4B and larger, or Qwen3-VL), or start a new conversation.',
      );
      await type('And now?');
      expect(sendButton().disabled).toBe(true);
      await pressEnter();
      expect(api.chatSend).toHaveBeenCalledOnce();

      await fireEvent.click(screen.getByRole('button', { name: 'New conversation' }));
      expect(screen.queryByTestId('chat-text-only')).toBeNull();
      expect(sendButton().disabled).toBe(false);
    });

    it('a failed send puts the text and the images back; New conversation clears them', async () => {
      const { api, latest, makeId } = fakeApi({ seesImages: true });
      render(ChatSection, { api, makeId });
      await pick(png());
      await thumbnail('cat.png');
      await type('Describe it');
      await pressEnter();
      await waitFor(() => expect(api.chatSend).toHaveBeenCalledOnce());
      latest().fail({ kind: 'invalid_settings', message: 'the image is 9000x9000 pixels, more than the 32000000 allowed' });
      await screen.findByRole('alert');
      expect(message().value).toBe('Describe it');
      expect(within(attached() as HTMLElement).getByRole('img', { name: 'cat.png' })).toBeTruthy();
      expect(within(log()).queryByTestId('chat-user')).toBeNull();

      await fireEvent.click(screen.getByRole('button', { name: 'New conversation' }));
      expect(attached()).toBeNull();
    });

    it('refuses a file over 20 MiB without reading it, and a file that is not an image', async () => {
      const readAsDataURL = vi.spyOn(FileReader.prototype, 'readAsDataURL');
      try {
        const { api, makeId } = fakeApi({ seesImages: true });
        render(ChatSection, { api, makeId });
        const huge = new File([], 'huge.png', { type: 'image/png' });
        Object.defineProperty(huge, 'size', { value: 21 * MiB });
        await pick(huge, new File(['%PDF'], 'notes.pdf', { type: 'application/pdf' }));
        const notes = screen.getAllByTestId('chat-attach-note').map((note) => note.textContent);
        expect(notes).toEqual([
          'huge.png is over 20 MiB; send a smaller image',
          'notes.pdf is not a PNG, JPEG, WebP or GIF image; it was left out',
        ]);
        expect(screen.getByRole('status').contains(screen.getAllByTestId('chat-attach-note')[0] ?? null)).toBe(true);
        expect(readAsDataURL).not.toHaveBeenCalled();
        expect(attached()).toBeNull();
      } finally {
        readAsDataURL.mockRestore();
      }
    });

    it('attaches an image pasted into the message', async () => {
      const { api, makeId } = fakeApi({ seesImages: true });
      render(ChatSection, { api, makeId });
      const file = png('image.png');
      const paste = createEvent.paste(message(), {
        clipboardData: { files: [], items: [{ kind: 'file', type: 'image/png', getAsFile: () => file }], types: ['Files'] },
      });
      await fireEvent(message(), paste);
      expect(paste.defaultPrevented).toBe(true);
      await thumbnail('image.png');

      // Text alone pastes as text.
      const text = createEvent.paste(message(), {
        clipboardData: { files: [], items: [{ kind: 'string', type: 'text/plain', getAsFile: () => null }], types: ['text/plain'] },
      });
      await fireEvent(message(), text);
      expect(text.defaultPrevented).toBe(false);
    });

    it('takes images dropped on the chat, highlighting it while dragged over, and leaves other files out', async () => {
      const { api, makeId } = fakeApi({ seesImages: true });
      render(ChatSection, { api, makeId });
      const chat = screen.getByTestId('chat');
      const over = createEvent.dragOver(log(), { dataTransfer: { types: ['Files'], files: [], dropEffect: 'none' } });
      await fireEvent(log(), over);
      expect(over.defaultPrevented).toBe(true);
      expect(chat.classList.contains('dropping')).toBe(true);
      await fireEvent.dragLeave(chat, { relatedTarget: null });
      expect(chat.classList.contains('dropping')).toBe(false);

      await fireEvent.dragOver(chat, { dataTransfer: { types: ['Files'], files: [] } });
      const drop = createEvent.drop(chat, {
        dataTransfer: { types: ['Files'], files: [png('photo.png'), new File(['hi'], 'notes.txt', { type: 'text/plain' })] },
      });
      await fireEvent(chat, drop);
      expect(drop.defaultPrevented).toBe(true);
      expect(chat.classList.contains('dropping')).toBe(false);
      await thumbnail('photo.png');
      expect(screen.getByTestId('chat-attach-note').textContent).toBe(
        'notes.txt is not a PNG, JPEG, WebP or GIF image; it was left out',
      );

      // Dropped anywhere else, a file is refused rather than opened in place of the popover.
      const elsewhere = createEvent.drop(document.body, { dataTransfer: { types: ['Files'], files: [png('stray.png')] } });
      await fireEvent(document.body, elsewhere);
      expect(elsewhere.defaultPrevented).toBe(true);
      expect(within(attached() as HTMLElement).queryByRole('img', { name: 'stray.png' })).toBeNull();
    });
  });
});
