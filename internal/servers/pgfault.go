package servers

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// PGFault is a fake: a TCP proxy in front of a real PostgreSQL that, when
// armed, delays or loses one answer, the faults a client cannot tell apart
// from a server that never got the request and that a real server will not
// show on cue (a stalled network, a connection cut between a COMMIT and its
// answer). Everything else it forwards unchanged.
//
// It is a FaultProxy whose relay reads the client's side of the protocol
// (the untyped startup message, then typed messages) to find the request a
// fault is armed for; it never changes a byte.
type PGFault struct {
	// DSN connects through the proxy, as Postgres.DSN connects directly.
	DSN string

	mu  sync.Mutex
	arm *pgArm

	// Hits counts the faults that happened.
	Hits atomic.Int32
}

// PGFaultAction is what an armed PGFault does.
type PGFaultAction int

const (
	// DelayAnswer holds the server's next answer for the armed duration,
	// then forwards it: the request ran, its answer is late.
	DelayAnswer PGFaultAction = iota
	// LoseAnswer swallows the server's next answer and cuts the
	// connection: the request ran, its answer never arrives.
	LoseAnswer
	// LoseRequest cuts the connection instead of forwarding the request:
	// the server never runs it.
	LoseRequest
)

type pgArm struct {
	query  string // a simple query starting with it (any case); "" is any answer
	action PGFaultAction
	delay  time.Duration
}

// StartPGFault starts the proxy in front of pg, stopped when the test ends.
func StartPGFault(t testing.TB, pg *Postgres) *PGFault {
	t.Helper()
	start := strings.Index(pg.DSN, "@") + 1
	end := start + strings.Index(pg.DSN[start:], "/")
	p := &PGFault{}
	proxy := StartFaultProxy(t, pg.DSN[start:end], p.relay)
	p.DSN = pg.DSN[:start] + proxy.Addr + pg.DSN[end:]
	return p
}

// Arm sets one fault, for the first connection that gets there. With query
// "" the fault is the next answer the server sends on any connection
// (LoseRequest needs a query); with a query, it is the answer to (or, for
// LoseRequest, the request of) the next simple query starting with it, as
// pgx sends COMMIT.
func (p *PGFault) Arm(query string, action PGFaultAction, delay time.Duration) {
	p.mu.Lock()
	p.arm = &pgArm{query: strings.ToUpper(query), action: action, delay: delay}
	p.mu.Unlock()
}

// take disarms and returns the fault if it applies to a query (q) or to
// any answer (q == "" and the fault names no query).
func (p *PGFault) take(q string, anyAnswer bool) *pgArm {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.arm
	if a == nil || (anyAnswer && a.query != "") || (!anyAnswer && (a.query == "" || !strings.HasPrefix(q, a.query))) {
		return nil
	}
	p.arm = nil
	return a
}

func (p *PGFault) relay(c, s net.Conn) {
	var next atomic.Pointer[pgArm] // a fault waiting for this connection's next answer
	cut := func() { c.Close(); s.Close() }
	go func() {
		defer cut()
		r := bufio.NewReader(c)
		first := true
		for {
			msg, err := readPGMessage(r, first)
			if err != nil {
				return
			}
			if !first && msg[0] == 'Q' {
				q := strings.ToUpper(strings.TrimSpace(string(bytes.TrimRight(msg[5:], "\x00"))))
				if a := p.take(q, false); a != nil {
					if a.action == LoseRequest {
						p.Hits.Add(1)
						return
					}
					next.Store(a)
				}
			}
			first = false
			if _, err := s.Write(msg); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			a := next.Swap(nil)
			if a == nil {
				a = p.take("", true)
			}
			if a != nil {
				p.Hits.Add(1)
				if a.action == LoseAnswer {
					cut()
					return
				}
				time.Sleep(a.delay)
			}
			if _, err := c.Write(buf[:n]); err != nil {
				cut()
				return
			}
		}
		if err != nil {
			cut()
			return
		}
	}
}

// readPGMessage reads one client message whole: the first of a connection
// has no type byte (startup, SSL or cancel request), the others have one.
func readPGMessage(r *bufio.Reader, untyped bool) ([]byte, error) {
	head := 5
	if untyped {
		head = 4
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:]))
	if n < 4 || n > 1<<26 {
		return nil, io.ErrUnexpectedEOF
	}
	msg = append(msg, make([]byte, n-4)...)
	_, err := io.ReadFull(r, msg[head:])
	return msg, err
}
