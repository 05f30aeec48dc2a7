// A small MCP Apps host for the end-to-end test (tests/python/test_mcp_apps_host.py).
//
// It is a web page: an MCP client (the official SDK, Streamable HTTP, bearer token) talks
// to dataref, and the extension's own AppBridge talks to the view, which runs in a
// sandboxed iframe (`sandbox="allow-scripts"`, no same-origin: an opaque origin) with the
// CSP the spec asks a host to build from the resource's `_meta.ui.csp`.
//
// Query string:
//   mcp    the MCP endpoint (Streamable HTTP)
//   token  the bearer token
//   tool   the tool to call (default `render_chart`)
//   args   its arguments, as JSON
//
// Everything it does is recorded in `window.__host` for the test to read.

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import {
  AppBridge,
  PostMessageTransport,
  RESOURCE_MIME_TYPE,
  getToolUiResourceUri,
  isToolVisibilityAppOnly,
} from '@modelcontextprotocol/ext-apps/app-bridge';

const UI_EXTENSION = 'io.modelcontextprotocol/ui';
const HOST_INFO = { name: 'dataref-test-host', version: '1.0.0' };

const record = {
  state: 'starting',
  error: null,
  modelTools: [], // what a model would be offered: tools/list without the app-only tools
  appOnlyTools: [],
  resourceUri: null,
  resourceMeta: null,
  csp: null,
  appInfo: null,
  appCapabilities: null,
  toolResult: null,
  viewCalls: [], // {name, arguments, result | error} for every tools/call the view made
  refused: [], // tools/call requests the host refused (visibility)
  downloads: [], // ui/download-file requests: each content item, a blob decoded as text
  links: [], // ui/open-link requests: the URLs
  traffic: [], // [from, method or "response <id>"] of every message between host and view
  logs: [],
  sizes: [],
};
window.__host = record;

const statusEl = document.getElementById('status');
function status(text) {
  record.state = text;
  if (statusEl) statusEl.textContent = text;
}

