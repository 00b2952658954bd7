// Package openapi holds the OpenAPI 3 document of a node's HTTP API, as
// `make openapi` generates it: swag reads the handlers' annotations
// (Swagger 2.0) and ./gen converts that to OpenAPI 3 with kin-openapi, adds
// what Swagger 2.0 cannot say, and writes openapi.json and openapi.yaml
// here. The node serves both (/openapi.json, /openapi.yaml); ./client is a
// Go client generated from the JSON by oapi-codegen. Do not edit the
// documents by hand: CI regenerates them and fails on a difference.
package openapi

import (
	_ "embed"
	"encoding/json"
	"slices"
)

// JSON is the document as JSON.
//
//go:embed openapi.json
var JSON []byte

// YAML is the document as YAML.
//
//go:embed openapi.yaml
var YAML []byte

// Operations are the "method path" of every operation of the document
// ("get /v1/jobs/{id}", …), sorted: what the tests hold the router and the
// auth matrix to.
func Operations() ([]string, error) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(JSON, &doc); err != nil {
		return nil, err
	}
	var ops []string
	for path, methods := range doc.Paths {
		for m := range methods {
			switch m {
			case "get", "put", "post", "delete", "patch", "head", "options":
				ops = append(ops, m+" "+path)
			}
		}
	}
	slices.Sort(ops)
	return ops, nil
}
