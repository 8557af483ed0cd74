// End to end: the built app under Xvfb, with trayer as the tray host, driven
// through tauri-driver (which drives WebKitWebDriver). It clicks what a user
// clicks, reads the timings back from the window, and saves screenshots of the
// window and of the whole screen (tray icon included) to docs/screenshots/.
//
// Needs: the app built with `cargo build -p ondo-app --features custom-protocol`
// (after `npm --prefix ui run build`), `cargo install tauri-driver@2.1.0 --locked`,
// and Debian's xvfb, trayer, webkit2gtk-driver, imagemagick, xdotool.
// Run: npm --prefix tests/e2e test   (ONDO_APP=path picks another binary)
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { createConnection, createServer } from 'node:net';
import { homedir, tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { remote } from 'webdriverio';

const run = promisify(execFile);
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const appBinary = process.env.ONDO_APP ?? path.join(repoRoot, 'target/debug/ondo-app');
const ondoCli = path.join(path.dirname(appBinary), 'ondo');
const testHub = path.join(path.dirname(appBinary), 'ondo-testhub');
/** The catalog model the test hub serves (a tiny synthetic model under its name). */
const servedRepo = 'mlx-community/Llama-3.2-1B-Instruct-4bit';
// Not in the catalog: reached by typing its id.
const repoById = 'someone/tiny-by-id';
const tauriDriver = process.env.TAURI_DRIVER ?? path.join(homedir(), '.cargo/bin/tauri-driver');
const screenshotDir = path.join(repoRoot, 'docs/screenshots');
const driverPort = 4444;

/** Processes this test started, stopped in reverse order by their own ids. */
const started = [];
let display;
let dataRoot;
let browser;

function start(command, args, env, stdout = 'ignore') {
  const child = spawn(command, args, { env, stdio: ['ignore', stdout, 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk) => {
    stderr = (stderr + chunk).slice(-4000);
  });
  child.lastErrors = () => stderr;
  started.push(child);
  return child;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitFor(what, check, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what}`);
}

function portOpen(port) {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port });
    socket.once('connect', () => socket.end(() => resolve(true)));
    socket.once('error', () => resolve(false));
  });
}

/** A port nobody listens on now. */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** The first X display number with no server on it. */
function freeDisplay() {
  for (let number = 90; number < 130; number += 1) {
    if (!existsSync(`/tmp/.X${number}-lock`) && !existsSync(`/tmp/.X11-unix/X${number}`)) return `:${number}`;
  }
  throw new Error('no free X display between :90 and :129');
}

/** Ids of the visible top-level windows titled "Ondo". */
async function visibleOndoWindows() {
  try {
    const { stdout } = await run('xdotool', ['search', '--onlyvisible', '--name', '^Ondo$'], {
      env: { ...process.env, DISPLAY: display },
    });
    return stdout.split('\n').filter(Boolean);
  } catch {
    return []; // xdotool exits 1 when nothing matches
  }
}

async function screenshotRoot(name) {
  await run('import', ['-window', 'root', path.join(screenshotDir, name)], {
    env: { ...process.env, DISPLAY: display },
  });
}

before(async () => {
  assert.ok(existsSync(appBinary), `build the app first: ${appBinary} is missing`);
  assert.ok(existsSync(tauriDriver), `install tauri-driver first: ${tauriDriver} is missing`);
  assert.equal(await portOpen(driverPort), false, `port ${driverPort} is taken; tauri-driver needs it`);
  await mkdir(screenshotDir, { recursive: true });

  display = freeDisplay();
  start('Xvfb', [display, '-screen', '0', '1280x800x24', '-nolisten', 'tcp']);
  await waitFor('Xvfb', () => existsSync(`/tmp/.X11-unix/X${display.slice(1)}`));

  // A clean data folder and an empty Hugging Face cache: the library starts empty.
  dataRoot = await mkdtemp(path.join(tmpdir(), 'ondo-e2e-'));
  // The hub: a test server on 127.0.0.1 that speaks the hub's protocol,
  // serving a tiny synthetic model under a catalog model's name.
  const served = path.join(dataRoot, 'served');
  await run(ondoCli, ['synth', 'tiny', served]);
  const hub = start(testHub, ['--repo', `${servedRepo}=${served}`, '--repo', `${repoById}=${served}`], process.env, 'pipe');
  const hubUrl = await new Promise((resolve, reject) => {
    let out = '';
    hub.stdout.on('data', (chunk) => {
      out += chunk;
      const found = /listening on (\S+)/.exec(out);
      if (found) resolve(found[1]);
    });
    hub.once('exit', () => reject(new Error(`ondo-testhub exited: ${hub.lastErrors()}`)));
  });
  const env = {
    ...process.env,
    DISPLAY: display,
    ONDO_HOME: path.join(dataRoot, 'ondo'),
    HF_HUB_CACHE: path.join(dataRoot, 'hub'),
    HF_ENDPOINT: hubUrl,
    ONDO_NO_KEYCHAIN: '1',
    // No accessibility bus under Xvfb; without this GTK waits for it.
    NO_AT_BRIDGE: '1',
  };
  delete env.DBUS_SESSION_BUS_ADDRESS;
  delete env.HF_HUB_OFFLINE;
  delete env.HF_TOKEN;

  // The tray host: without a D-Bus session the app's indicator falls back to
  // an XEmbed icon, which trayer shows at the top right.
  start('trayer', [
    '--edge', 'top', '--align', 'right', '--widthtype', 'request', '--height', '32',
    '--SetDockType', 'true', '--transparent', 'false', '--tint', '0x303030', '--expand', 'true',
  ], env);
  const driver = start(tauriDriver, ['--port', String(driverPort)], env);
  await waitFor('tauri-driver', () => portOpen(driverPort)).catch((error) => {
    throw new Error(`${error.message}\n${driver.lastErrors()}`);
  });

  browser = await remote({
    hostname: '127.0.0.1',
    port: driverPort,
    logLevel: 'warn',
    capabilities: {
      'tauri:options': { application: appBinary, args: ['--show'] },
    },
  });
});

after(async () => {
  await browser?.deleteSession().catch(() => {});
  for (const child of started.reverse()) child.kill('SIGTERM');
  if (dataRoot) await rm(dataRoot, { recursive: true, force: true });
});

test('the window opens with --show and shows the environment from the real core', async () => {
  await (await browser.$('h1=Ondo')).waitForDisplayed({ timeout: 30_000 });
  // Queried afresh on every poll: Svelte replaces the element when the report arrives.
  let memoryLine = '';
  await browser
    .waitUntil(
      async () => {
        // textContent, not getText: WebDriver's visibility rules drop ellipsis-clipped text.
        memoryLine = await browser.$('[data-testid="memory-line"]').getProperty('textContent');
        return /free of/.test(memoryLine);
      },
      { timeout: 60_000 },
    )
    .catch(() => assert.fail(`the memory line never showed the doctor report: "${memoryLine}"`));

  const environment = await browser.$('[data-testid="environment"]');
  const text = await environment.getText();
  // The MLX the project installs (scripts/setup.sh says which, once).
  const setup = await readFile(path.join(repoRoot, 'scripts/setup.sh'), 'utf8');
  const mlxVersion = setup.match(/^MLX_VERSION=([\d.]+)$/m)?.[1];
  assert.ok(mlxVersion, 'scripts/setup.sh names MLX_VERSION');
  assert.match(text, new RegExp(`MLX\\s+${mlxVersion.replaceAll('.', '\\.')}\\b`));
  assert.match(text, /Backend\s+cpu/);
  assert.match(text, /Memory\s+[\d.]+ GiB total, [\d.]+ GiB available/);
  assert.match(text, /Ondo\s+0\.1\.0/);
  assert.match(await (await browser.$('[data-testid="library-empty"]')).getText(), /No models are downloaded yet/);
});

test('a test generation on the built-in tiny model shows its timings', async () => {
  await (await browser.$('button=Use the built-in tiny model')).click();
  await (await browser.$('[data-testid="tiny-ready"]')).waitForDisplayed({ timeout: 120_000 });

  await (await browser.$('button=Run a test generation')).click();
  // Queried afresh on every poll: either may appear.
  const timings = () => browser.$('[data-testid="timings"]');
  const alert = () => browser.$('[role="alert"]');
  await browser.waitUntil(async () => (await timings().isDisplayed()) || (await alert().isExisting()), {
    timeout: 180_000,
    timeoutMsg: 'neither timings nor an error appeared',
  });
  if (await alert().isExisting()) assert.fail(`the run failed: ${await alert().getText()}`);

  /** Each row as "Stage measures | time | tokens | speed". */
  const cells = [];
  for (const row of await browser.$$('[data-testid="timings"] tbody tr')) {
    const parts = [];
    for (const cell of await row.$$('th, td')) parts.push((await cell.getText()).replace(/\s+/g, ' '));
    cells.push(parts.join(' | '));
  }
  assert.equal(cells.length, 3);
  const [load, prefill, decode] = cells;
  assert.match(load, /Load[\s\S]*cold start[\s\S]*\d[\d.,]* (ms|s)/);
  assert.match(prefill, /Prefill[\s\S]*\d[\d.,]* (ms|s)[\s\S]*\d+ prompt[\s\S]*[\d.,]+ tok\/s/);
  assert.match(decode, /Decode[\s\S]*\d[\d.,]* (ms|s)[\s\S]*\d+ generated[\s\S]*[\d.,]+ tok\/s/);
  assert.match(await (await browser.$('[data-testid="run-memory"]')).getText(), /^MLX peak [\d.]+ (B|[KMG]iB) · KV cache [\d.]+ (B|[KMG]iB)$/);
  const generated = await (await browser.$('[data-testid="generated-text"]')).getText();
  assert.ok(generated.length > 0, 'some text was generated');
  console.log(`# timings read back:\n#   ${cells.join('\n#   ')}`);

  // Let the smooth scroll to the timings settle before the pictures.
  await sleep(800);
  await browser.saveScreenshot(path.join(screenshotDir, 'app-window.png'));
});

test('a chat with the tiny model streams an answer and fills in the footer; the second turn is warm', async () => {
  const message = await browser.$('textarea[aria-label="Message"]');
  const footers = () => browser.$$('[data-testid="chat-footer"]');
  for (const [turn, text] of ['Tell me about the sea.', 'And the sky?'].entries()) {
    await message.setValue(text);
    await (await browser.$('button=Send')).click();
    await browser.waitUntil(async () => (await footers()).length === turn + 1 || (await browser.$('[role="alert"]').isExisting()), {
      timeout: 120_000,
      timeoutMsg: `no footer under answer ${turn + 1}`,
    });
    const alert = await browser.$('[role="alert"]');
    if (await alert.isExisting()) assert.fail(`the chat failed: ${await alert.getText()}`);
  }
  const texts = [];
  for (const footer of await footers()) texts.push(await footer.getText());
  const [first, second] = texts;
  // The tiny model was loaded by the test generation before: both warm, and
  // the second turn reuses the first turn's KV cache.
  assert.match(first, /TTFT [\d.,]+ (ms|s)[\s\S]*prefill [\d.,]+ tok\/s[\s\S]*decode [\d.,]+ tok\/s/);
  assert.match(second, /warm/);
  assert.match(second, /\(\d+ cached\)/);
  console.log(`# chat footers:\n#   ${first}\n#   ${second}`);

  // The shell's engine-state event lists the warm model at the top of the popover.
  const warm = await browser.$('[data-testid="warm-models"]');
  await warm.waitForExist({ timeout: 10_000, timeoutMsg: 'the popover never listed the warm model' });
  assert.match(await warm.getProperty('textContent'), /tiny \(speed test\)[\s\S]*weights[\s\S]*KV cache/);
});

test('a catalog model downloads from the hub with a click and joins the library', async () => {
  const card = await browser.$(`[data-repo="${servedRepo}"]`);
  await card.scrollIntoView();
  const download = await card.$('button.download');
  await download.click();
  // A will-not-fit confirmation would be a wrong verdict: 1B in 4 bits fits here.
  await browser.waitUntil(
    async () => (await browser.$(`[data-testid="library-model"][data-model="${servedRepo}"]`).isExisting()) ||
      (await browser.$('[role="alert"]').isExisting()),
    { timeout: 120_000, timeoutMsg: 'the downloaded model never reached the library' },
  );
  const alert = await browser.$('[role="alert"]');
  if (await alert.isExisting()) assert.fail(`the download failed: ${await alert.getText()}`);
  const files = await run('find', [path.join(dataRoot, 'hub'), '-name', '*.safetensors']);
  assert.ok(files.stdout.includes('models--mlx-community--Llama-3.2-1B-Instruct-4bit'), files.stdout);
  await browser.saveScreenshot(path.join(screenshotDir, 'app-downloaded.png'));
});

test('a model outside the catalog downloads by its id after a fit check against the hub', async () => {
  const id = await browser.$('#hub-model-id');
  await id.scrollIntoView();
  await id.setValue(repoById);
  await browser.keys('Enter');
  // The verdict comes from the real core reading the repo's files on the test hub.
  const card = await browser.$(`[data-testid="hub-model"][data-repo="${repoById}"]`);
  await browser.waitUntil(async () => (await card.isExisting()) || (await browser.$('[role="alert"]').isExisting()), {
    timeout: 60_000,
    timeoutMsg: 'the fit check never answered',
  });
  const alert = await browser.$('[role="alert"]');
  if (await alert.isExisting()) assert.fail(`the fit check failed: ${await alert.getText()}`);
  assert.match(await card.getText(), /fits[\s\S]*of weights · needs .* at 4,096 tokens/);
  await (await card.$(`button[aria-label="Download ${repoById}"]`)).click();
  await browser.waitUntil(
    async () => (await browser.$(`[data-testid="library-model"][data-model="${repoById}"]`).isExisting()) ||
      (await browser.$('[role="alert"]').isExisting()),
    { timeout: 120_000, timeoutMsg: 'the model downloaded by id never reached the library' },
  );
  if (await alert.isExisting()) assert.fail(`the download failed: ${await alert.getText()}`);
  assert.match(await card.getText(), /Downloaded/);
});

test('a downloaded model split over two ranks from the popover answers in Chat, and Stop ends both ranks', async () => {
  // Both ranks on this machine over the ring backend: the app starts `ondo
  // serve --hostfile` beside it as rank 0, which starts rank 1.
  const section = await browser.$('[data-testid="split"]');
  await section.scrollIntoView();
  await (await section.$('summary*=Several machines')).click();
  await (await section.$('input[placeholder="a repo id or a folder"]')).setValue(servedRepo);
  const machines = await section.$('textarea');
  await machines.setValue('localhost');
  await browser.keys('Enter');
  await machines.addValue('127.0.0.1');
  await (await section.$('button=Start')).click();
  const headline = () => browser.$('[data-testid="split-headline"]');
  let said = '';
  await browser
    .waitUntil(
      async () => {
        said = (await headline().isExisting()) ? await headline().getProperty('textContent') : said;
        return said.startsWith('Serving') || said.startsWith('Lost') || (await section.$('[role="alert"]').isExisting());
      },
      { timeout: 120_000 },
    )
    .catch(async () => {
      await browser.saveScreenshot(path.join(screenshotDir, 'app-split-failed.png')).catch(() => {});
      assert.fail(`the split never served: "${said}"; the section says: ${await section.getProperty('textContent')}`);
    });
  if (!said.startsWith('Serving')) {
    const lines = await browser.$('[data-testid="split-lines"]').getProperty('textContent').catch(() => '');
    assert.fail(`the split did not serve: "${said}" ${lines}`);
  }
  assert.match(said, /by layers over 2 machines \(localhost, 127\.0\.0\.1\)/);
  await browser.saveScreenshot(path.join(screenshotDir, 'app-split.png'));

  // Chat offers it as split; a turn streams from rank 0 and shows its footer.
  const chat = await browser.$('[data-testid="chat"]');
  await (await chat.$('button=New conversation')).click();
  const picker = await chat.$('select');
  await picker.click();
  const label = `${servedRepo} (split by layers over 2 machines)`;
  await browser.waitUntil(async () => (await picker.$(`option=${label}`).isExisting()), {
    timeout: 10_000,
    timeoutMsg: 'Chat never offered the split model',
  });
  await picker.selectByVisibleText(label);
  await (await chat.$('textarea[aria-label="Message"]')).setValue('Tell me about the sea.');
  await (await chat.$('button=Send')).click();
  const footers = () => browser.$$('[data-testid="chat-footer"]');
  await browser.waitUntil(async () => (await footers()).length === 1 || (await chat.$('[role="alert"]').isExisting()), {
    timeout: 120_000,
    timeoutMsg: 'no footer under the split answer',
  });
  const chatAlert = await chat.$('[role="alert"]');
  if (await chatAlert.isExisting()) assert.fail(`the split chat failed: ${await chatAlert.getText()}`);
  assert.match(await (await footers())[0].getText(), /decode [\d.,]+ tok\/s/);

  // Stop: the form comes back and no rank is left running.
  await (await section.$('button=Stop the split')).click();
  await (await section.$('button=Start')).waitForExist({ timeout: 60_000, timeoutMsg: 'the split never stopped' });
  const { stdout } = await run('ps', ['-eo', 'args']);
  const ranks = stdout.split('\n').filter((line) => line.includes(' serve ') && line.includes(servedRepo));
  assert.deepEqual(ranks, [], 'ranks left running after Stop');
});

test('the local server turned on in Settings answers HTTP clients, and the popover counts them', async () => {
  const popover = await browser.getWindowHandle();
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  await (await browser.$('button[aria-label="Settings"]')).click();
  await switchToTitled('Ondo: Runs and Settings');
  try {
    await (await browser.$('h1=Settings')).waitForDisplayed({ timeout: 10_000 });
    const toggle = await browser.$('input#setting-server_enabled');
    await toggle.scrollIntoView();
    await toggle.click();
    await (await browser.$('input#setting-server_port')).setValue(String(port));
    await (await browser.$('button=Save')).click();
    const status = await browser.$('[data-testid="settings-status"]');
    await browser.waitUntil(async () => (await status.getText()) === 'Saved', { timeout: 20_000, timeoutMsg: 'the settings were not saved' });
    const address = await browser.$('[data-testid="server-address"]');
    assert.match(await address.getText(), new RegExp(`${base}[\\s\\S]*Serving here now`));
    await address.scrollIntoView();
    await browser.saveScreenshot(path.join(screenshotDir, 'app-settings-server.png'));
  } finally {
    // Left open: the Runs test reuses it (a window closed through WebDriver
    // cannot be opened again by the app).
    await browser.switchToWindow(popover);
  }

  // A client that is not the app: Node's own fetch.
  const models = await (await fetch(`${base}/v1/models`, { headers: { 'user-agent': 'e2e-client/1' } })).json();
  assert.ok(models.data.some((model) => model.id === 'tiny'), `tiny is listed: ${JSON.stringify(models)}`);
  const response = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'user-agent': 'e2e-client/1' },
    body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8 }),
  });
  assert.equal(response.status, 200);
  const answer = await response.json();
  assert.equal(answer.choices[0].message.role, 'assistant');
  assert.ok(answer.usage.completion_tokens > 0, JSON.stringify(answer));

  // The popover's line, live from the shell's event.
  const line = await browser.$('[data-testid="local-server"]');
  await browser.waitUntil(async () => (await line.isExisting()) && / · 1 request\b/.test(await line.getText()), {
    timeout: 10_000,
    timeoutMsg: 'the popover did not count the request',
  });
  assert.match(await line.getText(), new RegExp(`Local server on ${base}`));
  // Copy puts the address on the system clipboard: a paste brings it back.
  assert.equal(await browser.execute(() => window.isSecureContext && typeof navigator.clipboard?.writeText), 'function');
  await (await browser.$(`button[aria-label="Copy the local server's address"]`)).click();
  await browser.waitUntil(async () => /Copied/.test(await line.getText()), { timeout: 5_000, timeoutMsg: 'Copy failed' });
  const message = await browser.$('textarea[aria-label="Message"]');
  await message.click();
  await browser.keys(['Control', 'v']);
  await browser.waitUntil(async () => (await message.getValue()) === base, { timeout: 5_000, timeoutMsg: 'the paste did not bring the address' });
  await message.clearValue();
  await line.scrollIntoView();
  await browser.saveScreenshot(path.join(screenshotDir, 'app-server-line.png'));
});

