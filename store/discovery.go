package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Discovery is a facilitator's discovery list (x402's bazaar): the
// resources it settled a payment for, each with the ways to pay it settled
// and the description its payer echoed. The facilitator decides what an
// entry says and checks it (package x402); the store keeps it bounded,
// de-duplicated by resource and in a deterministic order, and shares it
// between the instances of one deployment.
//
// A Redis implementation runs Record and List as one Lua script each, which
// gives the same atomicity as the Badger transaction.
type Discovery interface {
	// Record adds the entry or, when its Resource is listed, updates it: Type,
	// Extensions and Item are replaced; the ways to pay are replaced by e's
	// when e.ReplaceAccepts or e.Rank is above the live entry's (a less
	// trusted writer's way to pay must not be listed under a more trusted
	// one's description), else merged (MergeDiscoveryAccepts); and LastSeen
	// becomes the store's clock. A new resource on a full list
	// evicts the one seen longest ago. An entry that breaks a bound
	// (CheckDiscoveryEntry) is ErrDiscoveryEntry, one whose Payment listed
	// another resource ErrDiscoveryPaymentUsed, and one whose Rank is below
	// the live entry's ErrDiscoveryOutranked; each changes nothing.
	Record(ctx context.Context, e DiscoveryEntry) error
	// List answers the live entries matching q, seen most recently first
	// (equal times: Resource in ascending byte order), from q.Offset, at
	// most q.Limit, with the number of matches. An entry not seen for
	// MaxAge is gone: neither listed nor counted. An entry the store finds
	// corrupt (part of it missing or unreadable) keeps its place in the
	// page it was counted in, with no Item or Accepts, for the reader to
	// skip: so Offset + the entries of a page is the next page.
	List(ctx context.Context, q DiscoveryQuery) (DiscoveryPage, error)
	// Limits reports the list's bounds, defaults filled in.
	Limits() DiscoveryLimits
}

// DiscoveryLimits bound a discovery list. The zero value of each field is
// its default.
type DiscoveryLimits struct {
	// MaxEntries is the most resources listed (default
	// DefaultDiscoveryEntries).
	MaxEntries int
	// MaxItemBytes bounds an entry's Item (default DefaultDiscoveryItemBytes).
	MaxItemBytes int
	// MaxAge drops an entry not seen for this long (default
	// DefaultDiscoveryMaxAge).
	MaxAge time.Duration
}

// Defaults of DiscoveryLimits, and the fixed bounds of an entry's ways to
// pay. At the defaults a full list holds at most 1000 × (32 KiB + 8 × 4 KiB)
// = 64 MiB, and every new entry needed a settled payment to the operator.
const (
	DefaultDiscoveryEntries   = 1000
	DefaultDiscoveryItemBytes = 32 << 10
	DefaultDiscoveryMaxAge    = 30 * 24 * time.Hour

	MaxDiscoveryAccepts     = 8
	MaxDiscoveryAcceptBytes = 4 << 10
	// MaxDiscoveryResourceBytes bounds Resource, MaxDiscoveryFieldBytes
	// Type, each extension name and each of an accept's identity fields.
	MaxDiscoveryResourceBytes = 2048
	MaxDiscoveryFieldBytes    = 256
	maxDiscoveryExtensions    = 16
)

// WithDefaults fills the zero fields.
func (l DiscoveryLimits) WithDefaults() DiscoveryLimits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultDiscoveryEntries
	}
	if l.MaxItemBytes <= 0 {
		l.MaxItemBytes = DefaultDiscoveryItemBytes
	}
	if l.MaxAge <= 0 {
		l.MaxAge = DefaultDiscoveryMaxAge
	}
	return l
}

// DiscoveryEntry is one resource of the list.
type DiscoveryEntry struct {
	// Resource identifies the entry (for x402: its canonical URL, for an
	// MCP tool the URL and the tool's name).
	Resource string
	// Type and Extensions (names) are what List filters on.
	Type       string
	Extensions []string
	// Item is the rest of the listed item, opaque to the store: one JSON
	// value of at most MaxItemBytes.
	Item    json.RawMessage
	Accepts []DiscoveryAccept
	// Payment identifies the settled transaction that lists the entry
	// (e.g. the network and the transaction hash; "": none). One payment
	// lists one resource: the store remembers it for MaxAge, and Record of
	// another resource under a payment it remembers is
	// ErrDiscoveryPaymentUsed. A facilitator answers every caller of one
	// payment that it joined with the same success, and each caller names
	// its own resource, which the payer's signature does not cover.
	Payment string
	// Rank is how far the writer is trusted (higher: more). Record leaves
	// a live entry written at a higher Rank as it is
	// (ErrDiscoveryOutranked), so what the operator listed cannot be
	// rewritten by a payer. Not filled by List.
	Rank uint8
	// ReplaceAccepts says Accepts is every way to pay the resource, not
	// one more (the operator's gate knows all its prices): Record drops the
	// ways to pay the entry had instead of merging, so a retired pay-to,
	// network or asset stops being listed with the next record. Not filled
	// by List.
	ReplaceAccepts bool
	// LastSeen is set by the store: ignored by Record, filled by List.
	LastSeen time.Time
}

