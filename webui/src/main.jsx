// The chat page: a sidebar of conversations (IndexedDB), a thread with branches, a composer, settings.
import { render } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, getJSON, getKey, setKey, streamChat } from "./api.js";
import { addNode, branch, deleteConv, getConv, leaf, listConvs, newConv, putConv, validConv } from "./db.js";
import { hasMath, onMathReady, toHTML } from "./markdown.js";
import { enabledTools, listTools, requestFields, setEnabledTools } from "./mcp.js";
import { Icon } from "./icons.jsx";
import { Settings, loadSettings, samplingFields } from "./settings.jsx";
import "./style.css";

const MAX_TEXT_FILE = 1 << 20;
let mathRev = 0;

const modelState = (m) => (m && typeof m.status === "object" ? m.status?.value : m?.status) || "";
const mqPhone = () => window.matchMedia("(max-width: 760px)").matches;

function Markdown({ text }) {
  const html = useMemo(() => toHTML(text), [text, hasMath(text) ? mathRev : 0]);
  return <div class="content md" dangerouslySetInnerHTML={{ __html: html }} />;
}
onMathReady(() => (mathRev += 1)); // before the page's own listener, which re-renders

function Stats({ n }) {
  const t = n.timings;
  const u = n.usage;
  const parts = [];
  if (t && t.predicted_per_second) parts.push(`${t.predicted_per_second.toFixed(1)} tokens/s`);
  if (u) parts.push(`${u.completion_tokens} tokens`);
  if (u && n.n_ctx) {
    const used = u.prompt_tokens + u.completion_tokens;
    parts.push(`context ${used}/${n.n_ctx} (${Math.round((100 * used) / n.n_ctx)}%)`);
  }
  if (n.stopped) parts.push("stopped");
  if (!parts.length) return null;
  const title = t
    ? `prompt: ${t.prompt_n} tokens in ${t.prompt_ms?.toFixed(0)} ms (${t.prompt_per_second?.toFixed(1)}/s), ` +
      `cached ${t.cache_n}; generation: ${t.predicted_n} tokens in ${t.predicted_ms?.toFixed(0)} ms`
    : "";
  return (
    <span class="stats" title={title}>
      {parts.join(" · ")}
    </span>
  );
}

function Siblings({ conv, node, onPick }) {
  const sibs = conv.nodes[node.parent]?.children || [];
  if (sibs.length < 2) return null;
  const i = sibs.indexOf(node.id);
  return (
    <span class="branch">
      <button type="button" class="icon" title="previous branch" disabled={i <= 0} onClick={() => onPick(sibs[i - 1])}>
        <Icon name="left" size={14} />
      </button>
      <span class="branch-n">
        {i + 1}/{sibs.length}
      </span>
      <button type="button" class="icon" title="next branch" disabled={i >= sibs.length - 1} onClick={() => onPick(sibs[i + 1])}>
        <Icon name="right" size={14} />
      </button>
    </span>
  );
}

function Attachments({ items, onRemove }) {
  if (!items?.length) return null;
  return (
    <div class="atts">
      {items.map((a, i) => (
        <span class="att" key={i} title={a.name}>
          {a.kind === "image" ? <img src={a.data} alt={a.name} /> : <span class="att-file"><Icon name="file" size={13} /> {a.name}</span>}
          {onRemove && (
            <button type="button" class="icon att-x" title="remove" onClick={() => onRemove(i)}>
              ×
            </button>
          )}
        </span>
      ))}
    </div>
  );
}

