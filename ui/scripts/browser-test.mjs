// The popover in Debian's headless Chromium against a mocked backend
// (test/browser/): asserts on what a user sees and does, keyboard included,
// and writes screenshots to docs/screenshots/. Run: npm run test:browser
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startBrowser } from './browser-harness.mjs';

let browser;
before(async () => {
  browser = await startBrowser({ viewport: { width: 380, height: 560 }, deviceScaleFactor: 2 });
});
after(() => browser?.stop());

/** Opens the popover in a fresh page; fails the test on any page error or
 * request that leaves the local server (the popover loads no remote content). */
async function openPopover({ scenario = 'ok', colorScheme = 'light' } = {}) {
  const opened = await browser.openPage(`test/browser/index.html?scenario=${scenario}`, { colorScheme });
  await opened.page.getByRole('heading', { name: 'Ondo', level: 1 }).waitFor();
  return opened;
}

const text = (locator) => locator.innerText();

test('an empty library offers the tiny speed-test model and the recommended download', async () => {
  const { page, problems } = await openPopover();
  const memoryLine = page.getByTestId('memory-line');
  await memoryLine.getByText('20.0 GiB free of 24.0 GiB').waitFor();
  // The whole figure fits beside the header's buttons, not cut to "…".
  assert.ok(
    await memoryLine.evaluate((line) => line.scrollWidth <= line.clientWidth),
    'the memory line is cut off in the header',
  );
  await page.getByText('No models are downloaded yet.').waitFor();

  const recommended = page.getByRole('listitem', { name: 'Llama 3.2 3B Instruct' });
  assert.ok(await recommended.getByText('Recommended').isVisible());
  assert.ok(await page.getByRole('button', { name: 'Download Llama 3.2 3B Instruct 4-bit' }).isEnabled());

  const useTiny = page.getByRole('button', { name: 'Use the built-in tiny model' });
  assert.ok(await useTiny.isEnabled());
  // The label says what it is wherever the button is announced.
  const describedBy = (await useTiny.getAttribute('aria-describedby')).split(' ');
  const description = (await Promise.all(describedBy.map((id) => text(page.locator(`#${id}`))))).join(' ');
  assert.match(description, /Speed test · random weights/i);
  assert.match(description, /gibberish/);
  assert.ok(await page.getByRole('button', { name: 'Run a test generation' }).isDisabled());
  await page.getByText('Choose a model above first.').waitFor();

  const environment = page.getByTestId('environment');
  await environment.getByText('0.1.0 (release build)').waitFor();
  for (const shown of ['0.32.2', 'cpu (Intel Xeon, 2 cores)', '24.0 GiB total, 20.0 GiB available']) {
    assert.ok(await environment.getByText(shown, { exact: true }).isVisible(), shown);
  }
  await browser.screenshot(page, 'popover-empty.png');

  // Folded, the block still says whether all is well.
  await environment.getByRole('heading', { name: 'Environment' }).click();
  await environment.getByText('MLX 0.32.2 on cpu · all 3 checks passed').waitFor();
  assert.deepEqual(problems, []);
  await page.close();
});

test('any hub model by its id: a bad id is refused, a good one is checked for fit and offered for download', async () => {
  const { page, problems } = await openPopover();
  const id = page.getByRole('textbox', { name: 'Hub model id' });
  await id.fill('not a repo id');
  await id.press('Enter');
  await page.getByText("Type the model's id as org/name").waitFor();

  await id.fill('mlx-community/Qwen3-4B-4bit');
  await id.press('Enter');
  const card = page.getByTestId('hub-model');
  await card.getByText(/of weights · needs .* at 4,096 tokens/).waitFor();
  assert.ok(await card.getByRole('button', { name: 'Download mlx-community/Qwen3-4B-4bit' }).isEnabled());
  await card.scrollIntoViewIfNeeded();
  await browser.screenshot(page, 'popover-hub-model.png');

  // What the hub says about an id that does not exist reaches the user.
  await id.fill('nobody/nothing');
  await id.press('Enter');
  await page.getByText('No model nobody/nothing').waitFor();
  assert.equal(await card.count(), 0);
  assert.deepEqual(problems, []);
  await page.close();
});

