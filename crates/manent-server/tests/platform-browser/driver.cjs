// What the Platform page's browser drivers (clicks.cjs, analysis.cjs) share: the JSON
// configuration of their one argument, Debian's chromium under playwright-core, screenshots
// into `artifacts`, and one JSON object of what they saw printed on stdout (`failure` when a
// wait or a click failed), which crates/manent-server/tests/platform.rs reads.
'use strict';

const path = require('path');
const { chromium } = require('playwright-core');

/** How long any wait of a driver may take before it fails. */
const WAIT_MS = 60000;

/**
 * Runs `steps(cfg, browser, seen, shot)` in a fresh chromium, then prints `seen`.
 * `shot(page, name)` saves a full-page screenshot as `<artifacts>/<name>.png`.
 */
async function drive(steps) {
  const cfg = JSON.parse(process.argv[2]);
  const seen = { dialogs: [], screenshots: [] };
  const browser = await chromium.launch({
    executablePath: cfg.chromium,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  const shot = async (page, name) => {
    const file = path.join(cfg.artifacts, name + '.png');
    await page.screenshot({ path: file, fullPage: true });
    seen.screenshots.push(file);
  };
  try {
    await steps(cfg, browser, seen, shot);
  } catch (e) {
    seen.failure = String(e && e.stack ? e.stack : e);
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(seen) + '\n');
}

/** Runs `steps` as `drive` does; a failure before any step is printed as one too. */
function main(steps) {
  drive(steps).catch((e) => {
    process.stdout.write(JSON.stringify({ failure: String(e && e.stack ? e.stack : e) }) + '\n');
  });
}

module.exports = { WAIT_MS, main };
