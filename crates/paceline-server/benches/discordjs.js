// @discordjs/rest beside paceline's client limiter (crates/paceline-server/benches/proxy.rs
// runs this with NODE_PATH set to a node_modules holding @discordjs/rest). Sends REQUESTS
// POSTs from CALLERS concurrent callers to ROUTES (a JSON array, taken in turn) on the mock
// API at BASE, with the global limit GLOBAL per second. Prints one JSON object.
const { REST } = require('@discordjs/rest');

const base = process.env.BASE;
const total = Number(process.env.REQUESTS);
const callers = Number(process.env.CALLERS);
const routes = JSON.parse(process.env.ROUTES);
const rest = new REST({ api: base, version: '10', globalRequestsPerSecond: Number(process.env.GLOBAL) })
  .setToken('bench-token');

async function main() {
  let next = 0;
  let ok = 0;
  let failed = 0;
  const start = process.hrtime.bigint();
  await Promise.all(Array.from({ length: callers }, async () => {
    for (;;) {
      const k = next;
      next += 1;
      if (k >= total) return;
      try {
        await rest.post(routes[k % routes.length], { body: { x: 1 } });
        ok += 1;
      } catch (e) {
        failed += 1;
      }
    }
  }));
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ ok, failed, seconds }));
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
