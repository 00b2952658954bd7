package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/getkin/kin-openapi/openapi3"
)

// The event streams: a schema named ...Stream is a Go struct with one field
// per SSE event type, the field's JSON name the event's name and its type
// the JSON of the event's data (httpapi: EventStream, WorkerStream,
// ClusterEventStream, ChatCompletionEventStream), so adding an event type
// is adding a field. Each becomes what a generator can read one event
// with: a oneOf of one schema per event type, each an SSE event as an
// object {event, id, data, retry} whose data is the event's JSON, with a
// discriminator on the event name. The text/event-stream media types that
// use them say so with x-ogen-sse-event-shape: full, which is how ogen
// reads such a schema (other tools take the schema as the shape of each
// event): docs/api.md, "Event streams".

// sseShapeExtension names the shape of a text/event-stream schema for ogen:
// "full" is an event with its fields, rather than only its data.
const sseShapeExtension = "x-ogen-sse-event-shape"

// doneMarker is the data of the last event of an OpenAI chat completion
// stream: not JSON, the literal text.
const doneMarker = "[DONE]"

func streams(doc *openapi3.T) error {
	var names []string
	for name, s := range doc.Components.Schemas {
		if strings.HasSuffix(name, streamSuffix) && s.Value != nil && s.Value.Type.Is(openapi3.TypeObject) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		if err := eventStream(doc, name); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}
	used := map[string]bool{}
	err := operations(doc, func(_, _ string, op *openapi3.Operation) error {
		for status, resp := range op.Responses.Map() {
			mt := resp.Value.Content[mediaSSE]
			if mt == nil {
				continue
			}
			name := refName(mt.Schema)
			if !slices.Contains(names, name) {
				return fmt.Errorf("%s: a text/event-stream of %q, which is not an event stream schema (...%s)", status, name, streamSuffix)
			}
			used[name] = true
			mt.Extensions = map[string]any{sseShapeExtension: "full"}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, name := range names {
		if !used[name] {
			return fmt.Errorf("stream %s: no operation answers it", name)
		}
	}
	return nil
}

// eventStream turns the stream schema name into a oneOf of its events.
func eventStream(doc *openapi3.T, name string) error {
	stream := doc.Components.Schemas[name].Value
	if len(stream.Properties) == 0 {
		return fmt.Errorf("no event types")
	}
	oneOf := openapi3.SchemaRefs{}
	mapping := openapi3.StringMap[openapi3.MappingRef]{}
	for _, event := range slices.Sorted(maps.Keys(stream.Properties)) {
		data, desc := unwrap(stream.Properties[event])
		if data == nil {
			return fmt.Errorf("event %s: no data schema", event)
		}
		msg := name + pascal(event)
		if doc.Components.Schemas[msg] != nil {
			return fmt.Errorf("event %s: its schema's name %s is taken", event, msg)
		}
		doc.Components.Schemas[msg] = openapi3.NewSchemaRef("", &openapi3.Schema{
			Type:        &openapi3.Types{openapi3.TypeObject},
			Description: strings.TrimSpace(fmt.Sprintf("The `%s` event of a %s: its `event:` line, its `id:` line if it has one, and the JSON of its `data:` lines. %s", event, name, desc)),
			Required:    []string{"event", "data"},
			Properties: openapi3.Schemas{
				"event": openapi3.NewSchemaRef("", &openapi3.Schema{
					Type: &openapi3.Types{openapi3.TypeString}, Enum: []any{event},
					Description: "The event's name (its `event:` line; an event without one is a `message`).",
				}),
				"id": openapi3.NewSchemaRef("", &openapi3.Schema{
					Type:        &openapi3.Types{openapi3.TypeString},
					Description: "The event's `id:` line, where it has one: on a job's stream, the resume token to send as Last-Event-ID.",
				}),
				"retry": openapi3.NewSchemaRef("", &openapi3.Schema{
					Type:        &openapi3.Types{openapi3.TypeInteger},
					Description: "The `retry:` line of a stream's first event: how long a client waits before it reconnects, in milliseconds.",
				}),
				// A reference carries no description in OpenAPI 3.0: the
				// event's description is the message schema's.
				"data": data,
			},
		})
		ref := "#/components/schemas/" + msg
		oneOf = append(oneOf, openapi3.NewSchemaRef(ref, doc.Components.Schemas[msg].Value))
		mapping[event] = openapi3.MappingRef{Ref: ref}
	}
	doc.Components.Schemas[name] = openapi3.NewSchemaRef("", &openapi3.Schema{
		Description: strings.TrimSpace(stream.Description + " One event of the stream: " +
			"a oneOf of one schema per event type, discriminated by its name, `event` (docs/api.md, Event streams)."),
		OneOf:         oneOf,
		Discriminator: &openapi3.Discriminator{PropertyName: "event", Mapping: mapping},
	})
	return nil
}

// chatStreamData widens the data of a streamed chat completion's events:
// OpenAI's stream, whose shape is not ours to choose, names no events, and
// its data is a chunk, the literal [DONE] that ends it, or an error object
// that ends it instead. It is written as a oneOf of the text and a oneOf
// of the two objects (ChatCompletionChunkOrError), which says the same as
// one oneOf of three: ogen tells a string from an object, and two objects
// apart by their fields, but not both at one level.
func chatStreamData(doc *openapi3.T) error {
	msg := doc.Components.Schemas["ChatCompletionEventStreamMessage"]
	if msg == nil {
		return fmt.Errorf("no ChatCompletionEventStream with a message event: is httpapi's still annotated?")
	}
	chunk, err := schemaRef(doc, "ChatCompletionChunk")
	if err != nil {
		return err
	}
	failed, err := schemaRef(doc, "OpenAIErrorResponse")
	if err != nil {
		return err
	}
	const objects = "ChatCompletionChunkOrError"
	doc.Components.Schemas[objects] = openapi3.NewSchemaRef("", &openapi3.Schema{
		Description: "The JSON data of a streamed chat completion's event: a chunk, or the error that ends the stream.",
		OneOf:       openapi3.SchemaRefs{chunk, failed},
	})
	either, err := schemaRef(doc, objects)
	if err != nil {
		return err
	}
	const end = "ChatCompletionStreamEnd"
	doc.Components.Schemas[end] = openapi3.NewSchemaRef("", &openapi3.Schema{
		Type: &openapi3.Types{openapi3.TypeString}, Enum: []any{doneMarker},
		Description: "The data of the last event of a stream that completed: the literal `" + doneMarker + "`, not JSON.",
	})
	done, err := schemaRef(doc, end)
	if err != nil {
		return err
	}
	msg.Value.Properties["data"] = openapi3.NewSchemaRef("", &openapi3.Schema{OneOf: openapi3.SchemaRefs{either, done}})
	return nil
}

// unwrap returns the schema a stream's field refers to and the field's
// description: swag writes a field with a comment as an allOf of its
// type, to hang the description on.
func unwrap(p *openapi3.SchemaRef) (*openapi3.SchemaRef, string) {
	if p == nil || p.Value == nil {
		return nil, ""
	}
	if p.Ref != "" {
		return p, ""
	}
	if len(p.Value.AllOf) == 1 && p.Value.AllOf[0].Ref != "" {
		return p.Value.AllOf[0], p.Value.Description
	}
	return p, p.Value.Description
}

// pascal is an event name as the tail of a schema name: snapshot Snapshot,
// drop_oldest DropOldest.
func pascal(s string) string {
	var b strings.Builder
	up := true
	for _, r := range s {
		if r == '_' || r == '-' || r == '.' {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}
