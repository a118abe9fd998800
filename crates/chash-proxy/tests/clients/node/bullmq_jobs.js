// BullMQ through the proxy, unchanged but for a hash-tagged prefix (all of
// a queue's keys on one server): 5,000 jobs, 4 workers, every job
// completed once.
//
// Usage: node bullmq_jobs.js HOST PORT
const { Queue, Worker, QueueEvents } = require("bullmq");

async function main() {
  const [host, port] = [process.argv[2], Number(process.argv[3])];
  const connection = { host, port, maxRetriesPerRequest: null };
  const prefix = "{bull}";
  const queue = new Queue("jobs", { connection, prefix });
  await queue.obliterate({ force: true }).catch(() => {});
  const N = 5000;
  const done = new Map();
  let resolveAll;
  const all = new Promise((r) => (resolveAll = r));
  const workers = [];
  for (let w = 0; w < 4; w++) {
    const worker = new Worker(
      "jobs",
      async (job) => {
        done.set(job.data.n, (done.get(job.data.n) || 0) + 1);
        if (done.size === N) resolveAll();
        return job.data.n * 2;
      },
      { connection, prefix, concurrency: 8 }
    );
    worker.on("error", (e) => console.error("worker error", e));
    workers.push(worker);
  }
  const batch = [];
  for (let n = 0; n < N; n++) batch.push({ name: "job", data: { n } });
  for (let i = 0; i < N; i += 500) await queue.addBulk(batch.slice(i, i + 500));
  const timeout = setTimeout(() => {
    console.error(`timed out: ${done.size} of ${N} jobs done`);
    process.exit(1);
  }, 120000);
  await all;
  clearTimeout(timeout);
  // Give the workers a moment to settle, then check the queue's own counts.
  await new Promise((r) => setTimeout(r, 500));
  const counts = await queue.getJobCounts("completed", "failed", "waiting", "active");
  for (const w of workers) await w.close();
  await queue.close();
  const twice = [...done.values()].filter((c) => c !== 1).length;
  if (done.size !== N || twice !== 0 || counts.completed !== N || counts.failed !== 0) {
    console.error("wrong:", { done: done.size, twice, counts });
    process.exit(1);
  }
  console.log("ok", counts);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
