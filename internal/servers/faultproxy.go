package servers

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// FaultProxy is a fake: a TCP proxy in front of a real server, through
// which a test causes the network faults a real server will not show on
// cue (an answer lost after its request ran, a connection cut, a server
// gone). It is the one proxy the fakes of this package and the tests' own
// are built on: it accepts and dials, and its relay forwards the bytes of
// each connection and makes the fault.
type FaultProxy struct {
	// Addr is the proxy's host:port, to connect to in place of the
	// target's.
	Addr string

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// StartFaultProxy starts a FaultProxy in front of target, killed when the
// test ends. Each connection it accepts is handed to relay, in a goroutine
// of its own, with a connection of its own to target; a client whose
// connection to target cannot be made is cut.
func StartFaultProxy(t testing.TB, target string, relay func(client, server net.Conn)) *FaultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FaultProxy{Addr: ln.Addr().String(), ln: ln}
	t.Cleanup(p.Kill)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				p.mu.Lock()
				p.conns = append(p.conns, c, s)
				p.mu.Unlock()
				relay(c, s)
			}()
		}
	}()
	return p
}

// Kill closes the listener and every connection made through it: the
// server is gone, and every later dial is refused.
func (p *FaultProxy) Kill() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// ReplyDrop is a FaultProxy that, armed, swallows the next answer the
// server sends and cuts that connection: the command ran and its answer
// was lost (a timeout, a dropped connection), the fault a client cannot
// tell from a command that never arrived.
type ReplyDrop struct {
	*FaultProxy
	// Armed drops the next answer, on whichever connection it comes;
	// the drop disarms it.
	Armed atomic.Bool
	// Drops counts the answers dropped.
	Drops atomic.Int32
}

// StartReplyDrop starts a ReplyDrop in front of target, killed when the
// test ends.
func StartReplyDrop(t testing.TB, target string) *ReplyDrop {
	t.Helper()
	r := &ReplyDrop{}
	r.FaultProxy = StartFaultProxy(t, target, r.relay)
	return r
}

func (r *ReplyDrop) relay(c, s net.Conn) {
	go func() { io.Copy(s, c); s.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 && r.Armed.CompareAndSwap(true, false) {
			r.Drops.Add(1)
			c.Close()
			s.Close()
			return
		}
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				s.Close()
				return
			}
		}
		if err != nil {
			c.Close()
			return
		}
	}
}