/** Switches the session to the window whose title is `title`. */
async function switchToTitled(title) {
  let handles = [];
  await browser.waitUntil(async () => {
    handles = await browser.getWindowHandles();
    for (const handle of handles) {
      await browser.switchToWindow(handle);
      if ((await browser.getTitle()) === title) return true;
    }
    return false;
  }, { timeout: 30_000, timeoutMsg: `no window titled ${title} among ${handles.length}` });
}

/** The input labelled `text` in the open benchmark dialog. */
const benchField = (text) => browser.$(`//dialog//label[span[normalize-space()="${text}"]]/input`);

test('the Runs window lists the runs, runs a small benchmark and exports it to the file the user picks', async () => {
  const popover = await browser.getWindowHandle();
  await (await browser.$('button=Runs')).click();
  await switchToTitled('Ondo: Runs and Settings');
  try {
    await useTheRunsWindow();
  } finally {
    // The tests after this one work in the popover.
    await browser.closeWindow().catch(() => {});
    await browser.switchToWindow(popover);
  }
});

async function useTheRunsWindow() {
  const rows = () => browser.$$('table[aria-label="Recorded runs"] tbody tr');
  await browser.waitUntil(async () => (await rows()).length >= 3, { timeout: 30_000, timeoutMsg: 'the runs table stayed empty' });

  await (await browser.$('button=Benchmark…')).click();
  for (const [label, value] of [
    ['Prompt lengths (tokens, comma-separated)', '16'],
    ['Tokens to generate', '8'],
    ['Repetitions', '2'],
    ['Warm-ups', '0'],
    ['Cold starts (fresh processes)', '0'],
  ]) {
    await (await benchField(label)).setValue(value);
  }
  await (await browser.$('//dialog//button[normalize-space()="Start"]')).click();
  const summary = await browser.$('[data-testid="bench-summary"]');
  await summary.waitForDisplayed({ timeout: 180_000, timeoutMsg: 'the benchmark never finished' });
  const summaryText = await summary.getText();
  assert.match(summaryText, /sync/);
  assert.match(summaryText, /pipelined/);
  console.log(`# benchmark summary:\n#   ${summaryText.replace(/\n/g, '\n#   ')}`);
  await browser.saveScreenshot(path.join(screenshotDir, 'app-benchmark.png'));
  await (await browser.$('//dialog//button[normalize-space()="Close"]')).click();
  // The table now shows the benchmark's runs: 1 prompt length x 2 loop shapes x 2 repetitions.
  await browser.waitUntil(async () => (await rows()).length === 4, { timeout: 20_000, timeoutMsg: 'the table did not switch to the benchmark' },);
  await browser.saveScreenshot(path.join(screenshotDir, 'app-runs.png'));

  // Export as CSV: the system's save dialog (GTK) is answered with the keyboard.
  const target = path.join(dataRoot, 'bench-report.csv');
  await (await browser.$('//label[span[normalize-space()="Report format"]]/select')).selectByAttribute('value', 'csv');
  await (await browser.$('button=Export…')).click();
  const xenv = { ...process.env, DISPLAY: display };
  let dialogId;
  await waitFor('the save dialog', async () => {
    try {
      const { stdout } = await run('xdotool', ['search', '--onlyvisible', '--name', '^Export runs$'], { env: xenv });
      dialogId = stdout.split('\n').filter(Boolean).at(-1);
      return Boolean(dialogId);
    } catch {
      return false;
    }
  });
  await sleep(500);
  await run('xdotool', ['windowfocus', '--sync', dialogId], { env: xenv });
  await run('xdotool', ['key', 'ctrl+a'], { env: xenv });
  await run('xdotool', ['type', '--delay', '20', target], { env: xenv });
  await run('xdotool', ['key', 'Return'], { env: xenv });
  await waitFor('the report file', () => existsSync(target), 20_000);
  const status = await browser.$('[data-testid="export-status"]');
  await browser.waitUntil(async () => /Saved/.test(await status.getText()), { timeout: 10_000 });
  const csv = (await readFile(target, 'utf8')).trim().split('\n');
  assert.equal(csv.length, 1 + 4, `a header and the 4 runs:\n${csv.join('\n')}`);
  assert.match(csv[0], /decode_tps/);

  await (await browser.$('[role="tab"]=Settings')).click();
  await (await browser.$('h1=Settings')).waitForDisplayed({ timeout: 10_000 });
  await browser.saveScreenshot(path.join(screenshotDir, 'app-settings.png'));
}

