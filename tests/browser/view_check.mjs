#!/usr/bin/env node
// Static checks of the view, crates/dataref-mcp/ui/view.html (the page at `/` and the MCP
// Apps resource ui://dataref/view): one inline <style> and one inline <script>, nothing the
// Content-Security-Policy would refuse (style attributes, inline handlers, javascript: URLs)
// or that would parse data as HTML; the script parses (`node --check`); and the hashes the
// policy must name, computed the way crates/dataref-http/src/page.rs computes them (SHA-256
// of the text between `<tag>` and `</tag>`, base64).
//
//   node tests/browser/view_check.mjs [path/to/view.html]
//
// No packages: node >= 18 only. Exits 1 when a check fails.

import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const file = resolve(process.argv[2] || join(here, '..', '..', 'crates', 'dataref-mcp', 'ui', 'view.html'));
const html = readFileSync(file, 'utf8');
const bytes = Buffer.byteLength(html, 'utf8');
// Far under the page budget (1 MB compressed); a cap so growth is a decision.
const MAX_BYTES = 192 * 1024;

let passed = 0;
const failed = [];
function check(name, ok, detail) {
  if (ok) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed.push(name);
    console.log(`FAIL ${name}${detail ? `\n     ${detail}` : ''}`);
  }
}
const count = (re) => (html.match(re) || []).length;
/** Where `re` matches in `text`, as "line N: …" for a failure message. */
function where(text, re, max = 3) {
  const out = [];
  const g = new RegExp(re.source, re.flags.includes('g') ? re.flags : re.flags + 'g');
  let m;
  while ((m = g.exec(text)) && out.length < max) {
    const line = text.slice(0, m.index).split('\n').length;
    out.push(`line ${line}: ${JSON.stringify(m[0]).slice(0, 60)}`);
    if (m[0] === '') g.lastIndex++;
  }
  return out.join('; ');
}

// The server's extraction: the text between `<tag>` and `</tag>`, when `<tag` occurs once.
function only(tag) {
  const open = `<${tag}>`;
  const close = `</${tag}>`;
  const start = html.indexOf(open);
  if (start < 0) return null;
  const end = html.indexOf(close, start + open.length);
  if (end < 0) return null;
  if (html.split(`<${tag}`).length - 1 !== 1) return null;
  return { text: html.slice(start + open.length, end), start, end: end + close.length };
}

check('exactly one <script', count(/<script/gi) === 1, `found ${count(/<script/gi)}`);
check('exactly one </script>', count(/<\/script/gi) === 1, `found ${count(/<\/script/gi)}`);
check('exactly one <style', count(/<style/gi) === 1, `found ${count(/<style/gi)}`);
check('exactly one </style>', count(/<\/style/gi) === 1, `found ${count(/<\/style/gi)}`);
const script = only('script');
const style = only('style');
check('the script is a bare <script> (inline, no attributes)', !!script);
check('the style is a bare <style> (no attributes)', !!style);
if (!script || !style) finish();

const headEnd = html.indexOf('</head>');
check('the style is in <head>', style.start < headEnd && headEnd >= 0);
check('the script ends <body>', /^\s*<\/body>\s*<\/html>\s*$/i.test(html.slice(script.end)), JSON.stringify(html.slice(script.end, script.end + 40)));
check('the style comes before the script', style.end < script.start);

