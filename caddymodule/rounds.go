package caddymodule

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aovhq/aov/apierr"
)

// maxInputRounds bounds the rounds of a multi-round-trip MCP call (SEP-2322)
// one charge may run: the rounds of one payment, or of one free client
// between two charged answers. A round runs the tool and is handed over
// uncharged, its payment claim or free unit given back, so without a
// bound one payment signature (or one free unit) would buy tool runs
// without end, by sending the first call again and again. It is the
// official SDK client's own limit (maxMultiRoundTripRetries): the client
// gives up a call after its tenth round, so an honest client never sends
// the call an eleventh time.
const maxInputRounds = 10

// inputRoundsWindow is how long the rounds of a charge are remembered from
// its first round: a payment authorization is spent or lapsed long
// before, and a free client gets maxInputRounds more after it.
const inputRoundsWindow = 10 * time.Minute

// maxRoundCharges bounds the charges a roundCounter remembers. Past it, with
// none lapsed, a charge it does not know is refused its round (fails
// closed): the table must not grow without bound under a flood of
// payment signatures.
const maxRoundCharges = 1 << 16

// codeTooManyInputRounds is the refusal of a call past maxInputRounds.
const codeTooManyInputRounds = "too_many_input_rounds"

// errTooManyInputRounds is the refusal of a call whose charge has run
// maxInputRounds rounds: nothing is charged, and the tool does not run.
func errTooManyInputRounds() *apierr.Error {
	return &apierr.Error{
		Code: codeTooManyInputRounds,
		Message: fmt.Sprintf("The tool asked for the client's input %d times without answering the call, so the gateway stopped it before the tool ran; nothing was charged. "+
			"Call again with a new payment, or from the free allowance after %d minutes.", maxInputRounds, int(inputRoundsWindow.Minutes())),
		Status:      http.StatusTooManyRequests,
		NextActions: []apierr.Action{{Action: "contact_operator"}},
	}
}

// roundKey names a charge whose rounds are counted: a payment by its claim
// key, a free client by its pool and allowance key. A struct, so that
// naming a charge allocates nothing on the free path.
type roundKey struct {
	free     bool
	pool, id string
}

// roundCount is a charge's rounds since first.
type roundCount struct {
	n     int
	first time.Time
}

// roundCounter counts the rounds of an mcp_tool gate's charges. It is in
// memory, one per gate: gateways behind one load balancer each allow
// maxInputRounds per charge, and a config reload starts the count afresh.
type roundCounter struct {
	size atomic.Int64 // len(m): charges without rounds never take the lock
	mu   sync.Mutex
	m    map[roundKey]*roundCount
}

func newRoundCounter() *roundCounter {
	return &roundCounter{m: make(map[roundKey]*roundCount)}
}

// spent reports whether k has run maxInputRounds rounds within the window.
func (c *roundCounter) spent(k roundKey) bool {
	if c.size.Load() == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	return e != nil && now().Sub(e.first) < inputRoundsWindow && e.n >= maxInputRounds
}

// add counts a round of k, and reports whether it is within the bound.
func (c *roundCounter) add(k roundKey) bool {
	t := now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	if e != nil && t.Sub(e.first) >= inputRoundsWindow {
		e.n, e.first = 0, t
	}
	if e == nil {
		if len(c.m) >= maxRoundCharges {
			for k, e := range c.m {
				if t.Sub(e.first) >= inputRoundsWindow {
					delete(c.m, k)
				}
			}
			if len(c.m) >= maxRoundCharges {
				return false
			}
		}
		e = &roundCount{first: t}
		c.m[k] = e
		c.size.Store(int64(len(c.m)))
	}
	e.n++
	return e.n <= maxInputRounds
}

// done forgets k's rounds: its call was answered and charged.
func (c *roundCounter) done(k roundKey) {
	if c.size.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
	c.size.Store(int64(len(c.m)))
}
