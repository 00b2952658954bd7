package loadgen

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRecordCountsTerminalsAndTakesTheID(t *testing.T) {
	t0 := time.Unix(100, 0)
	var j Job
	j.Record("output", `{"job_id":"j_1","seq":1,"attempt":2,"data":{"i":0,"by":"w1"}}`, t0)
	j.Record("done", `{"seq":2}`, t0.Add(time.Second))
	j.Record("error", `{"seq":3,"code":"late","detail":"d"}`, t0.Add(2*time.Second))
	if j.ID != "j_1" || j.Terminals != 2 || j.Terminal != "done" || j.Code != "" || !j.EndAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("job %+v: want id j_1, 2 terminals, the first (done) ending it", j)
	}
	e := j.Events[0]
	if e.Kind != "output" || e.I != 0 || e.By != "w1" || e.Attempt != 2 || e.AfterTerminal {
		t.Errorf("output event %+v", e)
	}
	if j.Events[1].I != -1 || j.Events[1].AfterTerminal || !j.Events[2].AfterTerminal {
		t.Errorf("events %+v: want no index off outputs, only the third after a terminal", j.Events)
	}
	if !slices.Equal(j.Attempts(), []uint64{2}) || !j.OutputBy(t0) || j.OutputBefore(t0) || !j.Ended(time.Time{}) || j.Ended(t0) {
		t.Errorf("Attempts %v, OutputBy/Before/Ended wrong around %v", j.Attempts(), t0)
	}
	c := j.Clone()
	c.Events[0].Kind = "x"
	if j.Events[0].Kind != "output" {
		t.Error("Clone shares its events")
	}
}

func TestAnswerAndPostFailed(t *testing.T) {
	l := NewLoop[Job](1)
	var j Job
	res := &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"3"}}, Body: io.NopCloser(strings.NewReader(`{"code":"busy"}`))}
	if ok, wait := l.Answer(&j, res); ok || wait != time.Second || j.Status != 429 || j.Refusal != "busy" || j.EndAt.IsZero() {
		t.Errorf("refused: ok %v wait %v job %+v", ok, wait, j)
	}
	j = Job{}
	res = &http.Response{StatusCode: 200, Header: http.Header{"X-Job-Id": {"j_2"}}, Body: http.NoBody}
	if ok, _ := l.Answer(&j, res); !ok || j.ID != "j_2" || j.Status != 200 || !j.EndAt.IsZero() {
		t.Errorf("accepted: ok %v job %+v", ok, j)
	}
	j = Job{}
	j.PostFailed(errors.New("refused"), false)
	if j.PostErr != "refused" || j.Open || j.EndAt.IsZero() {
		t.Errorf("post failed: %+v", j)
	}
	j = Job{}
	j.PostFailed(errors.New("cut"), true)
	if j.PostErr != "" || !j.Open {
		t.Errorf("post cut by the halt: %+v", j)
	}
}
