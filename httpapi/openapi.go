// The general information of the OpenAPI document: swag reads it from this
// file (make openapi), and the routes' own annotations from their handlers.
//
//	@title			Switchyard API
//	@version		1
//	@description	A clustered transport for requested processes: post a job to a queue, stream its output as server-sent events, resume it, cancel it; serve a queue over HTTP. What this document promises, and how it describes event streams: docs/api.md.
//	@license.name	see the repository
//	@BasePath		/
//	@securityDefinitions.apikey	BearerKey
//	@in							header
//	@name						Authorization
//	@description				An API key, as `Bearer <key>`: its subject owns the jobs it submits; its roles (submit, work, admin) and queue patterns say what it may do.
//	@securityDefinitions.apikey	ReadTokenQuery
//	@in							query
//	@name						read_token
//	@description				A read token for one stream, for an EventSource (it cannot send a header): from POST /v1/jobs/{id}/read-token or POST /v1/cluster/read-token. See docs/api.md#read-tokens.
//	@tag.name		jobs
//	@tag.description	Submit, read, stream and cancel jobs.
//	@tag.name		cluster
//	@tag.description	Nodes and queues as this node sees them.
//	@tag.name		workers
//	@tag.description	Serve a queue over HTTP: a server-sent event session and JSON posts.
//	@tag.name		node
//	@tag.description	Health, readiness, metrics and this document.

package httpapi

import (
	"bytes"
	"io"
	"io/fs"
	"net/http"

	swaggerfiles "github.com/swaggo/files/v2"

	"github.com/switchyard/switchyard/openapi"
)

// handleOpenAPIJSON is GET /openapi.json.
//
//	@Summary		The OpenAPI document (JSON)
//	@Description	This document, OpenAPI 3.0. Generate a client from it in any language.
//	@Tags			node
//	@ID				openapiJSON
//	@Produce		json
//	@Success		200	{object}	object	"OpenAPI 3.0 document"
//	@Router			/openapi.json [get]
func (s *Server) handleOpenAPIJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openapi.JSON)
}

// handleOpenAPIYAML is GET /openapi.yaml.
//
//	@Summary		The OpenAPI document (YAML)
//	@Description	The same document as /openapi.json, as YAML.
//	@Tags			node
//	@ID				openapiYAML
//	@Produce		application/yaml
//	@Success		200	{string}	string	"OpenAPI 3.0 document"
//	@Router			/openapi.yaml [get]
func (s *Server) handleOpenAPIYAML(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(openapi.YAML)
}

// handleDocs is GET /docs: Swagger UI over /openapi.json, its assets
// embedded in the binary (github.com/swaggo/files/v2), so it works with no
// internet access. The assets are served under /docs/.
//
//	@Summary		Interactive documentation
//	@Description	Swagger UI showing this document; it needs no internet access.
//	@Tags			node
//	@ID				docs
//	@Produce		html
//	@Success		200	{string}	string	"an HTML page"
//	@Router			/docs [get]
func (s *Server) handleDocs(w http.ResponseWriter, r *http.Request) {
	serveDocsFile(w, r, "index.html")
}

// handleDocsAsset serves /docs/{file}: Swagger UI's assets, with its
// initializer pointing at this node's document.
func (s *Server) handleDocsAsset(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Path[len("/docs/"):]
	if name == "" {
		name = "index.html"
	}
	if name == "swagger-initializer.js" {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = io.WriteString(w, docsInitializer)
		return
	}
	serveDocsFile(w, r, name)
}

// The index page's links are relative ("./swagger-ui.css"): served at
// /docs, they would resolve against / — so /docs/ it is, through a base.
func serveDocsFile(w http.ResponseWriter, r *http.Request, name string) {
	if name == "index.html" {
		b, err := fs.ReadFile(swaggerfiles.FS, name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(bytes.Replace(b, []byte("<head>"), []byte(`<head><base href="/docs/">`), 1))
		return
	}
	http.ServeFileFS(w, r, swaggerfiles.FS, name)
}

const docsInitializer = `window.onload = function() {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    // No call to the public validator: the page works with no internet
    // access.
    validatorUrl: null,
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    plugins: [SwaggerUIBundle.plugins.DownloadUrl],
    layout: "StandaloneLayout"
  });
};
`
