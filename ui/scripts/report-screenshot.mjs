// The HTML run report in Debian's headless Chromium. The page is the one
// the Rust writer produced for the report test's fixture
// (tests/fixtures/report/expected.html, rewritten by
// `ONDO_BLESS=1 cargo test -p ondo --test report`). Asserts that its charts
// render with non-zero size, that it fetches nothing and that its
// Content-Security-Policy blocks nothing (a blocked inline resource shows up
// as a console error), and writes docs/screenshots/report.png.
// Run: node --test scripts/report-screenshot.mjs
import assert from 'node:assert/strict';
import { stat } from 'node:fs/promises';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { startBrowser, uiDir } from './browser-harness.mjs';

const reportUrl = pathToFileURL(path.resolve(uiDir, '../tests/fixtures/report/expected.html')).href;

let browser;
before(async () => {
  browser = await startBrowser({ viewport: { width: 1200, height: 900 }, serve: false });
});
after(() => browser?.stop());

/** Opens the report; collects page errors, console errors and warnings, and
 * every request other than the page itself. */
async function openReport() {
  const opened = await browser.openPage(reportUrl, {
    consoleTypes: ['error', 'warning'],
    allowRequest: (url) => url.href === reportUrl || url.protocol === 'data:',
  });
  await opened.page.getByRole('heading', { level: 1 }).waitFor();
  return opened;
}

test('the HTML report draws its charts, fetches nothing and blocks nothing', async () => {
  const { page, problems } = await openReport();

  const sections = await page.getByRole('heading', { level: 2 }).allInnerTexts();
  assert.deepEqual(sections, [
    'Prefill and decode speed per run',
    'Cold and warm start',
    'Memory during the run',
    'Summary',
    'Runs',
    'Provenance',
  ]);
  assert.equal(await page.locator('script').count(), 0, 'no script in the page');

  // Every chart is an image with a name, laid out at a readable size.
  const charts = page.getByRole('img');
  const count = await charts.count();
  assert.ok(count >= 4, `speed (2), start and memory charts: ${count}`);
  for (let i = 0; i < count; i += 1) {
    const chart = charts.nth(i);
    const name = await chart.getAttribute('aria-label');
    assert.ok(name && name.length > 10, `chart ${i} has a name`);
    const box = await chart.boundingBox();
    assert.ok(box && box.width >= 400 && box.height >= 150, `${name}: ${JSON.stringify(box)}`);
  }

  // What each chart drew, measured in the page: shapes with area, lines with length.
  const drawn = await page.evaluate(() =>
    [...document.querySelectorAll('svg[role="img"]')].map((svg) => {
      const visible = (element) => {
        const box = element.getBoundingClientRect();
        return box.width > 0 && box.height > 0 && getComputedStyle(element).visibility !== 'hidden';
      };
      return {
        name: svg.getAttribute('aria-label'),
        bars: [...svg.querySelectorAll('rect.bar')].filter(visible).length,
        bands: [...svg.querySelectorAll('rect.band')].map((band) => band.getAttribute('fill')),
        lines: [...svg.querySelectorAll('path.series')].map((line) => line.getTotalLength()),
        labels: [...svg.querySelectorAll('text')].filter(visible).length,
      };
    }),
  );
  const [prefill, decode, start, memory] = drawn;
  assert.match(prefill.name, /Prefill speed/);
  assert.equal(prefill.bars, 9, 'one prefill bar per run');
  assert.match(decode.name, /Decode speed/);
  assert.equal(decode.bars, 9, 'one decode bar per run');
  assert.match(start.name, /load and TTFT/);
  // Two fresh-process cold runs (process start, load, TTFT) and seven warm
  // runs (TTFT only: a zero load draws nothing).
  assert.equal(start.bars, 2 * 3 + 7);
  assert.match(memory.name, /Memory timeline/);
  assert.equal(memory.lines.length, 2, 'memory used and process footprint');
  assert.ok(memory.lines.every((length) => length > 200), `lines drawn: ${memory.lines}`);
  // normal, warning, normal: in both panels.
  assert.deepEqual(memory.bands, ['#34c759', '#ffcc00', '#34c759', '#34c759', '#ffcc00', '#34c759']);
  for (const chart of drawn) assert.ok(chart.labels >= 8, `${chart.name}: axis labels`);

  // The summary table and the warning a reader must not miss.
  const summary = page.getByRole('table', { name: /Groups of runs/ });
  assert.equal(await summary.locator('tbody tr').count(), 4);
  assert.match(await page.getByRole('note').first().innerText(), /Memory pressure rose above normal/);

  const screenshotPath = await browser.screenshot(page, 'report.png', { fullPage: true });
  const { size } = await stat(screenshotPath);
  assert.ok(size > 20_000, `a screenshot with content: ${size} bytes`);
  assert.deepEqual(problems, []);
  await page.close();
});

test('the runs table opens from the keyboard', async () => {
  const { page, problems } = await openReport();
  const table = page.getByRole('table').filter({ hasText: 'run id' });
  assert.equal(await table.isVisible(), false, 'folded at first');
  await page.getByText('All 9 runs, in order').focus();
  await page.keyboard.press('Enter');
  await table.waitFor();
  assert.equal(await table.locator('tbody tr').count(), 9);
  assert.deepEqual(problems, []);
  await page.close();
});
