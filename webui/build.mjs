// One build: `npm run build` bundles src/ into ../llamapy/server/webui_dist/ (the page `llamapy serve`
// answers at /), with content-hashed file names, an index.html pointing at them, KaTeX split off (loaded
// on the first formula) with its woff2 fonts only, and SOURCE_HASH: the sha256 of the source files, which
// tests/webui/test_bundle.py recomputes to fail when the bundle is older than its source.
import * as esbuild from "esbuild";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.resolve(here, "../llamapy/server/webui_dist");

// The files whose hash is recorded: keep this list in step with SOURCE_FILES in tests/webui/test_bundle.py.
export function sourceFiles() {
  const files = ["build.mjs", "package.json", "package-lock.json"];
  const walk = (dir) => {
    for (const e of fs.readdirSync(path.join(here, dir), { withFileTypes: true })) {
      const rel = `${dir}/${e.name}`;
      if (e.isDirectory()) walk(rel);
      else files.push(rel);
    }
  };
  walk("src");
  return files.sort();
}

export function sourceHash() {
  const h = createHash("sha256");
  for (const f of sourceFiles()) {
    h.update(f + "\0");
    h.update(fs.readFileSync(path.join(here, f)));
    h.update("\0");
  }
  return h.digest("hex");
}

async function main() {
  fs.rmSync(out, { recursive: true, force: true });
  fs.mkdirSync(path.join(out, "fonts"), { recursive: true });
  const common = {
    bundle: true,
    minify: true,
    format: "esm",
    target: ["chrome100", "firefox100", "safari15"],
    legalComments: "none",
    metafile: true,
    logLevel: "warning",
    outdir: out,
    entryNames: "[name]-[hash]",
  };
  const app = await esbuild.build({
    ...common,
    entryPoints: { app: path.join(here, "src/main.jsx") },
    jsx: "automatic",
    jsxImportSource: "preact",
  });
  const kx = await esbuild.build({
    ...common,
    entryPoints: { katex: path.join(here, "node_modules/katex/dist/katex.mjs") },
  });
  const names = {};
  for (const meta of [app.metafile, kx.metafile])
    for (const [file, o] of Object.entries(meta.outputs)) {
      const base = path.basename(file);
      names[base.replace(/-[A-Z0-9]+\./, ".")] = base;
      void o;
    }
  // KaTeX's stylesheet with woff2 fonts only (every browser the page targets reads woff2).
  const kdir = path.join(here, "node_modules/katex/dist");
  let css = fs.readFileSync(path.join(kdir, "katex.min.css"), "utf8");
  css = css.replace(/,url\(fonts\/[^)]+\.woff\) format\("woff"\)/g, "");
  css = css.replace(/,url\(fonts\/[^)]+\.ttf\) format\("truetype"\)/g, "");
  const kcss = `katex-${createHash("sha256").update(css).digest("hex").slice(0, 8).toUpperCase()}.css`;
  fs.writeFileSync(path.join(out, kcss), css);
  for (const f of fs.readdirSync(path.join(kdir, "fonts")))
    if (f.endsWith(".woff2")) fs.copyFileSync(path.join(kdir, "fonts", f), path.join(out, "fonts", f));
  const assets = { "app.js": names["app.js"], "app.css": names["app.css"], "katex.js": names["katex.js"], "katex.css": kcss };
  let html = fs.readFileSync(path.join(here, "src/index.html"), "utf8");
  for (const [k, v] of Object.entries(assets)) html = html.replaceAll(`{{${k}}}`, v);
  fs.writeFileSync(path.join(out, "index.html"), html);
  fs.writeFileSync(path.join(out, "SOURCE_HASH"), sourceHash() + "\n");
  let total = 0;
  for (const f of fs.readdirSync(out)) {
    const st = fs.statSync(path.join(out, f));
    if (st.isFile()) total += st.size;
  }
  console.log(`webui: ${out} (${assets["app.js"]}, ${(total / 1024).toFixed(0)} KiB without fonts)`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
