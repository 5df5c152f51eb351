// Drives the Platform page in Debian's headless chromium for crates/manent-server/tests/platform.rs:
// as an approver it clicks Approve, Reject and (on a running deploy's page) Cancel, answering
// the page's prompts, then Rollback on what runs where (once refused by the rollback guard)
// and Redeploy on the rollback's page;
// as a viewer it looks for buttons. Every wait is for a selector or a
// condition of the page, never a fixed time. Prints one JSON object of what it saw on stdout;
// the Rust test checks through the API that each click took effect.
//
// Usage: NODE_PATH=<node_modules with playwright-core> node clicks.cjs '<json>' where the JSON
// has base, chromium, artifacts, approver, viewer, approve, reject, cancel and waiting.
'use strict';

const { WAIT_MS, main } = require('./driver.cjs');

main(async (cfg, browser, seen, shot) => {
  const approver = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  approver.setDefaultTimeout(WAIT_MS);
  approver.on('dialog', async (dialog) => {
    seen.dialogs.push(dialog.type() + ': ' + dialog.message());
    if (dialog.message().startsWith('Reject')) await dialog.accept('rejected from the browser');
    else if (dialog.message().startsWith('Approve')) await dialog.accept('approved from the browser');
    else await dialog.accept();
  });
  approver.on('pageerror', (e) => { seen.page_errors = (seen.page_errors || []).concat(String(e)); });

  await approver.goto(cfg.base + '#token=' + cfg.approver);
  const row = (id) => approver.locator('#activity tr[data-deploy="' + id + '"]');
  const button = (id, action) => row(id).locator('button[data-action="' + action + '"]');
  await button(cfg.approve, 'approve').waitFor();
  await button(cfg.reject, 'reject').waitFor();
  await shot(approver, '1-overview-before-clicks');

  await button(cfg.approve, 'approve').click();
  // The deploy no longer waits for approval: the page's next read drops its Approve button.
  await button(cfg.approve, 'approve').waitFor({ state: 'detached' });
  await button(cfg.reject, 'reject').click();
  await button(cfg.reject, 'reject').waitFor({ state: 'detached' });
  await shot(approver, '2-overview-after-approve-and-reject');

  // The running deploy's page: its running step, with an elapsed time that grows.
  await approver.goto(cfg.base + '#deploy=' + cfg.cancel);
  const running = approver.locator('#targets .running-step');
  await running.waitFor();
  await approver.locator('#timeline g.step.running').first().waitFor();
  await approver.locator('#output [data-output-target="t1"] pre', { hasText: 'started-c' }).waitFor();
  const elapsed = approver.locator('#targets .running-step .elapsed');
  seen.elapsed_first = await elapsed.textContent();
  await approver.waitForFunction(
    (before) => {
      const node = document.querySelector('#targets .running-step .elapsed');
      return node && node.textContent !== before;
    },
    seen.elapsed_first,
    { timeout: WAIT_MS },
  );
  seen.elapsed_later = await elapsed.textContent();
  seen.running_step = await running.textContent();
  seen.timeline_running = await approver.locator('#timeline g.step.running title').first().textContent();
  seen.output_panes = await approver.locator('#output [data-output-target]').evaluateAll(
    (panes) => panes.map((p) => p.getAttribute('data-output-target')));
  await shot(approver, '3-running-deploy');

  await approver.locator('#deploy-actions button[data-action="cancel"]').click();
  await approver.locator('#deploy-facts .status.CANCELLED').waitFor();
  await approver.locator('#deploy-actions button[data-action="cancel"]').waitFor({ state: 'detached' });
  await shot(approver, '4-running-deploy-cancelled');

  // What runs where: acme/migrated runs 2, marked irreversible: Rollback is refused by
  // the rollback guard, and the page shows the refusal.
  await approver.goto(cfg.base + '#');
  const migrated = approver.locator('#apps tr[data-app="acme/migrated"][data-environment="prod"]');
  await migrated.locator('td.live', { hasText: '2' }).waitFor();
  await migrated.locator('button[data-action="rollback"]').click();
  const refusal = approver.locator('#error', { hasText: 'irreversible' });
  await refusal.waitFor();
  seen.guard_refusal = await refusal.textContent();
  await shot(approver, '9-rollback-refused-past-an-irreversible-deploy');
  // acme/released runs 2; Rollback makes a new deploy and shows its page (and clears the
  // refusal above).
  const released = approver.locator('#apps tr[data-app="acme/released"][data-environment="prod"]');
  await released.locator('td.live', { hasText: '2' }).waitFor();
  await released.locator('button[data-action="rollback"]').click();
  await approver.locator('#deploy-facts dd', { hasText: 'rollback of' }).waitFor();
  seen.rolled_back = await approver.locator('#deploy-id').textContent();
  await approver.locator('#deploy-facts .status.SUCCESS').waitFor();
  await shot(approver, '7-rollback-deploy');
  // Its page offers Redeploy once it ended; the click shows the new deploy's page.
  await approver.locator('#deploy-actions button[data-action="redeploy"]').click();
  await approver.waitForFunction(
    (before) => {
      const node = document.querySelector('#deploy-id');
      return node && node.textContent && node.textContent !== before;
    },
    seen.rolled_back,
    { timeout: WAIT_MS },
  );
  await approver.locator('#deploy-facts dd', { hasText: 'redeploy of' }).waitFor();
  seen.redeployed = await approver.locator('#deploy-id').textContent();
  await shot(approver, '8-redeploy');

  // A viewer: the same deploys, one still waiting for approval, and no button anywhere.
  const viewer = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  viewer.setDefaultTimeout(WAIT_MS);
  await viewer.goto(cfg.base + '#token=' + cfg.viewer);
  await viewer.locator('#activity tr[data-deploy="' + cfg.waiting + '"]', { hasText: 'waiting_approval' }).waitFor();
  await viewer.locator('#apps tr[data-app="acme/released"]').waitFor();
  seen.viewer_overview_buttons = await viewer.locator('main button').count();
  seen.viewer_rollback_buttons = await viewer.locator('#apps button').count();
  await shot(viewer, '5-viewer-overview');
  await viewer.goto(cfg.base + '#deploy=' + cfg.waiting);
  await viewer.locator('#deploy-id', { hasText: cfg.waiting }).waitFor();
  await viewer.locator('#deploy-facts dd', { hasText: 'waiting_approval' }).waitFor();
  seen.viewer_deploy_buttons = await viewer.locator('main button').count();
  await shot(viewer, '6-viewer-waiting-deploy');
  seen.viewer_error = await viewer.locator('#error').isVisible();
  seen.approver_error = await approver.locator('#error').isVisible();
});
