// Package apidocs builds the service's self-description from its live
// configuration: the OpenAPI 3.1 document (/openapi.json), the llms.txt for
// agents (/llms.txt), and the interactive API page (/docs) whose Swagger UI
// assets are embedded in the binary, so the docs never load anything from a
// CDN.
//
// Everything that is configuration (prices, networks, pay-to addresses,
// assets, the free allowance) comes in through Service, filled by the
// gateway from the routes it is enforcing right now; everything that is
// contract (request and result shapes, error codes, receipt verification)
// is written here once, from the specification. So a price change is a
// config reload, never a docs edit, and the docs cannot advertise a price
// the gateway does not charge.
//
// The package serves nothing itself: the gateway's aov_docs Caddy handler
// does, and any other server could.
package apidocs
