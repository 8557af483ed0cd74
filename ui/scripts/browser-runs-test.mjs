// The Runs view in Debian's headless Chromium against a mocked backend
// (test/browser/runs.html): the table, sorting, keyboard selection with the
// memory timeline drawn, filters, a benchmark with progress and its summary,
// and export. Writes screenshots to docs/screenshots/.
// Run: node --test scripts/browser-runs-test.mjs
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startBrowser } from './browser-harness.mjs';

const windowSize = { width: 1000, height: 700 };

let browser;
before(async () => {
  browser = await startBrowser({ viewport: windowSize });
});
after(() => browser?.stop());

/** Opens the Runs view in a fresh page; collects page errors and any request
 * that leaves the local server. */
async function openRuns({ scenario = 'ok', colorScheme = 'light' } = {}) {
  const opened = await browser.openPage(`test/browser/runs.html?scenario=${scenario}`, { colorScheme });
  await opened.page.getByRole('heading', { name: 'Runs', level: 1 }).waitFor();
  return opened;
}

const table = (page) => page.getByRole('table', { name: 'Recorded runs' });
const bodyRows = (page) => table(page).locator('tbody tr');

/** The canvas of a chart, with its drawn size. */
async function canvasSize(page, testid) {
  const canvas = page.getByTestId(testid).locator('canvas');
  await canvas.waitFor();
  return canvas.evaluate((element) => ({ width: element.width, height: element.height }));
}

test('the table lists runs; sorting, keyboard selection and the timeline chart work', async () => {
  const { page, problems } = await openRuns();
  await bodyRows(page).first().waitFor();
  assert.equal(await bodyRows(page).count(), 30, 'every run but the warm-ups');
  assert.match(await bodyRows(page).first().innerText(), /tiny \(speed test\)/);

  // Sort by decode tok/s, largest first.
  const decode = table(page).getByRole('columnheader', { name: /Decode/ });
  await decode.getByRole('button').click();
  assert.equal(await decode.getAttribute('aria-sort'), 'descending');
  const decodeColumn = await bodyRows(page).locator('td:nth-child(9)').allInnerTexts();
  const rates = decodeColumn.map((cell) => Number.parseFloat(cell.replace(/,/g, '')));
  assert.deepEqual(rates, [...rates].sort((a, b) => b - a));

  // Back to newest first with the keyboard, then select the fourth run.
  const when = table(page).getByRole('columnheader', { name: /When/ }).getByRole('button');
  await when.focus();
  await page.keyboard.press('Enter');
  assert.equal(await table(page).getByRole('columnheader', { name: /When/ }).getAttribute('aria-sort'), 'descending');
  // Tab past the other headers to the table's one tabbable row.
  const first = bodyRows(page).first();
  const headers = await table(page).getByRole('columnheader').count();
  let presses = 0;
  while (!(await first.evaluate((row) => row === document.activeElement))) {
    await page.keyboard.press('Tab');
    presses += 1;
    assert.ok(presses <= headers, 'Tab reaches the table’s rows after its headers');
  }
  assert.notEqual(await first.evaluate((row) => getComputedStyle(row).outlineStyle), 'none', 'a focused row shows a ring');
  for (let i = 0; i < 3; i += 1) await page.keyboard.press('ArrowDown');
  const fourth = bodyRows(page).nth(3);
  assert.equal(await fourth.getAttribute('aria-selected'), 'true');
  const runId = await fourth.getAttribute('data-run-id');
  await page.waitForFunction(
    (id) => window.__ondoIpcCalls.some((call) => call.cmd === 'run_timeline' && call.payload.runId === id),
    runId,
  );
  const timeline = await canvasSize(page, 'timeline-chart');
  assert.ok(timeline.width > 100 && timeline.height > 100, `timeline drawn at ${timeline.width}×${timeline.height}`);
  for (const chart of ['speed-chart', 'cold-warm-chart']) {
    const size = await canvasSize(page, chart);
    assert.ok(size.width > 100 && size.height > 50, `${chart} drawn at ${size.width}×${size.height}`);
  }
  await page.getByRole('img', { name: 'Memory timeline of the selected run' }).waitFor();

  // Charts follow the window's size.
  const before = await canvasSize(page, 'speed-chart');
  await page.setViewportSize({ width: 1200, height: 700 });
  await page.waitForFunction(
    (width) => document.querySelector('[data-testid="speed-chart"] canvas').width > width,
    before.width,
  );
  await page.setViewportSize(windowSize);
  // Tabbing through the headers scrolled the wide table sideways; show its start.
  await table(page).evaluate((element) => (element.parentElement.scrollLeft = 0));
  await page.waitForTimeout(200);
  await browser.screenshot(page, 'runs.png');
  assert.deepEqual(problems, []);
  await page.close();
});

