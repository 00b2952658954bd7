package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	sse "github.com/tmaxmax/go-sse"
)

func runSubmit(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "node HTTP address")
	queue := fs.String("queue", "demo", "queue to post to")
	input := fs.String("input", "hello from switchyard", "input: a JSON value, or plain text sent as a JSON string")
	ttl := fs.Int64("ttl-ms", 0, "job TTL in milliseconds (0: the node's default)")
	var caps stringList
	fs.Var(&caps, "capability", "required capability key=value (repeatable)")
	apiKey := fs.String("api-key", "", "API key (submit role on the queue) for a node that checks keys; better set as SWITCHYARD_API_KEY")
	tlsCA := fs.String("tls-ca", "", "PEM file of the CA that signed the node's certificate, for an https --url")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	env := map[string]any{"input": jsonOrString(*input)}
	if *ttl > 0 {
		env["ttl_ms"] = *ttl
	}
	if len(caps) > 0 {
		m := map[string]string{}
		for _, c := range caps {
			k, v, _ := strings.Cut(c, "=")
			m[k] = v
		}
		env["capabilities"] = m
	}
	body, _ := json.Marshal(env)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(*url, "/")+"/v1/queues/"+*queue+"/jobs", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if *apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+*apiKey)
	}
	hc, err := httpClient(*tlsCA)
	if err != nil {
		return err
	}
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		return fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(b))
	}
	for ev, err := range sse.Read(res.Body, &sse.ReadConfig{MaxEventSize: 16 << 20}) {
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stdout, "%s\t%s\n", ev.Type, ev.Data)
		if ev.Type == "error" {
			return fmt.Errorf("job failed")
		}
	}
	return nil
}

// jsonOrString returns s as JSON if it parses, else as a JSON string.
func jsonOrString(s string) json.RawMessage {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s)
	return b
}