/** Left-clicks the middle of trayer's window, where the app's icon sits; on
 * Linux that opens the tray menu. */
async function clickTrayIcon() {
  const env = { ...process.env, DISPLAY: display };
  const trayWindow = await trayerWindow(env);
  assert.ok(trayWindow, 'trayer has a window');
  const geometry = await run('xdotool', ['getwindowgeometry', '--shell', trayWindow], { env });
  const value = (key) => Number(new RegExp(`${key}=(\\d+)`).exec(geometry.stdout)?.[1]);
  const [x, y] = [value('X') + value('WIDTH') / 2, value('Y') + value('HEIGHT') / 2];
  await run('xdotool', ['mousemove', String(Math.round(x)), String(Math.round(y)), 'click', '1'], { env });
}

/** Trayer's window. xdotool walks the whole window tree, and a window that
 * closes during the walk (the save dialog of the test before, going away)
 * fails it with BadWindow: then it walks again. */
async function trayerWindow(env) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      const { stdout } = await run('xdotool', ['search', '--class', 'trayer'], { env });
      return stdout.split('\n').filter(Boolean).at(-1);
    } catch (error) {
      if (attempt >= 5) throw error;
      await sleep(300);
    }
  }
}

/** Picks the first menu item (Open) of the open tray menu with the keyboard. */
async function chooseOpen() {
  await run('xdotool', ['key', 'Down', 'Return'], { env: { ...process.env, DISPLAY: display } });
}

