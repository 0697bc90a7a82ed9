// Conversations in IndexedDB: one record per conversation, its messages a tree (branches from edits and
// regenerations) in `nodes`, the shown branch ending at `curr`.
const DB = "llamapy-webui";
const STORE = "conversations";
let dbp = null;

function open() {
  if (!dbp)
    dbp = new Promise((resolve, reject) => {
      const req = indexedDB.open(DB, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(STORE, { keyPath: "id" });
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  return dbp;
}

async function tx(mode, fn) {
  const db = await open();
  return new Promise((resolve, reject) => {
    const t = db.transaction(STORE, mode);
    const r = fn(t.objectStore(STORE));
    t.oncomplete = () => resolve(r && "result" in r ? r.result : undefined);
    t.onerror = () => reject(t.error);
    t.onabort = () => reject(t.error || new Error("IndexedDB transaction aborted"));
  });
}

export const listConvs = async () =>
  ((await tx("readonly", (s) => s.getAll())) || []).sort((a, b) => b.updated - a.updated);
export const getConv = (id) => tx("readonly", (s) => s.get(id));
export const putConv = (c) => tx("readwrite", (s) => s.put(c));
export const deleteConv = (id) => tx("readwrite", (s) => s.delete(id));

export const uid = () =>
  (crypto.randomUUID ? crypto.randomUUID() : Date.now().toString(36) + Math.random().toString(36).slice(2));

export function newConv() {
  const now = Date.now();
  return { id: uid(), name: "New chat", created: now, updated: now, curr: "root",
    nodes: { root: { id: "root", parent: null, children: [], role: "root", content: "" } } };
}

/** The messages from the first to `conv.curr` (the branch shown). */
export function branch(conv) {
  const out = [];
  for (let n = conv.nodes[conv.curr]; n && n.role !== "root"; n = conv.nodes[n.parent]) out.unshift(n);
  return out;
}

/** Adds a message under `parent` and makes it the end of the shown branch. */
export function addNode(conv, parent, fields) {
  const n = { id: uid(), parent, children: [], time: Date.now(), ...fields };
  conv.nodes[n.id] = n;
  conv.nodes[parent].children.push(n.id);
  conv.curr = n.id;
  conv.updated = Date.now();
  return n;
}

/** The deepest message under `id`, following each node's last child (the newest branch). */
export function leaf(conv, id) {
  let n = conv.nodes[id];
  while (n.children.length) n = conv.nodes[n.children[n.children.length - 1]];
  return n.id;
}

/** Whether a JSON value is a conversation this page can show (for import). */
export function validConv(c) {
  if (!c || typeof c !== "object" || typeof c.id !== "string" || !c.nodes || typeof c.nodes !== "object")
    return false;
  if (!c.nodes.root || !c.nodes[c.curr]) return false;
  return Object.values(c.nodes).every(
    (n) => n && typeof n.id === "string" && Array.isArray(n.children) && typeof n.role === "string" &&
      n.children.every((k) => c.nodes[k]),
  );
}
