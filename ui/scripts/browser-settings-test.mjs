// The Settings view in Debian's headless Chromium against a mocked backend
// (test/browser/settings.html): keyboard-only editing and saving, validation
// that blocks Save, the theme applied at once, the folder dialog, the local
// server section; writes docs/screenshots/settings.png, settings-dark.png
// and settings-server.png.
// Run: node --test scripts/browser-settings-test.mjs
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startBrowser } from './browser-harness.mjs';

const lightBackground = 'rgb(247, 246, 244)';
const darkBackground = 'rgb(28, 27, 26)';

let browser;
before(async () => {
  browser = await startBrowser({ viewport: { width: 1000, height: 700 }, deviceScaleFactor: 2 });
});
after(() => browser?.stop());

/** Opens the Settings view in a fresh page; collects page errors and any
 * request that leaves the local server (the view loads no remote content). */
async function openSettings({ scenario = 'ok', colorScheme = 'light' } = {}) {
  const opened = await browser.openPage(`test/browser/settings.html?scenario=${scenario}`, { colorScheme });
  await opened.page.getByRole('heading', { name: 'Settings', level: 1 }).waitFor();
  await opened.page.getByRole('region', { name: 'Generation defaults' }).waitFor();
  return opened;
}

const background = (page) => page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
const calls = (page, cmd) => page.evaluate((name) => window.__ondoIpcCalls.filter((call) => call.cmd === name), cmd);
const isFocused = (locator) => locator.evaluate((element) => element === document.activeElement);

/** Presses Tab until `locator` has focus, as a keyboard user would. */
async function tabTo(page, locator, most = 40) {
  for (let presses = 0; !(await isFocused(locator)); presses += 1) {
    assert.ok(presses < most, `${locator} is reachable with Tab`);
    await page.keyboard.press('Tab');
  }
}