function Message({ conv, node, live, busy, onPick, onEdit, onRegen }) {
  const [editing, setEditing] = useState(null);
  const copy = () => copyText(node.content || "");
  if (node.role === "user")
    return (
      <div class="msg user" data-id={node.id}>
        {editing === null ? (
          <>
            <Attachments items={node.attachments} />
            <div class="content plain">{node.content}</div>
            <div class="actions">
              <Siblings conv={conv} node={node} onPick={onPick} />
              <button type="button" class="icon" data-act="edit" title="edit and branch" disabled={busy} onClick={() => setEditing(node.content)}>
                <Icon name="edit" />
              </button>
              <button type="button" class="icon" data-act="copy" title="copy" onClick={copy}>
                <Icon name="copy" />
              </button>
            </div>
          </>
        ) : (
          <div class="edit">
            <textarea value={editing} onInput={(e) => setEditing(e.currentTarget.value)} rows={Math.min(12, editing.split("\n").length + 1)} />
            <div class="edit-row">
              <button type="button" onClick={() => setEditing(null)}>
                Cancel
              </button>
              <button type="button" class="primary" data-act="save" onClick={() => (setEditing(null), onEdit(node, editing))}>
                Send
              </button>
            </div>
          </div>
        )}
      </div>
    );
  const streaming = live && !node.done;
  return (
    <div class={`msg assistant${node.error ? " error" : ""}${streaming ? " streaming" : ""}`} data-id={node.id}>
      {node.model && <div class="who">{node.model}</div>}
      {node.reasoning && (
        <details class="reasoning">
          <summary>{streaming && !node.content ? "Thinking…" : "Reasoning"}</summary>
          <Markdown text={node.reasoning} />
        </details>
      )}
      {node.tool_calls?.length > 0 && (
        <details class="tools">
          <summary>Tool calls ({node.tool_calls.length})</summary>
          {node.tool_calls.map((t, i) => (
            <pre key={i}>
              {t.name}({t.arguments})
            </pre>
          ))}
        </details>
      )}
      {(node.content || (!node.error && !node.reasoning)) && <Markdown text={node.content || (streaming ? "" : "")} />}
      {streaming && !node.content && !node.reasoning && <div class="dots">…</div>}
      {node.error && <div class="error-text" role="alert">{node.error}</div>}
      <div class="actions">
        <Siblings conv={conv} node={node} onPick={onPick} />
        {!streaming && (
          <>
            <button type="button" class="icon" data-act="copy" title="copy" onClick={copy}>
              <Icon name="copy" />
            </button>
            <button type="button" class="icon" data-act="regen" title="regenerate" disabled={busy} onClick={() => onRegen(node)}>
              <Icon name="regen" />
            </button>
          </>
        )}
        <Stats n={node} />
      </div>
    </div>
  );
}

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const ta = document.createElement("textarea");
  ta.value = text;
  document.body.append(ta);
  ta.select();
  document.execCommand("copy");
  ta.remove();
}

function ConvItem({ c, active, onOpen, onRename, onDelete }) {
  const [renaming, setRenaming] = useState(false);
  const [sure, setSure] = useState(false);
  useEffect(() => {
    if (!sure) return;
    const t = setTimeout(() => setSure(false), 3000);
    return () => clearTimeout(t);
  }, [sure]);
  if (renaming)
    return (
      <li class="conv active">
        <input
          class="rename"
          value={c.name}
          ref={(el) => el && !el.dataset.f && ((el.dataset.f = 1), el.focus(), el.select())}
          onKeyDown={(e) => {
            if (e.key === "Enter") (onRename(c, e.currentTarget.value.trim() || c.name), setRenaming(false));
            if (e.key === "Escape") setRenaming(false);
          }}
          onBlur={(e) => (onRename(c, e.currentTarget.value.trim() || c.name), setRenaming(false))}
        />
      </li>
    );
  return (
    <li class={`conv${active ? " active" : ""}`} data-id={c.id}>
      <button type="button" class="conv-name" onClick={() => onOpen(c.id)} title={c.name}>
        {c.name}
      </button>
      <button type="button" class="icon" data-act="rename" title="rename" onClick={() => setRenaming(true)}>
        <Icon name="edit" size={14} />
      </button>
      <button type="button" class={`icon${sure ? " danger" : ""}`} data-act="delete" title={sure ? "click again to delete" : "delete"} onClick={() => (sure ? onDelete(c) : setSure(true))}>
        {sure ? "Delete?" : <Icon name="trash" size={14} />}
      </button>
    </li>
  );
}

function KeyDialog({ why, onSave }) {
  const [v, setV] = useState("");
  return (
    <div class="modal" id="apikey-dialog">
      <form class="card" onSubmit={(e) => (e.preventDefault(), v.trim() && onSave(v.trim()))}>
        <h2>API key</h2>
        <p>This server needs an API key (it was started with --api-key). It is kept in this browser.</p>
        {why && <p class="error-text">{why}</p>}
        <input type="password" name="apikey" autocomplete="current-password" placeholder="API key" value={v} onInput={(e) => setV(e.currentTarget.value)} autofocus />
        <div class="edit-row">
          <button type="submit" class="primary">
            Save
          </button>
        </div>
      </form>
    </div>
  );
}