/** The CSP of the spec's "Restrictive Default", widened only by what the resource declares. */
function buildCsp(csp) {
  const list = (xs) => (Array.isArray(xs) ? xs.filter((x) => typeof x === 'string' && /^[^\s;,'"]+$/.test(x)) : []);
  const res = list(csp && csp.resourceDomains).join(' ');
  const connect = list(csp && csp.connectDomains);
  const frame = list(csp && csp.frameDomains);
  const base = list(csp && csp.baseUriDomains);
  return [
    "default-src 'none'",
    `script-src 'self' 'unsafe-inline' ${res}`.trim(),
    `style-src 'self' 'unsafe-inline' ${res}`.trim(),
    `img-src 'self' data: ${res}`.trim(),
    `font-src 'self' ${res}`.trim(),
    `media-src 'self' data: ${res}`.trim(),
    `connect-src ${connect.length ? connect.join(' ') : "'none'"}`,
    `frame-src ${frame.length ? frame.join(' ') : "'none'"}`,
    "object-src 'none'",
    `base-uri ${base.length ? base.join(' ') : "'self'"}`,
  ].join('; ');
}

/** The view's document with the host's CSP as the first thing in its head. */
function withCsp(html, policy) {
  const attr = policy.replace(/&/g, '&amp;').replace(/"/g, '&quot;');
  const tag = `<meta http-equiv="Content-Security-Policy" content="${attr}">`;
  const head = /<head(\s[^>]*)?>/i.exec(html);
  if (head) return html.slice(0, head.index + head[0].length) + tag + html.slice(head.index + head[0].length);
  return tag + html;
}

function resourceText(content) {
  if (typeof content.text === 'string') return content.text;
  if (typeof content.blob === 'string') {
    const bytes = Uint8Array.from(atob(content.blob), (c) => c.charCodeAt(0));
    return new TextDecoder().decode(bytes);
  }
  throw new Error('the UI resource has neither text nor blob');
}

async function main() {
  const q = new URLSearchParams(location.search);
  const mcpUrl = q.get('mcp');
  const token = q.get('token');
  const toolName = q.get('tool') || 'render_chart';
  const toolArgs = JSON.parse(q.get('args') || '{}');
  if (!mcpUrl || !token) throw new Error('host.html needs ?mcp=…&token=…');

  // 1. The MCP client, declaring the UI extension at initialize.
  status('connecting');
  const client = new Client(HOST_INFO, {
    capabilities: { extensions: { [UI_EXTENSION]: { mimeTypes: [RESOURCE_MIME_TYPE] } } },
  });
  const transport = new StreamableHTTPClientTransport(new URL(mcpUrl, location.href), {
    authProvider: { token: async () => token },
  });
  await client.connect(transport);

  // 2. The tools: the model would get only those whose visibility includes "model".
  const { tools } = await client.listTools();
  const byName = new Map(tools.map((t) => [t.name, t]));
  record.modelTools = tools.filter((t) => !isToolVisibilityAppOnly(t)).map((t) => t.name);
  record.appOnlyTools = tools.filter((t) => isToolVisibilityAppOnly(t)).map((t) => t.name);
  const tool = byName.get(toolName);
  if (!tool) throw new Error(`the server has no tool ${toolName}`);
  const uri = getToolUiResourceUri(tool);
  if (!uri) throw new Error(`${toolName} names no UI resource`);
  record.resourceUri = uri;

  // 3. The call runs while the view starts, as it would after a model's tool call.
  status('calling ' + toolName);
  const called = client.callTool({ name: toolName, arguments: toolArgs });
  called.catch(() => {});

  // 4. The view: resources/read, checked, with the CSP the host enforces.
  status('reading ' + uri);
  const read = await client.readResource({ uri });
  const content = (read.contents || []).find((c) => c.uri === uri) || (read.contents || [])[0];
  if (!content) throw new Error(`resources/read of ${uri} returned nothing`);
  if (content.mimeType !== RESOURCE_MIME_TYPE) throw new Error(`the UI resource is ${content.mimeType}, not ${RESOURCE_MIME_TYPE}`);
  const ui = (content._meta && content._meta.ui) || {};
  record.resourceMeta = ui;
  record.csp = buildCsp(ui.csp);
  const html = withCsp(resourceText(content), record.csp);

  // 5. The sandboxed frame, and the bridge on its window (listening before the document loads).
  const frame = document.createElement('iframe');
  frame.setAttribute('sandbox', 'allow-scripts');
  frame.setAttribute('title', 'dataref view');
  frame.dataset.testid = 'view-frame';
  frame.className = ui.prefersBorder === false ? 'view' : 'view bordered';
  document.getElementById('views').append(frame);

  const bridge = new AppBridge(
    null,
    HOST_INFO,
    // `?download=0`: a host without `ui/download-file` (it opens links only).
    { serverTools: {}, serverResources: {}, logging: {}, openLinks: {}, ...(q.get('download') === '0' ? {} : { downloadFile: {} }) },
    {
      hostContext: {
        toolInfo: { tool },
        theme: 'light',
        displayMode: 'inline',
        availableDisplayModes: ['inline'],
        platform: 'web',
        locale: navigator.language || 'en-US',
        containerDimensions: { maxWidth: 960, maxHeight: 1400 },
      },
    },
  );

  // The view's tools/call: only tools of this server whose visibility includes "app".
  bridge.oncalltool = async (params) => {
    const t = byName.get(params.name);
    const vis = t && t._meta && t._meta.ui && Array.isArray(t._meta.ui.visibility) ? t._meta.ui.visibility : ['model', 'app'];
    if (!t || !vis.includes('app')) {
      record.refused.push(params.name);
      throw new Error(`the view may not call ${params.name}`);
    }
    const entry = { name: params.name, arguments: params.arguments || {} };
    record.viewCalls.push(entry);
    try {
      entry.result = await client.callTool({ name: params.name, arguments: params.arguments || {} });
      return entry.result;
    } catch (e) {
      entry.error = String(e && e.message ? e.message : e);
      throw e;
    }
  };
  bridge.onreadresource = async (params) => client.readResource(params);
  bridge.onopenlink = async ({ url }) => {
    record.links.push(url);
    return {};
  };
  // A real host would ask the person and save the file; this one keeps what it was given.
  bridge.ondownloadfile = async ({ contents }) => {
    record.downloads.push((contents || []).map((c) => ({
      type: c.type,
      uri: c.resource ? c.resource.uri : c.uri,
      mimeType: c.resource ? c.resource.mimeType : c.mimeType,
      text: c.resource ? resourceText(c.resource) : null,
    })));
    return {};
  };
  bridge.onloggingmessage = (p) => record.logs.push(p);
  bridge.onsizechange = ({ width, height }) => {
    record.sizes.push({ width, height });
    if (typeof height === 'number' && height > 0) frame.style.height = `${Math.min(height, 1400)}px`;
  };
  const initialized = new Promise((resolve) => {
    bridge.oninitialized = () => resolve();
  });

  const frameTransport = new PostMessageTransport(frame.contentWindow, frame.contentWindow);
  // A record of the traffic, for the test's messages when something goes wrong.
  const send = frameTransport.send.bind(frameTransport);
  frameTransport.send = (msg, opts) => {
    record.traffic.push(['host', msg.method || `response ${msg.id}`]);
    return send(msg, opts);
  };
  window.addEventListener('message', (ev) => {
    if (ev.source !== frame.contentWindow || !ev.data || ev.data.jsonrpc !== '2.0') return;
    record.traffic.push(['view', ev.data.method || `response ${ev.data.id}`]);
  });
  await bridge.connect(frameTransport);

  status('loading the view');
  frame.srcdoc = html;
  await initialized;
  record.appInfo = bridge.getAppVersion() || null;
  record.appCapabilities = bridge.getAppCapabilities() || null;

  // 6. After `ui/notifications/initialized`: the input, then the result when it comes.
  await bridge.sendToolInput({ arguments: toolArgs });
  status('waiting for ' + toolName);
  const result = await called;
  record.toolResult = result;
  await bridge.sendToolResult(result);
  status('result sent');
}

main().catch((e) => {
  record.error = String(e && e.stack ? e.stack : e);
  status('failed: ' + (e && e.message ? e.message : e));
  console.error(e);
});
