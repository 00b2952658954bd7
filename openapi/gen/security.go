package main

import (
	"errors"
	"fmt"

	"github.com/getkin/kin-openapi/openapi3"
)

// security makes BearerKey an HTTP bearer scheme; refuses a scheme named
// like a schema (a generator names types after both, and one of them
// loses); lets every operation that takes a credential be called without
// one too (`{}`, last: a node without keys takes every call as
// anonymous, so a generated client must not have to invent a key); and
// gives each of those operations its 401 unauthenticated and 403
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
	for name := range schemes {
		if doc.Components.Schemas[name] != nil {
			return fmt.Errorf("the security scheme %s has the name of a schema: rename it in httpapi/openapi.go", name)
		}
	}
	return operations(doc, func(path, _ string, op *openapi3.Operation) error {
		if op.Security == nil || len(*op.Security) == 0 {
			return nil
		}
		*op.Security = append(*op.Security, openapi3.SecurityRequirement{})
		answer, err := errorAnswer(doc, path)
		if err != nil {
			return err
		}
		for status, desc := range map[int]string{
			401: "unauthenticated: no API key, one that is not valid, or an expired read token (WWW-Authenticate: Bearer); a node without keys never answers it",
			403: "permission_denied: the key lacks the role or the queue",
		} {
			if op.Responses.Status(status) != nil {
				continue
			}
			op.Responses.Set(fmt.Sprint(status), answer(desc))
		}
		return nil
	})
}
