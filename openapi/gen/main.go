// Command gen turns the Swagger 2.0 document swag writes from the HTTP
// handlers' annotations into the OpenAPI 3 document the node serves
// (openapi.json and openapi.yaml), and adds what Swagger 2.0 cannot say:
//
//   - servers, from basePath (the converter drops basePath when the
//     document has no host);
//   - one media type per response: Swagger 2.0 lists what an operation
//     produces once, so the conversion offers every response in all of
//     them; a problem is application/problem+json, an event stream
//     text/event-stream, a JSON document application/json;
//   - the Problem schema's code as an enum of every code of apierr's table,
//     with each code's status in its description, so the document lists
//     every code the node can answer with from the table itself;
//   - the links of a submitted job's 202 (OpenAPI 3 links), to the routes
//     that read, stream and cancel it;
//   - the API key as an HTTP bearer scheme (Swagger 2.0 knows only apiKey
//     headers), and the 401 and 403 of every operation that declares it.
//
// Usage: go run ./openapi/gen swagger.json outdir
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"sigs.k8s.io/yaml"

	"github.com/switchyard/switchyard/apierr"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gen swagger.json outdir")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "openapi/gen:", err)
		os.Exit(1)
	}
}

func run(in, outDir string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var doc2 openapi2.T
	if err := json.Unmarshal(b, &doc2); err != nil {
		return fmt.Errorf("read %s: %w", in, err)
	}
	doc, err := openapi2conv.ToV3(&doc2)
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	doc.Servers = openapi3.Servers{{URL: doc2.BasePath, Description: "the node that serves this document"}}
	if err := mediaTypes(doc); err != nil {
		return err
	}
	if err := problemCodes(doc); err != nil {
		return err
	}
	if err := submitLinks(doc); err != nil {
		return err
	}
	if err := security(doc); err != nil {
		return err
	}
	if err := doc.Validate(openapi3.NewLoader().Context); err != nil {
		return fmt.Errorf("the converted document is not valid: %w", err)
	}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	js = append(js, '\n')
	ym, err := yaml.JSONToYAML(js)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "openapi.json"), js, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(outDir, "openapi.yaml"), ym, 0o644)
}

// mediaTypes leaves each response one media type: the one its schema is
// written in.
func mediaTypes(doc *openapi3.T) error {
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status, resp := range op.Responses.Map() {
				content := resp.Value.Content
				if len(content) < 2 {
					continue
				}
				var ref string
				for _, mt := range content {
					if mt.Schema != nil {
						ref = mt.Schema.Ref
					}
				}
				want := "application/json"
				switch {
				case strings.HasSuffix(ref, "/Problem"):
					want = "application/problem+json"
				case strings.HasSuffix(ref, "/EventStream"):
					want = "text/event-stream"
				}
				mt, ok := content[want]
				if !ok {
					mt = content[slices.Sorted(func(yield func(string) bool) {
						for k := range content {
							if !yield(k) {
								return
							}
						}
					})[0]]
				}
				if mt == nil {
					return fmt.Errorf("%s %s %s: no media type", method, path, status)
				}
				resp.Value.Content = openapi3.Content{want: mt}
			}
		}
	}
	return nil
}

// problemCodes makes Problem.code the enum of every code of the table.
func problemCodes(doc *openapi3.T) error {
	p := doc.Components.Schemas["Problem"]
	if p == nil || p.Value.Properties["code"] == nil {
		return errors.New("no Problem schema with a code property: is apierr.Problem still annotated?")
	}
	code := p.Value.Properties["code"].Value
	var lines []string
	for _, c := range apierr.Codes() {
		code.Enum = append(code.Enum, string(c))
		lines = append(lines, fmt.Sprintf("`%s` %d", c, apierr.HTTPStatus(c)))
	}
	code.Description = "The stable, machine-readable reason: match on it, never on the detail. Every code the node can answer with, and its HTTP status: " +
		strings.Join(lines, ", ") + ". A job's stream carries outcome codes in its error event too (docs/errors.md)."
	return nil
}

// submitLinks adds the 202's links: where the job can be read, streamed
// and cancelled, by its id.
func submitLinks(doc *openapi3.T) error {
	item := doc.Paths.Value("/v1/queues/{queue}/jobs")
	if item == nil || item.Post == nil || item.Post.Responses.Value("202") == nil {
		return errors.New("POST /v1/queues/{queue}/jobs has no 202 to link from")
	}
	id := map[string]any{"id": "$response.body#/job_id"}
	item.Post.Responses.Value("202").Value.Links = openapi3.Links{
		"self":   {Value: &openapi3.Link{OperationID: "getJob", Parameters: id, Description: "the job's document (links.self)"}},
		"events": {Value: &openapi3.Link{OperationID: "jobEvents", Parameters: id, Description: "the job's event stream (links.events)"}},
		"cancel": {Value: &openapi3.Link{OperationID: "cancelJob", Parameters: id, Description: "cancel the job (DELETE links.self)"}},
	}
	return nil
}

// security makes BearerKey an HTTP bearer scheme and gives every operation
// that requires a credential its 401 unauthenticated and 403
// permission_denied, in the error shape of its routes (OpenAI's under
// /openai/).
func security(doc *openapi3.T) error {
	schemes := doc.Components.SecuritySchemes
	key := schemes["BearerKey"]
	if key == nil || key.Value == nil {
		return errors.New("no BearerKey security scheme: is it still declared in httpapi/openapi.go?")
	}
	schemes["BearerKey"] = &openapi3.SecuritySchemeRef{Value: &openapi3.SecurityScheme{
		Type: "http", Scheme: "bearer", Description: key.Value.Description,
	}}
	for path, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.Security == nil || len(*op.Security) == 0 {
				continue
			}
			name, ctype := "Problem", "application/problem+json"
			if strings.HasPrefix(path, "/openai/") {
				name, ctype = "OpenAIErrorResponse", "application/json"
			}
			target := doc.Components.Schemas[name]
			if target == nil {
				return fmt.Errorf("%s: no schema %s for its 401 and 403", path, name)
			}
			schema := openapi3.NewSchemaRef("#/components/schemas/"+name, target.Value)
			for status, desc := range map[int]string{
				401: "unauthenticated: no API key, one that is not valid, or an expired read token (WWW-Authenticate: Bearer)",
				403: "permission_denied: the key lacks the role or the queue",
			} {
				if op.Responses.Status(status) != nil {
					continue
				}
				op.Responses.Set(fmt.Sprint(status), &openapi3.ResponseRef{Value: openapi3.NewResponse().
					WithDescription(desc).
					WithContent(openapi3.Content{ctype: openapi3.NewMediaType().WithSchemaRef(schema)})})
			}
		}
	}
	return nil
}
