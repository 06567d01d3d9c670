// BullMQ beside paceline's queue (crates/paceline-queue/benches/queue.rs runs this with
// NODE_PATH set to a node_modules holding bullmq). Prints one JSON object per cell.
//
// PORT: the private Redis; REDIS_PID: its process, whose CPU time each cell reports
// (`redis_cpu_ns`, from /proc/PID/task/*/schedstat); SECONDS: each timed cell's length;
// JOBS: the jobs the end-to-end cell preloads; PAYLOAD: the payload's size in bytes.
const fs = require('fs');
const { Queue, Worker } = require('bullmq');

// The Redis server's CPU time so far in ns (the sum over its threads), or null.
function redisCpu() {
  const pid = process.env.REDIS_PID;
  if (!pid) return null;
  try {
    let total = 0n;
    for (const task of fs.readdirSync(`/proc/${pid}/task`)) {
      const text = fs.readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8');
      total += BigInt(text.split(' ')[0]);
    }
    return total;
  } catch (e) {
    return null;
  }
}

function cpuSince(before) {
  const after = redisCpu();
  return before === null || after === null ? null : Number(after - before);
}

const connection = { host: '127.0.0.1', port: Number(process.env.PORT) };
const seconds = Number(process.env.SECONDS || '3');
const jobs = Number(process.env.JOBS || '20000');
const payload = { data: 'x'.repeat(Number(process.env.PAYLOAD || '100')) };
const options = { removeOnComplete: true, removeOnFail: true };

async function timed(name, tasks, body) {
  const until = Date.now() + seconds * 1000;
  let done = 0;
  const cpu = redisCpu();
  const start = process.hrtime.bigint();
  await Promise.all(Array.from({ length: tasks }, async () => {
    while (Date.now() < until) {
      // Not `done += await body()`: that reads `done` before the await, and the tasks
      // would overwrite each other's counts.
      const n = await body();
      done += n;
    }
  }));
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ cell: name, jobs: done, seconds: elapsed, redis_cpu_ns: cpuSince(cpu) }));
}

async function main() {
  const queue = new Queue(`bench-${process.pid}`, { connection, defaultJobOptions: options });
  await queue.waitUntilReady();
  await timed('enqueue one', 64, async () => {
    await queue.add('job', payload);
    return 1;
  });
  // Each cell on an empty queue, as paceline's cells run on an empty server.
  await queue.obliterate({ force: true });
  await timed('enqueue batch', 8, async () => {
    await queue.addBulk(Array.from({ length: 100 }, () => ({ name: 'job', data: payload })));
    return 100;
  });
  await queue.obliterate({ force: true });

  const e2e = new Queue(`bench-e2e-${process.pid}`, { connection, defaultJobOptions: options });
  for (let n = 0; n < jobs; n += 1000) {
    await e2e.addBulk(Array.from({ length: Math.min(1000, jobs - n) }, () => ({ name: 'job', data: payload })));
  }
  let completed = 0;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const cpu = redisCpu();
  const start = process.hrtime.bigint();
  const worker = new Worker(e2e.name, async () => {}, { connection, concurrency: 64, autorun: false });
  worker.on('completed', () => {
    completed += 1;
    if (completed === jobs) finish();
  });
  worker.run();
  await finished;
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ cell: 'end to end', jobs: completed, seconds: elapsed, redis_cpu_ns: cpuSince(cpu) }));
  await worker.close();
  await e2e.obliterate({ force: true });
  await queue.close();
  await e2e.close();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