test('the tray menu opens, and its Open item toggles the window', async () => {
  // The save dialog of the test before may still be going away.
  await waitFor('the popover on screen', async () => (await visibleOndoWindows()).length === 1, 10_000);
  await clickTrayIcon();
  await sleep(700); // the menu maps
  await screenshotRoot('app-tray.png');

  await chooseOpen();
  await waitFor('Open to hide the visible window', async () => (await visibleOndoWindows()).length === 0, 10_000);

  await clickTrayIcon();
  await sleep(700);
  await chooseOpen();
  await waitFor('Open to show the window again', async () => (await visibleOndoWindows()).length === 1, 10_000);
});

test('Escape hides the window and the app keeps running in the tray', async () => {
  await browser.keys(['Escape']);
  await waitFor('the window to hide', async () => (await visibleOndoWindows()).length === 0, 10_000);
  // The process is still there and its page still answers.
  assert.equal(await browser.execute(() => document.title), 'Ondo');
});

test('without --show the app starts in the tray only, its window hidden', async () => {
  assert.equal((await visibleOndoWindows()).length, 0, 'the first instance is hidden by now');
  const env = { ...process.env, DISPLAY: display, ONDO_HOME: path.join(dataRoot, 'ondo'), NO_AT_BRIDGE: '1' };
  const trayOnly = start(appBinary, [], env);
  await sleep(5000); // long enough for a window to have been mapped, had it been shown
  assert.equal(trayOnly.exitCode, null, `the app exited: ${trayOnly.lastErrors()}`);
  assert.equal((await visibleOndoWindows()).length, 0);
});

