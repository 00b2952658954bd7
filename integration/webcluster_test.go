package integration_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/switchyard/switchyard"
	"github.com/switchyard/switchyard/worker"
)

// The web page of a two-node cluster, in a real Chromium: the charts draw
// the cluster's load and follow it while jobs run (values on hover and
// from the keyboard, a text alternative), with screenshots at 1280×900 and
// 390px wide and no horizontal overflow; the chat queue takes a chat
// message and streams its reply, and refuses plain text by saying what it
// wants; a node that drains shows as draining, then as gone.
func TestWebPageCluster(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 2, func(i int, c *switchyard.Config) {
		// n2 drains with a job to finish: time enough on a loaded machine.
		c.DrainTimeout = 20 * time.Second
	})
	n1, n2 := nodes[0], nodes[1]
	MustStartWorker(t, n1, worker.Config{Name: "w1", Concurrency: 8}, worker.Tokens(30*time.Millisecond))
	MustStartWorker(t, n1, worker.Config{Name: "chat-worker", Queue: "chat", Concurrency: 4}, worker.Chat(60*time.Millisecond))
	MustStartWorker(t, n2, worker.Config{Name: "w2", Concurrency: 8, Capabilities: []string{"model=demo", "site=n2"}}, worker.Tokens(30*time.Millisecond))
	log := &pageLog{}
	br := mustStartBrowser(t, chromedp.WithListener(log.listen))
	p := &webPage{t: t, br: br}
	p.watchCSP()
	p.do("desktop viewport", chromedp.EmulateViewport(1280, 900))
	p.do("load the page", chromedp.Navigate(baseURL(n1)+"/"))
	p.wait("both nodes, live", `document.getElementById('live').dataset.live === 'live'
		&& !!document.querySelector('#nodes tr[data-node="n1"]') && !!document.querySelector('#nodes tr[data-node="n2"]')`, 10*time.Second)

	t.Run("ChartsFollowTheLoad", func(t *testing.T) { chartsFollowTheLoad(t, &webPage{t: t, br: br}, n1, n2) })
	t.Run("ChatMode", func(t *testing.T) { chatMode(t, &webPage{t: t, br: br}) })
	t.Run("DrainingNodeShown", func(t *testing.T) { drainingNodeShown(t, &webPage{t: t, br: br}, n1, n2) })

	p.mustBeClean(log)
}

// chartState is what the page shows of one chart.
type chartState struct {
	Samples int               `json:"samples"`
	Paths   map[string]string `json:"paths"`  // series -> the line's path
	Legend  map[string]string `json:"legend"` // series -> its latest value as shown
	Text    string            `json:"text"`   // the text alternative
}

func charts(p *webPage) map[string]chartState {
	p.t.Helper()
	return eval[map[string]chartState](p, `Object.fromEntries([...document.querySelectorAll('figure.chart')].map((f) => [f.dataset.chart, {
		samples: Number(f.dataset.samples || 0),
		paths: Object.fromEntries([...f.querySelectorAll('.chart-svg path.line')].map((l) => [l.dataset.series, l.getAttribute('d')])),
		legend: Object.fromEntries([...f.querySelectorAll('.legend li')].map((li) => [li.dataset.series, li.querySelector('.value').textContent])),
		text: f.querySelector('.sr-only').textContent,
	}]))`)
}

