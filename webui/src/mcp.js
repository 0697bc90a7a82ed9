// Tools from MCP servers the llamapy server runs (issue 28 §2): listed from GET /mcp/tools when the server
// answers it, toggled one by one in the settings, remembered per browser. The request fields that turn
// the server's agent loop on are built here alone, so the MCP side changes one function.
import { getJSON } from "./api.js";

const KEY = "llamapy.mcpTools";

/** The tools the server offers (GET /mcp/tools: {servers, tools: [{name, description, ...}]}), or null
 * when it runs no MCP servers (any answer but 200, or neither servers nor tools). */
export async function listTools() {
  try {
    const j = await getJSON("mcp/tools");
    const tools = Array.isArray(j) ? j : j.tools || j.data || [];
    if (!tools.length && !j.servers?.length) return null; // no MCP servers configured: nothing to show
    return tools.map((t) => (typeof t === "string" ? { name: t } : t)).filter((t) => t && t.name);
  } catch (_) {
    return null;
  }
}

export const enabledTools = () => {
  try {
    const v = JSON.parse(localStorage.getItem(KEY) || "[]");
    return Array.isArray(v) ? v : [];
  } catch (_) {
    return [];
  }
};
export const setEnabledTools = (names) => localStorage.setItem(KEY, JSON.stringify(names));

/** Fields added to each /v1/chat/completions body: none until a tool is switched on, then
 * `"mcp": [names]` (the server's agent loop with those tools; see llamapy/server/mcp_http.py). */
export function requestFields(enabled = enabledTools()) {
  return enabled.length ? { mcp: enabled } : {};
}
