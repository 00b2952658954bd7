// Calls to the node's HTTP API: the API key, problem+json refusals, and
// failures that never reached the node, all as one ApiError.

const KEY = 'switchyard.apiKey';

/** The API key for this tab (sessionStorage: gone when the tab closes). */
export function apiKey() {
  try {
    return sessionStorage.getItem(KEY) || '';
  } catch {
    return ''; // storage disabled: no key
  }
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

/** Headers with the API key, if one is set, as a bearer token. */
export function withAuth(headers = {}) {
  const key = apiKey();
  if (key) headers['Authorization'] = 'Bearer ' + key;
  return headers;
}

/** A refusal or failure, shown with its code and detail. */
export class ApiError extends Error {
  /**
   * @param {{status?: number, code?: string, title?: string, detail?: string, field?: string, retryAfter?: string}} p
   */
  constructor(p) {
    super(p.detail || p.title || p.code || 'request failed');
    this.status = p.status || 0; // 0: no HTTP answer at all
    this.code = p.code || '';
    this.title = p.title || '';
    this.detail = p.detail || '';
    this.field = p.field || '';
    this.retryAfter = p.retryAfter || '';
  }

  /** 401 or 403: the node wants a key, or a better one. */
  get auth() {
    return this.status === 401 || this.status === 403;
  }
}

const statusText = {401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found'};

/** Turns a response that is not ok into an ApiError, reading its body. */
export async function problemFrom(res) {
  const retryAfter = res.headers.get('Retry-After') || '';
  const type = res.headers.get('Content-Type') || '';
  let text = '';
  try {
    text = await res.text();
  } catch {
    // The body broke off: status alone.
  }
  if (type.includes('json')) {
    try {
      const p = JSON.parse(text);
      return new ApiError({
        status: res.status, code: p.code, title: p.title, detail: p.detail, field: p.field, retryAfter,
      });
    } catch {
      // Not the JSON it said: fall through to the text.
    }
  }
  return new ApiError({
    status: res.status,
    title: res.statusText || statusText[res.status] || 'HTTP ' + res.status,
    detail: text.trim().slice(0, 500),
    retryAfter,
  });
}

/** The error for a fetch that got no answer (the node is down, or the network). */
export function networkError(err) {
  return new ApiError({code: 'network', title: 'No answer from the node', detail: String(err && err.message || err)});
}

/**
 * fetch with the key; a failure to reach the node becomes an ApiError.
 * An abort (signal) is rethrown as it is. auth false sends no key: the
 * request an EventSource makes, asked again to see the answer it got.
 */
export async function call(path, init = {}, {auth = true} = {}) {
  init.headers = auth ? withAuth(init.headers || {}) : (init.headers || {});
  try {
    return await fetch(path, init);
  } catch (err) {
    if (err && err.name === 'AbortError') throw err;
    throw networkError(err);
  }
}

/** GET (or another method) returning JSON; any refusal throws an ApiError. */
export async function json(path, init = {}) {
  const res = await call(path, init);
  if (!res.ok) throw await problemFrom(res);
  try {
    return await res.json();
  } catch (err) {
    throw new ApiError({status: res.status, code: 'bad_response', title: 'Unreadable answer', detail: String(err)});
  }
}

/**
 * A read token for an EventSource, which cannot send the key: path is the
 * job's /v1/jobs/{id}/read-token or /v1/cluster/read-token, asked with the
 * key. The token reads that one stream, for a while (docs/web.md).
 */
export async function readToken(path) {
  const v = await json(path, {method: 'POST'});
  return v.token;
}

/** path with params added to its query (the node's own origin). */
export function withParams(path, params) {
  const u = new URL(path, location.href);
  for (const [k, v] of Object.entries(params)) u.searchParams.set(k, v);
  return u.pathname + u.search;
}
