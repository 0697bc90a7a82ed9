// Markdown to safe HTML: marked (GFM), highlight.js (a core with common languages), math by KaTeX (loaded
// on the first formula), and DOMPurify over everything the model wrote.
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdown from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import shell from "highlight.js/lib/languages/shell";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import { Marked } from "marked";

const langs = { bash, c, cpp, css, diff, go, java, javascript, json, markdown, python, rust, shell, sql,
  typescript, xml, yaml };
for (const [k, v] of Object.entries(langs)) hljs.registerLanguage(k, v);

const esc = (s) => s.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    code({ text, lang }) {
      const l = (lang || "").trim().split(/\s+/)[0].toLowerCase();
      let body;
      try {
        body = l && hljs.getLanguage(l) ? hljs.highlight(text, { language: l }).value : esc(text);
      } catch (_) {
        body = esc(text);
      }
      return `<div class="code"><div class="code-head"><span>${esc(l || "text")}</span>` +
        `<button type="button" class="copy">Copy</button></div><pre><code class="hljs">${body}</code></pre></div>`;
    },
  },
});

// -- math: cut out of the text before markdown sees it (so `_` and `*` inside stay), put back rendered --
let katex = null;
let katexLoading = null;
const listeners = new Set();
/** Called once KaTeX has loaded (the page re-renders the messages that have formulas). */
export const onMathReady = (fn) => listeners.add(fn);

function loadKatex() {
  if (katexLoading) return;
  const meta = document.querySelector('meta[name="llamapy-katex"]');
  if (!meta) return;
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = meta.dataset.css;
  document.head.append(link);
  const url = new URL(meta.content, document.baseURI).href;
  katexLoading = import(url).then(
    (m) => {
      katex = m.default || m;
      for (const fn of listeners) fn();
    },
    (e) => console.error("KaTeX did not load", e),
  );
}

const MATH = /\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\]|\\\(([\s\S]+?)\\\)|\$(?![\s$])((?:\\\$|[^$\n])+?)(?<![\s\\])\$(?!\d)/g;
const CODE = /(```[\s\S]*?(?:```|$)|~~~[\s\S]*?(?:~~~|$)|`[^`\n]*`)/g;

function cutMath(text, found) {
  return text
    .split(CODE)
    .map((part, i) =>
      i % 2 ? part : part.replace(MATH, (_, d1, d2, i1, i2) => {
        found.push({ tex: d1 ?? d2 ?? i1 ?? i2, display: d1 !== undefined || d2 !== undefined });
        return `\u2063MATH${found.length - 1}\u2063`;
      }),
    )
    .join("");
}

function renderMath({ tex, display }) {
  if (!katex) {
    loadKatex();
    return `<span class="math-pending">${esc(tex)}</span>`;
  }
  try {
    return katex.renderToString(tex, { displayMode: display, throwOnError: false, trust: false, output: "htmlAndMathml" });
  } catch (_) {
    return `<code>${esc(tex)}</code>`;
  }
}

/** Safe HTML for a message's markdown text. */
export function toHTML(text) {
  const found = [];
  const src = cutMath(text || "", found);
  const html = DOMPurify.sanitize(marked.parse(src), { ADD_ATTR: ["target"] });
  if (!found.length) return html;
  return html.replace(/\u2063MATH(\d+)\u2063/g, (_, i) => renderMath(found[+i]));
}

export const hasMath = (text) => /\$|\\\(|\\\[/.test(text || "");
