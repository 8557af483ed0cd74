// What the headless-browser tests share: Vite's dev server on 127.0.0.1,
// Debian's Chromium ($CHROMIUM or /usr/bin/chromium) in a throwaway profile,
// pages that record whatever should fail a test, and docs/screenshots/.
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { createServer } from 'vite';

export const uiDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const screenshotDir = path.resolve(uiDir, '../docs/screenshots');

const chromiumArgs = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** True for the local dev server and data: URLs: all a test page may load. */
const isLocal = (url) => url.hostname === '127.0.0.1' || url.protocol === 'data:';

/**
 * Starts Chromium with `viewport` (CSS pixels) and `deviceScaleFactor`, and
 * unless `serve` is false the Vite dev server for ui/. Returns the browser
 * `context`, the server's `baseUrl`, `openPage`, `screenshot` and `stop`.
 */
export async function startBrowser({ viewport, deviceScaleFactor = 1, serve = true }) {
  let server;
  let userDataDir;
  let context;

  async function stop() {
    await context?.close();
    await server?.close();
    if (userDataDir) await rm(userDataDir, { recursive: true, force: true });
  }

  try {
    await mkdir(screenshotDir, { recursive: true });
    if (serve) {
      server = await createServer({
        root: uiDir,
        logLevel: 'warn',
        server: { host: '127.0.0.1', port: 5174, strictPort: false },
      });
      await server.listen();
    }
    userDataDir = await mkdtemp(path.join(tmpdir(), 'ondo-chromium-'));
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      headless: true,
      args: chromiumArgs,
      viewport,
      deviceScaleFactor,
    });
  } catch (error) {
    await stop();
    throw error;
  }
  const baseUrl = server?.resolvedUrls.local[0];

  /**
   * Opens `url` (relative to the dev server, or absolute) in a fresh page in
   * `colorScheme`. `problems` collects page errors, console messages of
   * `consoleTypes` and requests `allowRequest` refuses (by default any that
   * leaves the local server); a test asserts it stays empty.
   */
  async function openPage(url, { colorScheme = 'light', consoleTypes = ['error'], allowRequest = isLocal } = {}) {
    const page = await context.newPage();
    const problems = [];
    page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
    page.on('console', (message) => {
      if (consoleTypes.includes(message.type())) problems.push(`console ${message.type()}: ${message.text()}`);
    });
    page.on('request', (request) => {
      const requested = new URL(request.url());
      if (!allowRequest(requested)) problems.push(`request: ${requested}`);
    });
    // A page in the background gets no animation frames, and the charts draw in one.
    await page.bringToFront();
    await page.emulateMedia({ colorScheme });
    await page.goto(new URL(url, baseUrl).href);
    return { page, problems };
  }

  /** Saves what `page` shows to docs/screenshots/`name`; returns the file's path. */
  async function screenshot(page, name, options = {}) {
    const file = path.join(screenshotDir, name);
    await page.screenshot({ ...options, path: file });
    return file;
  }

  return { context, baseUrl, openPage, screenshot, stop };
}
