// The page's entry point: the API key, the playground and the cluster view.

import {apiKey, setApiKey, json} from './api.js';
import {$, showProblem} from './ui.js';
import {Playground} from './playground.js';
import {ClusterView} from './cluster.js';

/** The key panel; onChange runs when the key is set or forgotten. */
function keyPanel(onChange) {
  const input = $('api-key');
  const state = $('key-state');
  const show = () => {
    state.textContent = apiKey() ? 'set for this tab' : 'none';
  };
  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    setApiKey(input.value.trim());
    input.value = '';
    show();
    onChange();
  });
  $('key-forget').addEventListener('click', () => {
    setApiKey('');
    input.value = '';
    show();
    input.focus();
    onChange();
  });
  show();
}

async function main() {
  $('noscript').remove();
  const pg = new Playground();
  // The snapshot stream keeps the queue list current; a plain GET fills it
  // first, and still works where the stream does not.
  const cluster = new ClusterView((snap) => pg.setQueues(snap.queues, snap.openai_queue));
  const load = async () => {
    cluster.start();
    try {
      const {queues} = await json('/v1/queues');
      if (cluster.snapshots === 0) pg.setQueues(queues);
    } catch (err) {
      if (err && err.auth) {
        // A key that may submit but not read the catalog: the form says
        // so where the queues would be; it is no failure of the page.
        pg.catalogUnreadable(err);
      } else {
        showProblem($('problem'), err, 'The queue list could not be read.');
      }
    }
  };
  // A new key may see what the last could not (or no longer may).
  keyPanel(load);
  await load();
}

main();
