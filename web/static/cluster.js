// The live cluster view: one EventSource on /v1/cluster/events, a snapshot
// per change, rendered into the counters and three tables.

import {call, problemFrom, readToken, withParams} from './api.js';
import {el, $, showProblem, clearProblem, num} from './ui.js';

const EVENTS = '/v1/cluster/events';
const READ_TOKEN = '/v1/cluster/read-token';

export class ClusterView {
  /** @param {(snap: any) => void} onSnapshot also told of every snapshot (the playground's queues). */
  constructor(onSnapshot) {
    this.onSnapshot = onSnapshot;
    this.live = $('live');
    this.problem = $('cluster-problem');
    this.snapshots = 0;
  }

  /**
   * Opens the stream. An EventSource cannot send the key: it reads with a
   * read token (scope cluster:read), asked for with the key; on a node
   * that checks keys that takes the admin role.
   */
  async start() {
    if (this.es) this.es.close();
    this.es = null;
    this.setLive('connecting', 'connecting…');
    try {
      this.url = withParams(EVENTS, {read_token: await readToken(READ_TOKEN)});
    } catch (err) {
      this.setLive('closed', 'not live');
      showProblem(this.problem, err, 'The live view needs a read token: a key with the admin role, on a node that checks keys.');
      return;
    }
    const es = new EventSource(this.url);
    this.es = es;
    this.setLive('connecting', 'connecting…');
    es.addEventListener('open', () => {
      clearProblem(this.problem);
      this.setLive('live', 'live');
    });
    es.addEventListener('snapshot', (e) => {
      let snap;
      try {
        snap = JSON.parse(e.data);
      } catch (err) {
        showProblem(this.problem, {code: 'bad_snapshot', title: 'Unreadable snapshot', detail: String(err)});
        return;
      }
      this.snapshots++;
      this.render(snap);
      this.onSnapshot(snap);
    });
    es.addEventListener('error', () => {
      // The tables keep the last snapshot: the badge says it is not live.
      if (es.readyState === EventSource.CONNECTING) {
        this.setLive('reconnecting', this.snapshots ? 'reconnecting… (last snapshot shown)' : 'reconnecting…');
        return;
      }
      this.setLive('closed', this.snapshots ? 'not live (last snapshot shown)' : 'not live');
      this.explain();
    });
  }

  setLive(state, text) {
    this.live.dataset.live = state;
    this.live.textContent = text;
  }

  /** The EventSource was refused: ask again with fetch (and, as it, the read token, no key) to show why. */
  async explain() {
    const ctrl = new AbortController();
    try {
      const res = await call(this.url, {signal: ctrl.signal}, {auth: false});
      if (res.status === 401) {
        // The read token expired: a new one.
        this.start();
      } else if (!res.ok) {
        showProblem(this.problem, await problemFrom(res), 'The live view could not start.');
      } else {
        showProblem(this.problem, {title: 'The live view closed', detail: 'The node answers again; retrying.'});
        setTimeout(() => this.start(), 1000);
      }
    } catch (err) {
      showProblem(this.problem, err, 'The live view stopped. Reload the page to try again.');
    } finally {
      ctrl.abort();
    }
  }

  render(s) {
    $('node-name').textContent = s.node;
    document.title = `Switchyard · ${s.node}`;
    this.renderCounters(s.counters);
    this.renderNodes(s.nodes, s.node);
    this.renderQueues(s.queues);
    this.renderWorkers(s.queues);
    this.live.dataset.snapshots = String(this.snapshots);
  }

  renderCounters(c) {
    const sum = (m) => Object.values(m || {}).reduce((a, b) => a + b, 0);
    // The breakdown names what is there: zero series are left out.
    const by = (m) => Object.entries(m || {}).filter(([, v]) => v !== 0).sort(([a], [b]) => a.localeCompare(b))
      .map(([k, v]) => `${k || '–'} ${num(v)}`).join(', ');
    const rows = [
      ['jobs', 'Jobs ended', num(sum(c.jobs)), by(c.jobs)],
      ['peer_messages', 'Peer messages', num(sum(c.peer_messages)), by(c.peer_messages)],
      ['streams_open', 'Streams open', num(sum(c.streams_open)), by(c.streams_open)],
      ['unary_fallbacks', 'Unary fallbacks', num(c.unary_fallbacks), ''],
      ['workers_connected', 'Workers connected here', num(c.workers_connected), ''],
    ];
    $('counters').replaceChildren(...rows.map(([key, label, total, detail]) =>
      el('div', {'data-counter': key},
        el('dt', {text: label}),
        el('dd', {}, el('span', {class: 'total', text: total}), detail ? el('span', {class: 'by', text: detail}) : null))));
  }

  renderNodes(nodes, self) {
    const rows = nodes.map((n) => el('tr', {'data-node': n.id},
      el('th', {scope: 'row'}, n.id, n.id === self ? el('span', {class: 'tag', text: 'this node'}) : null),
      el('td', {text: n.zone || '–'}),
      el('td', {}, el('span', {class: 'state', 'data-state': n.state, text: n.state})),
      el('td', {}, n.http_addr ? el('a', {href: `http://${n.http_addr}/`, text: n.http_addr}) : '–')));
    this.fill('nodes', rows, 4, 'No node in the catalog.');
  }

  renderQueues(queues) {
    const rows = queues.map((q) => {
      const slots = q.consumers.reduce((a, c) => a + c.concurrency, 0);
      const load = q.local ? `${q.local.bound} of ${slots}` : '–';
      return el('tr', {'data-queue': q.name},
        el('th', {scope: 'row', text: q.name}),
        el('td', {text: q.dispatcher || '–'}),
        el('td', {text: String(q.consumers.length)}),
        el('td', {text: q.local ? String(q.local.depth) : '–'}),
        el('td', {text: load}));
    });
    this.fill('queues', rows, 5, 'No queue: queues exist while they have workers or jobs.');
  }

  renderWorkers(queues) {
    const rows = [];
    for (const q of queues) {
      for (const c of q.consumers) {
        rows.push(el('tr', {'data-worker': c.name || c.id},
          el('th', {scope: 'row', title: c.id, text: c.name || c.id}),
          el('td', {text: q.name}),
          el('td', {text: c.node + (c.zone ? ` (${c.zone})` : '')}),
          el('td', {}, c.capabilities.length ? c.capabilities.map((cap) => el('code', {class: 'cap', text: cap})) : '–'),
          el('td', {text: String(c.concurrency)})));
      }
    }
    this.fill('workers', rows, 5, 'No worker attached anywhere.');
  }

  fill(table, rows, cols, empty) {
    const body = $(table).tBodies[0];
    if (rows.length === 0) rows = [el('tr', {class: 'empty'}, el('td', {colSpan: cols, text: empty}))];
    body.replaceChildren(...rows);
  }
}