// DiscoveryAccept is one way to pay an entry: its identity (what List
// filters on and Record de-duplicates by) and the requirements as JSON (at
// most MaxDiscoveryAcceptBytes).
type DiscoveryAccept struct {
	Scheme, Network, Asset, PayTo string
	Raw                           json.RawMessage
}

func (a DiscoveryAccept) same(b DiscoveryAccept) bool {
	return a.Scheme == b.Scheme && a.Network == b.Network && a.Asset == b.Asset && a.PayTo == b.PayTo
}

// DiscoveryQuery selects entries: each non-empty filter must match exactly
// (Type; Extension among Extensions; Scheme, Network and PayTo all on one
// way to pay).
//
// MaxBytes, when positive, bounds a page by size as Limit does by count:
// the entries of a page hold at most MaxBytes of Item and ways to pay
// (Raw) together, its first entry always included, so that reading a page
// never holds more than that whatever the entries' sizes.
type DiscoveryQuery struct {
	Type, Extension, Scheme, Network, PayTo string
	Offset, Limit                           int
	MaxBytes                                int
}

func (q DiscoveryQuery) unfiltered() bool {
	return q.Type == "" && q.Extension == "" && q.Scheme == "" && q.Network == "" && q.PayTo == ""
}

// Matches reports whether e is selected by q's filters.
func (q DiscoveryQuery) Matches(e *DiscoveryEntry) bool {
	if q.Type != "" && e.Type != q.Type {
		return false
	}
	if q.Extension != "" && !slices.Contains(e.Extensions, q.Extension) {
		return false
	}
	if q.Scheme == "" && q.Network == "" && q.PayTo == "" {
		return true
	}
	return slices.ContainsFunc(e.Accepts, func(a DiscoveryAccept) bool {
		return (q.Scheme == "" || a.Scheme == q.Scheme) && (q.Network == "" || a.Network == q.Network) && (q.PayTo == "" || a.PayTo == q.PayTo)
	})
}

// DiscoveryPage is one page of List.
type DiscoveryPage struct {
	Entries []DiscoveryEntry
	Total   int
}

// ErrDiscoveryEntry reports an entry that breaks a bound of the list.
var ErrDiscoveryEntry = errors.New("store: discovery entry out of bounds")

// ErrDiscoveryPaymentUsed reports a Record whose Payment already listed
// another resource; ErrDiscoveryOutranked one whose Rank is below the
// live entry's. Either changes nothing.
var (
	ErrDiscoveryPaymentUsed = errors.New("store: this payment already listed another resource")
	ErrDiscoveryOutranked   = errors.New("store: the listed entry was written by a more trusted writer")
)

// CheckDiscoveryEntry checks e against the bounds every backend enforces.
func CheckDiscoveryEntry(e DiscoveryEntry, l DiscoveryLimits) error {
	bad := func(what string) error { return fmt.Errorf("%w: %s", ErrDiscoveryEntry, what) }
	switch {
	case e.Resource == "" || len(e.Resource) > MaxDiscoveryResourceBytes:
		return bad("resource empty or too long")
	case e.Type == "" || len(e.Type) > MaxDiscoveryFieldBytes:
		return bad("type empty or too long")
	case len(e.Extensions) > maxDiscoveryExtensions:
		return bad("too many extensions")
	case len(e.Item) > l.MaxItemBytes || !json.Valid(e.Item):
		return bad("item too large or not JSON")
	case len(e.Accepts) == 0 || len(e.Accepts) > MaxDiscoveryAccepts:
		return bad("no way to pay, or too many")
	}
	if hasControl(e.Resource) || hasControl(e.Type) || hasControl(e.Payment) {
		return bad("resource, type or payment with a control character")
	}
	if len(e.Payment) > MaxDiscoveryFieldBytes {
		return bad("payment too long")
	}
	for _, x := range e.Extensions {
		if x == "" || len(x) > MaxDiscoveryFieldBytes || hasControl(x) {
			return bad("extension name empty, too long or with a control character")
		}
	}
	for _, a := range e.Accepts {
		if hasControl(a.Scheme + a.Network + a.Asset + a.PayTo) {
			return bad("way to pay with a control character")
		}
		if len(a.Scheme) > MaxDiscoveryFieldBytes || len(a.Network) > MaxDiscoveryFieldBytes ||
			len(a.Asset) > MaxDiscoveryFieldBytes || len(a.PayTo) > MaxDiscoveryFieldBytes {
			return bad("way to pay with a field too long")
		}
		if len(a.Raw) > MaxDiscoveryAcceptBytes || !json.Valid(a.Raw) {
			return bad("way to pay too large or not JSON")
		}
	}
	return nil
}

