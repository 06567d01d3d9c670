// rate-limiter-flexible's RateLimiterRedis (with ioredis) under the same load as paceline's
// Redis benchmark: CONCURRENCY async workers calling consume() on random keys of KEYS for
// SECONDS. Prints one JSON line: {"decisions": n, "seconds": s, "p50_us": x, "p99_us": y}.
// Run by benches/redis.rs; rate-limiter-flexible and ioredis come from NODE_PATH.
const { RateLimiterRedis } = require('rate-limiter-flexible');
const Redis = require('ioredis');

const port = Number(process.env.PORT);
const concurrency = Number(process.env.CONCURRENCY);
const seconds = Number(process.env.SECONDS);
const keys = Number(process.env.KEYS);

async function main() {
  const redis = new Redis({ port, host: '127.0.0.1', enableOfflineQueue: true });
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'rlflex',
    points: 1000000000,
    duration: 1,
  });
  const latencies = [];
  let decisions = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(seconds * 1e9));
  async function worker() {
    while (process.hrtime.bigint() < end) {
      const key = 'user:' + Math.floor(Math.random() * keys);
      const t0 = process.hrtime.bigint();
      await limiter.consume(key, 1);
      latencies.push(Number(process.hrtime.bigint() - t0) / 1000);
      decisions += 1;
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  latencies.sort((a, b) => a - b);
  const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * p))];
  console.log(JSON.stringify({ decisions, seconds: elapsed, p50_us: pct(0.5), p99_us: pct(0.99) }));
  redis.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
