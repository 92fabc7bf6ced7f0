// lanebus — MIT License.
// Browser test of the MetricsServer dashboard: starts tests/dashboard_server
// (a bus with traffic and an SLA that goes at risk), opens its page in
// Debian's chromium (headless, through playwright-core) and checks that the
// page renders the topic, that the lag number changes between two polls, that
// the at-risk state is shown, that paging and filtering work with 300+
// topics, and that the page logs no console error. Saves a screenshot.
//
// Environment: LANEBUS_DASHBOARD_SERVER (the server program, set by meson),
// LANEBUS_SCREENSHOT (the PNG to write), LANEBUS_CHROMIUM (default
// /usr/bin/chromium). Without chromium or playwright-core (scripts/deps.sh
// installs both) the test is skipped (exit 77), except under CI=true, where
// it fails.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";

const SKIP = 77;
const ci = process.env.CI === "true";
const chromiumPath = process.env.LANEBUS_CHROMIUM || "/usr/bin/chromium";
const serverPath = process.env.LANEBUS_DASHBOARD_SERVER;
const screenshot = process.env.LANEBUS_SCREENSHOT || path.join(os.tmpdir(), "lanebus-dashboard.png");

function unavailable(what) {
  console.log(`${what}${ci ? "" : ": skipped (run scripts/deps.sh)"}`);
  process.exit(ci ? 1 : SKIP);
}

if (!serverPath || !fs.existsSync(serverPath)) {
  console.log("LANEBUS_DASHBOARD_SERVER is not set or missing");
  process.exit(1);
}
if (!fs.existsSync(chromiumPath)) unavailable(`no chromium at ${chromiumPath}`);
let chromium;
try {
  ({ chromium } = await import("playwright-core"));
} catch (e) {
  unavailable(`playwright-core is not installed in tests/browser/node_modules (${e.code || e.message})`);
}

// A hang guard only (every wait below has its own bound): the whole test
// takes ~15 s plain. It kills what the test started, so nothing outlives it.
let server = null;
let browser = null;
function killAll() {
  if (server && server.exitCode === null) server.kill("SIGKILL");
  const p = browser && browser.process();
  if (p && p.exitCode === null) p.kill("SIGKILL");
}
const guard = setTimeout(() => {
  console.log("FAIL: the test did not finish within 200 s");
  killAll();
  process.exit(1);
}, 200_000);