// hasControl reports an ASCII control character: none may be in what a
// backend keys or separates entries by.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// KeepDiscoveryAccepts reports whether Record of e merges its ways to pay
// into those of a live entry written at oldRank, rather than replacing
// them: only a writer as trusted as the old one that does not name every
// way to pay.
func KeepDiscoveryAccepts(e DiscoveryEntry, oldRank uint8) bool {
	return !e.ReplaceAccepts && e.Rank == oldRank
}

// MergeDiscoveryAccepts is the accepts of an entry after a merging Record
// (KeepDiscoveryAccepts): old with each of add replacing its twin (same
// Scheme, Network, Asset and PayTo) or appended while there are fewer than
// MaxDiscoveryAccepts (past that it is dropped).
func MergeDiscoveryAccepts(old, add []DiscoveryAccept) []DiscoveryAccept {
	out := slices.Clone(old)
	for _, a := range add {
		if i := slices.IndexFunc(out, a.same); i >= 0 {
			out[i] = a
		} else if len(out) < MaxDiscoveryAccepts {
			out = append(out, a)
		}
	}
	return out
}

// Badger layout of the discovery list (tag 'd', see keys.go):
//
//	'd' 'm' resource            → discoveryMeta (binary, see encode): last seen, type, extensions, accept identities
//	'd' 'b' resource            → discoveryBody (JSON): the item and the accepts' requirements
//	'd' 't' inv(lastSeen) resource → empty; the list, most recently seen first
//	'd' 'p' payment             → the resource that payment listed
//
// The small meta record is what List filters on, so a listing reads the
// bodies of its page only. Every key expires MaxAge after the entry was
// last seen (Badger's TTL reclaims it; the store's clock decides). An
// evicted entry's 'p' keys are left to expire: the payment still lists
// nothing else for MaxAge, and there is at most one per listing payment
// made within MaxAge, each a settled payment to the operator.

type discoveryMeta struct {
	At      int64 // Unix nanoseconds
	Type    string
	Ext     []string
	Accepts [][4]string
}

// encode is the meta record: At (8 bytes, big endian), then the type, the
// extension names and each accept's identity fields, each followed by a
// NUL (no name may hold a control character), the groups separated by
// 0x01. A filtered List decodes one per entry, so it is not JSON.
func (m *discoveryMeta) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(m.At))
	b = append(append(b, m.Type...), 0, 1)
	for _, x := range m.Ext {
		b = append(append(b, x...), 0)
	}
	for _, a := range m.Accepts {
		b = append(b, 1)
		for _, f := range a {
			b = append(append(b, f...), 0)
		}
	}
	return b
}

// errDiscoveryMeta reports a corrupt entry: a meta record that does not
// decode, or a body missing, not JSON or disagreeing with its meta.
var errDiscoveryMeta = errors.New("store: malformed discovery entry")

// decode reads what encode wrote.
func (m *discoveryMeta) decode(v []byte) error {
	if len(v) < 8 {
		return errDiscoveryMeta
	}
	m.At = int64(binary.BigEndian.Uint64(v))
	groups := bytes.Split(v[8:], []byte{1})
	if len(groups) < 2 {
		return errDiscoveryMeta
	}
	fields := func(g []byte) []string {
		var out []string
		for len(g) > 0 {
			i := bytes.IndexByte(g, 0)
			if i < 0 {
				return nil
			}
			out, g = append(out, string(g[:i])), g[i+1:]
		}
		return out
	}
	t := fields(groups[0])
	if len(t) != 1 {
		return errDiscoveryMeta
	}
	m.Type, m.Ext, m.Accepts = t[0], fields(groups[1]), nil
	for _, g := range groups[2:] {
		f := fields(g)
		if len(f) != 4 {
			return errDiscoveryMeta
		}
		m.Accepts = append(m.Accepts, [4]string{f[0], f[1], f[2], f[3]})
	}
	return nil
}