test('filters narrow the rows, and the backend gets the whole filter', async () => {
  const { page, problems } = await openRuns();
  await bodyRows(page).first().waitFor();
  await page.getByRole('combobox', { name: 'Benchmark' }).selectOption('latest');
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 13);
  await page.getByRole('combobox', { name: 'Loop' }).selectOption('pipelined');
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 7);
  await page.getByRole('checkbox', { name: 'Include warm-ups' }).check();
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 9);
  const calls = await page.evaluate(() => window.__ondoIpcCalls.filter((call) => call.cmd === 'list_runs'));
  const last = calls.at(-1).payload.filter;
  assert.equal(last.bench_id, 'b-1760004000000-7f3a');
  assert.equal(last.include_warmup, true);
  assert.equal(last.loop, 'pipelined');
  assert.deepEqual(
    new Set(await bodyRows(page).locator('td:nth-child(11)').allInnerTexts()),
    new Set(['pipelined']),
  );
  await page.getByRole('button', { name: 'Clear filters' }).first().click();
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 30);
  await page.getByRole('combobox', { name: 'Model' }).selectOption('mlx-community/Qwen3-0.6B-4bit');
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 2);
  await page.getByRole('combobox', { name: 'Setting' }).selectOption('max_kv_size=none');
  await page.waitForFunction(() =>
    window.__ondoIpcCalls.some((call) => call.cmd === 'list_runs' && call.payload.filter.max_kv_size === 0),
  );
  assert.equal(await bodyRows(page).count(), 2);
  assert.deepEqual(problems, []);
  await page.close();
});