// `promise`, or an error naming `what` after `ms`.
function within(ms, promise, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took more than ${ms} ms`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

const failures = [];
function check(ok, what) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures.push(what);
}

// ---- the server
// stderr through a pipe of ours (not meson's), so a stray child cannot hold the test open.
server = spawn(serverPath, [], { stdio: ["pipe", "pipe", "pipe"] });
server.stderr.on("data", (d) => process.stderr.write(d));
const serverExit = new Promise((resolve) => server.on("exit", (code, signal) => resolve({ code, signal })));
const url = await new Promise((resolve, reject) => {
  const lines = readline.createInterface({ input: server.stdout });
  lines.on("line", (line) => {
    const m = line.match(/(http:\/\/\S+)/);
    if (m) resolve(m[1]);
  });
  server.on("exit", (code) => reject(new Error(`dashboard_server exited (${code}) before printing its URL`)));
});
console.log(`dashboard at ${url}`);

// ---- the browser: nothing that phones home. launch() gives chromium a fresh
// --user-data-dir (a new temporary profile, removed on close) and lets us
// kill its process if it ever hangs on close.
browser = await chromium.launch({
  executablePath: chromiumPath,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const context = await browser.newContext({ viewport: { width: 1500, height: 950 } });
const errors = [];
let exitCode = 1;
try {
  const page = await context.newPage();
  page.on("console", (msg) => {
    if (msg.type() === "error") errors.push(`console: ${msg.text()}`);
  });
  page.on("pageerror", (err) => errors.push(`page error: ${err.message}`));
  page.on("requestfailed", (req) => errors.push(`request failed: ${req.url()} ${req.failure()?.errorText}`));

  await page.goto(url + "?interval=500", { waitUntil: "load" });
  const row = 'tr[data-topic="orders"][data-group="billing"]';
  await page.waitForSelector(row, { timeout: 60_000 });
  check(true, "the page renders topic orders, group billing");

  // The lag number changes between two polls (the consumer falls behind).
  const lagOf = () => page.$eval(`${row} .lag`, (td) => td.textContent.trim());
  const first = await lagOf();
  await page.waitForFunction(
    ([sel, before]) => {
      const td = document.querySelector(sel);
      return td && td.textContent.trim() !== before;
    },
    [`${row} .lag`, first],
    { timeout: 60_000 },
  );
  const second = await lagOf();
  check(first !== second, `the lag updates between polls (${first} -> ${second})`);

  // The SLA goes at risk: orange state badge and row marker.
  await page.waitForSelector(`${row} .state.state-at_risk`, { timeout: 90_000 });
  const label = await page.$eval(`${row} .state`, (el) => el.textContent.trim());
  check(label === "at risk", `orders/billing shows "${label}"`);
  const colour = await page.$eval(`${row} .state`, (el) => getComputedStyle(el).backgroundColor);
  check(colour === "rgb(224, 138, 0)", `the at-risk badge is amber (${colour})`);
  const atRiskCard = await page.$eval("#c-risk", (el) => el.textContent.trim());
  check(Number(atRiskCard) >= 1, `the "groups at risk" card counts it (${atRiskCard})`);
  const projected = await page.$eval(`${row} .projected`, (el) => el.textContent.trim());
  check(/\/ 10\.0 m$/.test(projected), `projected drain against the 600 s SLA is shown (${projected})`);

  // The healthy group next to it.
  const ledger = await page.$eval('tr[data-topic="payments"][data-group="ledger"] .state', (el) => el.textContent.trim());
  check(ledger === "ok", `payments/ledger shows "${ledger}"`);

  // The hot key shows in the lane strip.
  await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.hotLane !== "", `${row} canvas.lanes`, {
    timeout: 30_000,
  });
  const hot = await page.$eval(`${row} canvas.lanes`, (c) => c.title);
  check(/^hot lane \d+/.test(hot), `the lane strip marks the hot lane (${hot})`);

  // 300 idle topics: paged, and the filter finds one.
  const info = await page.$eval("#pageinfo", (el) => el.textContent.trim());
  const rows = await page.$$eval("#groups tbody tr", (trs) => trs.length);
  check(/page 1 of [7-9]\b/.test(info) && rows === 50, `paging: "${info}", ${rows} rows shown`);
  await page.fill("#filter", "idle-0299");
  await page.waitForFunction(() => document.querySelectorAll("#groups tbody tr").length === 1);
  const found = await page.$eval("#groups tbody tr", (tr) => tr.dataset.topic);
  check(found === "idle-0299", `the filter finds idle-0299 (${found})`);
  await page.fill("#filter", "");
  await page.selectOption("#statefilter", "problem");
  await page.waitForFunction(() => document.querySelectorAll("#groups tbody tr").length === 1);
  check(true, "the state filter keeps only the group at risk");
  await page.selectOption("#statefilter", "");

  // DLQ (audit/checker rejects every 4th message) and the lease.
  await page.waitForFunction(() => Number((document.getElementById("dlq-depth")?.textContent || "0").replace(/,/g, "")) > 0, null, {
    timeout: 60_000,
  });
  const depth = await page.$eval("#dlq-depth", (el) => el.textContent.trim());
  check(Number(depth) > 0, `the DLQ depth is shown (${depth})`);
  const lease = await page.$eval("#leases", (el) => el.textContent);
  check(lease.includes("orders-writer") && lease.includes("held"), "the held lease orders-writer is listed");

  await page.waitForTimeout(1000);  // one more poll for the trend lines in the picture
  fs.mkdirSync(path.dirname(screenshot), { recursive: true });
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`screenshot: ${screenshot}`);

  check(errors.length === 0, `no console errors${errors.length ? ": " + errors.join("; ") : ""}`);
  exitCode = failures.length === 0 ? 0 : 1;
} catch (e) {
  console.log(`FAIL: ${e.stack || e}`);
  if (errors.length) console.log(`console errors: ${errors.join("; ")}`);
  exitCode = 1;
} finally {
  server.stdin.end();  // the server exits when its stdin closes
  try {
    const { code, signal } = await within(30_000, serverExit, "dashboard_server's exit");
    if (code !== 0) {
      console.log(`FAIL: dashboard_server exited with ${code ?? signal}`);
      exitCode = 1;
    }
  } catch (e) {
    console.log(`FAIL: ${e.message}; killed`);
    server.kill("SIGKILL");
    exitCode = 1;
  }
  try {
    await within(20_000, browser.close(), "closing chromium");
  } catch (e) {
    // Not the dashboard's doing: note it and make sure nothing is left behind.
    console.log(`note: ${e.message}; killed chromium (pid ${browser.process()?.pid})`);
    killAll();
  }
  clearTimeout(guard);
}
process.exit(exitCode);
