// Command seller-agent is a tiny seller agent for the "For sellers"
// walkthrough and the gateway's tests: it answers invoices as JSON, the way
// an agent that sells structured work would, and has one deliberate bug so
// that a failing verification can be seen.
//
//	GET /invoices/{id}   an invoice (id: INV- and four digits)
//	                     ?lines=N adds generated line items (N ≤ 1000), for
//	                     larger answers
//	GET /health          {"status":"ok"}
//
// Every invoice's line totals sum to its total, except INV-7732: there the
// agent adds a shipping fee to the total without a line for it (the worked
// example of the specification), which the rule "line totals sum to the
// total" catches.
//
// Like most web frameworks it compresses its answer when the client accepts
// gzip: a gateway that checks responses must ask it for identity encoding.
//
// It is not for production: no persistence, no authentication.
//
// Usage:
//
//	go run ./examples/seller-agent -addr 127.0.0.1:9000
package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address (host:port; port 0 picks a free one)")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("seller-agent: %v", err)
	}
	// The first line of output names the address, for scripts and tests.
	fmt.Printf("seller-agent listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("seller-agent: %v", err)
	}
}

// Invoice is what the agent sells.
type Invoice struct {
	InvoiceID string     `json:"invoice_id"`
	Currency  string     `json:"currency"`
	Customer  string     `json:"customer"`
	IssuedOn  string     `json:"issued_on"`
	LineItems []LineItem `json:"line_items"`
	Total     float64    `json:"total"`
}

// LineItem is one line of an invoice.
type LineItem struct {
	SKU         string  `json:"sku"`
	Description string  `json:"description"`
	Qty         int     `json:"qty"`
	LineTotal   float64 `json:"line_total"`
}

var invoiceID = regexp.MustCompile(`^INV-[0-9]{4}$`)

// buggyInvoice is the invoice whose total includes an unlisted fee.
const buggyInvoice = "INV-7732"

const maxLines = 1000

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /invoices/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !invoiceID.MatchString(id) {
			writeJSON(w, r, http.StatusNotFound, map[string]string{"error": "no such invoice; ids look like INV-7731"})
			return
		}
		lines := 0
		if s := r.URL.Query().Get("lines"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n > maxLines {
				writeJSON(w, r, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("lines must be a number from 0 to %d", maxLines)})
				return
			}
			lines = n
		}
		writeJSON(w, r, http.StatusOK, makeInvoice(id, lines))
	})
	return mux
}

// makeInvoice builds the invoice: two fixed lines, extra generated ones,
// and the total (in cents, so it is exact).
func makeInvoice(id string, extra int) Invoice {
	inv := Invoice{
		InvoiceID: id,
		Currency:  "USD",
		Customer:  "Acme Robotics",
		IssuedOn:  "2026-11-29",
		LineItems: []LineItem{
			{SKU: "A-100", Description: "Sensor calibration", Qty: 2, LineTotal: 87.0},
			{SKU: "B-200", Description: "Field report", Qty: 1, LineTotal: 42.5},
		},
	}
	for i := range extra {
		qty := i%3 + 1
		cents := qty * (1000 + 25*i)
		inv.LineItems = append(inv.LineItems, LineItem{
			SKU:         fmt.Sprintf("G-%04d", i),
			Description: "Generated service line",
			Qty:         qty,
			LineTotal:   float64(cents) / 100,
		})
	}
	cents := 0
	for _, l := range inv.LineItems {
		cents += int(l.LineTotal*100 + 0.5)
	}
	if id == buggyInvoice {
		cents += 550 // shipping, added to the total but never listed
	}
	inv.Total = float64(cents) / 100
	return inv
}

// writeJSON answers v as JSON, gzip-compressed when the client accepts it.
func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Vary", "Accept-Encoding")
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		h.Set("Content-Encoding", "gzip")
		w.WriteHeader(status)
		gz := gzip.NewWriter(w)
		json.NewEncoder(gz).Encode(v)
		gz.Close()
		return
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// acceptsGzip reports whether an Accept-Encoding value allows gzip.
func acceptsGzip(ae string) bool {
	for _, part := range strings.Split(ae, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			return !strings.Contains(strings.ReplaceAll(params, " ", ""), "q=0")
		}
	}
	return false
}
