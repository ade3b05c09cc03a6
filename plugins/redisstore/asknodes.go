package redisstore

import (
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxAskNodes bounds the clients askNodes keeps: one per node that
// receives a slot while it moves, a handful at once in any cluster.
const maxAskNodes = 8

// askNodes are the clients a Store keeps for the nodes an ASK names, by
// address. An ASK names the node a slot's keys are moving to while the
// slot map still rightly names the old one, which keeps serving it:
// rereading the whole map (CLUSTER SLOTS) for it would cost every write
// of the slot a topology read for as long as the move lasts, and not
// even find a node that serves no slot yet (one added to take this
// one), which the map does not list. It keeps the least recently used
// maxAskNodes; one evicted, or left when the Store is closed, is closed
// once no write uses it.
type askNodes struct {
	mu      sync.Mutex
	clients map[string]*askNode
	tick    uint64 // counts uses, for the least recently used
	closed  bool
}

type askNode struct {
	c     *redis.Client
	users int    // writes using c
	used  uint64 // askNodes.tick at its last use
	gone  bool   // evicted or closed: c is closed once users is 0
}

// get is the client for the node at addr, made with like's options (a
// node client of the same cluster), and done, which the caller calls once
// it no longer uses it. After close it is redis.ErrClosed.
func (a *askNodes) get(like *redis.Client, addr string) (c *redis.Client, done func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, nil, redis.ErrClosed
	}
	n := a.clients[addr]
	if n == nil {
		if len(a.clients) >= maxAskNodes {
			a.evictLocked()
		}
		o := *like.Options()
		o.Addr, o.NodeAddress = addr, ""
		if o.MaintNotificationsConfig != nil {
			mc := *o.MaintNotificationsConfig // one per client, as go-redis does
			o.MaintNotificationsConfig = &mc
		}
		n = &askNode{c: redis.NewClient(&o)}
		if a.clients == nil {
			a.clients = make(map[string]*askNode)
		}
		a.clients[addr] = n
	}
	a.tick++
	n.users++
	n.used = a.tick
	return n.c, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		n.users--
		if n.gone && n.users == 0 {
			n.c.Close()
		}
	}, nil
}

// evictLocked drops the least recently used client.
func (a *askNodes) evictLocked() {
	var oldest string
	for addr, n := range a.clients {
		if oldest == "" || n.used < a.clients[oldest].used {
			oldest = addr
		}
	}
	a.dropLocked(oldest)
}

func (a *askNodes) dropLocked(addr string) {
	n := a.clients[addr]
	delete(a.clients, addr)
	n.gone = true
	if n.users == 0 {
		n.c.Close()
	}
}

// close closes every client (those in use once their write is done), and
// get fails from then on.
func (a *askNodes) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for addr := range a.clients {
		a.dropLocked(addr)
	}
}
