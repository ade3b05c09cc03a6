package svmfacilitator

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// serve starts the fake in front of f.target.
func (f *faultyRPC) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		json.Unmarshal(body, &req)
		f.mu.Lock()
		target, dropSend, forward, hide, errorAfter, before := f.target, f.dropSend, f.forwardOK, f.hideStatus, f.errorAfterSend, f.beforeSend
		confirmedValid, beforeSim, beforeStatus := f.confirmedValid, f.beforeSimulate, f.beforeStatus
		if f.calls == nil {
			f.calls = map[string]int{}
		}
		f.calls[req.Method]++
		f.mu.Unlock()
		if req.Method == "sendTransaction" && before != nil {
			before()
		}
		if req.Method == "simulateTransaction" && beforeSim != nil {
			beforeSim()
		}
		if req.Method == "getSignatureStatuses" && beforeStatus != nil {
			beforeStatus()
		}
		switch {
		case req.Method == "sendTransaction" && dropSend:
			if forward {
				if resp, err := http.Post(target, "application/json", bytes.NewReader(body)); err == nil {
					resp.Body.Close()
				}
			}
			// The reply is lost: the connection breaks.
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			return
		case req.Method == "sendTransaction" && errorAfter:
			if resp, err := http.Post(target, "application/json", bytes.NewReader(body)); err == nil {
				resp.Body.Close()
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"error":{"code":-32603,"message":"Internal error"}}`))
			return
		case req.Method == "isBlockhashValid" && confirmedValid && len(req.Params) == 2 && bytes.Contains(req.Params[1], []byte(`"confirmed"`)):
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":{"context":{"slot":1},"value":true}}`))
			return
		case req.Method == "getSignatureStatuses" && hide:
			replyNoStatus(w, req.ID)
			return
		}
		resp, err := http.Post(target, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// count is how many calls of method it has seen.
func (f *faultyRPC) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}
