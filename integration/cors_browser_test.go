package integration_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// corsPage is a web app of another origin than the node's: it streams a
// job with fetch (its key in the Authorization header), resumes that job
// with an EventSource from the position after its first output (a read
// token in the URL), and reads a second, longer job with an EventSource
// that the node ends after --stream-max-duration, so that the browser's
// own reconnect — a cross-origin GET with Last-Event-ID, which needs a
// preflight — is part of the test. It reports everything in one object.
const corsPage = `<!doctype html><title>another origin</title><script>
function parse(text) {
  return text.split('\n\n').filter(b => b.trim()).map(b => {
    const ev = {};
    for (const line of b.split('\n')) {
      const i = line.indexOf(':');
      if (i > 0) ev[line.slice(0, i)] = line.slice(i + 1).trim();
    }
    return ev;
  });
}
function listen(url) {
  return new Promise((resolve) => {
    const got = {seqs: [], opens: 0, error: false, last: ''};
    const es = new EventSource(url);
    es.onopen = () => got.opens++;
    es.addEventListener('output', (e) => got.seqs.push(JSON.parse(e.data).seq));
    for (const end of ['done', 'error']) {
      es.addEventListener(end, (e) => {
        if (e.data === undefined) return; // a connection error, not the job's
        got.last = end; got.seqs.push(JSON.parse(e.data).seq); es.close(); resolve(got);
      });
    }
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) { got.error = true; resolve(got); }
    };
  });
}
async function run(node, key) {
  const out = {};
  const auth = {'Authorization': 'Bearer ' + key};
  try {
    const res = await fetch(node + '/v1/queues/demo/jobs', {method: 'POST',
      headers: {...auth, 'Content-Type': 'application/json', 'Accept': 'text/event-stream', 'Idempotency-Key': 'k-' + Math.random()},
      body: JSON.stringify({input: 'one two three four', ttl_ms: 30000})});
    out.status = res.status;
    out.job = res.headers.get('X-Job-Id');
    out.events = parse(await res.text());
  } catch (e) { out.fetchError = String(e); return out; }
  const token = async (job) => (await (await fetch(node + '/v1/jobs/' + job + '/read-token', {method: 'POST', headers: auth})).json()).token;
  const after = out.events.find((e) => e.event === 'output').id;
  out.resumed = await listen(node + '/v1/jobs/' + out.job + '/events?read_token=' + encodeURIComponent(await token(out.job)) +
    '&last_event_id=' + encodeURIComponent(after));
  const detached = await fetch(node + '/v1/queues/demo/jobs', {method: 'POST',
    headers: {...auth, 'Content-Type': 'application/json'}, body: JSON.stringify({input: 'a b c d e f g h i j', ttl_ms: 30000})});
  out.location = detached.headers.get('Location');
  const job2 = (await detached.json()).job_id;
  out.long = await listen(node + '/v1/jobs/' + job2 + '/events?read_token=' + encodeURIComponent(await token(job2)));
  return out;
}
async function refused(node, key) {
  const out = {};
  try {
    await fetch(node + '/v1/queues/demo/jobs', {method: 'POST',
      headers: {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}, body: '{"input":"x"}'});
    out.fetch = 'answered';
  } catch (e) { out.fetch = e.name; }
  try {
    await fetch(node + '/v1/jobs/j_x');
    out.get = 'answered';
  } catch (e) { out.get = e.name; }
  out.stream = await listen(node + '/v1/cluster/events');
  return out;
}
</script>`

type corsResult struct {
	Status     int
	Job        string
	Events     []map[string]string
	FetchError string
	Location   string
	Resumed    listened
	Long       listened
}

type listened struct {
	Seqs  []int
	Opens int
	Error bool
	Last  string
}

// A page of an origin on --cors-origins streams a job with fetch, resumes it
// and reads another with EventSource (the browser reconnecting by itself);
// a page of an origin not on the list is refused by the browser.
func TestCORSInABrowser(t *testing.T) {
	t.Parallel()
	page := func() *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(corsPage))
		}))
		t.Cleanup(s.Close)
		return s
	}
	allowed, other := page(), page()
	n := MustStartSecuredNode(t, func(c *switchyard.Config) {
		c.HTTP.CORSOrigins = []string{allowed.URL}
		s := &c.HTTP.Stream
		s.MaxDuration, s.Idle, s.Heartbeat = 1500*time.Millisecond, 1200*time.Millisecond, 400*time.Millisecond
		s.Setup, s.WriteTimeout = time.Second, time.Second
	})
	MustStartWorker(t, n, worker.Config{Queue: "demo", Concurrency: 4, DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), worker.APIKey(keyAliceWork)}}, worker.Tokens(250*time.Millisecond))
	br := mustStartBrowser(t)
	eval := func(js string, into any) {
		t.Helper()
		v, err := chromedp.Run(br.step(30*time.Second), chromedp.Evaluate[json.RawMessage](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("evaluate %.60q: %v", js, err)
		}
		if err := json.Unmarshal(v, into); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}

	if err := chromedp.Do(br.step(10*time.Second), chromedp.Navigate(allowed.URL+"/")); err != nil {
		t.Fatal(err)
	}
	var got corsResult
	eval(`run(`+jsString(baseURL(n))+`, `+jsString(keyAlice)+`)`, &got)
	var kinds []string
	for _, ev := range got.Events {
		kinds = append(kinds, ev["event"])
	}
	t.Logf("from %s: fetch %d %v; EventSource resume %+v; long job %+v", allowed.URL, got.Status, kinds, got.Resumed, got.Long)
	if got.FetchError != "" || got.Status != 200 || !strings.HasPrefix(got.Job, "j_") ||
		!slices.Equal(kinds, []string{"accepted", "output", "output", "output", "output", "done"}) {
		t.Fatalf("the streamed fetch: %+v", got)
	}
	if !slices.Equal(got.Resumed.Seqs, []int{3, 4, 5, 6}) || got.Resumed.Last != "done" {
		t.Errorf("the EventSource resume after seq 2: %+v", got.Resumed)
	}
	if !strings.HasPrefix(got.Location, "/v1/jobs/j_") {
		t.Errorf("Location of the detached job (an exposed header): %q", got.Location)
	}
	want := []int{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	if !slices.Equal(got.Long.Seqs, want) || got.Long.Last != "done" || got.Long.Opens < 2 {
		t.Errorf("the long job's EventSource (reconnecting by itself, Last-Event-ID cross-origin): %+v, want seqs %v and more than one open", got.Long, want)
	}

	if err := chromedp.Do(br.step(10*time.Second), chromedp.Navigate(other.URL+"/")); err != nil {
		t.Fatal(err)
	}
	var refused struct {
		Fetch, Get string
		Stream     listened
	}
	eval(`refused(`+jsString(baseURL(n))+`, `+jsString(keyAlice)+`)`, &refused)
	t.Logf("from %s: %+v", other.URL, refused)
	if refused.Fetch != "TypeError" || refused.Get != "TypeError" || !refused.Stream.Error || len(refused.Stream.Seqs) != 0 {
		t.Errorf("an origin not on the list: %+v, want every call refused by the browser", refused)
	}
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
