package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/switchyard/switchyard/apierr"
)

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

// errorAnswer returns a maker of answers in the error shape of path's
// routes: a problem document, or under /openai/ OpenAI's error object.
func errorAnswer(doc *openapi3.T, path string) (func(desc string) *openapi3.ResponseRef, error) {
	name, ctype := "Problem", mediaProblem
	if strings.HasPrefix(path, "/openai/") {
		name, ctype = "OpenAIErrorResponse", mediaJSON
	}
	schema, err := schemaRef(doc, name)
	if err != nil {
		return nil, err
	}
	return func(desc string) *openapi3.ResponseRef {
		return &openapi3.ResponseRef{Value: openapi3.NewResponse().
			WithDescription(desc).
			WithContent(openapi3.Content{ctype: openapi3.NewMediaType().WithSchemaRef(schema)})}
	}, nil
}

// errorAnswers gives every operation the errors any route can answer
// with, in the error shape of its routes: 500 internal (a server fault,
// its cause only in the node's log), and a default answer for every other
// status — among them 405 method_not_allowed, which answers a method a
// path does not have and so belongs to no operation of it, and 408
// request_timeout for a body that does not arrive in time.
func errorAnswers(doc *openapi3.T) error {
	return operations(doc, func(path, _ string, op *openapi3.Operation) error {
		answer, err := errorAnswer(doc, path)
		if err != nil {
			return err
		}
		if op.Responses.Status(http.StatusInternalServerError) == nil {
			op.Responses.Set("500", answer("internal: a server fault; the node logs its cause and the answer says no more. "+
				"Also any code this node's table does not know: a newer peer's, or where a job's end is the answer (a chat completion), the worker's own failure code"))
		}
		if op.Responses.Default() == nil {
			op.Responses.Set("default", answer(fmt.Sprintf(
				"any other refusal, with its code (docs/errors.md): e.g. %d %s for a method this path does not have, %d %s for a body that did not arrive within the node's --http-body-timeout",
				apierr.HTTPStatus("method_not_allowed"), "method_not_allowed",
				apierr.HTTPStatus("request_timeout"), "request_timeout")))
		}
		return nil
	})
}
