// Type-checks every ```ts block of the README against the built package (dist/), as a
// user's ES module importing "@paceline/client" would be: `node scripts/readme-types.mjs`
// after `npm run build`. Exits non-zero, naming the block, when one does not compile.

import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const readme = readFileSync(join(here, "README.md"), "utf8");
const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
if (blocks.length === 0) throw new Error("README.md has no ts block");
const folder = join(here, "node_modules", ".readme-types");
rmSync(folder, { recursive: true, force: true });
mkdirSync(folder, { recursive: true });
const dist = join(here, "dist", "index.js");
const files = blocks.map((block, i) => {
  const file = join(folder, `block-${i + 1}.mts`);
  writeFileSync(file, `export {};\n${block.replaceAll('"@paceline/client"', JSON.stringify(dist))}`);
  return file;
});
const tsc = join(here, "node_modules", ".bin", "tsc");
const args = ["--noEmit", "--strict", "--target", "ES2022", "--module", "NodeNext", "--moduleResolution", "NodeNext"];
const checked = spawnSync(tsc, [...args, "--types", "node", "--skipLibCheck", ...files], { encoding: "utf8" });
rmSync(folder, { recursive: true, force: true });
if (checked.status !== 0) {
  console.error(`README.md's ts blocks do not compile (block-N is the Nth):\n${checked.stdout}${checked.stderr}`);
  process.exit(1);
}
console.log(`README.md: ${blocks.length} ts blocks compile against dist/`);