// runLoad posts streamed jobs of 20 words to both nodes from conc loops
// until stop is called; stop returns once every loop has.
func runLoad(t *testing.T, conc int, nodes ...*switchyard.Node) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range conc {
		n := nodes[i%len(nodes)]
		wg.Go(func() {
			for ctx.Err() == nil {
				res := post(ctx, t, n, "demo", `{"input":"`+words(20)+`"}`, true)
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func chartsFollowTheLoad(t *testing.T, p *webPage, n1, n2 *switchyard.Node) {
	stop := runLoad(t, 6, n1, n2)
	defer stop()
	p.wait("every chart drawing the load", `(() => {
		const has = (chart, series) => !!document.querySelector('#chart-' + chart + ' path.line[data-series="' + series + '"]');
		const value = (chart, series) => parseFloat((document.querySelector('#chart-' + chart + ' .legend li[data-series="' + series + '"] .value') || {}).textContent);
		return has('jobs', 'completed') && value('jobs', 'completed') > 0
			&& has('first-output', 'p50') && has('first-output', 'p99')
			&& has('queues', 'in_flight:demo') && value('queues', 'in_flight:demo') > 0
			&& has('streams', 'n1') && has('streams', 'n2') && value('streams', 'n1') > 0 && value('streams', 'n2') > 0;
	})()`, 20*time.Second)
	before := charts(p)
	p.wait("three more samples", fmt.Sprintf(`Number(document.getElementById('chart-jobs').dataset.samples) >= %d`, before["jobs"].Samples+3), 10*time.Second)
	after := charts(p)
	for _, c := range []struct{ chart, series string }{{"jobs", "completed"}, {"first-output", "p50"}, {"streams", "n1"}, {"queues", "in_flight:demo"}} {
		if b, a := before[c.chart].Paths[c.series], after[c.chart].Paths[c.series]; a == b || len(a) <= len(b) {
			t.Errorf("%s's %s line did not grow while the load ran: %d then %d bytes of path", c.chart, c.series, len(b), len(a))
		}
	}
	for name, c := range after {
		if !strings.Contains(c.Text, "Now: ") || !strings.Contains(c.Text, "Highest: ") {
			t.Errorf("the %s chart's text alternative: %q", name, c.Text)
		}
	}
	t.Logf("charts under load: jobs %v; first output %v; queues %v; streams %v", after["jobs"].Legend, after["first-output"].Legend, after["queues"].Legend, after["streams"].Legend)

	// The values at a moment: under the pointer, and from the keyboard.
	tip := eval[string](p, `(() => { const pl = document.querySelector('#chart-jobs .chart-plot'); const r = pl.getBoundingClientRect();
		pl.dispatchEvent(new PointerEvent('pointermove', {clientX: r.right - 15, clientY: r.top + 40, bubbles: true}));
		const tip = pl.querySelector('.chart-tip'); return tip.hidden ? '' : tip.innerText; })()`)
	if !strings.Contains(tip, "completed") || !strings.Contains(tip, "/s") || !strings.Contains(tip, ":") {
		t.Errorf("hovering the jobs chart shows %q, want the time and the values", tip)
	}
	p.do("keyboard on the streams chart", chromedp.Focus(chromedp.CSS(`#chart-streams .chart-plot`)), chromedp.KeyEvent(kb.ArrowLeft))
	if said := eval[string](p, `document.querySelector('#chart-streams [aria-live]').textContent`); !strings.Contains(said, "n1 ") || !strings.Contains(said, "n2 ") {
		t.Errorf("the arrow key on the streams chart says %q, want both nodes' values", said)
	}
	p.do("leave the chart", chromedp.KeyEvent(kb.Escape))

	// The cluster view under load at 1280×900, and the page at 390px: no
	// horizontal overflow, no chart wider than its box.
	overflow := func(width int) {
		t.Helper()
		type widths struct {
			Page, View int
			Charts     []int // each chart's svg width minus its box's
		}
		w := eval[widths](p, `({Page: document.documentElement.scrollWidth, View: window.innerWidth,
			Charts: [...document.querySelectorAll('.chart-plot')].map((pl) => Math.round(pl.querySelector('svg').getBoundingClientRect().width - pl.clientWidth))})`)
		if w.Page > w.View {
			t.Errorf("at %dpx the page is %dpx wide", width, w.Page)
		}
		for i, d := range w.Charts {
			if d > 1 {
				t.Errorf("at %dpx chart %d is %dpx wider than its box", width, i, d)
			}
		}
	}
	eval[chromedp.Void](p, `document.getElementById('cl-title').scrollIntoView()`)
	overflow(1280)
	mustScreenshotView(t, p, "cluster-under-load-1280x900.png")
	p.do("phone viewport", chromedp.EmulateViewport(390, 844))
	p.wait("the charts redrawn narrow", `document.querySelector('#chart-jobs svg').getAttribute('width') < 390`, 5*time.Second)
	overflow(390)
	mustScreenshot(t, p, "page-390.png")
	p.do("desktop viewport", chromedp.EmulateViewport(1280, 900))
}

func chatMode(t *testing.T, p *webPage) {
	p.idle()
	eval[chromedp.Void](p, `window.scrollTo(0, 0)`)
	// A user picks the chat queue: the input becomes a chat message.
	p.do("pick the chat queue", chromedp.SetValue(chromedp.ID("queue"), "chat"), chromedp.Evaluate[chromedp.Void](
		`document.getElementById('queue').dispatchEvent(new Event('change'))`))
	type chatState struct {
		Kind, Label, Sent, Reply string
		Turns                    []string
	}
	const chatJS = `({Kind: document.querySelector('input[name=input-kind]:checked').value, Label: document.getElementById('input-label').textContent,
		Sent: document.getElementById('sent').textContent, Reply: [...document.querySelectorAll('#output .tok')].map((t) => t.textContent).join(''),
		Turns: [...document.querySelectorAll('#chat-log .turn')].map((li) => li.dataset.role + ': ' + li.querySelector('.said').textContent)})`
	if c := eval[chatState](p, chatJS); c.Kind != "chat" || c.Label != "Message" {
		t.Fatalf("on the chat queue the input is %q labelled %q, want a chat message", c.Kind, c.Label)
	}
	send := func(msg string) chatState {
		t.Helper()
		p.idle()
		eval[chromedp.Void](p, `document.getElementById('input').value = ''`)
		p.do("type a message", chromedp.SendKeys(chromedp.ID("input"), msg))
		eval[chromedp.Void](p, `(() => {
			window.__replies = [];
			const out = document.getElementById('output');
			new MutationObserver(() => window.__replies.push(out.textContent)).observe(out, {childList: true, subtree: true});
		})()`)
		p.do("send", chromedp.Click(chromedp.ID("submit")))
		return chatState{}
	}
	first := "hello switchyard how are you"
	send(first)
	p.wait("the reply to the first message", `!document.getElementById('final').hidden`, 15*time.Second)
	c := eval[chatState](p, chatJS)
	if c.Reply != first {
		t.Errorf("the reply %q, want the demo's echo %q", c.Reply, first)
	}
	if partial := eval[[]string](p, `window.__replies.filter((r) => r !== '' && r !== `+"`"+first+"`"+`)`); len(partial) < 2 {
		t.Errorf("the reply went through %q before it was whole: want it to stream", partial)
	}
	if !strings.Contains(c.Sent, `"messages"`) || !strings.Contains(c.Sent, `"role": "user"`) {
		t.Errorf("the request sent: %s", c.Sent)
	}
	if want := []string{"user: " + first, "assistant: " + first}; !slices.Equal(c.Turns, want) {
		t.Errorf("the conversation %q, want %q", c.Turns, want)
	}
	// The next message carries the conversation; mid-reply, a picture.
	second := "tell me about streams and resumes please now"
	send(second)
	p.wait("three words of the second reply", `document.querySelectorAll('#output .tok').length >= 3`, 10*time.Second)
	eval[chromedp.Void](p, `window.scrollTo(0, 0)`)
	mustScreenshotView(t, p, "chat-mode-1280x900.png")
	p.wait("the reply to the second message", `!document.getElementById('final').hidden`, 15*time.Second)
	c = eval[chatState](p, chatJS)
	if strings.Count(c.Sent, `"role"`) != 3 || len(c.Turns) != 4 || c.Reply != second {
		t.Errorf("the second exchange: sent %s; conversation %q; reply %q", c.Sent, c.Turns, c.Reply)
	}

	// Plain text to the chat queue: the worker says what it wants, in
	// JSON's words.
	p.idle()
	p.do("text input", chromedp.Click(chromedp.CSS(`input[name=input-kind][value=text]`)))
	eval[chromedp.Void](p, `document.getElementById('input').value = 'the quick brown fox'`)
	p.do("send text", chromedp.Click(chromedp.ID("submit")))
	p.wait("the refusal", `!document.getElementById('final').hidden`, 15*time.Second)
	final := eval[string](p, `document.getElementById('final').innerText`)
	if !strings.Contains(final, "bad_input") || !strings.Contains(final, `want a chat request, {"messages": [{"role": "user", "content": "..."}]}`) {
		t.Errorf("text to the chat queue ends %q, want bad_input saying what a chat request is", final)
	}
	for _, goWords := range []string{"Go value", "worker.", "ChatInput", "unmarshal"} {
		if strings.Contains(final, goWords) {
			t.Errorf("the refusal names Go's types (%q): %q", goWords, final)
		}
	}
	p.do("back to the demo queue", chromedp.SetValue(chromedp.ID("queue"), "demo"), chromedp.Evaluate[chromedp.Void](
		`document.getElementById('queue').dispatchEvent(new Event('change'))`))
}

func drainingNodeShown(t *testing.T, p *webPage, n1, n2 *switchyard.Node) {
	// Every state n2's row goes through, as the page shows it.
	eval[chromedp.Void](p, `(() => {
		window.__n2 = [];
		const body = document.querySelector('#nodes tbody');
		const look = () => { const r = body.querySelector('tr[data-node="n2"]'); const s = r ? r.dataset.state : 'absent';
			if (window.__n2[window.__n2.length - 1] !== s) window.__n2.push(s); };
		look();
		new MutationObserver(look).observe(body, {childList: true, subtree: true, attributes: true});
	})()`)
	// A job only n2's worker may run keeps n2 draining while it finishes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := post(ctx, t, n1, "demo", `{"input":"`+words(30)+`","capabilities":{"site":"n2"},"options":{"delay_ms":50}}`, true)
	defer res.Body.Close()
	job := readStream(res.Body)
	waitFor(t, 10*time.Second, "the job's first output", func() bool { return job.count("output") > 0 })
	closed := make(chan error, 1)
	go func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		closed <- n2.Close(cctx)
	}()
	p.wait("n2 gone from the catalog", `document.querySelector('#nodes tr[data-node="n2"]').dataset.state === 'gone'`, 30*time.Second)
	if err := <-closed; err != nil {
		t.Errorf("close n2: %v", err)
	}
	states := eval[[]string](p, `window.__n2`)
	if i := slices.Index(states, "draining"); i < 0 || !slices.Contains(states[i:], "gone") {
		t.Errorf("n2's row went %q: want draining, then gone", states)
	}
	row := eval[string](p, `document.querySelector('#nodes tr[data-node="n2"]').innerText`)
	if !strings.Contains(row, "last seen draining") {
		t.Errorf("n2's row once gone: %q", row)
	}
	if evs, err := job.wait(20 * time.Second); err != nil || len(evs) == 0 || evs[len(evs)-1].Type != "done" {
		t.Errorf("the job n2 held while it drained: %v, %d events", err, len(evs))
	}
	t.Logf("n2's row went %q", states)
}
