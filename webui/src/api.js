// The server's API: an optional key (asked once, kept in localStorage), OpenAI-style errors, and the SSE
// stream of /v1/chat/completions read chunk by chunk.
const KEY = "llamapy.apiKey";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const getKey = () => localStorage.getItem(KEY) || "";
export const setKey = (k) => (k ? localStorage.setItem(KEY, k) : localStorage.removeItem(KEY));

function headers(extra = {}) {
  const h = { ...extra };
  const k = getKey();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

async function errorOf(r) {
  let msg = `${r.status} ${r.statusText}`;
  try {
    const j = await r.json();
    const e = j && (j.error ?? j.detail);
    msg = typeof e === "string" ? e : e?.message || JSON.stringify(j);
  } catch (_) {}
  return new ApiError(r.status, msg);
}

/** GET a JSON endpoint (relative to the page, so a proxy prefix works). */
export async function getJSON(path) {
  const r = await fetch(path, { headers: headers() });
  if (!r.ok) throw await errorOf(r);
  return r.json();
}

/**
 * POST /v1/chat/completions with stream: true; calls onChunk(obj) for each SSE data chunk.
 * Throws ApiError for an HTTP error or an error event in the stream; AbortError when `signal` stops it.
 */
export async function streamChat(body, signal, onChunk) {
  const r = await fetch("v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!r.ok) throw await errorOf(r);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i).replace(/^\r?\n\r?\n/, "");
      const data = event
        .split(/\r?\n/)
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      let obj;
      try {
        obj = JSON.parse(data);
      } catch (_) {
        throw new ApiError(0, `unreadable stream event: ${data.slice(0, 200)}`);
      }
      if (obj.error) {
        const e = obj.error;
        throw new ApiError(e.code || 0, typeof e === "string" ? e : e.message || JSON.stringify(e));
      }
      onChunk(obj);
    }
  }
}