type discoveryBody struct {
	Item    json.RawMessage   `json:"i"`
	Accepts []json.RawMessage `json:"a"`
	Rank    uint8             `json:"r,omitempty"` // 0 in entries written before ranks
}

func discoveryKey(kind byte, resource string) []byte {
	return append([]byte{tagDiscovery, kind}, resource...)
}

func discoveryOrderKey(at int64, resource string) []byte {
	k := make([]byte, 0, 10+len(resource))
	k = append(k, tagDiscovery, 't')
	k = binary.BigEndian.AppendUint64(k, invTime(time.Unix(0, at)))
	return append(k, resource...)
}

var discoveryOrderPrefix = []byte{tagDiscovery, 't'}

func (m *discoveryMeta) entry(resource string) DiscoveryEntry {
	e := DiscoveryEntry{Resource: resource, Type: m.Type, Extensions: m.Ext, LastSeen: time.Unix(0, m.At)}
	for _, a := range m.Accepts {
		e.Accepts = append(e.Accepts, DiscoveryAccept{Scheme: a[0], Network: a[1], Asset: a[2], PayTo: a[3]})
	}
	return e
}

// Discovery returns the discovery list bounded by l (zero fields: the
// defaults). Every facilitator on one database shares one list; give them
// the same limits.
func (db *DB) Discovery(l DiscoveryLimits) Discovery {
	return discovery{db: db, lim: l.WithDefaults()}
}

type discovery struct {
	db  *DB
	lim DiscoveryLimits
}

// Limits implements Discovery.
func (d discovery) Limits() DiscoveryLimits { return d.lim }

// Record implements Discovery.
func (d discovery) Record(ctx context.Context, e DiscoveryEntry) error {
	if err := CheckDiscoveryEntry(e, d.lim); err != nil {
		return err
	}
	return d.db.update(ctx, func(txn *tx) error {
		at := now().UnixNano()
		cutoff := at - d.lim.MaxAge.Nanoseconds()
		if e.Payment != "" {
			item, err := txn.Get(discoveryKey('p', e.Payment))
			switch {
			case err == nil:
				listed, err := item.ValueCopy(nil)
				if err != nil {
					return err
				}
				if string(listed) != e.Resource {
					return ErrDiscoveryPaymentUsed
				}
			case !errors.Is(err, badger.ErrKeyNotFound):
				return err
			}
		}
		old, oldBody, err := d.get(txn, e.Resource, cutoff, true)
		if err != nil {
			return err
		}
		if old != nil && oldBody.Rank > e.Rank {
			return ErrDiscoveryOutranked
		}
		if old == nil {
			if err := d.makeRoom(txn, cutoff); err != nil {
				return err
			}
		} else if err := txn.Delete(discoveryOrderKey(old.At, e.Resource)); err != nil {
			return err
		}
		var prev []DiscoveryAccept
		if old != nil && KeepDiscoveryAccepts(e, oldBody.Rank) {
			prev = old.entry(e.Resource).Accepts
			for i := range prev {
				prev[i].Raw = oldBody.Accepts[i]
			}
		}
		accepts := MergeDiscoveryAccepts(prev, e.Accepts)
		meta := discoveryMeta{At: at, Type: e.Type, Ext: e.Extensions}
		body := discoveryBody{Item: e.Item, Rank: e.Rank}
		for _, a := range accepts {
			meta.Accepts = append(meta.Accepts, [4]string{a.Scheme, a.Network, a.Asset, a.PayTo})
			body.Accepts = append(body.Accepts, a.Raw)
		}
		mb := meta.encode()
		bb, err := json.Marshal(body)
		if err != nil {
			return err
		}
		expires := uint64(time.Unix(0, at).Add(d.lim.MaxAge).Unix()) + 1
		kvs := [][2][]byte{
			{discoveryKey('m', e.Resource), mb},
			{discoveryKey('b', e.Resource), bb},
			{discoveryOrderKey(at, e.Resource), nil},
		}
		if e.Payment != "" {
			kvs = append(kvs, [2][]byte{discoveryKey('p', e.Payment), []byte(e.Resource)})
		}
		for _, kv := range kvs {
			ent := badger.NewEntry(kv[0], kv[1])
			ent.ExpiresAt = expires
			if err := txn.SetEntry(ent); err != nil {
				return err
			}
		}
		return nil
	})
}