function App() {
  const [convs, setConvs] = useState([]);
  const [conv, setConv] = useState(null);
  const [, setRev] = useState(0);
  const bump = () => setRev((r) => r + 1);
  const [settings, setSettings] = useState(loadSettings);
  const [models, setModels] = useState([]);
  const [model, setModel] = useState(localStorage.getItem("llamapy.model") || "");
  const [ctxOf, setCtxOf] = useState({});
  const [vision, setVision] = useState(null); // null until /props answers: no warning on a guess
  const [params, setParams] = useState(null);
  const [keyWhy, setKeyWhy] = useState(null);
  const [showSettings, setShowSettings] = useState(false);
  const [side, setSide] = useState(!mqPhone());
  const [search, setSearch] = useState("");
  const [input, setInput] = useState("");
  const [atts, setAtts] = useState([]);
  const [live, setLive] = useState(null); // {convId, nodeId, ctrl}
  const [bootErr, setBootErr] = useState(null);
  const [waiting, setWaiting] = useState(null);
  const [toast, setToast] = useState(null);
  const [tools, setTools] = useState(null);
  const threadRef = useRef(null);
  const fileRef = useRef(null);
  const importRef = useRef(null);
  const inputRef = useRef(null);
  const stick = useRef(true);
  const frame = useRef(0);
  const liveConvs = useRef({});

  const note = (msg) => {
    setToast(msg);
    setTimeout(() => setToast((t) => (t === msg ? null : t)), 4000);
  };

  const storeFailed = (e) => note(`conversations cannot be kept in this browser (IndexedDB: ${e?.message || e})`);
  const refreshConvs = async () => {
    try {
      setConvs(await listConvs());
    } catch (e) {
      storeFailed(e);
    }
  };

  const refreshModels = async () => {
    try {
      setModels((await getJSON("v1/models")).data || []);
    } catch (_) {}
  };

  const boot = async () => {
    setBootErr(null);
    try {
      const j = await getJSON("v1/models");
      const data = j.data || [];
      setModels(data);
      const ids = data.map((m) => m.id);
      const pick = ids.includes(model) ? model : (data.find((m) => modelState(m) === "loaded") || data[0])?.id || "";
      setModel(pick);
      setKeyWhy(null);
      setWaiting(null);
      loadProps(pick, data.length > 1);
      listTools().then(setTools);
    } catch (e) {
      if (e.status === 401) setKeyWhy(getKey() ? e.message : "");
      else if (e.status === 503) {
        setWaiting(`the server is getting ready: ${e.message}`); // loading its model: ask again soon
        setTimeout(boot, 1000);
        return;
      } else setBootErr(`the server did not list its models: ${e.message}`);
    }
  };

  const loadProps = async (id, multi) => {
    setVision(null);
    try {
      const p = await getJSON(multi && id ? `props?model=${encodeURIComponent(id)}` : "props");
      const n = p?.default_generation_settings?.n_ctx;
      if (n) setCtxOf((o) => ({ ...o, [id]: n }));
      setVision(!!p?.modalities?.vision);
      setParams(p?.default_generation_settings?.params || null);
      return n;
    } catch (_) {} // (router mode: a model not loaded yet has no props; asked again after its answer)
  };

  useEffect(() => {
    onMathReady(bump);
    refreshConvs();
    boot();
  }, []);

  useEffect(() => {
    if (!models.some((m) => modelState(m) === "loading")) return;
    const t = setTimeout(refreshModels, 1500); // a model loading: show when it is ready (or failed)
    return () => clearTimeout(t);
  }, [models]);

  useEffect(() => {
    document.title = conv && conv.name !== "New chat" ? `${conv.name} · llamapy` : "llamapy";
  });

  useEffect(() => {
    const el = threadRef.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });

  const save = async (c) => {
    c.updated = Date.now();
    try {
      await putConv(c);
    } catch (e) {
      return storeFailed(e); // the conversation goes on in memory
    }
    await refreshConvs();
  };

  const open = async (id) => {
    const c = liveConvs.current[id] || (await getConv(id));
    setConv(c || null);
    stick.current = true;
    if (mqPhone()) setSide(false);
  };

  const apiMessages = (c, uptoId) => {
    const path = [];
    for (let n = c.nodes[uptoId]; n && n.role !== "root"; n = c.nodes[n.parent]) path.unshift(n);
    const out = settings.system.trim() ? [{ role: "system", content: settings.system }] : [];
    for (const n of path) {
      if (n.role === "assistant") {
        if (n.error && !n.content) continue;
        out.push({ role: "assistant", content: n.content });
      } else {
        const files = (n.attachments || []).filter((a) => a.kind === "text");
        const imgs = (n.attachments || []).filter((a) => a.kind === "image");
        let text = n.content;
        for (const f of files) text += `\n\n--- ${f.name} ---\n${f.data}`;
        out.push({
          role: "user",
          content: imgs.length
            ? [{ type: "text", text }, ...imgs.map((a) => ({ type: "image_url", image_url: { url: a.data } }))]
            : text,
        });
      }
    }
    return out;
  };

  const generate = async (c, parentId) => {
    const multi = models.length > 1;
    const a = addNode(c, parentId, { role: "assistant", content: "", reasoning: "", model: multi ? model : undefined });
    const ctrl = new AbortController();
    liveConvs.current[c.id] = c;
    setLive({ convId: c.id, nodeId: a.id, ctrl });
    stick.current = true;
    bump();
    await save(c);
    const paint = () => {
      if (!frame.current) frame.current = requestAnimationFrame(() => ((frame.current = 0), bump()));
    };
    if (multi && modelState(models.find((m) => m.id === model)) !== "loaded") setTimeout(refreshModels, 400);
    const body = {
      messages: apiMessages(c, parentId),
      ...(model ? { model } : {}),
      ...samplingFields(settings),
      ...(tools ? requestFields(enabledTools().filter((t) => tools.some((x) => x.name === t))) : {}),
    };
    try {
      await streamChat(body, ctrl.signal, (ch) => {
        const d = ch.choices?.[0]?.delta;
        if (d?.content) a.content += d.content;
        if (d?.reasoning_content) a.reasoning += d.reasoning_content;
        for (const tc of d?.tool_calls || []) {
          a.tool_calls ||= [];
          const t = (a.tool_calls[tc.index ?? a.tool_calls.length] ||= { name: "", arguments: "" });
          t.name += tc.function?.name || "";
          t.arguments += tc.function?.arguments || "";
        }
        if (ch.usage) a.usage = ch.usage;
        if (ch.timings) a.timings = ch.timings;
        paint();
      });
    } catch (e) {
      if (e.name === "AbortError") a.stopped = true;
      else {
        a.error = e instanceof ApiError ? e.message : `the request failed: ${e.message}`;
        if (e.status === 401) setKeyWhy(e.message);
      }
    }
    a.done = true;
    a.n_ctx = ctxOf[model] || (!a.error && !a.stopped && (await loadProps(model, multi))) || undefined;
    if (multi) refreshModels(); // the router may have loaded or unloaded models
    delete liveConvs.current[c.id];
    setLive(null);
    await save(c);
    bump();
  };

  const send = async () => {
    const text = input.trim();
    if ((!text && !atts.length) || live) return;
    const c = conv || newConv();
    addNode(c, c.curr, { role: "user", content: text, attachments: atts.length ? atts : undefined });
    if (c.name === "New chat") c.name = (text || atts[0].name).slice(0, 60).replace(/\s+/g, " ");
    setInput("");
    setAtts([]);
    setConv(c);
    await generate(c, c.curr);
    inputRef.current?.focus();
  };

  const stop = () => live?.ctrl.abort();

  const pick = async (id) => {
    conv.curr = leaf(conv, id);
    bump();
    await save(conv);
  };

  const edit = async (node, text) => {
    if (live) return;
    const n = addNode(conv, node.parent, { role: "user", content: text, attachments: node.attachments });
    await generate(conv, n.id);
  };

  const regen = async (node) => {
    if (live) return;
    await generate(conv, node.parent);
  };

  const readFiles = async (files) => {
    const out = [];
    for (const f of files) {
      if (f.type.startsWith("image/")) {
        const data = await new Promise((res, rej) => {
          const r = new FileReader();
          r.onload = () => res(r.result);
          r.onerror = () => rej(r.error);
          r.readAsDataURL(f);
        });
        out.push({ kind: "image", name: f.name, data });
        if (vision === false) note("this model was not started with a vision projector (--mmproj): the server may refuse images");
      } else if (f.size > MAX_TEXT_FILE) note(`${f.name}: over 1 MiB, not attached`);
      else {
        const text = await f.text();
        if (text.includes("\u0000")) note(`${f.name}: not a text file, not attached`);
        else out.push({ kind: "text", name: f.name, data: text });
      }
    }
    if (out.length) setAtts((a) => [...a, ...out]);
  };

  const exportAll = async () => {
    const all = await listConvs();
    const blob = new Blob([JSON.stringify({ llamapy_webui: 1, conversations: all }, null, 1)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `llamapy-conversations-${new Date().toISOString().slice(0, 10)}.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  };

  const importFile = async (f) => {
    try {
      const j = JSON.parse(await f.text());
      const list = Array.isArray(j) ? j : j.conversations || [j];
      const ok = list.filter(validConv);
      for (const c of ok) await putConv(c);
      await refreshConvs();
      note(`imported ${ok.length} conversation${ok.length === 1 ? "" : "s"}` + (ok.length < list.length ? `, ${list.length - ok.length} skipped (not a conversation)` : ""));
    } catch (e) {
      note(`${f.name}: not a conversations JSON file (${e.message})`);
    }
  };

  const q = search.trim().toLowerCase();
  const shown = q
    ? convs.filter((c) => c.name.toLowerCase().includes(q) || Object.values(c.nodes).some((n) => (n.content || "").toLowerCase().includes(q)))
    : convs;
  const thread = conv ? branch(conv) : [];
  const busy = !!live;
  const liveHere = live && conv && live.convId === conv.id;
  const cur = models.find((m) => m.id === model);

  return (
    <div class={`layout${side ? " side-open" : ""}`}>
      <aside class="sidebar">
        <div class="side-top">
          <button type="button" class="primary new" id="new-chat" onClick={() => (setConv(null), mqPhone() && setSide(false), inputRef.current?.focus())}>
            + New chat
          </button>
          <input type="search" id="search" placeholder="Search" value={search} onInput={(e) => setSearch(e.currentTarget.value)} />
        </div>
        <ul class="convs">
          {shown.map((c) => (
            <ConvItem
              key={c.id}
              c={c}
              active={conv?.id === c.id}
              onOpen={open}
              onRename={async (c2, name) => {
                const full = liveConvs.current[c2.id] || c2;
                full.name = name;
                if (conv?.id === c2.id) conv.name = name;
                await save(conv?.id === c2.id ? conv : full);
              }}
              onDelete={async (c2) => {
                if (live?.convId === c2.id) live.ctrl.abort();
                await deleteConv(c2.id);
                if (conv?.id === c2.id) setConv(null);
                await refreshConvs();
              }}
            />
          ))}
          {!shown.length && <li class="empty">{q ? "nothing found" : "no conversations yet"}</li>}
        </ul>
        <div class="side-foot">
          <button type="button" id="export" onClick={exportAll}>
            Export
          </button>
          <button type="button" id="import" onClick={() => importRef.current.click()}>
            Import
          </button>
          <input type="file" accept="application/json,.json" hidden ref={importRef} onChange={(e) => (e.currentTarget.files[0] && importFile(e.currentTarget.files[0]), (e.currentTarget.value = ""))} />
          <button
            type="button"
            id="theme"
            title="dark / light"
            onClick={() => {
              const t = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
              document.documentElement.dataset.theme = t;
              localStorage.setItem("llamapy.theme", t);
            }}
          >
            <Icon name="theme" />
          </button>
          <button type="button" id="open-settings" title="settings" onClick={() => setShowSettings(true)}>
            <Icon name="gear" />
          </button>
        </div>
      </aside>
      <div class="scrim" onClick={() => setSide(false)} />
      <main class="main">
        <header class="top">
          <button type="button" class="icon" id="toggle-side" title="conversations" onClick={() => setSide(!side)}>
            <Icon name="menu" size={18} />
          </button>
          <div class="title">{conv?.name || "llamapy"}</div>
          {models.length > 1 ? (
            <select id="model" value={model} onFocus={refreshModels} onChange={(e) => (setModel(e.currentTarget.value), localStorage.setItem("llamapy.model", e.currentTarget.value), loadProps(e.currentTarget.value, true))}>
              {models.map((m) => (
                <option value={m.id} key={m.id}>
                  {m.id}
                  {modelState(m) && modelState(m) !== "loaded" ? ` (${modelState(m)})` : ""}
                </option>
              ))}
            </select>
          ) : (
            <span class="model-name" title="model">
              {model}
            </span>
          )}
          {cur && modelState(cur) && <span class={`state ${modelState(cur)}`} title={`model ${modelState(cur)}`} />}
        </header>
        <div
          class="thread"
          ref={threadRef}
          onScroll={(e) => {
            const el = e.currentTarget;
            stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
          }}
          onClick={(e) => {
            const b = e.target.closest?.(".copy");
            if (!b) return;
            copyText(b.closest(".code").querySelector("code").innerText);
            b.textContent = "Copied";
            setTimeout(() => (b.textContent = "Copy"), 1200);
          }}
        >
          {bootErr && <div class="msg assistant error"><div class="error-text">{bootErr}</div></div>}
          {waiting && <div class="waiting">{waiting}</div>}
          {!thread.length && !bootErr && <div class="hello">Ask anything. Enter sends, Shift+Enter starts a new line.</div>}
          {thread.map((n) => (
            <Message key={n.id} conv={conv} node={n} live={liveHere && live.nodeId === n.id} busy={busy} onPick={pick} onEdit={edit} onRegen={regen} />
          ))}
        </div>
        <form
          class="composer"
          onSubmit={(e) => (e.preventDefault(), send())}
          onDragOver={(e) => e.preventDefault()}
          onDrop={(e) => (e.preventDefault(), readFiles([...e.dataTransfer.files]))}
        >
          <Attachments items={atts} onRemove={(i) => setAtts(atts.filter((_, j) => j !== i))} />
          <div class="row">
            <button type="button" class="icon" id="attach" data-vision={vision === null ? "" : vision ? "yes" : "no"} title={vision === false ? "attach text files (this model was started without a vision projector)" : "attach images or text files"} onClick={() => fileRef.current.click()}>
              <Icon name="clip" size={18} />
            </button>
            <input type="file" multiple hidden ref={fileRef} id="file" onChange={(e) => (readFiles([...e.currentTarget.files]), (e.currentTarget.value = ""))} />
            <textarea
              id="input"
              ref={inputRef}
              rows={1}
              placeholder="Message"
              value={input}
              onInput={(e) => {
                setInput(e.currentTarget.value);
                e.currentTarget.style.height = "auto";
                e.currentTarget.style.height = `${Math.min(e.currentTarget.scrollHeight, 240)}px`;
              }}
              onKeyDown={(e) => {
                if (e.key === "Enter" && !e.shiftKey && !e.isComposing) (e.preventDefault(), send());
                if (e.key === "Escape" && live) stop();
              }}
              onPaste={(e) => {
                const files = [...(e.clipboardData?.files || [])];
                if (files.length) (e.preventDefault(), readFiles(files));
              }}
            />
            {live ? (
              <button type="button" id="stop" class="danger" onClick={stop}>
                Stop
              </button>
            ) : (
              <button type="submit" id="send" class="primary" disabled={busy || (!input.trim() && !atts.length)}>
                Send
              </button>
            )}
          </div>
        </form>
      </main>
      {showSettings && (
        <Settings
          value={settings}
          params={params}
          tools={tools}
          enabled={enabledTools()}
          onTools={setEnabledTools}
          onForgetKey={() => (setKey(""), setShowSettings(false), boot())}
          hasKey={!!getKey()}
          onClose={() => setShowSettings(false)}
          onSave={(s) => (setSettings(s), setShowSettings(false))}
        />
      )}
      {keyWhy !== null && (
        <KeyDialog
          why={keyWhy}
          onSave={(k) => {
            setKey(k);
            setKeyWhy(null);
            boot();
          }}
        />
      )}
      {toast && (
        <div class="toast" role="status">
          {toast}
        </div>
      )}
    </div>
  );
}

render(<App />, document.getElementById("app"));