test('shows the saved settings with what each knob costs', async () => {
  const { page, problems } = await openSettings();
  assert.equal(await page.getByRole('textbox', { name: 'Max tokens' }).inputValue(), '256');
  assert.equal(await page.getByRole('textbox', { name: 'Prefill step size' }).inputValue(), '512');
  assert.equal(await page.getByRole('combobox', { name: 'Keep a model loaded' }).inputValue(), '5');
  assert.equal((await page.getByTestId('models-folder').innerText()).trim(), '/Users/me/Models');
  await page.getByText("67% of this Mac's 24.0 GiB of memory").waitFor();
  await page.getByText('smaller steps lower peak memory on long prompts, larger steps prefill faster').waitFor();
  assert.ok(await page.getByRole('button', { name: 'Save' }).isDisabled(), 'nothing to save yet');
  assert.equal(await background(page), lightBackground);
  // The page stays put; the form scrolls inside it, the Save bar stays in view.
  assert.ok(await page.getByRole('button', { name: 'Save' }).isVisible());
  await browser.screenshot(page, 'settings.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('keyboard only: edit, pick a loop shape and save with Ctrl+S', async () => {
  const { page, problems } = await openSettings();
  const maxTokens = page.getByRole('textbox', { name: 'Max tokens' });
  await tabTo(page, maxTokens);
  const ring = await maxTokens.evaluate((input) => getComputedStyle(input).outlineStyle);
  assert.notEqual(ring, 'none', 'a focused field shows a focus ring');
  await page.keyboard.press('Control+A');
  await page.keyboard.type('1024');
  await page.keyboard.press('Tab');
  assert.ok(await isFocused(page.getByRole('textbox', { name: 'Temperature' })));
  await page.keyboard.press('Control+A');
  await page.keyboard.type('0.2');

  // Into the radio group (the checked radio takes focus), then the arrow picks Sync.
  await tabTo(page, page.getByRole('radio', { name: 'Pipelined' }));
  await page.keyboard.press('ArrowRight');
  assert.ok(await page.getByRole('radio', { name: 'Sync' }).isChecked());

  const seed = page.getByRole('textbox', { name: 'Seed' });
  await seed.focus();
  await page.keyboard.press('Control+A');
  await page.keyboard.press('Backspace');
  await page.keyboard.press('Control+S');
  await page.getByTestId('settings-status').getByText('Saved').waitFor();

  const saves = await calls(page, 'set_settings');
  assert.equal(saves.length, 1);
  const saved = saves[0].payload.settings;
  assert.equal(saved.generation.max_tokens, 1024);
  assert.equal(saved.generation.temperature, 0.2);
  assert.equal(saved.generation.loop, 'sync');
  assert.equal(saved.generation.seed, null);
  // Untouched fields go back as they came.
  assert.equal(saved.memory_budget_bytes, 16 * 2 ** 30);
  assert.equal(saved.models_folder, '/Users/me/Models');
  assert.equal(saved.global_shortcut, 'CommandOrControl+Shift+O');
  assert.ok(await page.getByRole('button', { name: 'Save' }).isDisabled(), 'saved: nothing left to save');
  assert.deepEqual(problems, []);
  await page.close();
});

test('an invalid value blocks Save with a message next to the field', async () => {
  const { page, problems } = await openSettings();
  const step = page.getByRole('textbox', { name: 'Prefill step size' });
  await step.fill('0');
  const message = page.getByText('Enter a whole number from 1 to 65,536.');
  await message.waitFor();
  assert.equal(await step.getAttribute('aria-invalid'), 'true');
  const describedBy = await step.getAttribute('aria-describedby');
  assert.ok(describedBy.includes(await message.getAttribute('id')), 'the message is announced with the field');
  assert.ok(await page.getByRole('button', { name: 'Save' }).isDisabled());
  await page.getByText('Fix the field marked above to save.').waitFor();

  // Ctrl+S saves nothing and brings the user to the field.
  await page.getByRole('textbox', { name: 'Max tokens' }).focus();
  await page.keyboard.press('Control+S');
  await page.waitForFunction(() => document.activeElement?.id === 'setting-prefill_step_size');
  assert.equal((await calls(page, 'set_settings')).length, 0);
  await step.scrollIntoViewIfNeeded();
  await browser.screenshot(page, 'settings-invalid.png');

  await page.keyboard.press('Control+A');
  await page.keyboard.type('4096');
  await message.waitFor({ state: 'detached' });
  assert.ok(await page.getByRole('button', { name: 'Save' }).isEnabled());
  assert.deepEqual(problems, []);
  await page.close();
});

test('the theme applies at once, against the system setting both ways', async () => {
  const { page, problems } = await openSettings({ colorScheme: 'light' });
  assert.equal(await background(page), lightBackground);
  const dark = page.getByRole('radio', { name: 'Dark' });
  await dark.scrollIntoViewIfNeeded();
  await dark.check();
  assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
  assert.equal(await background(page), darkBackground);
  await page.getByRole('textbox', { name: 'Max tokens' }).scrollIntoViewIfNeeded();
  await page.evaluate(() => document.querySelector('.scroll')?.scrollTo(0, 0));
  await browser.screenshot(page, 'settings-dark.png');

  await page.emulateMedia({ colorScheme: 'dark' });
  await page.getByRole('radio', { name: 'Light' }).check();
  assert.equal(await background(page), lightBackground, 'a forced light theme beats a dark system');
  await page.getByRole('radio', { name: 'System' }).check();
  assert.equal(await page.evaluate(() => document.documentElement.hasAttribute('data-theme')), false);
  assert.equal(await background(page), darkBackground, 'system follows the OS again');
  assert.deepEqual(problems, []);
  await page.close();
});

test('choose a models folder with the system dialog, then save it', async () => {
  const { page, problems } = await openSettings();
  await page.getByRole('button', { name: 'Choose…' }).click();
  await page.getByTestId('models-folder').getByText('/Volumes/External/ondo-models').waitFor();
  assert.equal((await calls(page, 'choose_folder')).length, 1);
  await page.getByRole('button', { name: 'Save' }).click();
  await page.getByTestId('settings-status').getByText('Saved').waitFor();
  const [save] = await calls(page, 'set_settings');
  assert.equal(save.payload.settings.models_folder, '/Volumes/External/ondo-models');

  await page.getByRole('button', { name: 'Use the Hugging Face cache' }).click();
  await page.getByTestId('models-folder').getByText('Hugging Face cache (shared with mlx-lm)').waitFor();
  assert.deepEqual(problems, []);
  await page.close();
});

test('Record… captures the next key combination as an accelerator', async () => {
  const { page, problems } = await openSettings();
  const record = page.getByRole('button', { name: 'Record…' });
  await record.focus();
  await page.keyboard.press('Enter');
  await page.getByRole('button', { name: 'Press keys…' }).waitFor();
  await page.keyboard.press('Control+Alt+K');
  const shortcut = page.getByRole('textbox', { name: 'Global shortcut' });
  assert.equal(await shortcut.inputValue(), 'CommandOrControl+Alt+K');
  assert.equal((await calls(page, 'set_settings')).length, 0, 'recording Ctrl+… does not save');
  assert.deepEqual(problems, []);
  await page.close();
});

test('a failed save says what happened and keeps the edits', async () => {
  const { page, problems } = await openSettings({ scenario: 'save-fails' });
  await page.getByRole('textbox', { name: 'Max tokens' }).fill('100');
  await page.getByRole('button', { name: 'Save' }).click();
  const alert = page.getByRole('alert');
  await alert.waitFor();
  assert.match(await alert.innerText(), /That request was not accepted/);
  assert.match(await alert.innerText(), /is taken by another app; choose another/);
  assert.equal(await page.getByRole('textbox', { name: 'Max tokens' }).inputValue(), '100');
  assert.deepEqual(problems, []);
  await page.close();
});

test('keyboard only: turn the local server on with a generated key and save', async () => {
  const { page, problems } = await openSettings();
  const toggle = page.getByRole('checkbox', { name: 'Run the local server' });
  await tabTo(page, toggle, 80);
  await page.keyboard.press('Space');
  const generate = page.getByRole('button', { name: 'Generate a key' });
  await tabTo(page, generate);
  await page.keyboard.press('Enter');
  const key = await page.getByLabel('API key').inputValue();
  assert.match(key, /^ondo-[0-9a-f]{32}$/);
  await page.getByTestId('server-address').getByText('http://127.0.0.1:11480').waitFor();
  assert.match(await page.getByTestId('server-curl').innerText(), new RegExp(`Bearer ${key}`));
  await page.getByTestId('server-curl').scrollIntoViewIfNeeded();
  await page.keyboard.press('Control+s');
  await page.getByTestId('settings-status').getByText('Saved').waitFor();
  const saved = await calls(page, 'set_settings');
  assert.deepEqual(saved.at(-1).payload.settings.local_server, {
    enabled: true,
    port: 11480,
    api_key: key,
    allowed_origins: [],
  });
  // The client set-ups: chosen from the keyboard, Codex's names the
  // Responses dialect and the key's variable.
  const client = page.getByRole('combobox', { name: 'Set up a client' });
  await client.focus();
  await page.keyboard.press('ArrowDown');
  assert.equal(await client.inputValue(), 'codex');
  const setup = await page.getByTestId('server-setup-text').innerText();
  assert.match(setup, /wire_api = "responses"/);
  assert.match(setup, /env_key = "ONDO_API_KEY"/);
  // Hidden again, the key shows as dots in the picture.
  await page.getByRole('button', { name: 'Hide' }).click();
  await page.getByTestId('server-setup-text').scrollIntoViewIfNeeded();
  await browser.screenshot(page, 'settings-server.png');
  assert.deepEqual(problems, []);
  await page.close();
});
