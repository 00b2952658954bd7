// DOM helpers shared by the playground and the cluster view. Text goes in
// as text (textContent), never as HTML.

import {apiKey} from './api.js';

/** Creates an element with attributes and children (strings become text). */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('data-')) e.setAttribute(k, String(v));
    else if (k in e) e[k] = v;
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export const $ = (id) => document.getElementById(id);

/**
 * Shows an ApiError (or any error) in box: the HTTP status, the problem
 * code, the title and the detail. Never an empty box.
 */
export function showProblem(box, err, hint = '') {
  const status = err && err.status ? String(err.status) : '';
  const code = (err && err.code) || '';
  const title = (err && err.title) || (status ? 'HTTP ' + status : 'Error');
  const detail = (err && err.detail) || (err && err.message) || String(err);
  const parts = [];
  if (status) parts.push(el('span', {class: 'status-code', text: status}));
  if (code) parts.push(el('code', {class: 'problem-code', 'data-code': code, text: code}));
  parts.push(el('strong', {text: title}));
  box.replaceChildren(...[
    el('p', {class: 'problem-head'}, parts),
    detail && detail !== title ? el('p', {class: 'problem-detail', text: detail}) : null,
    err && err.field ? el('p', {class: 'problem-field'}, 'Field: ', el('code', {text: err.field})) : null,
    err && err.retryAfter ? el('p', {text: `Retry after ${err.retryAfter}s.`}) : null,
    err && err.auth ? el('p', {class: 'problem-hint', text: authHint(err)}) : null,
    hint ? el('p', {text: hint}) : null,
  ].filter(Boolean));
  box.dataset.code = code || (status ? 'http_' + status : 'error');
  box.hidden = false;
}

/**
 * What to do about a 401 or 403, knowing whether a key is set: a node
 * that wants one, a key it does not take, or a key without the role or
 * queue the call needs (the detail names which).
 */
export function authHint(err) {
  if (!apiKey()) return 'This node wants an API key for this: set one under "API key" at the top.';
  if (err.status === 401) return 'The node does not take the key set under "API key": check it, or set another.';
  return 'The key set under "API key" is valid, but may not do this (the detail says which role or queue it lacks): use a key that may.';
}

export function clearProblem(box) {
  box.hidden = true;
  box.replaceChildren();
  delete box.dataset.code;
}

/** A number as a counter reads: integers without decimals. */
export function num(n) {
  return Number.isInteger(n) ? String(n) : (n || 0).toFixed(2);
}
