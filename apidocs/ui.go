package apidocs

import (
	"bytes"
	"embed"
	"html/template"
	"strings"
)

// ui holds the Swagger UI files vendored from the swagger-ui-dist npm
// package by ui/update.sh, byte for byte.
//
//go:embed ui/swagger-ui.css ui/swagger-ui-bundle.js ui/LICENSE ui/NOTICE ui/swagger-ui-bundle.js.LICENSE.txt ui/VERSION
var ui embed.FS

// initScript starts Swagger UI on the page. It is a file of its own, not an
// inline script, so the page's Content-Security-Policy can forbid inline
// scripts and every origin but its own. The spec URL comes from the page's
// data-spec attribute.
const initScript = `window.addEventListener("DOMContentLoaded", function () {
  var el = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: el.getAttribute("data-spec"),
    dom_id: "#swagger-ui",
    deepLinking: true,
    tryItOutEnabled: true,
    displayRequestDuration: true,
    showExtensions: true,
    defaultModelsExpandDepth: 0,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout"
  });
});
`

// assets are the files served under the assets prefix: name → type.
var assets = map[string]string{
	"swagger-ui.css":                   "text/css; charset=utf-8",
	"swagger-ui-bundle.js":             "text/javascript; charset=utf-8",
	"init.js":                          "text/javascript; charset=utf-8",
	"LICENSE":                          "text/plain; charset=utf-8",
	"NOTICE":                           "text/plain; charset=utf-8",
	"swagger-ui-bundle.js.LICENSE.txt": "text/plain; charset=utf-8",
	"VERSION":                          "text/plain; charset=utf-8",
}

// Asset returns an embedded file of the interactive page by its name under
// the assets prefix ("swagger-ui-bundle.js"), with its content type.
func Asset(name string) (data []byte, contentType string, ok bool) {
	ct, ok := assets[name]
	if !ok {
		return nil, "", false
	}
	if name == "init.js" {
		return []byte(initScript), ct, true
	}
	data, err := ui.ReadFile("ui/" + name)
	if err != nil {
		return nil, "", false
	}
	return data, ct, true
}

// UIVersion is the vendored Swagger UI release ("5.35.0"), from ui/VERSION.
func UIVersion() string {
	v, _ := ui.ReadFile("ui/VERSION")
	line, _, _ := strings.Cut(string(v), "\n")
	return strings.TrimPrefix(line, "swagger-ui-dist ")
}

// PageCSP is the Content-Security-Policy the page is served with: only its
// own origin for scripts, styles, fonts and requests (Swagger UI sets inline
// style attributes and uses data: images).
const PageCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

var pageTemplate = template.Must(template.New("docs").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}: API docs</title>
<link rel="stylesheet" href="{{.Assets}}/swagger-ui.css?v={{.Version}}">
</head>
<body>
<noscript>This page needs JavaScript. The API is described in <a href="{{.Spec}}">{{.Spec}}</a> (OpenAPI 3.1) and <a href="{{.LLMs}}">{{.LLMs}}</a>.</noscript>
<div id="swagger-ui" data-spec="{{.Spec}}"></div>
<script src="{{.Assets}}/swagger-ui-bundle.js?v={{.Version}}"></script>
<script src="{{.Assets}}/init.js?v={{.Version}}"></script>
</body>
</html>
`))

// Page returns the /docs HTML: Swagger UI from the embedded assets under
// assetsPrefix ("/docs/assets"), initialised against specURL
// ("/openapi.json") with "Try it out" enabled. llmsURL is linked for
// readers without JavaScript.
func Page(title, specURL, llmsURL, assetsPrefix string) []byte {
	var b bytes.Buffer
	pageTemplate.Execute(&b, struct{ Title, Spec, LLMs, Assets, Version string }{
		title, specURL, llmsURL, strings.TrimSuffix(assetsPrefix, "/"), UIVersion(),
	})
	return b.Bytes()
}
