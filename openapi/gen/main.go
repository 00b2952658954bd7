// Command gen turns the Swagger 2.0 document swag writes from the HTTP
// handlers' annotations into the OpenAPI 3.0 document the node serves
// (openapi.json and openapi.yaml), and adds what Swagger 2.0 cannot say,
// one step a file:
//
//   - media.go: servers, from basePath (the converter drops basePath when
//     the document has no host); one media type per response, the one the
//     node answers it in (a problem is application/problem+json wherever it
//     is sent); the responses that answer JSON or an event stream by the
//     request's Accept or body; the links of a submitted job's 202;
//   - streams.go: each event stream described one schema per event type (a
//     oneOf with a discriminator on the event name);
//   - security.go: the API key as an HTTP bearer scheme, the anonymous
//     alternative of a node without keys, and the 401 and 403 of every
//     operation that takes a credential;
//   - errors.go: the Problem schema's code as an enum of every code of
//     apierr's table, and the 500 and default answers of every operation.
//
// What the document must stay true to, and how it is checked against the
// node, is docs/api.md.
//
// Usage: go run ./openapi/gen swagger.json outdir
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"sigs.k8s.io/yaml"
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
	// The order matters where a step reads what an earlier one wrote:
	// streams finds the event streams by their media type, and errors
	// gives the anonymous alternative's operations their default answer.
	for _, step := range []func(*openapi3.T) error{
		mediaTypes, alternatives, opaqueBodies, submitLinks,
		streams, chatStreamData, problemCodes, security, errorAnswers,
	} {
		if err := step(doc); err != nil {
			return err
		}
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

// operations calls f with every operation of doc, in a stable order.
func operations(doc *openapi3.T, f func(path, method string, op *openapi3.Operation) error) error {
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
			if op := item.GetOperation(method); op != nil {
				if err := f(path, method, op); err != nil {
					return fmt.Errorf("%s %s: %w", method, path, err)
				}
			}
		}
	}
	return nil
}

// schemaRef is a reference to the component schema name of doc.
func schemaRef(doc *openapi3.T, name string) (*openapi3.SchemaRef, error) {
	s := doc.Components.Schemas[name]
	if s == nil || s.Value == nil {
		return nil, fmt.Errorf("no schema %s", name)
	}
	return openapi3.NewSchemaRef("#/components/schemas/"+name, s.Value), nil
}

// refName is the component name a schema reference points to ("" for an
// inline schema).
func refName(s *openapi3.SchemaRef) string {
	if s == nil {
		return ""
	}
	const prefix = "#/components/schemas/"
	if len(s.Ref) > len(prefix) && s.Ref[:len(prefix)] == prefix {
		return s.Ref[len(prefix):]
	}
	return ""
}
