// Opens URL in a running headless Chromium (its DevTools websocket: BROWSER_WS), lets it run
// for WAIT_MS of real time, and saves a PNG screenshot of the page to OUT.
// Usage: node --experimental-websocket screenshot.mjs BROWSER_WS URL OUT WAIT_MS
import { writeFileSync } from 'node:fs';

const [browserWs, url, out, waitMs] = process.argv.slice(2);
const socket = new WebSocket(browserWs);
let nextId = 1;
const pending = new Map();
socket.addEventListener('message', (event) => {
  const message = JSON.parse(event.data);
  const waiting = pending.get(message.id);
  if (!waiting) return;
  pending.delete(message.id);
  if (message.error) waiting.reject(new Error(JSON.stringify(message.error)));
  else waiting.resolve(message.result);
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  socket.send(JSON.stringify({ id, method, params, sessionId }));
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}
await new Promise((resolve, reject) => {
  socket.addEventListener('open', resolve);
  socket.addEventListener('error', reject);
});
const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
await send('Emulation.setDeviceMetricsOverride',
  { width: 1280, height: 1150, deviceScaleFactor: 1, mobile: false }, sessionId);
await send('Page.navigate', { url }, sessionId);
await new Promise((resolve) => setTimeout(resolve, Number(waitMs)));
const { data } = await send('Page.captureScreenshot', { format: 'png' }, sessionId);
writeFileSync(out, Buffer.from(data, 'base64'));
socket.close();
