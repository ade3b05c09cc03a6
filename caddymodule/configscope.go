package caddymodule

import (
	"context"
	"sync"

	"github.com/caddyserver/caddy/v2"
)

// perConfig keeps a value per config being provisioned, for checks that
// span the modules of one config (storemix.go, freepool.go). A config is
// told apart by its context's Done channel: every module of one config
// load shares it (Caddy derives per-server contexts from it with values
// only), and each load has its own, so a reload's new config is checked
// apart from the old one still serving. The value goes when the config
// is unloaded.
type perConfig[T any] struct {
	mu sync.Mutex
	m  map[<-chan struct{}]*T
}

// with calls fn, under the lock, with the value of ctx's config, zero the
// first time. It does nothing for a context that is never done (outside a
// config load).
func (p *perConfig[T]) with(ctx caddy.Context, fn func(*T)) {
	done := ctx.Done()
	if done == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, seen := p.m[done]
	if !seen {
		if p.m == nil {
			p.m = map[<-chan struct{}]*T{}
		}
		v = new(T)
		p.m[done] = v
		context.AfterFunc(ctx, func() {
			p.mu.Lock()
			delete(p.m, done)
			p.mu.Unlock()
		})
	}
	fn(v)
}