// get reads the live meta (and, with body, the body) of resource; nil when
// it is not listed or has aged out.
func (d discovery) get(txn *tx, resource string, cutoff int64, body bool) (*discoveryMeta, *discoveryBody, error) {
	item, err := txn.Get(discoveryKey('m', resource))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	m := new(discoveryMeta)
	if err := item.Value(m.decode); err != nil {
		return nil, nil, fmt.Errorf("store: reading discovery entry: %w", err)
	}
	if m.At < cutoff {
		return nil, nil, nil
	}
	if !body {
		return m, nil, nil
	}
	item, err = txn.Get(discoveryKey('b', resource))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil, fmt.Errorf("%w: its body is missing", errDiscoveryMeta)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("store: reading discovery entry: %w", err)
	}
	b := new(discoveryBody)
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, b) }); err != nil {
		return nil, nil, fmt.Errorf("%w: its body: %v", errDiscoveryMeta, err)
	}
	if len(b.Accepts) != len(m.Accepts) {
		return nil, nil, fmt.Errorf("%w: its meta and body disagree", errDiscoveryMeta)
	}
	return m, b, nil
}

// makeRoom deletes the entries that aged out and, while the list is full,
// the one seen longest ago, so one more fits.
func (d discovery) makeRoom(txn *tx, cutoff int64) error {
	var live, dead [][]byte
	it := txn.NewIterator(badger.IteratorOptions{Prefix: discoveryOrderPrefix})
	for it.Rewind(); it.Valid(); it.Next() {
		k := it.Item().KeyCopy(nil)
		if orderAt(k) < cutoff {
			dead = append(dead, k)
		} else {
			live = append(live, k)
		}
	}
	it.Close()
	for len(live) >= d.lim.MaxEntries {
		dead, live = append(dead, live[len(live)-1]), live[:len(live)-1]
	}
	for _, k := range dead {
		res := string(k[10:])
		for _, key := range [][]byte{k, discoveryKey('m', res), discoveryKey('b', res)} {
			if err := txn.Delete(key); err != nil {
				return err
			}
		}
	}
	return nil
}

// orderAt is the last-seen time (Unix nanoseconds) of an order key.
func orderAt(k []byte) int64 {
	return int64(math.MaxUint64 - binary.BigEndian.Uint64(k[2:10]))
}

// List implements Discovery.
func (d discovery) List(ctx context.Context, q DiscoveryQuery) (DiscoveryPage, error) {
	page := DiscoveryPage{Entries: []DiscoveryEntry{}}
	cutoff := now().UnixNano() - d.lim.MaxAge.Nanoseconds()
	err := d.db.view(ctx, func(txn *tx) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: discoveryOrderPrefix})
		defer it.Close()
		var seen, size int
		for it.Rewind(); it.Valid() && seen < d.lim.MaxEntries; it.Next() {
			k := it.Item().Key()
			if orderAt(k) < cutoff {
				break // older ones follow
			}
			seen++
			res := string(k[10:])
			full := len(page.Entries) >= q.Limit || (q.MaxBytes > 0 && len(page.Entries) > 0 && size >= q.MaxBytes)
			if q.unfiltered() {
				// Every live entry matches: only the page's are read.
				page.Total++
				if page.Total <= q.Offset || full {
					continue
				}
			}
			// A corrupt entry (errDiscoveryMeta) keeps its place: in the
			// unfiltered list it was counted, and a page that left it out
			// would make offset + limit miss the next page's first entry.
			// It is given back with no item, for the reader to skip.
			m, _, err := d.get(txn, res, cutoff, false)
			if err != nil && !errors.Is(err, errDiscoveryMeta) {
				return err
			}
			if m == nil {
				if q.unfiltered() {
					page.Entries = append(page.Entries, DiscoveryEntry{Resource: res})
				}
				continue
			}
			e := m.entry(res)
			if !q.unfiltered() {
				if !q.Matches(&e) {
					continue
				}
				page.Total++
				if page.Total <= q.Offset || full {
					continue
				}
			}
			_, b, err := d.get(txn, res, cutoff, true)
			if errors.Is(err, errDiscoveryMeta) {
				page.Entries = append(page.Entries, DiscoveryEntry{Resource: res, Type: e.Type, Extensions: e.Extensions, LastSeen: e.LastSeen})
				continue
			}
			if err != nil {
				return err
			}
			n := len(b.Item)
			for _, a := range b.Accepts {
				n += len(a)
			}
			if q.MaxBytes > 0 && len(page.Entries) > 0 && size+n > q.MaxBytes {
				size = q.MaxBytes // the page is full: the rest is only counted
				continue
			}
			size += n
			// json.Unmarshal copied them out of the transaction's buffers.
			e.Item = b.Item
			for i := range e.Accepts {
				e.Accepts[i].Raw = b.Accepts[i]
			}
			page.Entries = append(page.Entries, e)
		}
		return nil
	})
	if err != nil {
		return DiscoveryPage{}, err
	}
	return page, nil
}