// The markup outside the two elements.
const markup = html.slice(0, style.start) + html.slice(style.end, script.start) + html.slice(script.end);
check('no style="…" attribute in the markup', !/\sstyle\s*=/i.test(markup), where(markup, /\sstyle\s*=/i));
check('no inline event handler attribute in the markup', !/\son[a-z]+\s*=/i.test(markup), where(markup, /\son[a-z]+\s*=/i));
check('no " on…=" anywhere in the file', !/ on[a-z]+=/i.test(html), where(html, / on[a-z]+=/i));
check('no style= anywhere in the file', !/style=/i.test(html), where(html, /style=/i));
// The one link allowed is the empty icon, so the browser asks for no /favicon.ico.
const noIcon = markup.replace('<link rel="icon" href="data:,">', '');
check('no external resource in the markup (src=, href=, <link>, <iframe>)', !/<(link|iframe|img|object|embed)\b|\s(src|href)\s*=/i.test(noIcon), where(noIcon, /<(link|iframe|img|object|embed)\b|\s(src|href)\s*=/i));
check('no @import or remote url() in the style', !/@import|url\(\s*['"]?(https?:)?\/\//i.test(style.text), where(style.text, /@import|url\(/i));

const s = script.text;
const forbidden = [
  ['innerHTML', /innerHTML/],
  ['outerHTML', /outerHTML/],
  ['insertAdjacentHTML', /insertAdjacentHTML/],
  ['document.write', /document\s*\.\s*write/],
  ['createContextualFragment', /createContextualFragment/],
  ['DOMParser', /DOMParser/],
  ['srcdoc', /srcdoc/i],
  ['eval(', /\beval\s*\(/],
  ['new Function', /new\s+Function\b/],
  ['javascript: URLs', /javascript:/i],
  ['setAttribute("style")', /setAttribute\(\s*['"`]style['"`]/],
  ['cssText', /cssText/],
  ['string timers', /set(Timeout|Interval)\(\s*['"`]/],
  ['cookies', /document\s*\.\s*cookie/],
  ['localStorage (the token belongs in sessionStorage)', /localStorage/],
];
for (const [name, re] of forbidden) check(`the script has no ${name}`, !re.test(s), where(s, re));
check('the script has no "<!--" (HTML comment parsing in script data)', !s.includes('<!--'));

// Hooks the browser tests rely on.
const testids = ['token-input', 'token-submit', 'new-chat', 'session-list', 'session-item', 'artifact-list', 'artifact-item',
  'open-grid', 'download-', 'chat-input', 'chat-send', 'chat-stop', 'answer', 'tool-step', 'approve', 'deny', 'grid',
  'grid-status', 'grid-next', 'grid-prev', 'grid-header', 'grid-filter', 'grid-cell', 'chart', 'chart-tooltip', 'legend-item', 'error'];
const missing = testids.filter((t) => !s.includes(`'${t}'`));
check('every data-testid hook is in the script', !missing.length, `missing: ${missing.join(', ')}`);
check('window.__dataref is set', /window\.__dataref\s*=/.test(s));

// The script parses, as the classic script it is.
const dir = mkdtempSync(join(tmpdir(), 'view-check-'));
try {
  const js = join(dir, 'view-script.cjs');
  writeFileSync(js, s);
  let err = '';
  try {
    execFileSync(process.execPath, ['--check', js], { stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    err = String(e.stderr || e.message).trim();
  }
  check('node --check accepts the script', !err, err.split('\n').slice(0, 6).join('\n     '));
} finally {
  rmSync(dir, { recursive: true, force: true });
}

check(`the file is at most ${MAX_BYTES} bytes`, bytes <= MAX_BYTES, `${bytes} bytes`);

const hash = (text) => `'sha256-${createHash('sha256').update(text, 'utf8').digest('base64')}'`;
console.log('');
console.log(`file:   ${file} (${bytes} bytes; script ${Buffer.byteLength(s)} bytes, style ${Buffer.byteLength(style.text)} bytes)`);
console.log(`script: ${hash(s)}`);
console.log(`style:  ${hash(style.text)}`);
console.log(`csp:    default-src 'none'; script-src ${hash(s)}; style-src ${hash(style.text)}; img-src 'self' data: blob:; ` +
  `connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`);
finish();

function finish() {
  console.log('');
  console.log(`${passed} passed, ${failed.length} failed`);
  process.exit(failed.length ? 1 : 0);
}
