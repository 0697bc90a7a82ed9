// The settings dialog: system prompt and sampling (saved per browser in localStorage), theme, API key,
// and the MCP tools the server offers (shown only when GET /mcp/tools answers).
import { useState } from "preact/hooks";

const KEY = "llamapy.settings";
export const FIELDS = [ // [request field, label, placeholder, key in /props default_generation_settings.params]
  ["temperature", "Temperature", "0.8", "temperature"],
  ["top_k", "Top-k", "40", "top_k"],
  ["top_p", "Top-p", "0.95", "top_p"],
  ["min_p", "Min-p", "0.05", "min_p"],
  ["max_tokens", "Max tokens", "-1", "n_predict"],
  ["repeat_penalty", "Repeat penalty", "1.0", "repeat_penalty"],
  ["presence_penalty", "Presence penalty", "0.0", "presence_penalty"],
  ["frequency_penalty", "Frequency penalty", "0.0", "frequency_penalty"],
  ["seed", "Seed", "random", "seed"],
];

/** The server's default for a field, as the placeholder of an empty field. */
function serverDefault(params, key, fallback) {
  const v = params?.[key];
  if (typeof v !== "number") return fallback;
  if (key === "seed" && (v < 0 || v === 0xffffffff)) return "random";
  if (key === "n_predict" && v < 0) return "-1 (until the context)";
  return String(Math.round(v * 1e6) / 1e6);
}
const DEFAULTS = { system: "", extra: "", ...Object.fromEntries(FIELDS.map(([k]) => [k, ""])) };

export function loadSettings() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(KEY) || "{}") };
  } catch (_) {
    return { ...DEFAULTS };
  }
}

/** The request fields the user set (an empty field leaves the server's default). A value that is not a
 * number goes as typed, so the server's error names it in the thread. */
export function samplingFields(s) {
  const out = {};
  for (const [k] of FIELDS) {
    const v = String(s[k] ?? "").trim();
    if (v === "") continue;
    out[k] = Number.isFinite(Number(v)) ? Number(v) : v;
  }
  if (s.extra?.trim()) {
    try {
      Object.assign(out, JSON.parse(s.extra));
    } catch (_) {}
  }
  return out;
}

export function Settings({ value, params, tools, enabled, onTools, onSave, onClose, onForgetKey, hasKey }) {
  const [s, setS] = useState(value);
  const [on, setOn] = useState(enabled);
  let extraErr = "";
  if (s.extra.trim()) {
    try {
      const j = JSON.parse(s.extra);
      if (!j || typeof j !== "object" || Array.isArray(j)) extraErr = "a JSON object, please";
    } catch (e) {
      extraErr = e.message;
    }
  }
  const set = (k) => (e) => setS({ ...s, [k]: e.currentTarget.value });
  return (
    <div class="modal" id="settings-dialog" onClick={(e) => e.target === e.currentTarget && onClose()}>
      <form
        class="card settings"
        onSubmit={(e) => {
          e.preventDefault();
          if (extraErr) return;
          localStorage.setItem(KEY, JSON.stringify(s));
          onTools(on);
          onSave(s);
        }}
      >
        <h2>Settings</h2>
        <label>
          System prompt
          <textarea id="system" rows={3} value={s.system} onInput={set("system")} placeholder="(none)" />
        </label>
        <div class="grid">
          {FIELDS.map(([k, label, ph, pk]) => (
            <label key={k}>
              {label}
              <input name={k} inputmode="decimal" value={s[k]} placeholder={serverDefault(params, pk, ph)} onInput={set(k)} />
            </label>
          ))}
        </div>
        <label>
          Extra request fields (JSON object)
          <textarea name="extra" rows={2} value={s.extra} onInput={set("extra")} placeholder='{"top_n_sigma": 1.5}' />
          {extraErr && <span class="error-text">{extraErr}</span>}
        </label>
        {tools && (
          <fieldset id="mcp-tools">
            <legend>Tools (MCP)</legend>
            {!tools.length && <p>The server offers no tools.</p>}
            {tools.map((t) => (
              <label class="check" key={t.name} title={t.description || ""}>
                <input
                  type="checkbox"
                  checked={on.includes(t.name)}
                  onChange={(e) => setOn(e.currentTarget.checked ? [...on, t.name] : on.filter((x) => x !== t.name))}
                />
                {t.name}
                {t.server ? <small> ({t.server})</small> : null}
              </label>
            ))}
          </fieldset>
        )}
        <div class="edit-row">
          {hasKey && (
            <button type="button" onClick={onForgetKey}>
              Forget API key
            </button>
          )}
          <button type="button" onClick={() => setS({ ...DEFAULTS })}>
            Defaults
          </button>
          <button type="button" onClick={onClose}>
            Cancel
          </button>
          <button type="submit" class="primary" id="save-settings">
            Save
          </button>
        </div>
      </form>
    </div>
  );
}