test('a benchmark runs with progress to a per-case summary; the table shows its runs', async () => {
  const { page, problems } = await openRuns();
  await bodyRows(page).first().waitFor();
  await page.getByRole('button', { name: 'Benchmark…' }).click();
  const dialog = page.getByRole('dialog', { name: 'Benchmark' });
  await dialog.waitFor();
  const model = dialog.getByRole('combobox', { name: 'Model' });
  assert.equal(await model.inputValue(), 'tiny');
  assert.match(await model.innerText(), /Built-in tiny \(speed test, random weights\)/);
  await dialog.getByRole('option', { name: /Qwen3-0\.6B-4bit/ }).waitFor({ state: 'attached' });

  // A bad value says what is wrong, next to the field.
  const prompts = dialog.getByLabel(/Prompt lengths/);
  await prompts.fill('128, many');
  await dialog.getByRole('button', { name: 'Start' }).click();
  await dialog.getByText(/“many” is not a valid prompt length/).waitFor();
  assert.ok(await prompts.evaluate((input) => input === document.activeElement), 'focus goes to the bad field');
  await prompts.fill('128, 512');
  // Keyboard only from here: Tab never reaches the page behind the modal
  // dialog (between its last and first control it visits the browser's own
  // chrome, where the document's body is the active element).
  for (let i = 0; i < 25; i += 1) {
    await page.keyboard.press('Tab');
    const inside = await dialog.evaluate(
      (element) => element.contains(document.activeElement) || document.activeElement === document.body,
    );
    assert.ok(inside, 'focus stays in the dialog');
  }
  await dialog.getByRole('button', { name: 'Start' }).focus();
  await page.keyboard.press('Enter');

  const bar = dialog.getByRole('progressbar', { name: 'Benchmark progress' });
  await bar.waitFor();
  await page.waitForFunction(() => document.querySelector('dialog progress')?.value >= 5);
  assert.match(await dialog.getByTestId('bench-progress').innerText(), /^\d+ of 17 runs · /);
  // Escape does not stop a running benchmark.
  await page.keyboard.press('Escape');
  assert.ok(await dialog.isVisible(), 'the dialog stays open while it runs');
  await browser.screenshot(page, 'runs-benchmark.png');

  const summary = dialog.getByTestId('bench-summary');
  await summary.waitFor({ timeout: 10_000 });
  const caseRows = summary.getByRole('table', { name: 'Benchmark summary per case' }).locator('tbody tr');
  assert.equal(await caseRows.count(), 4);
  assert.match(await caseRows.nth(1).innerText(), /pipelined[\s\S]*1\.\d\d×/);
  await summary.getByRole('list', { name: 'Warnings' }).waitFor();
  await page.waitForTimeout(200);
  await browser.screenshot(page, 'runs-benchmark-summary.png');

  await summary.getByRole('button', { name: 'Close' }).click();
  await dialog.waitFor({ state: 'detached' });
  assert.equal(await page.getByRole('combobox', { name: 'Benchmark' }).inputValue(), 'b-1760007600000-0aa1');
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 13);
  const request = await page.evaluate(() => window.__ondoIpcCalls.find((call) => call.cmd === 'run_benchmark').payload.request);
  // The prompt lengths typed; everything else the core's defaults.
  assert.deepEqual(request, {
    model: 'tiny',
    shape: {
      prompt_tokens: [128, 512],
      generate_tokens: 128,
      repetitions: 5,
      warmup: 1,
      loops: ['sync', 'pipelined'],
      prefill_step_size: 2048,
      max_kv_size: null,
      vary: null,
      kv_bits: null,
      kv_group_size: 64,
      quantized_kv_start: 5000,
      cold_repetitions: 3,
    },
  });
  assert.deepEqual(problems, []);
  await page.close();
});

test('export asks for a path, then writes the runs the table shows there', async () => {
  const { page, problems } = await openRuns();
  await bodyRows(page).first().waitFor();
  await page.getByRole('combobox', { name: 'Kind' }).selectOption('chat');
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 3);
  await page.getByRole('combobox', { name: 'Loop' }).selectOption('pipelined');
  await page.waitForFunction(() => document.querySelectorAll('table[aria-label="Recorded runs"] tbody tr').length === 2);
  await page.getByRole('combobox', { name: 'Report format' }).selectOption('md');
  await page.getByRole('button', { name: 'Export…' }).click();
  await page.getByText('Saved 2 runs to /home/me/Documents/ondo-runs.md (47.1 KiB)').waitFor();
  const calls = await page.evaluate(() =>
    window.__ondoIpcCalls.filter((call) => call.cmd === 'choose_export_path' || call.cmd === 'export_runs'),
  );
  assert.deepEqual(
    calls.map((call) => call.cmd),
    ['choose_export_path', 'export_runs'],
  );
  assert.equal(calls[0].payload.format, 'md');
  assert.equal(calls[1].payload.path, '/home/me/Documents/ondo-runs.md');
  assert.equal(calls[1].payload.format, 'md');
  assert.equal(calls[1].payload.filter.kind, 'chat');
  assert.equal(calls[1].payload.filter.loop, 'pipelined');
  assert.deepEqual(problems, []);
  await page.close();
});

test('dark mode, and the empty state', async () => {
  const { page, problems } = await openRuns({ colorScheme: 'dark' });
  await bodyRows(page).first().waitFor();
  assert.equal(await page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor), 'rgb(28, 27, 26)');
  await canvasSize(page, 'timeline-chart');
  await page.waitForTimeout(200);
  await browser.screenshot(page, 'runs-dark.png');
  assert.deepEqual(problems, []);
  await page.close();

  const empty = await openRuns({ scenario: 'empty' });
  await empty.page.getByTestId('runs-empty').waitFor();
  assert.match(await empty.page.getByTestId('runs-empty').innerText(), /Chat with a model in the menu-bar popover/);
  assert.deepEqual(empty.problems, []);
  await empty.page.close();
});
