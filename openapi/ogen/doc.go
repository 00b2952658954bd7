// Package ogen is a Go client of the node's HTTP API generated from its
// OpenAPI document by ogen (make openapi), with no edit by hand: the
// second generator the document is held to (openapi/client is
// oapi-codegen's). ogen is strict about OpenAPI 3 and reads the event
// streams as typed events (x-ogen-sse-event-shape: full), so a document
// it cannot generate, or a stream it cannot decode, fails the build or
// integration's TestOgenClient. docs/api.md says what the document
// promises.
package ogen
