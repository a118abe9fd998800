// ioredis pub/sub through two proxies of the same servers: a subscriber
// (channels and a pattern) on one, the publisher on the other; 2,000
// messages over 10 channels, each delivered once and in order.
//
// Usage: node ioredis_pubsub.js SUB_HOST:PORT PUB_HOST:PORT
const Redis = require("ioredis");

async function main() {
  const at = (s) => ({ host: s.split(":")[0], port: Number(s.split(":")[1]) });
  const sub = new Redis(at(process.argv[2]));
  const pub = new Redis(at(process.argv[3]));
  const channels = Array.from({ length: 10 }, (_, i) => `io:${i}`);
  await sub.subscribe(...channels);
  await sub.psubscribe("io:1*");
  const got = new Map();
  const N = 2000;
  let want = 0;
  for (let i = 0; i < N; i++) want += 1 + (channels[i % 10].startsWith("io:1") ? 1 : 0);
  let n = 0;
  let finish;
  const done = new Promise((r) => (finish = r));
  const note = (key, msg) => {
    if (!got.has(key)) got.set(key, []);
    got.get(key).push(Number(msg));
    if (++n === want) finish();
  };
  sub.on("message", (ch, msg) => note(`m ${ch}`, msg));
  sub.on("pmessage", (p, ch, msg) => note(`p ${p} ${ch}`, msg));
  for (let i = 0; i < N; i++) await pub.publish(channels[i % 10], String(i));
  const timer = setTimeout(() => {
    console.error(`timed out: ${n} of ${want}`);
    process.exit(1);
  }, 60000);
  await done;
  clearTimeout(timer);
  await new Promise((r) => setTimeout(r, 300));
  if (n !== want) throw new Error(`${n} messages, ${want} sent`);
  channels.forEach((ch, c) => {
    const sent = [];
    for (let i = c; i < N; i += 10) sent.push(i);
    if (JSON.stringify(got.get(`m ${ch}`)) !== JSON.stringify(sent)) throw new Error(`${ch}: not once each in order`);
    if (ch.startsWith("io:1") && JSON.stringify(got.get(`p io:1* ${ch}`)) !== JSON.stringify(sent))
      throw new Error(`pattern ${ch}`);
  });
  sub.disconnect();
  pub.disconnect();
  console.log("ok");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
