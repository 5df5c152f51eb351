// Drives the Platform page's analysis (docs/analysis.md) in Debian's headless chromium for
// crates/manent-server/tests/platform.rs: as a viewer it opens a deploy waiting for a
// decision and looks for buttons; as an approver it reads that deploy's charts (the canary,
// the baseline, the threshold), clicks Promote on it and Abort on another, answering the
// page's prompts. Every wait is for a selector or a condition of the page, never a fixed
// time. Prints one JSON object of what it saw on stdout; the Rust test checks through the
// API that each click took effect.
//
// Usage: NODE_PATH=<node_modules with playwright-core> node analysis.cjs '<json>' where the
// JSON has base, chromium, artifacts, approver, viewer, promote and abort.
'use strict';

const { WAIT_MS, main } = require('./driver.cjs');

main(async (cfg, browser, seen, shot) => {
  /** A new page signed in with `token`. */
  const page = async (token) => {
    const p = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
    p.setDefaultTimeout(WAIT_MS);
    p.on('pageerror', (e) => { seen.page_errors = (seen.page_errors || []).concat(String(e)); });
    await p.goto(cfg.base + '#token=' + token);
    await p.locator('#signed-in strong').waitFor();
    return p;
  };
  const viewer = await page(cfg.viewer);
  await viewer.goto(cfg.base + '#deploy=' + cfg.promote);
  await viewer.locator('#deploy-facts dd', { hasText: 'waiting_decision' }).waitFor();
  await viewer.locator('#analysis figure[data-metric="errors"]').waitFor();
  seen.viewer_buttons = await viewer.locator('main button').count();
  await shot(viewer, 'analysis-1-viewer');

  const approver = await page(cfg.approver);
  approver.on('dialog', async (dialog) => {
    seen.dialogs.push(dialog.type() + ': ' + dialog.message());
    if (dialog.message().startsWith('Promote')) await dialog.accept('promoted from the browser');
    else if (dialog.message().startsWith('Abort')) await dialog.accept('aborted from the browser');
    else await dialog.dismiss();
  });
  await approver.goto(cfg.base + '#deploy=' + cfg.promote);
  // A level line has an empty box, which playwright calls hidden: attached is drawn.
  await approver.locator('#analysis figure[data-metric="errors"] polyline.threshold').waitFor({ state: 'attached' });
  await approver.locator('#analysis figure[data-metric="quiet"]').waitFor();
  seen.charts = await approver.locator('#analysis figure').evaluateAll((figures) => figures.map((f) => ({
    metric: f.getAttribute('data-metric'),
    threshold: f.getAttribute('data-threshold'),
    caption: f.querySelector('figcaption').textContent,
    title: f.querySelector('svg > title').textContent,
    lines: Array.from(f.querySelectorAll('polyline')).map((l) => l.getAttribute('class')),
  })));
  const promote = approver.locator('#deploy-actions button[data-action="promote"]');
  seen.promote_label = await promote.textContent();
  seen.abort_shown = await approver.locator('#deploy-actions button[data-action="abort"]').count();
  await shot(approver, 'analysis-2-waiting-decision');
  await promote.click();
  await promote.waitFor({ state: 'detached' });
  await shot(approver, 'analysis-3-promoted');

  await approver.goto(cfg.base + '#deploy=' + cfg.abort);
  const abort = approver.locator('#deploy-actions button[data-action="abort"]');
  await abort.click();
  await approver.locator('#deploy-facts .status.ERROR').waitFor();
  await shot(approver, 'analysis-4-aborted');
  seen.approver_error = await approver.locator('#error').isVisible();
});
