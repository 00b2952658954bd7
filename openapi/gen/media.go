package main

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// Media types the node answers in.
const (
	mediaJSON    = "application/json"
	mediaProblem = "application/problem+json"
	mediaSSE     = "text/event-stream"
)

// streamSuffix marks the schemas that describe an event stream (EventStream,
// WorkerStream, ClusterEventStream, ChatCompletionEventStream): each is a Go
// struct with one field per event type (see streams.go).
const streamSuffix = "Stream"

// mediaTypes leaves each response the one media type the node answers it
// in. Swagger 2.0 lists what an operation produces once, so the conversion
// offers every response in all of them; the schema says which is meant: a
// Problem is application/problem+json wherever it is sent (a stream's
// refusal, /readyz's 503), OpenAI's error object application/json, an event
// stream text/event-stream, any other schema application/json when the
// operation produces it, else the one type it produces (text/plain,
// text/html, application/yaml).
func mediaTypes(doc *openapi3.T) error {
	return operations(doc, func(_, _ string, op *openapi3.Operation) error {
		for status, resp := range op.Responses.Map() {
			content := resp.Value.Content
			if len(content) == 0 {
				continue
			}
			var mt *openapi3.MediaType
			for _, k := range slices.Sorted(maps.Keys(content)) {
				if mt = content[k]; mt.Schema != nil {
					break
				}
			}
			want := ""
			switch name := refName(mt.Schema); {
			case name == "Problem":
				want = mediaProblem
			case name == "OpenAIErrorResponse":
				want = mediaJSON
			case strings.HasSuffix(name, streamSuffix):
				want = mediaSSE
			case content[mediaJSON] != nil:
				want = mediaJSON
			case len(content) == 1:
				for k := range content {
					want = k
				}
			default:
				return fmt.Errorf("%s: which of %v is meant?", status, slices.Sorted(maps.Keys(content)))
			}
			resp.Value.Content = openapi3.Content{want: mt}
		}
		return nil
	})
}

// jsonAlternatives are the responses that answer JSON or an event stream
// for the same status, by the request: Swagger 2.0 has one schema per
// status, so the handler's annotation names both (swag then defines both
// schemas), the stream last, and the JSON one is added here.
var jsonAlternatives = []struct{ op, status, schema, why string }{
	// A retried POST whose Idempotency-Key matched, without Accept:
	// text/event-stream.
	{"submitJob", "200", "Job", "without `Accept: text/event-stream`, a retried POST whose `Idempotency-Key` matched a job answers that job's document"},
	// A chat completion without stream: true.
	{"createChatCompletion", "200", "ChatCompletion", "without `stream: true`, one chat.completion once the job has ended"},
}

func alternatives(doc *openapi3.T) error {
	for _, alt := range jsonAlternatives {
		op := operationByID(doc, alt.op)
		if op == nil {
			return fmt.Errorf("alternatives: no operation %s", alt.op)
		}
		resp := op.Responses.Value(alt.status)
		if resp == nil || resp.Value.Content[mediaSSE] == nil {
			return fmt.Errorf("alternatives: %s has no %s event stream to add JSON to", alt.op, alt.status)
		}
		s, err := schemaRef(doc, alt.schema)
		if err != nil {
			return fmt.Errorf("alternatives: %s: %w", alt.op, err)
		}
		resp.Value.Content[mediaJSON] = openapi3.NewMediaType().WithSchemaRef(s)
		d := *resp.Value.Description + "; " + alt.why
		resp.Value.Description = &d
	}
	return nil
}

// opaqueBodies describes the bodies that are neither JSON nor an event
// stream (the page, the metrics, the YAML document, plain text) as what
// they are to a client: a string of bytes to take as it is
// (format: binary, which generators read as a byte stream rather than
// refusing a media type they do not parse).
func opaqueBodies(doc *openapi3.T) error {
	return operations(doc, func(_, _ string, op *openapi3.Operation) error {
		for _, resp := range op.Responses.Map() {
			for k, mt := range resp.Value.Content {
				if k == mediaJSON || k == mediaProblem || k == mediaSSE {
					continue
				}
				mt.Schema = openapi3.NewSchemaRef("", &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeString}, Format: "binary"})
			}
		}
		return nil
	})
}

// submitLinks adds the 202's links: where the job can be read, streamed
// and cancelled, by its id.
func submitLinks(doc *openapi3.T) error {
	op := operationByID(doc, "submitJob")
	if op == nil || op.Responses.Value("202") == nil {
		return errors.New("POST /v1/queues/{queue}/jobs has no 202 to link from")
	}
	id := map[string]any{"id": "$response.body#/job_id"}
	op.Responses.Value("202").Value.Links = openapi3.Links{
		"self":   {Value: &openapi3.Link{OperationID: "getJob", Parameters: id, Description: "the job's document (links.self)"}},
		"events": {Value: &openapi3.Link{OperationID: "jobEvents", Parameters: id, Description: "the job's event stream (links.events)"}},
		"cancel": {Value: &openapi3.Link{OperationID: "cancelJob", Parameters: id, Description: "cancel the job (DELETE links.self)"}},
	}
	return nil
}

func operationByID(doc *openapi3.T, id string) *openapi3.Operation {
	var found *openapi3.Operation
	_ = operations(doc, func(_, _ string, op *openapi3.Operation) error {
		if op.OperationID == id {
			found = op
		}
		return nil
	})
	return found
}