test('keyboard only: choose the tiny model, run a test generation, read the timings', async () => {
  const { page, problems } = await openPopover();
  const useTiny = page.getByRole('button', { name: 'Use the built-in tiny model' });
  await useTiny.waitFor();

  // Tab from the top of the page to the button, as a keyboard user would.
  let presses = 0;
  while (!(await useTiny.evaluate((button) => button === document.activeElement))) {
    await page.keyboard.press('Tab');
    presses += 1;
    assert.ok(presses < 10, 'the tiny-model button is reachable with Tab');
  }
  await page.keyboard.press('Enter');
  await page.getByTestId('tiny-ready').waitFor();

  const run = page.getByRole('button', { name: 'Run a test generation' });
  assert.ok(await run.isEnabled());
  await run.focus();
  const focusRing = await run.evaluate((button) => getComputedStyle(button).outlineStyle);
  assert.notEqual(focusRing, 'none', 'a focused button shows a focus ring');
  await page.keyboard.press('Enter');
  await page.getByRole('button', { name: 'Generating…' }).waitFor();

  const timings = page.getByRole('table', { name: 'Timings of the test generation' });
  await timings.waitFor();
  const rows = await timings.locator('tbody tr').allInnerTexts();
  assert.equal(rows.length, 3);
  assert.match(rows[0], /Load[\s\S]*cold start[\s\S]*41\.7 ms/);
  assert.match(rows[1], /Prefill[\s\S]*to first token[\s\S]*8\.93 ms[\s\S]*12 prompt[\s\S]*1,427 tok\/s/);
  assert.match(rows[2], /Decode[\s\S]*66\.2 ms[\s\S]*32 generated[\s\S]*468 tok\/s/);
  assert.equal(await text(page.getByTestId('run-memory')), 'MLX peak 12.5 MiB · KV cache 352 KiB');
  assert.match(await text(page.getByTestId('generated-text')), /quartz lantern/);

  const calls = await page.evaluate(() => window.__ondoIpcCalls.map((call) => call.cmd));
  assert.deepEqual(calls.filter((cmd) => cmd === 'run_test_generation').length, 1);
  const runCall = await page.evaluate(() => window.__ondoIpcCalls.find((call) => call.cmd === 'run_test_generation'));
  assert.deepEqual(runCall.payload.model, { kind: 'builtin_tiny' });
  assert.equal(runCall.payload.maxTokens, 32);

  await page.waitForTimeout(600); // the smooth scroll that brings the timings into view
  await browser.screenshot(page, 'popover-timings.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('dark mode follows the system setting', async () => {
  const { page, problems } = await openPopover({ colorScheme: 'dark' });
  const background = await page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
  assert.equal(background, 'rgb(28, 27, 26)');
  await page.getByRole('button', { name: 'Use the built-in tiny model' }).click();
  await page.getByRole('button', { name: 'Run a test generation' }).click();
  await page.getByRole('table', { name: 'Timings of the test generation' }).waitFor();
  await page.waitForTimeout(600);
  // Only the content scrolls; the header stays put.
  assert.equal(await page.evaluate(() => document.scrollingElement.scrollTop), 0);
  assert.equal(await page.locator('header').evaluate((header) => header.getBoundingClientRect().top), 0);
  await browser.screenshot(page, 'popover-dark.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('a failed generation says what happened and what to do', async () => {
  const { page, problems } = await openPopover({ scenario: 'generation-fails' });
  await page.getByRole('button', { name: 'Use the built-in tiny model' }).click();
  await page.getByRole('button', { name: 'Run a test generation' }).click();
  const alert = page.getByRole('alert');
  await alert.waitFor();
  assert.match(await text(alert), /MLX failed while generating/);
  assert.match(await text(alert), /try a smaller model or a shorter context/);
  // The app's words: no command-line advice, no source paths.
  assert.doesNotMatch(await text(alert), /\bondo [a-z]|\s--[a-z]|\.cpp:|\/rustc\//);
  assert.ok(await page.getByRole('button', { name: 'Run a test generation' }).isEnabled(), 'the user can try again');
  await browser.screenshot(page, 'popover-error.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('a Mac app without its GPU kernels says so first, with every place it looked', async () => {
  const { page, problems } = await openPopover({ scenario: 'no-kernels' });
  const note = page.getByRole('region', { name: 'Ondo cannot run models' });
  await note.getByText('MLX’s GPU kernels are missing').waitFor();
  const shown = await text(note);
  for (const path of [
    '/Applications/Ondo.app/Contents/Resources/mlx.metallib',
    '/Applications/Ondo.app/Contents/Frameworks/mlx.metallib',
  ]) {
    assert.ok(shown.includes(path), `${path} is not named`);
  }
  assert.match(shown, /drag Ondo from its disk image to Applications again/);
  // Long paths wrap inside the note rather than run out of the popover.
  assert.ok(
    await note.getByRole('alert').evaluate((box) => box.scrollWidth <= box.clientWidth),
    'a path runs out of the note',
  );
  assert.doesNotMatch(shown, /\bondo [a-z]|\s--[a-z]|\.cpp:|\/rustc\//);
  // The note is the first thing in the popover, above Models and Chat.
  assert.ok(
    await note.evaluate((section) => section.parentElement.firstElementChild === section),
    'the note is not at the top',
  );
  await page.getByTestId('environment').getByText('1 of 2 checks failed', { exact: false }).waitFor();
  await browser.screenshot(page, 'popover-no-kernels.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('the catalog shows fit verdicts; a download shows progress, pauses, resumes and completes', async () => {
  const { page, problems } = await openPopover();
  const catalog = page.getByRole('list', { name: 'Download a model' });
  await catalog.waitFor();
  const verdicts = await catalog.locator(':scope > li summary').allInnerTexts();
  // The first line is what shows; the rest is for screen readers.
  assert.deepEqual(
    verdicts.map((verdict) => verdict.split('\n')[0].trim()),
    ['fits', 'fits', 'tight', "won't fit"],
  );
  // Green, amber and red as the theme defines them.
  const colours = await catalog
    .locator(':scope > li summary')
    .evaluateAll((chips) => chips.map((chip) => getComputedStyle(chip).color));
  assert.deepEqual(colours, ['rgb(47, 125, 74)', 'rgb(47, 125, 74)', 'rgb(154, 100, 0)', 'rgb(179, 38, 30)']);

  // The memory gauge: green at normal pressure, its breakdown on keyboard focus.
  const meter = page.getByRole('meter', { name: 'Memory in use, pressure normal' });
  assert.equal(await meter.locator('.fill').evaluate((fill) => getComputedStyle(fill).fill), 'rgb(52, 168, 83)');
  await page.keyboard.press('Tab');
  assert.ok(await meter.evaluate((element) => element === document.activeElement), 'the gauge is the first Tab stop');
  const breakdown = page.getByRole('tooltip');
  await breakdown.waitFor();
  assert.match(await text(breakdown), /Cached files\s+6\.00 GiB/);
  assert.match(await text(breakdown), /Ondo: 182 MiB/);
  await page.keyboard.press('Tab');
  await breakdown.waitFor({ state: 'hidden' });

  // Download with the keyboard; the download stops at 42 % in the mock.
  const qwen = page.getByRole('listitem', { name: 'Qwen3 0.6B' });
  await page.getByRole('button', { name: 'Download Qwen3 0.6B 4-bit' }).focus();
  await page.keyboard.press('Enter');
  const bar = page.getByRole('progressbar', { name: 'Downloading Qwen3 0.6B 4-bit' });
  await bar.waitFor();
  await page.waitForFunction(() => document.querySelector('progress')?.value > 0);
  assert.match(await text(qwen), /136 MiB of 324 MiB · 12\.4 MB\/s · 16 s left/);
  assert.match(await text(qwen), /model\.safetensors/);

  // Show the whole catalog card with the download, and the chip that will not fit opened.
  await catalog.locator(':scope > li').last().locator('summary').click();
  await qwen.evaluate((card) => card.scrollIntoView({ block: 'start' }));
  await page.waitForTimeout(200);
  await browser.screenshot(page, 'popover-models.png');

  await page.getByRole('button', { name: 'Pause download of Qwen3 0.6B 4-bit' }).click();
  await qwen.getByText(/Paused at 136 MiB of 324 MiB/).waitFor();
  assert.equal(await page.getByRole('alert').count(), 0, 'a pause is not an error');
  await page.getByRole('button', { name: 'Resume download of Qwen3 0.6B 4-bit' }).click();
  await qwen.getByText('Downloaded').waitFor();
  await page.getByRole('list', { name: 'Models on this Mac' }).getByText('Qwen3-0.6B-4bit').waitFor();
  const calls = await page.evaluate(() => window.__ondoIpcCalls.map((call) => call.cmd));
  assert.equal(calls.filter((cmd) => cmd === 'download_model').length, 2);
  assert.equal(calls.filter((cmd) => cmd === 'cancel_download').length, 1);

  // A model that will not fit asks first.
  await page.getByRole('button', { name: 'Download Mistral 7B Instruct v0.3 4-bit' }).click();
  await page.getByRole('group', { name: 'Confirm the download of Mistral 7B Instruct v0.3 4-bit' }).waitFor();
  assert.deepEqual(problems, []);
  await page.close();
});

test('keyboard only: chat twice; the second answer is warm and reuses the KV cache', async () => {
  const { page, problems } = await openPopover();
  const chat = page.getByRole('region', { name: 'Chat' });
  const message = chat.getByRole('textbox', { name: 'Message' });
  await message.waitFor();
  const picker = chat.getByRole('combobox', { name: 'Model' });
  assert.equal(await picker.inputValue(), 'tiny');
  assert.match(await text(picker), /Built-in tiny \(speed test, random weights\)/);

  // Tab to the message box, as a keyboard user would.
  let presses = 0;
  while (!(await message.evaluate((box) => box === document.activeElement))) {
    await page.keyboard.press('Tab');
    presses += 1;
    assert.ok(presses < 60, 'the message box is reachable with Tab');
  }
  await page.keyboard.type('Why is the sky blue?');
  await page.keyboard.press('Shift+Enter');
  await page.keyboard.type('One sentence, please.');
  await page.keyboard.press('Enter');
  const live = chat.getByTestId('chat-live');
  await live.getByText(/prefilling…|decoding…/).waitFor();
  assert.ok(await chat.getByRole('button', { name: 'Stop' }).isVisible(), 'Stop shows while it writes');
  const footers = chat.getByTestId('chat-footer');
  await footers.first().waitFor();
  const first = await text(footers.first());
  assert.match(first, /cold · load 15\.0 ms/);
  assert.match(first, /TTFT 8\.50 ms/);
  assert.match(first, /prompt \d+ tok · prefill 3,790 tok\/s/);
  assert.match(first, /9 tok · decode 383 tok\/s/);
  assert.match(first, /peak 7\.40 MiB/);
  assert.match(await text(chat.getByTestId('chat-assistant').first()), /The sky scatters blue light more than red\./);
  assert.ok(await message.evaluate((box) => box === document.activeElement), 'focus stays in the message box');

  await page.keyboard.type('And at sunset?');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="chat-footer"]').length === 2);
  const second = await text(footers.nth(1));
  assert.match(second, /^warm/);
  assert.match(second, /prompt \d+ tok \(\d+ cached\)/);
  assert.match(second, /decode 401 tok\/s/);

  const sends = await page.evaluate(() => window.__ondoIpcCalls.filter((call) => call.cmd === 'chat_send'));
  assert.equal(sends.length, 2);
  assert.equal(sends[0].payload.conversationId, sends[1].payload.conversationId);
  assert.deepEqual(
    sends[1].payload.messages.map((m) => m.role),
    ['user', 'assistant', 'user'],
  );
  assert.equal(sends[0].payload.messages[0].content, 'Why is the sky blue?\nOne sentence, please.');
  assert.equal(sends[0].payload.settings.max_tokens, 64);

  await chat.evaluate((section) => section.scrollIntoView({ block: 'start' }));
  await page.waitForTimeout(200);
  await browser.screenshot(page, 'popover-chat.png');

  // Stop keeps the partial answer; New conversation forgets and clears.
  await page.keyboard.type('Tell me more.');
  await page.keyboard.press('Enter');
  await live.getByText(/decoding…/).waitFor();
  await chat.getByRole('button', { name: 'Stop' }).focus();
  await page.keyboard.press('Enter');
  await chat.getByTestId('chat-stopped').waitFor();
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="chat-footer"]').length === 3);
  await chat.getByRole('button', { name: 'New conversation' }).focus();
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="chat-footer"]').length === 0);
  const calls = await page.evaluate(() => window.__ondoIpcCalls);
  assert.equal(calls.filter((call) => call.cmd === 'chat_stop').length, 1);
  const forget = calls.find((call) => call.cmd === 'chat_forget');
  assert.equal(forget.payload.conversationId, sends[0].payload.conversationId);
  assert.deepEqual(problems, []);
  await page.close();
});

test('a thinking model: the Think switch, reasoning folded with its time, the answer as Markdown', async () => {
  const { page, problems } = await openPopover({ scenario: 'thinking' });
  const chat = page.getByRole('region', { name: 'Chat' });
  const picker = chat.getByRole('combobox', { name: 'Model' });
  await picker.getByRole('option', { name: 'mlx-community/Qwen3-0.6B-4bit' }).waitFor({ state: 'attached' });
  await picker.focus();
  await picker.selectOption('mlx-community/Qwen3-0.6B-4bit');
  const think = chat.getByRole('switch', { name: /Think/ });
  await think.waitFor();
  assert.ok(await think.isChecked(), 'a new conversation thinks');

  const message = chat.getByRole('textbox', { name: 'Message' });
  await message.focus();
  await page.keyboard.type('How do I list my files?');
  await page.keyboard.press('Enter');
  const reasoning = chat.getByTestId('chat-reasoning');
  const toggle = reasoning.getByRole('button');
  // Open while the model thinks, folded once the answer starts.
  await toggle.getByText('Thinking…').waitFor();
  assert.equal(await toggle.getAttribute('aria-expanded'), 'true');
  await chat.getByTestId('chat-footer').waitFor();
  assert.equal(await toggle.getAttribute('aria-expanded'), 'false');
  assert.match(await text(toggle), /Thought for 3\.2 s · 48 tokens/);
  assert.match(await text(chat.getByTestId('chat-footer')), /118 tok \(48 thinking\) · decode 38\.4 tok\/s/);

  const answer = chat.getByTestId('chat-answer');
  await answer.getByRole('heading', { name: 'Listing files' }).waitFor();
  assert.equal(await answer.locator('table tr').count(), 3);
  assert.equal(
    (await answer.locator('pre code').innerText()).trim(),
    'ls -la ~/Documents  # every file, the hidden ones too, with sizes and dates\nls -la ~/Downloads',
  );
  // What the model wrote as HTML is text on the page, and nothing ran.
  assert.match(await text(answer), /<img src=x onerror=alert\(1\)>/);
  assert.equal(await answer.locator('img, script').count(), 0);

  const sends = await page.evaluate(() => window.__ondoIpcCalls.filter((call) => call.cmd === 'chat_send'));
  assert.equal(sends[0].payload.think, true);

  await chat.evaluate((section) => section.scrollIntoView({ block: 'start' }));
  await chat.getByRole('log', { name: 'Conversation' }).evaluate((log) => (log.scrollTop = 0));
  await page.waitForTimeout(200);
  await browser.screenshot(page, 'popover-chat-thinking.png');

  // The code block's Copy button, then the reasoning, from the keyboard.
  const copy = answer.getByRole('button', { name: 'Copy sh code' });
  // The button sits above the code: the long first line never runs under it.
  const button = await copy.boundingBox();
  const code = await answer.locator('pre code').boundingBox();
  assert.ok(code.y >= button.y + button.height, `code at ${code.y}, Copy ends at ${button.y + button.height}`);
  // and in view: the long line scrolls inside its block, not the answer out of the log.
  const log = await chat.getByRole('log', { name: 'Conversation' }).boundingBox();
  assert.ok(button.x + button.width <= log.x + log.width, `Copy ends at ${button.x + button.width}, the log at ${log.x + log.width}`);
  await copy.focus();
  await page.keyboard.press('Enter');
  await copy.getByText('Copied').waitFor();
  await toggle.focus();
  await page.keyboard.press('Enter');
  assert.equal(await toggle.getAttribute('aria-expanded'), 'true');
  assert.match(await text(chat.getByTestId('chat-reasoning-text')), /explain the flags in a table\./);
  await page.keyboard.press('Space');
  assert.equal(await toggle.getAttribute('aria-expanded'), 'false');

  // Switched off, the next turn asks the template not to think.
  await think.focus();
  await page.keyboard.press('Space');
  assert.ok(!(await think.isChecked()));
  await message.focus();
  await page.keyboard.type('Shorter, please.');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="chat-footer"]').length === 2);
  const calls = await page.evaluate(() => window.__ondoIpcCalls.filter((call) => call.cmd === 'chat_send'));
  assert.equal(calls[1].payload.think, false);
  assert.equal(await chat.getByTestId('chat-reasoning').count(), 1, 'the second answer did not think');
  assert.deepEqual(problems, []);
  await page.close();
});

test('the local server line: address, requests, the client answered, and Copy from the keyboard', async () => {
  const { page, problems } = await openPopover({ scenario: 'server' });
  const line = page.getByTestId('local-server');
  await line.getByText('http://127.0.0.1:11480').waitFor();
  assert.match(await text(line), /12 requests · answering curl\/8\.5\.0 \(chat, tiny\)/);
  const copy = page.getByRole('button', { name: "Copy the local server's address" });
  for (let presses = 0; !(await copy.evaluate((element) => element === document.activeElement)); presses += 1) {
    assert.ok(presses < 20, 'Copy is reachable with Tab');
    await page.keyboard.press('Tab');
  }
  await page.keyboard.press('Enter');
  await line.getByText('Copied').waitFor();
  await browser.screenshot(page, 'popover-server.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('Escape and the hide button hide the window', async () => {
  const { page, problems } = await openPopover();
  await page.keyboard.press('Escape');
  await page.getByRole('button', { name: 'Hide the Ondo window' }).click();
  await page.waitForFunction(
    () => window.__ondoIpcCalls.filter((call) => call.cmd === 'plugin:window|hide').length === 2,
  );
  assert.deepEqual(problems, []);
  await page.close();
});


test('an image picked for a text-only model shows as a thumbnail, and the chat says why it cannot go', async () => {
  const { page } = await openPopover();
  const chat = page.getByRole('region', { name: 'Chat' });
  await chat.getByRole('textbox', { name: 'Message' }).waitFor();
  // A 1x1 PNG, as the file picker hands it over.
  const png = Buffer.from(
    'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC',
    'base64',
  );
  await chat.locator('input[type="file"]').setInputFiles({ name: 'dot.png', mimeType: 'image/png', buffer: png });
  const attached = chat.getByRole('list', { name: 'Attached images' });
  await attached.getByRole('img').waitFor();
  assert.ok(await attached.getByRole('button', { name: 'Remove image dot.png' }).isVisible());
  assert.match(await text(chat), /reads text only/);
  await chat.getByRole('textbox', { name: 'Message' }).fill('What is this?');
  assert.ok(await chat.getByRole('button', { name: 'Send' }).isDisabled(), 'Send waits for a model that sees images');
  await attached.getByRole('button', { name: 'Remove image dot.png' }).click();
  assert.equal(await attached.count(), 0);
  assert.ok(await chat.getByRole('button', { name: 'Send' }).isEnabled());
  const sends = await page.evaluate(() => window.__ondoIpcCalls.filter((call) => call.cmd === 'chat_send'));
  assert.equal(sends.length, 0);
});
