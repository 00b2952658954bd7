package main

import (
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// streamDoc is a document with one event stream, FooStream, whose events
// are the given names, each with its own data schema, answered by one
// operation.
func streamDoc(events ...string) *openapi3.T {
	doc := &openapi3.T{OpenAPI: "3.0.3", Info: &openapi3.Info{Title: "t", Version: "1"}, Paths: openapi3.NewPaths(),
		Components: &openapi3.Components{Schemas: openapi3.Schemas{}}}
	stream := &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeObject}, Properties: openapi3.Schemas{}}
	for _, ev := range events {
		data := "Data" + pascal(ev)
		doc.Components.Schemas[data] = openapi3.NewSchemaRef("", &openapi3.Schema{
			Type: &openapi3.Types{openapi3.TypeObject}, Required: []string{ev},
			Properties: openapi3.Schemas{ev: openapi3.NewSchemaRef("", &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeInteger}})},
		})
		stream.Properties[ev] = openapi3.NewSchemaRef("#/components/schemas/"+data, doc.Components.Schemas[data].Value)
	}
	doc.Components.Schemas["FooStream"] = openapi3.NewSchemaRef("", stream)
	op := openapi3.NewOperation()
	op.OperationID = "foo"
	op.Responses = openapi3.NewResponses(openapi3.WithStatus(200, &openapi3.ResponseRef{Value: openapi3.NewResponse().WithDescription("the stream").
		WithContent(openapi3.Content{mediaSSE: openapi3.NewMediaType().WithSchemaRef(openapi3.NewSchemaRef("#/components/schemas/FooStream", stream))})}))
	doc.Paths.Set("/foo", &openapi3.PathItem{Get: op})
	return doc
}

// A stream schema becomes a oneOf of one event schema per event type,
// discriminated by the event name, each event's data its own schema; its
// media type says which shape it is. Adding an event type is adding a
// property (in httpapi, a field): one more branch, nothing else.
func TestStreamsOneSchemaPerEvent(t *testing.T) {
	for _, events := range [][]string{{"accepted", "done"}, {"accepted", "done", "restart"}} {
		doc := streamDoc(events...)
		if err := streams(doc); err != nil {
			t.Fatal(err)
		}
		s := doc.Components.Schemas["FooStream"].Value
		if len(s.OneOf) != len(events) || s.Discriminator == nil || s.Discriminator.PropertyName != "event" || len(s.Discriminator.Mapping) != len(events) {
			t.Fatalf("%v: oneOf %d, discriminator %+v", events, len(s.OneOf), s.Discriminator)
		}
		for _, ev := range events {
			msg := doc.Components.Schemas["FooStream"+pascal(ev)]
			if msg == nil || s.Discriminator.Mapping[ev].Ref != "#/components/schemas/FooStream"+pascal(ev) {
				t.Fatalf("%s: no event schema, or not mapped: %+v", ev, s.Discriminator.Mapping)
			}
			if got := msg.Value.Properties["event"].Value.Enum; len(got) != 1 || got[0] != ev {
				t.Errorf("%s: event enum %v", ev, got)
			}
			if got := msg.Value.Properties["data"].Ref; got != "#/components/schemas/Data"+pascal(ev) {
				t.Errorf("%s: data %q", ev, got)
			}
		}
		// The document validates: a done event validates as done, and not
		// with an accepted event's data.
		if err := doc.Validate(openapi3.NewLoader().Context); err != nil {
			t.Fatal(err)
		}
		if err := s.VisitJSON(map[string]any{"event": "done", "data": map[string]any{"done": 1.0}}); err != nil {
			t.Errorf("a done event: %v", err)
		}
		if err := s.VisitJSON(map[string]any{"event": "done", "data": map[string]any{"accepted": 1.0}}); err == nil {
			t.Error("a done event with an accepted event's data validated")
		}
		mt := doc.Paths.Value("/foo").Get.Responses.Value("200").Value.Content[mediaSSE]
		if mt.Extensions[sseShapeExtension] != "full" {
			t.Errorf("media type extensions %v", mt.Extensions)
		}
	}
}

// A stream schema no operation answers, or an event stream of a schema
// that is not a stream, is refused: the document would say something the
// node does not do.
func TestStreamsRefusesStrays(t *testing.T) {
	doc := streamDoc("a")
	doc.Paths.Value("/foo").Get.Responses.Value("200").Value.Content = openapi3.Content{mediaJSON: openapi3.NewMediaType()}
	if err := streams(doc); err == nil {
		t.Error("a stream no operation answers: no error")
	}
}
