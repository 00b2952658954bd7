// The playground form: a queue and capabilities from the live catalog, the
// input (text, JSON, or a chat message with its conversation), TTL and
// options, the mode; and the buttons that drive a run.

import {apiKey} from './api.js';
import {el, $, showProblem, clearProblem} from './ui.js';
import {JobView} from './jobview.js';
import {StreamedRun, DetachedRun} from './jobrun.js';

const OTHER = '\u0000other'; // the "Another queue…" option's value: no queue name has a NUL

const INPUT_HELP = {
  text: '',
  json: '',
  chat: 'Sent as a chat request, {"messages": [...]}: the conversation so far, then this message. ' +
    'A completed reply joins the conversation.',
};

export class Playground {
  constructor() {
    this.form = $('job-form');
    this.queue = $('queue');
    this.queueHelp = $('queue-help');
    this.otherField = $('queue-other-field');
    this.other = $('queue-other');
    this.caps = $('caps-list');
    this.input = $('input');
    this.submitBtn = $('submit');
    this.cancelBtn = $('cancel');
    this.dropBtn = $('drop');
    this.pauseBtn = $('pause');
    this.problem = $('problem');
    this.chatBox = $('chat');
    this.chatLog = $('chat-log');
    this.view = new JobView();
    this.queues = [];
    this.known = true; // the queue list is the catalog's (false: this key may not read it)
    this.openaiQueue = ''; // the node's chat completions queue, from its snapshots
    this.autoChat = false; // chat input was picked by the page, for the chat queue
    this.chat = []; // the conversation so far: {role, content}
    this.run = null;
    this.capChoice = {}; // key -> chosen value ('' any), kept across refreshes

    this.form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.submit();
    });
    this.queue.addEventListener('change', () => {
      this.queuePicked = true;
      this.queueChanged();
    });
    this.view.onConn = () => this.buttons();
    this.cancelBtn.addEventListener('click', () => {
      if (this.run) this.run.cancel();
      this.buttons();
    });
    this.dropBtn.addEventListener('click', () => this.run && this.run.drop && this.run.drop());
    this.pauseBtn.addEventListener('click', () => this.togglePause());
    for (const r of this.form.elements['mode']) r.addEventListener('change', () => this.buttons());
    for (const r of this.form.elements['input-kind']) {
      r.addEventListener('change', () => {
        this.autoChat = false;
        this.kindChanged();
      });
    }
    $('chat-clear').addEventListener('click', () => {
      this.chat = [];
      this.renderChat();
      this.input.focus();
    });
    this.setQueues([]);
    this.kindChanged();
    this.buttons();
  }

  /**
   * The queues of the catalog (GET /v1/queues or a cluster snapshot), and
   * the node's chat completions queue when a snapshot names it.
   */
  setQueues(queues, openaiQueue) {
    if (openaiQueue !== undefined) this.openaiQueue = openaiQueue;
    this.known = true;
    this.queueHelp.textContent = 'Queues with workers now, from the catalog.';
    const chosen = this.queue.value;
    this.queues = queues;
    const opts = queues.map((q) => {
      const n = q.consumers.length;
      const chat = q.name === this.openaiQueue ? ', chat' : '';
      return el('option', {value: q.name, text: `${q.name} (${n} worker${n === 1 ? '' : 's'}${chat})`});
    });
    opts.push(el('option', {value: OTHER, text: 'Another queue…'}));
    this.queue.replaceChildren(...opts);
    // Keep what the user picked; until they pick, the catalog decides:
    // "demo" when there is one (the queue `make run`'s demo worker serves,
    // whose input is plain text; its neighbour "chat" wants a chat
    // request, which the chat input builds), else the first queue, else
    // "Another queue…".
    if (this.queuePicked && [...this.queue.options].some((o) => o.value === chosen)) this.queue.value = chosen;
    else if (queues.some((q) => q.name === 'demo')) this.queue.value = 'demo';
    else this.queue.value = queues.length ? queues[0].name : OTHER;
    this.queueChanged(false);
  }

  /**
   * The catalog could not be read (err: a refusal): with a key that may
   * submit but not read the catalog (the admin role), a queue is typed by
   * name, and nothing is claimed about its workers.
   */
  catalogUnreadable(err) {
    this.known = false;
    this.queues = [];
    this.queue.replaceChildren(el('option', {value: OTHER, text: 'Another queue…'}));
    this.queue.value = OTHER;
    this.queueHelp.textContent = !apiKey()
      ? 'This node wants an API key to list its queues: set one under "API key" at the top, or type a queue\'s name.'
      : err && err.status === 403
        ? 'This key may not read the catalog (listing queues needs the admin role): type the queue\'s name.'
        : 'The node does not take the key set under "API key", so it lists no queue: check the key.';
    this.queueChanged(false);
  }

  queueChanged(focus = true) {
    const other = this.queue.value === OTHER;
    this.otherField.hidden = !other;
    if (other && focus) this.other.focus();
    // The chat queue takes chat requests: its input is a message. Leaving
    // it undoes what the page picked, not what the user did. Only a move
    // to another queue picks: a snapshot that re-lists the same queue must
    // not undo the user's own choice of input kind.
    const name = this.queueName();
    const moved = name !== this.shownQueue || this.openaiQueue !== this.shownChatQueue;
    this.shownQueue = name;
    this.shownChatQueue = this.openaiQueue;
    if (!moved) {
      this.renderCaps();
      return;
    }
    const chatQueue = !!this.openaiQueue && name === this.openaiQueue;
    if (chatQueue && this.kind() !== 'chat') {
      this.setKind('chat');
      this.autoChat = true;
    } else if (!chatQueue && this.autoChat) {
      this.setKind('text');
      this.autoChat = false;
    }
    this.renderCaps();
  }

  queueName() {
    return this.queue.value === OTHER ? this.other.value.trim() : this.queue.value;
  }

  kind() {
    return this.form.elements['input-kind'].value;
  }

  setKind(kind) {
    this.form.querySelector(`input[name=input-kind][value=${kind}]`).checked = true;
    this.kindChanged();
  }

  /** The input's label and help follow its kind; chat shows the conversation. */
  kindChanged() {
    const kind = this.kind();
    const chat = kind === 'chat';
    $('input-label').textContent = chat ? 'Message' : 'Input';
    const help = $('input-help');
    help.textContent = INPUT_HELP[kind] || '';
    help.hidden = !help.textContent;
    this.chatBox.hidden = !chat;
    this.view.setChat(chat);
    this.renderChat();
  }

  renderChat() {
    const n = this.chat.length;
    $('chat-count').textContent = n ? `${n} message${n === 1 ? '' : 's'}` : 'empty';
    $('chat-clear').disabled = n === 0;
    this.chatLog.replaceChildren(...this.chat.map((m) => el('li', {class: 'turn', 'data-role': m.role},
      el('span', {class: 'who', text: m.role === 'user' ? 'you' : m.role}),
      el('span', {class: 'said', text: m.content}))));
    this.chatLog.hidden = n === 0;
  }

  /** One radio group per capability key the queue's workers offer. */
  renderCaps() {
    if (!this.known) {
      this.caps.replaceChildren(el('p', {class: 'help', text: 'This key may not read the catalog, so the page cannot offer the ' +
        'capabilities of the queue\'s workers: the node matches the job against them when you submit.'}));
      return;
    }
    const q = this.queues.find((q) => q.name === this.queue.value);
    const byKey = new Map();
    for (const c of q ? q.consumers : []) {
      for (const cap of c.capabilities) {
        const i = cap.indexOf('=');
        const k = cap.slice(0, i), v = cap.slice(i + 1);
        if (!byKey.has(k)) byKey.set(k, new Set());
        byKey.get(k).add(v);
      }
    }
    if (byKey.size === 0) {
      this.caps.replaceChildren(el('p', {class: 'help', text: q
        ? 'The workers of this queue declare no capabilities.'
        : 'No worker in the catalog for this queue: the node will answer no_capable_worker.'}));
      return;
    }
    const groups = [];
    let n = 0;
    for (const [k, values] of [...byKey].sort(([a], [b]) => a.localeCompare(b))) {
      const chosen = values.has(this.capChoice[k]) ? this.capChoice[k] : '';
      const radios = ['', ...[...values].sort()].map((v) => {
        const id = `cap-${n}-${v === '' ? 'any' : v}`.replace(/[^A-Za-z0-9_-]/g, '_');
        const input = el('input', {type: 'radio', name: `cap-${n}`, id, value: v, checked: v === chosen, 'data-key': k});
        input.addEventListener('change', () => { this.capChoice[k] = v; });
        return el('label', {for: id}, input, v === '' ? 'any' : v);
      });
      groups.push(el('div', {class: 'cap-group', role: 'radiogroup', 'aria-labelledby': `cap-${n}-key`},
        el('span', {id: `cap-${n}-key`, class: 'cap-key', text: k}), radios));
      n++;
    }
    this.caps.replaceChildren(...groups);
  }

  capabilities() {
    const out = {};
    for (const r of this.caps.querySelectorAll('input[type=radio]:checked')) {
      if (r.value !== '') out[r.dataset.key] = r.value;
    }
    return out;
  }

  /** The chat request: the conversation, then message as the user's; the model when one is picked. */
  chatRequest(message) {
    const req = {};
    const model = this.capabilities().model;
    if (model) req.model = model;
    req.messages = [...this.chat, {role: 'user', content: message}];
    return JSON.stringify(req);
  }

  /**
   * The envelope as text: the user's JSON goes in as typed, so a mistake
   * in it is the node's to refuse, with its code (malformed_json,
   * invalid_field, missing_input…), as any client would see it.
   */
  envelope() {
    const parts = [];
    const ttl = $('ttl').value.trim();
    if (ttl !== '') parts.push(`"ttl_ms":${ttl}`);
    const caps = this.capabilities();
    if (Object.keys(caps).length) parts.push(`"capabilities":${JSON.stringify(caps)}`);
    const input = this.input.value;
    switch (this.kind()) {
      case 'json':
        if (input.trim() !== '') parts.push(`"input":${input}`);
        break;
      case 'chat':
        parts.push(`"input":${this.chatRequest(input)}`);
        break;
      default:
        parts.push(`"input":${JSON.stringify(input)}`);
    }
    const options = $('options').value.trim();
    if (options !== '') parts.push(`"options":${options}`);
    return `{${parts.join(',')}}`;
  }

  mode() {
    return this.form.elements['mode'].value;
  }

  submit() {
    if (this.run && !this.run.ended) return;
    clearProblem(this.problem);
    this.view.reset();
    const queue = this.queueName();
    if (!queue) {
      this.onProblem({code: 'invalid_queue_name', title: 'No queue', detail: 'Type the name of a queue.'});
      this.other.focus();
      return;
    }
    const chat = this.kind() === 'chat';
    const message = this.input.value;
    if (chat && message.trim() === '') {
      this.onProblem({code: 'empty_message', title: 'No message', detail: 'Type a message to send.'});
      this.input.focus();
      return;
    }
    const hooks = {
      onProblem: (err, hint) => this.onProblem(err, hint),
      onEnd: () => {
        if (chat) this.chatEnded(message);
        this.buttons();
      },
    };
    this.run = this.mode() === 'detached' ? new DetachedRun(this.view, hooks) : new StreamedRun(this.view, hooks);
    const body = this.envelope();
    this.view.setSent(queue, body);
    this.view.say(`Submitting to queue ${queue}…`);
    this.buttons();
    this.run.start(queue, body);
    this.buttons();
  }

  /** A chat job ended: a completed reply joins the conversation with the message it answers. */
  chatEnded(message) {
    if (this.view.finalBox.dataset.state !== 'completed') return;
    const reply = [...this.view.output.querySelectorAll('.tok')].map((t) => t.textContent).join('');
    this.chat.push({role: 'user', content: message}, {role: 'assistant', content: reply});
    this.renderChat();
    if (this.input.value === message) this.input.value = '';
  }

  onProblem(err, hint) {
    showProblem(this.problem, err, hint);
    this.problem.focus();
    this.buttons();
  }

  togglePause() {
    const r = this.run;
    if (!r || !r.disconnect) return;
    if (r.connected) r.disconnect();
    else r.reconnect();
    this.buttons();
  }

  /** Enables what makes sense now. */
  buttons() {
    const r = this.run;
    const live = !!r && !r.ended;
    const detached = live && r instanceof DetachedRun;
    this.submitBtn.disabled = live;
    // A detached job can be cancelled once the node has named it.
    this.cancelBtn.disabled = !live || r.stopped || (detached && !r.id);
    this.dropBtn.disabled = !detached || !r.connected;
    this.pauseBtn.disabled = !detached;
    const paused = detached && !!r.eventsURL && !r.connected;
    // The label says what a press does; the connection line says the state.
    this.pauseBtn.textContent = paused ? 'Reconnect' : 'Disconnect';
    this.form.dataset.running = String(live);
  }
}
